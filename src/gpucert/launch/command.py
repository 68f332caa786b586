"""`gpucert launch {slurm,torchrun,k8s} VERB [options] [options of VERB]`: options launch does not know go to
the launched verb unchanged, e.g.

    gpucert launch slurm accept --nodes 2 --gpus-per-node 0 --profile cpu --output /shared/run --dry-run
    gpucert launch slurm finetune --nodes 2 --gpus-per-node 8 --config qwen2-7b-glaive
    gpucert launch torchrun accept --nodes 2 --head node-a
    gpucert launch k8s accept --nodes 2 --gpus-per-node 8 --image registry/gpucert:0.1 --pvc shared > job.yaml

Slurm without --dry-run submits, follows the job (state, nodes), and exits with the verdict of the report the
job wrote (3 with the tails of the job's own log and of its nodes' when it wrote none).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from gpucert.config.loader import ConfigError, said_by_every
from gpucert.launch import k8s, slurm, torchrun
from gpucert.launch.presets import preset_env
from gpucert.report.store import file_identity
from gpucert.runtime.config import MAX_SECONDS
from gpucert.status import Status

ERROR_EXIT = Status.ERROR.exit_code
# GPUs a node asks Slurm or Kubernetes for when --gpus-per-node is not given: an HGX node's.
DEFAULT_GPUS = 8


def build_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    # No abbreviations: an option of the launched verb (`--set`) must never be taken for one of ours (`--setup`).
    parser = parser_class(
        prog="gpucert launch", description="Render or submit a multi-node gpucert job.", allow_abbrev=False
    )
    backends = parser.add_subparsers(dest="backend", required=True, parser_class=parser_class)
    helps = {
        "slurm": "an sbatch job: one task per node; submitted and followed unless --dry-run",
        "torchrun": "the command for every node of a cluster without a scheduler",
        "k8s": "an indexed Job with a headless Service (YAML on stdout)",
    }
    for name, text in helps.items():
        p = backends.add_parser(name, help=text, description=text, allow_abbrev=False)
        p.add_argument("verb", choices=slurm.VERBS)
        p.add_argument("--nodes", type=int, required=True, help="nodes in the job")
        p.add_argument(
            "--gpus-per-node",
            type=int,
            help="GPUs per node (0: a CPU job, gloo); Slurm and Kubernetes request them, default 8; torchrun: each "
            "node's own count unless given",
        )
        p.add_argument("--preset", action="append", default=[], help="network preset (ib, roce, socket, debug)")
        p.add_argument("--iface", help="network interface of the socket preset (NCCL_SOCKET_IFNAME)")
        p.add_argument("--port", type=int, help="node rank 0's rendezvous port")
        # Default: the verb's own runtime.rendezvous_timeout_s (its config file, a --set, else 120 s).
        p.add_argument("--rendezvous-timeout", type=float, help="seconds nodes have to meet")
    s = backends.choices["slurm"]
    for flag in ("--partition", "--account", "--reservation", "--time", "--mem", "--container-image"):
        s.add_argument(flag)
    s.add_argument("--cpus-per-task", type=int)
    s.add_argument("--venv", help="a virtual environment every node activates (on the shared filesystem)")
    s.add_argument(
        "--setup",
        action="append",
        default=[],
        help="a shell line the batch script runs before gpucert, on the job's first node: what it exports (a venv, "
        "`module load`, variables) reaches every node through srun; an action each node must take itself needs "
        "srun, e.g. --setup 'srun --ntasks-per-node=1 nvidia-smi -pm 1'",
    )
    s.add_argument("--dry-run", action="store_true", help="print the script; submit nothing")
    s.add_argument(
        "--follow-timeout",
        type=float,
        help="seconds to follow the job (default: its --time + 10 min from when it starts, after at most 24 h in the "
        "queue; 24 h without --time)",
    )
    backends.choices["torchrun"].add_argument("--head", required=True, help="node rank 0's address")
    k = backends.choices["k8s"]
    k.add_argument(
        "--image",
        required=True,
        help="container image with gpucert installed, pushed where the nodes pull from; build one from the "
        "repository's deploy/Dockerfile (docs/fleet.md)",
    )
    k.add_argument("--name", help="Job name (default gpucert-VERB)")
    k.add_argument("--pvc", help="PersistentVolumeClaim of the shared filesystem")
    k.add_argument("--mount", default="/shared", help="where the shared volume is mounted")
    return parser


def check_verb_args(verb: str, rest: list[str], here: bool = True) -> str | None:
    """The options passed on to the verb, checked here with the verb's own parser and config schema, so a
    mistyped option, --set key or profile is refused now, not by every node of a job that was already submitted.
    Returns the hardware profile the verb will use ("auto": chosen by each node's GPUs; None for finetune)."""
    from gpucert.cli import SUITE_VERBS, suite_args
    from gpucert.cli import build_parser as verb_parser

    argv = [*slurm.VERB_ARGV[verb][1:], *rest]
    if verb == "fs" and not [a for a in rest if not a.startswith("-")]:
        argv.append(".")  # its PATH may be given later; the options are what is checked here
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parsed = verb_parser().parse_args(argv)
    except SystemExit:
        said = err.getvalue().strip().splitlines()[-1:] or ["bad options"]
        raise ConfigError(f"launch ... {verb}: {said[0].removeprefix('gpucert: error: ')}") from None
    overrides = list(getattr(parsed, "overrides", []) or [])
    config = getattr(parsed, "config", None)
    if verb == "finetune":
        from gpucert.finetune.config import load_finetune_config, resolve_recipe

        if parsed.stage not in (None, "prepare"):  # as finetune() refuses it, on every node of the job
            raise ConfigError(f"launch ... finetune: {parsed.stage!r}: the only stage is `prepare`")

        # A local file or a shipped recipe (else a ConfigError naming it), with its --set values.
        load_finetune_config(resolve_recipe(config), overrides, False)
        return None
    flag = getattr(parsed, "profile", None)
    if parsed.verb in SUITE_VERBS:
        # The verb's own checks of its flags (--skip names, --nproc, --duration), the profile added as it adds it.
        try:
            overrides = suite_args(parsed)[0]
        except ConfigError as exc:
            raise ConfigError(f"launch ... {verb}: {exc}") from None
    elif flag is not None:
        overrides.append(f"profile={flag}")  # as the verb itself adds it (cli.run_suite)
    if verb == "localize" and not overrides and config is None:
        return "auto"
    from gpucert.config.loader import load_config
    from gpucert.config.profiles import available_profiles, load_profile
    from gpucert.config.run import RunConfig

    # A --config that is not here is refused here, not by every node of the job (the rendered script makes
    # it absolute: the nodes read this host's path on the shared filesystem). here=False (Kubernetes): the
    # pods read it from their volume, which this host need not mount; its keys are checked where it is here.
    given = Path(config) if config is not None and (here or Path(config).is_file()) else None
    profile = load_config(RunConfig, given, overrides).profile
    # A name that is no built-in profile, refused with the list of those; a --profile file like a --config file.
    # A path from a config file or a --set is left to the nodes: it is read relative to where they run.
    is_path = profile.endswith((".yaml", ".yml"))
    known = profile != "auto" and (not is_path or (profile == flag and (here or Path(profile).is_file())))
    if known:
        load_profile(profile)
    if config is None or given is not None:  # a --config only the pods have may make a value right: theirs to judge
        judged = [profile] if known else [] if profile != "auto" else available_profiles()
        _refuse_out_of_range(given, overrides, judged)
    return profile


def _refuse_out_of_range(config: Path | None, overrides: list[str], profiles: list[str]) -> None:
    """A value out of range (bench.memory.size_mib=0) is refused here as every node would refuse it. A range
    may depend on the profile's run defaults, so under "auto" (each node picks by its GPUs) only what is out of
    range under every built-in profile is said; the nodes judge the rest."""
    from gpucert.acceptance import RunRequest, load_run_config
    from gpucert.config.profiles import load_profile

    request = RunRequest("launch", [], config, overrides, None, None, [])
    said: list[list[str]] = []
    for name in profiles:
        try:
            load_run_config(request, base=load_profile(name).run_defaults)
        except ConfigError as exc:
            said.append(list(exc.problems))
        else:
            return  # fine under one profile a node may pick: nothing certain to say
    # In the order the first profile said them (the file's line order, then the --set items).
    certain = said_by_every(said)
    if certain:
        raise ConfigError(problems=certain)


def _value_of(args: list[str], *flags: str) -> str | None:
    for i, arg in enumerate(args):
        for flag in flags:
            if arg == flag and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(f"{flag}="):
                return arg.split("=", 1)[1]
    return None


def _replace_values(args: list[str], flags: tuple[str, ...], new: Callable[[str], str]) -> list[str]:
    """args with each value of these flags (`--flag VALUE` or `--flag=VALUE`) replaced by new(VALUE)."""
    out = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if i > 0 and args[i - 1] in flags and not arg.startswith("-"):
            out.append(new(arg))
        elif eq and flag in flags:
            out.append(f"{flag}={new(value)}")
        else:
            out.append(arg)
    return out


def _absolute(path: str) -> str:
    return str(Path(path).absolute())


def _absolute_if_file(value: str) -> str:
    """A file here as its absolute path; anything else (a recipe or profile name) as it is."""
    return _absolute(value) if Path(value).is_file() else value


def _finetune_args(verb: str, rest: list[str]) -> list[str]:
    """finetune's options on every backend: without --config it is refused (every node would train the offline
    tiny recipe); without --resume it gets --resume auto, so a job started again (a requeue, a resubmission, a
    node restarted by hand) continues from its checkpoints, where a fresh run into a directory holding some is
    refused (finetune/train/checkpoint.check_fresh_output)."""
    if verb != "finetune":
        return rest
    if _value_of(rest, "--config") is None:
        raise ConfigError(
            "launch ... finetune: name the recipe with --config (a name from `gpucert finetune --list-recipes`, "
            "e.g. --config qwen2-7b-glaive, or a YAML path); without it every node would train the offline tiny "
            "recipe"
        )
    if _value_of(rest, "--resume") is None and not any(a.startswith("resume=") for a in rest):
        return [*rest, "--resume", "auto"]
    return rest


def _verb_args(verb: str, rest: list[str]) -> list[str]:
    """The launched verb's own options, as every node will read them, from whatever directory it starts in: a
    --config or --profile that names a file here, the --output directory and `fs`'s PATH become absolute paths;
    a recipe or profile name stays a name (it ships with gpucert). finetune's as _finetune_args says."""
    out = _replace_values(_finetune_args(verb, rest), ("--config", "--profile"), _absolute_if_file)
    out = _replace_values(out, ("--output", "-o"), _absolute)
    if verb == "fs":
        from gpucert.cli import build_parser as verb_parser

        try:
            with contextlib.redirect_stderr(io.StringIO()):
                given = verb_parser().parse_args([*slurm.VERB_ARGV[verb][1:], *rest]).path
        except SystemExit:  # no PATH yet: the job's problems (check_verb_args, render_sbatch) say what is missing
            return out
        # The positional PATH: the argument that names it and is no option's value.
        at = [i for i, a in enumerate(out) if Path(a) == given and (i == 0 or not out[i - 1].startswith("-"))]
        if at:
            out[at[-1]] = _absolute(str(given))
    return out


def _pod_args(verb: str, rest: list[str], pvc: str | None, mount: str, name: str) -> list[str]:
    """The verb's options as a pod reads them: it sees only its image and the shared volume, so a --config or
    --profile file and the --output directory must be on that volume (absolute paths under the mount; a name
    stays a name), and with a volume and no --output the run directory goes on it, not into the pod's own
    filesystem, which goes with the pod."""
    rest = _finetune_args(verb, rest)
    problems = []
    for flag in ("--config", "--profile", "--output", "-o"):
        value = _value_of(rest, flag)
        if value is None or (flag in ("--config", "--profile") and "/" not in value and not value.endswith(".yaml")):
            continue  # absent, or a recipe or profile name that ships with gpucert
        if not (pvc and Path(value).is_absolute() and Path(value).is_relative_to(mount)):
            problems.append(f"{flag} {value}")
    if problems:
        where = f"on the shared volume, under {mount}" if pvc else "on a shared volume (--pvc CLAIM, at --mount)"
        raise ConfigError(
            f"launch k8s {verb}: {', '.join(problems)}: a pod sees only its image and the shared volume; give "
            f"paths {where}"
        )
    if pvc and _value_of(rest, "--output", "-o") is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        return [*rest, "--output", f"{mount.rstrip('/')}/runs/{stamp}-{name}"]
    return rest


def _with_run_dir(verb: str, rest: list[str]) -> tuple[list[str], str]:
    """The verb's output directory (made absolute by _verb_args: every node must find the same path), added when
    absent."""
    flags = ("--output", "-o")
    given = _value_of(rest, *flags)
    if given is not None:
        return rest, _absolute(given)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = _absolute(str(Path("runs", f"{stamp}-launch-{verb}")))
    return [*rest, flags[0], run_dir], run_dir


# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or no limit.
_SLURM_TIME = re.compile(r"(\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2})|unlimited|infinite", re.IGNORECASE)
PORT_MIN = 1024


def launch_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the launch options themselves, before anything is rendered, written or submitted."""
    found = []
    if args.port is not None and not PORT_MIN <= args.port < 65536:
        found.append(
            f"--port must be in {PORT_MIN}..65535, found {args.port}: ports below {PORT_MIN} need root and belong "
            "to system services; leave --port out for the default"
        )
    if args.rendezvous_timeout is not None and not 0 < args.rendezvous_timeout <= MAX_SECONDS:
        found.append(
            f"--rendezvous-timeout must be a positive number of seconds, at most 30 days, found "
            f"{args.rendezvous_timeout:g}"
        )
    # Every backend: Kubernetes printed `nvidia.com/gpu: -1` and torchrun `--nproc -2` (Slurm's job said it too).
    if args.gpus_per_node is not None and args.gpus_per_node < 0:
        found.append(f"--gpus-per-node must be >= 0, found {args.gpus_per_node}")
    head = getattr(args, "head", None)
    if head is not None and (not head or re.search(r"\s", head) or head.startswith("-")):
        found.append(f"--head {head!r}: expected node rank 0's host name or address, which every node can reach")
    if getattr(args, "follow_timeout", None) is not None and not 0 < args.follow_timeout < float("inf"):
        found.append(f"--follow-timeout must be a positive number of seconds, found {args.follow_timeout:g}")
    time = getattr(args, "time", None)
    if time is not None and not _SLURM_TIME.fullmatch(time):
        found.append(
            f"--time {time!r}: expected sbatch's format, minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS "
            "or UNLIMITED (e.g. 30, 2:00:00, 1-12)"
        )
    return found


def slurm_problems(args: argparse.Namespace, rest: list[str], gpus: int, profile: str | None) -> list[str]:
    """What every node of a Slurm job would fail on once it had its allocation (on a busy cluster, after queueing
    for it), said before it is submitted."""
    found = []
    if args.verb == "localize" and gpus == 0 and profile == "auto":
        # cluster/localize.py refuses the same in the job: a job that asked for no GPU gets none to choose by.
        found.append(
            "localize sizes its pair jobs by the nodes' GPU profile, and a job of --gpus-per-node 0 has no GPU to "
            "choose one by: pass --profile (e.g. h100-sxm, h200; cpu for CPU nodes)"
        )
    output = _value_of(rest, "--output", "-o") if args.verb == "localize" else None
    if output is not None and not args.dry_run:
        from gpucert.cluster.localize import earlier_run

        # The job would claim the directory and stop at once, after its wait in the queue.
        earlier = earlier_run(Path(output))
        if earlier is not None:
            found.append(earlier)
    activate = Path(args.venv).absolute() / "bin" / "activate" if args.venv else None
    # This host sees the shared filesystem the nodes activate it from (as it does for --config). Not under
    # --dry-run: the printed script may be submitted later, once the environment is made.
    if activate is not None and not args.dry_run and not activate.is_file():
        found.append(
            f"--venv {activate.parent.parent}: no {activate} there, which every node's job would `source` first: "
            "give the directory `python -m venv` made, on the filesystem every node shares"
        )
    return found


def run(argv: list[str], parser_class: type[argparse.ArgumentParser], say: Callable[[str], None]) -> int:
    args, rest = build_parser(parser_class).parse_known_args(argv)
    problems = launch_problems(args)
    if problems:
        raise ConfigError(problems=[f"gpucert launch {args.backend}: {problem}" for problem in problems])
    profile = check_verb_args(args.verb, rest, here=args.backend != "k8s")
    env = preset_env(args.preset, args.iface)
    if args.backend == "torchrun":
        verb_args = tuple(_verb_args(args.verb, rest))  # a finetune without --config is refused here first
        if args.verb == "finetune" and _value_of(rest, "--output", "-o") is None:
            # Every node writes and resumes from the same directory; nothing here can pick one the nodes share
            # (launch slurm uses the submitting directory, which a Slurm cluster shares).
            raise ConfigError(
                "launch torchrun finetune: give --output DIR on the shared filesystem: every node's ranks write "
                "their checkpoints there, and --resume auto (added for a restarted node) continues from them"
            )
        port = args.port or 29500
        commands = torchrun.node_commands(
            args.verb,
            verb_args,
            args.nodes,
            args.head,
            port,
            args.gpus_per_node,  # None: every node trains on the GPUs it has
            env,
            args.rendezvous_timeout,
        )
        print(torchrun.render_commands(commands, args.head), end="")
        return 0
    # Slurm and Kubernetes request the GPUs, so they need a count; torchrun's nodes use what they have.
    gpus = DEFAULT_GPUS if args.gpus_per_node is None else args.gpus_per_node
    if args.backend == "k8s":
        name = args.name or f"gpucert-{args.verb}"
        print(
            k8s.render_manifests(
                args.verb,
                tuple(_pod_args(args.verb, rest, args.pvc, args.mount, name)),
                args.nodes,
                gpus,
                args.image,
                name,
                args.port or 29500,
                env,
                args.pvc,
                args.mount,
                args.rendezvous_timeout,
            ),
            end="",
        )
        if args.pvc is None:
            # The manifest is the result (stdout, `> job.yaml`): the note goes to stderr.
            say(
                "note: no --pvc: each pod's run directory (report.json, logs) is in its container and goes with "
                "the pod; give --pvc NAME (a ReadWriteMany claim every node mounts) to keep the report"
            )
        return 0
    problems = slurm_problems(args, rest, gpus, profile)
    if problems:
        raise ConfigError(problems=[f"gpucert launch slurm {args.verb}: {problem}" for problem in problems])
    rest, run_dir = _with_run_dir(args.verb, rest)
    # Absolute: the script runs as printed from any directory (sbatch --chdir, a node's own working directory).
    venv = [f"source {shlex.quote(str(Path(args.venv).absolute()))}/bin/activate"] if args.venv else []
    setup = venv + list(args.setup)
    job = slurm.SlurmJob(
        verb=args.verb,
        args=tuple(_verb_args(args.verb, rest)),
        nodes=args.nodes,
        gpus_per_node=gpus,
        run_dir=run_dir,
        cpus_per_task=args.cpus_per_task,
        mem=args.mem,
        time=args.time,
        partition=args.partition,
        account=args.account,
        reservation=args.reservation,
        setup=tuple(setup),
        container_image=args.container_image,
        env=env,
        port=args.port,
        rendezvous_timeout_s=args.rendezvous_timeout,
    )
    script = slurm.render_sbatch(job)  # refuses bad values before anything is written or submitted
    if args.dry_run:
        print(script, end="")
        return 0
    return _submit_and_follow(job, script, _follow_timeout(args), say)


# How long a launch follows a job that waits in the queue, when neither --follow-timeout nor --time bounds it.
QUEUE_FOLLOW_S = 24 * 3600.0


def _follow_timeout(args: argparse.Namespace) -> tuple[float, float | None, str]:
    """The follow's limits: over all, and from when the job starts running (its --time does not count the
    queue); and the flag that set them, for the message that says it gave up."""
    if args.follow_timeout is not None:
        return float(args.follow_timeout), None, "--follow-timeout"
    if args.time and args.time[0].isdigit():
        return QUEUE_FOLLOW_S, _slurm_minutes(args.time) * 60 + 600, "--time + 10 min from its start"
    return QUEUE_FOLLOW_S, None, "24 h by default; --follow-timeout"


def _slurm_minutes(spec: str) -> float:
    """sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    days, _, clock = spec.rpartition("-")
    parts = [float(p) for p in clock.split(":")]
    if days:
        hours, minutes, seconds = [*parts, 0.0, 0.0][:3]
        return float(days) * 1440 + hours * 60 + minutes + seconds / 60
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        return parts[0] + parts[1] / 60
    return parts[0] * 60 + parts[1] + parts[2] / 60


def _write_job(run_dir: Path, script: str) -> Callable[[], None]:
    """job.sbatch and logs/ (sbatch's --chdir) in the run directory; returns what undoes it: a launch whose job
    was never submitted leaves no directory it made and no script of its own behind (a job.sbatch an earlier
    launch wrote there is put back)."""
    made = [d for d in (run_dir / "logs", run_dir, *run_dir.parents) if not d.exists()]
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    path = run_dir / "job.sbatch"
    before = path.read_text() if path.is_file() else None
    path.write_text(script)

    def undo() -> None:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(before)
        for directory in made:  # deepest first; one that holds anything now is someone else's: stop
            try:
                directory.rmdir()
            except OSError:
                break

    return undo


def _standing_verdict(run_dir: Path, exit_code: str) -> Status | None:
    """The verdict of a fine-tuning run that had finished before the job started (a requeue, a resubmission), or
    None. Such a job trains nothing and leaves the run's files as they were (finetune/train/loop.py,
    finished_run), so no rewritten metrics.json tells it apart from a job that died before its gpucert started;
    its exit code does: every node exits with the standing run's verdict. Not for ERROR: a job that crashed exits
    3 too (and 1 is Python's own exit on a traceback, rare here: gpucert says its errors and exits 3)."""
    code, _, signal = exit_code.partition(":")
    try:
        if not (run_dir / "report.json").is_file():
            return None
        status = Status(json.loads((run_dir / "metrics.json").read_text())["status"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if status is Status.ERROR or signal not in ("", "0") or code != str(status.exit_code):
        return None
    return status


def result(line: str) -> None:
    """The job's verdict: a result, so on stdout (`| tee`, `| grep '^...'`), where progress goes to stderr."""
    print(line, flush=True)


def _following(job_id: str, follow: Callable[[], dict[str, str]]) -> dict[str, str]:
    """follow(), stopped by Ctrl-C or SIGTERM (it died silently, 143) saying the job runs on, by its id."""
    import signal

    from gpucert.runtime.errors import Interrupted, interrupting

    try:
        with interrupting(lambda sig: f"stopped by {sig.name}", signal.SIGINT, signal.SIGTERM):
            return follow()
    except Interrupted as exc:
        exc.after = f"job {job_id} keeps running: scancel {job_id} to stop it"
        raise


def _submit_and_follow(
    job: slurm.SlurmJob, script: str, timeout: tuple[float, float | None, str], say: Callable[[str], None]
) -> int:
    run_dir = Path(job.run_dir)
    undo = _write_job(run_dir, script)
    path = run_dir / "job.sbatch"
    earlier = {name: file_identity(run_dir / name) for name in ("report.json", "metrics.json")}
    earlier_logs = {log: file_identity(log) for log in slurm.logs(run_dir)}
    try:
        job_id = slurm.submit(path)
    except BaseException:
        undo()
        raise
    say(f"submitted job {job_id} ({path}); logs in {run_dir / 'logs'}")
    limit, run_limit, what = timeout
    record = _following(job_id, lambda: slurm.follow(job_id, limit, say, run_timeout_s=run_limit, what=what))
    state, exit_code = record.get("JobState", "?"), record.get("ExitCode", "?")
    if job.verb in slurm.JUDGED_VERBS:
        report = run_dir / "report.json"
        if report.exists() and file_identity(report) != earlier["report.json"]:
            from gpucert.report.store import load_report

            verdict = load_report(report).status
            result(f"job {job_id} {state} (exit {exit_code}); verdict {verdict.value}: {report}")
            return verdict.exit_code
    else:
        metrics = run_dir / "metrics.json"
        if metrics.exists() and file_identity(metrics) != earlier["metrics.json"]:
            status = Status(json.loads(metrics.read_text())["status"])
            result(f"job {job_id} {state} (exit {exit_code}); fine-tuning {status.value}: {metrics}")
            return status.exit_code
        standing = _standing_verdict(run_dir, exit_code)
        if standing is not None:
            result(
                f"job {job_id} {state} (exit {exit_code}): the run had already finished; its report stands "
                f"(fine-tuning {standing.value}): {run_dir / 'report.json'}"
            )
            return standing.exit_code
    mine = slurm.job_logs(run_dir, job.verb, job_id, lambda log: file_identity(log) != earlier_logs.get(log))
    if not mine:
        say(f"job {job_id} ended {state} (exit {exit_code}) without a result and wrote no log in {run_dir / 'logs'}")
        return ERROR_EXIT
    say(f"job {job_id} ended {state} (exit {exit_code}) without a result; its logs end:")
    say(slurm.log_tails(mine))
    return ERROR_EXIT
