"""`gpucert launch slurm VERB`: the sbatch script from a dataclass, submitted and followed to a verdict.

The script runs one task per node (`srun --ntasks-per-node=1`), for every verb the same:
gpucert, which reads its node rank from SLURM_NODEID and starts the node's ranks on torchrun's engine
(runtime/launcher.py). Node rank 0's address is resolved inside the job (the allocation's first host).
`set -euo pipefail` and `exit $rc` carry srun's status to the job's. The script runs as printed under plain
sbatch from any directory: nothing it needs is made by `gpucert launch` alone.

Values go two ways: #SBATCH directives are parsed by sbatch, not a shell, so their values must be plain
(letters, digits and `_.,:@%+=/-`, refused otherwise before anything is submitted); everything in the shell body
is quoted with shlex, so `--output '/shared/$(touch x)'` stays a directory name.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gpucert
from gpucert.config.loader import ConfigError

# Values sbatch reads from #SBATCH lines: no whitespace, quotes, `$`, backticks or `;`.
_DIRECTIVE_VALUE = re.compile(r"^[A-Za-z0-9_.,:@%+=/-]+$")
# Job states after which a job changes no more (squeue(1) "JOB STATE CODES").
FINAL_STATES = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "REVOKED",
    "SPECIAL_EXIT",
    "TIMEOUT",
}
# What each verb runs: one task per node (the node agents), or once in the batch step (localize issues its own
# srun steps, one per pair of nodes).
VERB_ARGV = {
    "accept": ("gpucert", "accept"),
    "health": ("gpucert", "health"),
    "bench": ("gpucert", "bench"),
    "fs": ("gpucert", "cluster", "fs"),
    "localize": ("gpucert", "cluster", "localize"),
    "finetune": ("gpucert", "finetune"),
}
ONCE_VERBS = ("localize",)


def refuse_once_verb(verb: str, backend: str) -> None:
    if verb in ONCE_VERBS:
        raise ConfigError(
            f"`launch {backend} {verb}`: {verb} runs once and starts the pair jobs itself; run "
            "`gpucert cluster localize --hosts H1 H2 ...` on one host, or `gpucert launch slurm localize`"
        )


VERBS = tuple(VERB_ARGV)
# Verbs whose result is a judged report.json (finetune's is its run's metrics.json).
JUDGED_VERBS = tuple(v for v in VERBS if v != "finetune")


@dataclass(frozen=True)
class SlurmJob:
    verb: str
    # Passed through to the verb unchanged (after quoting): --profile cpu, --config x.yaml, --set k=v ...
    args: tuple[str, ...]
    nodes: int
    gpus_per_node: int
    # On the shared filesystem: the report (or fine-tuning run) and every node's log under logs/.
    run_dir: str
    cpus_per_task: int | None = None
    mem: str | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    reservation: str | None = None
    # Shell lines every node runs first (a venv's activate, module loads); the user's own commands, as typed.
    setup: tuple[str, ...] = ()
    # pyxis/enroot image for srun --container-image; the run directory is mounted at the same path.
    container_image: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # None: 20000 + job id % 10000 (below the ephemeral ports), so two jobs on one node do not collide.
    port: int | None = None
    rendezvous_timeout_s: float | None = None  # None: the verb's own runtime.rendezvous_timeout_s

    def problems(self) -> list[str]:
        found = []
        if self.verb not in VERBS:
            found.append(f"verb {self.verb!r}: expected one of {', '.join(VERBS)}")
        if self.nodes < 1:
            found.append(f"--nodes must be >= 1, found {self.nodes}")
        if self.gpus_per_node < 0:
            found.append(f"--gpus-per-node must be >= 0, found {self.gpus_per_node}")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            found.append(f"--cpus-per-task must be >= 1, found {self.cpus_per_task}")
        if self.port is not None and not 0 < self.port < 65536:
            found.append(f"--port must be in 1..65535, found {self.port}")
        for flag, value in (
            ("--mem", self.mem),
            ("--time", self.time),
            ("--partition", self.partition),
            ("--account", self.account),
            ("--reservation", self.reservation),
            ("--container-image", self.container_image),
        ):
            if value is not None and not _DIRECTIVE_VALUE.match(value):
                found.append(
                    f"{flag} {value!r}: sbatch reads it unquoted from an #SBATCH line, so it may hold only "
                    "letters, digits and _.,:@%+=/-"
                )
        if not self.run_dir.startswith("/"):
            found.append(f"run directory {self.run_dir!r} must be absolute (on the filesystem every node shares)")
        for key in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                found.append(f"environment variable name {key!r} is not a shell name")
        return found


def _directives(job: SlurmJob) -> list[str]:
    lines = [
        f"--job-name=gpucert-{job.verb}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        # Relative: sbatch opens it in the directory it was called from, which exists; the run directory does not
        # until the script makes it (slurmd: "Could not open stdout file").
        "--output=%x-%j.out",
    ]
    if job.gpus_per_node:
        # Acceptance and training want whole nodes: nothing else may share the GPUs, NICs or memory bandwidth.
        lines += [f"--gpus-per-node={job.gpus_per_node}", "--exclusive"]
    for flag, value in (
        ("cpus-per-task", job.cpus_per_task),
        ("mem", job.mem),
        ("time", job.time),
        ("partition", job.partition),
        ("account", job.account),
        ("reservation", job.reservation),
    ):
        if value is not None:
            lines.append(f"--{flag}={value}")
    return [f"#SBATCH {line}" for line in lines]


def rendezvous_set(seconds: float | None) -> list[str]:
    """--launcher's --rendezvous-timeout as the verb's --set, put before the user's own options: a --set of
    runtime.rendezvous_timeout_s among them comes later and wins, as it does on a node run by hand. Nothing
    when not given: the verb then takes its config file's value, or 120 s."""
    return [] if seconds is None else ["--set", f"runtime.rendezvous_timeout_s={seconds:g}"]


def _task_command(job: SlurmJob) -> str:
    """What srun runs on every node, quoted for the batch script's shell: gpucert itself, which reads its node
    rank from SLURM_NODEID and node 0's address from MASTER_ADDR below, and starts the node's ranks."""
    argv = [*VERB_ARGV[job.verb]]
    if job.verb != "localize":
        argv += rendezvous_set(job.rendezvous_timeout_s)
    argv += job.args
    if job.verb == "finetune" and job.gpus_per_node:
        argv += ["--nproc", str(job.gpus_per_node)]
    return shlex.join(argv)


def render_sbatch(job: SlurmJob) -> str:
    problems = job.problems()
    if problems:
        raise ConfigError(problems=problems)
    run_dir = shlex.quote(job.run_dir)
    # %n (the node's index in the job) keeps two nodes of one hostname apart; %N names the host.
    # No --kill-on-bad-exit: every node exits with the run's verdict (1 WARN, 2 FAIL), and srun would SIGTERM the
    # nodes still on their way out (the job's code then 143, not the verdict); a failed node ends the others
    # within runtime.heartbeat_timeout_s by itself (runtime/launcher.py).
    srun = ["srun", "--ntasks-per-node=1", f"--output={job.run_dir}/logs/node-%n-%N.log"]
    if job.container_image:
        srun += [f"--container-image={job.container_image}", f"--container-mounts={job.run_dir}:{job.run_dir}"]
    port = str(job.port) if job.port else "$((20000 + SLURM_JOB_ID % 10000))"
    if job.verb in ONCE_VERBS:
        run = [
            "# Runs once, here in the batch step; it starts one srun step per pair of nodes itself.",
            "rc=0",
            f"{_task_command(job)} || rc=$?",
        ]
    else:
        run = [
            "# Node rank 0's address, resolved inside the job: the allocation's first host. sed reads every line:",
            "# `head -n 1` would exit early, and scontrol's SIGPIPE would end the job under pipefail.",
            'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
            f"MASTER_PORT={port}",
            "export MASTER_ADDR MASTER_PORT",
            "rc=0",
            f"{shlex.join(srun)} {_task_command(job)} || rc=$?",
            "# The verdict in the job's own log too (node 0's output ends with it), where sbatch users look first;",
            "# the node-0 log written last, this job's: an --output used again keeps earlier jobs' node logs.",
            f"node0=$(ls -t {run_dir}/logs/node-0-*.log 2>/dev/null | sed -n 1p) || true",
            '[ -z "$node0" ] || tail -n 3 "$node0" || true',
        ]
    lines = [
        "#!/bin/bash",
        f"# gpucert launch slurm {job.verb}, rendered by gpucert {gpucert.__version__}: submit with sbatch from any",
        f"# directory (the job's own log: gpucert-{job.verb}-<job id>.out there); every node's output goes to",
        f"# {job.run_dir}/"
        + ("pairs/<round>-<pair>/logs/." if job.verb in ONCE_VERBS else "logs/node-<index>-<host>.log."),
        *_directives(job),
        "set -euo pipefail",
        f"mkdir -p {run_dir}/logs",
        *job.setup,
        *(f"export {key}={shlex.quote(value)}" for key, value in job.env.items()),
        *run,
        "exit $rc",
    ]
    return "\n".join(lines) + "\n"


# Submission and following: a thin layer over sbatch and scontrol, with every wait bounded.


class SlurmError(RuntimeError):
    """sbatch or scontrol refused or failed: the message carries their own words."""


def _run(argv: Sequence[str], timeout_s: float = 60.0) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        raise SlurmError(f"{argv[0]} not found: is this a Slurm login node (slurm-client installed)?") from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"{shlex.join(argv)} gave no answer within {timeout_s:g} s: is slurmctld up?") from exc
    if done.returncode != 0:
        raise SlurmError(f"{shlex.join(argv[:2])}: {(done.stderr or done.stdout).strip()}")
    return done.stdout


# sbatch's words for a request the cluster has no partition or nodes for (an unknown --partition may be said as
# a bad gres: sbatch checks --gpus-per-node against the default partition first).
_REQUEST_REFUSED = (
    "invalid partition",
    "invalid generic resource",
    "node count specification invalid",
    "requested node configuration is not available",
)


def submit(script: Path) -> str:
    """The job id sbatch gives the script, submitted from the run's logs/ (where the job's own log then goes)."""
    try:
        out = _run(["sbatch", "--parsable", f"--chdir={script.parent / 'logs'}", str(script)])
    except SlurmError as exc:
        if not any(words in str(exc).lower() for words in _REQUEST_REFUSED):
            raise
        raise SlurmError(
            f"{exc}\n`sinfo -s` lists the partitions and their nodes; `gpucert cluster slurm --partition P --gpus N` "
            "checks what a partition can give (--partition, --nodes, --gpus-per-node)"
        ) from None
    return out.strip().split(";")[0]


def parse_job(line: str) -> dict[str, str]:
    """`scontrol show job -o` output (one line of Key=Value pairs) as a dict."""
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def follow(
    job_id: str,
    timeout_s: float,
    say: Callable[[str], None],
    poll_s: float = 2.0,
    run_timeout_s: float | None = None,
    what: str = "--follow-timeout",
) -> dict[str, str]:
    """Poll the job until it ends, saying every state change; its last scontrol record. Gives up timeout_s after
    it began following, or run_timeout_s after the job left the queue where that is given (a job's --time does
    not count its wait in the queue). A failed `scontrol show job` (slurmctld busy or restarting) is asked again
    until then: the job runs on without us."""
    deadline = time.monotonic() + timeout_s
    seen, said_reason, failing = None, "None", None
    while True:
        try:
            job = parse_job(_run(["scontrol", "show", "job", "-o", job_id]))
        except SlurmError as exc:
            if "invalid job id" in str(exc).lower() or isinstance(exc.__cause__, FileNotFoundError):
                raise  # gone from slurmctld's memory, or no scontrol here: asking again will not help
            if failing is None:
                say(f"job {job_id}: {exc}; asking again every {poll_s:g} s")
            failing = str(exc)
            job = None
        if job is not None:
            failing = None
            state = job.get("JobState", "UNKNOWN")
            # A queued job says why it waits (Resources, Priority, ReqNodeNotAvail: its nodes drained or down).
            reason = job.get("Reason", "None") if state == "PENDING" else "None"
            if (state, reason) != (seen, said_reason):
                nodes = job.get("NodeList", "")
                say(
                    f"job {job_id}: {state}"
                    + (f" ({reason})" if reason not in ("None", "(null)") else "")
                    + (f" on {nodes}" if nodes and nodes not in ("(null)", "None assigned") else "")
                )
                if run_timeout_s is not None and seen in (None, "PENDING") and state != "PENDING":
                    deadline, timeout_s = time.monotonic() + run_timeout_s, run_timeout_s
                seen, said_reason = state, reason
            if state in FINAL_STATES:
                return job
        if time.monotonic() > deadline:
            last = f"; scontrol has failed since: {failing}" if failing else ""
            raise SlurmError(
                f"job {job_id} still {seen or 'unknown'} after {timeout_s:g} s ({what}){last}; it keeps running: "
                f"scancel {job_id} to stop it"
            )
        time.sleep(poll_s)


def logs(run_dir: Path) -> list[Path]:
    """The logs in the run directory: the jobs' own (gpucert-<verb>-<job id>.out), the nodes' and the ranks'."""
    return sorted([*(run_dir / "logs").glob("*.log"), *(run_dir / "logs").glob("*.out")])


def job_logs(run_dir: Path, verb: str, job_id: str, written: Callable[[Path], bool]) -> list[Path]:
    """This job's logs: its own, named by its id, and the node and rank logs it wrote (`written`: new or changed
    since it was submitted). An --output used again holds earlier jobs' logs, an earlier run's verdict among them."""
    own = f"gpucert-{verb}-{job_id}.out"
    return [log for log in logs(run_dir) if log.name == own or (log.suffix == ".log" and written(log))]


def log_tails(paths: Sequence[Path], lines: int = 12) -> str:
    """The end of each log, for the operator when a job ended badly."""
    parts = []
    for log in paths:
        text = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"== {log}\n" + "\n".join(text))
    return "\n".join(parts)
