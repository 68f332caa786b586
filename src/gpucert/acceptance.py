"""One judged run (discover, health, accept, bench) on one node or many, ending in one report.

Three ways a run meets its nodes, one result:
- **gpucert's node agents** (a lone node; `--nnodes N --node-rank R --master-addr A`; `srun --ntasks-per-node=1`;
  a Kubernetes indexed Job): every node's gpucert checks its own node, then each benchmark is a step whose
  workers (one per GPU) span all nodes. Node 0 judges and writes the report; every node exits with its verdict.
- **an outside launcher's ranks** (`torchrun ... -m gpucert accept`, `srun` with one task per GPU): every rank
  runs this; each node's local rank 0 checks its node; the benchmarks run in the job's one process group.
- **a local check** (discover/health of this node only): no process group at all.

Every result names its node (`place_on_node`): per-GPU subjects read `<node> GPU <i> ...`, node subjects the
node's label, and the messages say the same.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gpucert
from gpucert.config.loader import (
    ConfigError,
    also_wrong,
    blame_sources,
    in_file_order,
    key_line,
    load_config,
    said_by_every,
    salvage,
)
from gpucert.config.profiles import Profile, available_profiles, load_profile, select_profile
from gpucert.config.run import RunConfig
from gpucert.hardware.inventory import NodeInventory, NodeSources, bundle_sources, collect_inventory, live_sources
from gpucert.report.schema import Report, Result, RunMeta
from gpucert.report.store import (
    NOT_A_DIRECTORY,
    RunDir,
    check_reuse,
    claim_run_dir,
    default_run_dir,
    file_identity,
    write_problem,
    write_report,
)
from gpucert.runtime.errors import BROKEN_PIPE_EXIT, Interrupted, JobFailed, ReaderLeft, RendezvousError
from gpucert.status import Status


@dataclass(frozen=True)
class RunRequest:
    """What the command line asked for, checked before any work."""

    verb: str  # discover | health | accept | bench <name>
    benchmarks: list[str]
    config_path: Path | None
    overrides: list[str]
    output: Path | None
    replay: Path | None
    command: list[str]
    # An override a command-line flag made -> the flag as typed (`bench.nproc=2` -> `--nproc 2`), for messages.
    flags: dict[str, str] = field(default_factory=dict)


@dataclass
class NodeWork:
    """One node's own share: its inventory, profile, resolved config and (node-tagged) health results."""

    label: str
    sources: NodeSources
    inventory: NodeInventory
    profile: Profile
    config: RunConfig
    results: list[Result] = field(default_factory=list)

    def part(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "inventory": self.inventory.to_dict(),
            "results": [r.to_dict() for r in self.results],
        }


def place_on_node(results: Sequence[Result], label: str, host: str) -> list[Result]:
    """Results of one node, named by that node: `node` set, GPU and rank subjects prefixed with the label,
    subjects that were the hostname replaced by the label, and the messages saying the same."""
    placed = []
    for r in results:
        if r.node is not None:
            placed.append(r)
            continue
        subject = r.subject
        if subject == host or subject in ("node", ""):
            subject = label
        elif not subject.startswith(f"{label} "):
            subject = f"{label} {subject}"  # GPU 3 (bus id), mlx5_1 port 1: unique across nodes
        message = r.message
        if subject != r.subject and r.subject not in (host, "node") and r.subject in message:
            message = _replace_word(message, r.subject, subject)
        elif label != host:
            message = _replace_word(message, host, label)
        placed.append(dataclasses.replace(r, node=label, subject=subject, message=message))
    return placed


def _replace_word(text: str, old: str, new: str) -> str:
    return re.sub(rf"(?<![\w.\[-]){re.escape(old)}(?![\w\[])", lambda _m: new, text)


def with_gpu_uuids(results: list[Result], nodes: dict[str, dict[str, Any]]) -> list[Result]:
    """Every result about one GPU carries that GPU's UUID in its details (the name that survives a reboot
    renumbering and an RMA ticket), looked up in its node's inventory by NVML index."""
    uuids: dict[tuple[str | None, int], str | None] = {
        (label, gpu["index"]): gpu.get("uuid") for label, inv in nodes.items() for gpu in inv.get("gpus", [])
    }
    return [
        dataclasses.replace(r, details={**r.details, "uuid": uuids[(r.node, r.gpu_index)]})
        if r.gpu_index is not None and "uuid" not in r.details and uuids.get((r.node, r.gpu_index))
        else r
        for r in results
    ]


def load_run_config(request: RunRequest, base: dict[str, Any] | None = None, profile: str | None = None) -> RunConfig:
    """The resolved config, every range and name checked (ConfigError naming each bad key) before any work.
    `profile`: the name of the profile whose run defaults `base` is, where the config says "auto"."""

    def problems_of(base: dict[str, Any] | None) -> Callable[[RunConfig, Sequence[str]], list[str]]:
        def found(config: RunConfig, _used: Sequence[str]) -> list[str]:
            # "auto": the profile, whose run defaults may change a related key (gate_bytes against max_bytes), is
            # known once collect_node has read the hardware and loads again; only the timeouts are judged now.
            runtime = config.runtime.problems() + config.localize.problems()
            return config.problems() if base is not None else runtime

        return found

    def blamed(base: dict[str, Any] | None, profile: str) -> Callable[[list[str], Sequence[str]], list[str]]:
        label = f"profile {profile}"
        return lambda found, used: blame_sources(found, request.config_path, used, label, base, request.flags)

    def load(base: dict[str, Any] | None) -> RunConfig:
        try:
            return load_config(RunConfig, request.config_path, request.overrides, base=base)
        except ConfigError as exc:  # wrong types: said with the ranges of what was right, all at once
            problems, path, overrides = list(exc.problems), request.config_path, request.overrides
            found = salvage(RunConfig, path, overrides, exc, base)
            if base is None and found is not None and found.config.profile != "auto":  # for its run defaults
                try:
                    base = load_profile(found.config.profile).run_defaults
                except ConfigError as unknown:  # said now too, not on the next run
                    problems += [_where_profile(request, problem) for problem in unknown.problems]
                else:
                    found = salvage(RunConfig, path, overrides, exc, base)
            profile = found.config.profile if found is not None else "auto"
            more = also_wrong(found, problems_of(base), blamed(base, profile))
            if base is None and profile == "auto":
                # The profile is chosen by the hardware, after this: say now the ranges wrong under every
                # built-in profile (a value out of range whatever the node), so a wrong type hides none of them.
                refused = exc
                certain = certain_problems(lambda b: salvage(RunConfig, path, overrides, refused, b))
                more += [p for p in certain if p not in more]
            raise ConfigError(problems=in_file_order(problems + more, path)) from None

    def certain_problems(build: Callable[[dict[str, Any]], Any]) -> list[str]:
        said: list[list[str]] = []
        for name in available_profiles():
            b = load_profile(name).run_defaults
            said.append(also_wrong(build(b), problems_of(b), blamed(b, "auto")))
        return said_by_every(said)

    config = load(base)
    if base is None and config.profile != "auto":
        # A named profile's run defaults sit under the file and --set values: judge the values the run will use.
        try:
            base = load_profile(config.profile).run_defaults
        except ConfigError as exc:
            raise ConfigError(problems=[_where_profile(request, problem) for problem in exc.problems]) from None
        config = load(base)
    problems = problems_of(base)(config, request.overrides)
    if problems:
        found = blamed(base, profile or config.profile)(problems, request.overrides)
        raise ConfigError(problems=in_file_order(found, request.config_path))
    return config


def collect_node(request: RunRequest, label: str | None = None) -> NodeWork:
    """This node's inventory, the profile it selects, and the config with that profile's run defaults."""
    config = load_run_config(request)
    sources = bundle_sources(request.replay) if request.replay else live_sources()
    inventory = collect_inventory(sources)
    named = [g.name for g in inventory.gpu.gpus if "nvmlDeviceGetName" not in g.unreadable]
    if inventory.gpu.gpus and not named and config.profile == "auto":
        raise ConfigError("no GPU answered NVML's name query, so no profile can be chosen: name one with --profile")
    try:
        profile = select_profile(named) if config.profile == "auto" else load_profile(config.profile)
    except ConfigError as exc:
        if config.profile == "auto":
            raise
        # Named in a config file or a --set: said where, as every other bad value is (blame_sources).
        raise ConfigError(problems=[_where_profile(request, problem) for problem in exc.problems]) from None
    # Now that the hardware is known, its profile's run defaults sit under the file and --set values.
    config = load_run_config(request, base=profile.run_defaults, profile=profile.name)
    return NodeWork(label or inventory.hostname, sources, inventory, profile, config)


def _where_profile(request: RunRequest, problem: str) -> str:
    """`problem` (an unknown or broken profile) with the place that named the profile: the last --set or flag,
    else the config file's line. A problem inside a profile file names that file and line already."""
    if re.match(r"\S+\.ya?ml(:\d+)?: ", problem):
        return problem
    for item in reversed(request.overrides):
        if item.split("=", 1)[0].strip() == "profile":
            return f"{request.flags.get(item) or f'--set {item}'}: {problem}"
    path = request.config_path
    if path is not None:
        line = key_line(path, "profile")
        return f"{path}:{line}: {problem}" if line else f"{path}: {problem}"
    return problem


def check_health(
    work: NodeWork, request: RunRequest, now: datetime, own_pids: frozenset[int] = frozenset()
) -> list[Result]:
    """discover/health/accept: this node's health checks, named by the node."""
    if request.verb not in ("health", "accept"):
        return []
    from gpucert.health.liveness import SubprocessLivenessProbe
    from gpucert.health.suite import run_health
    from gpucert.health.xid import collect_kernel_log

    if work.sources.kernel_log is not None:
        kernel_log: tuple[str | None, str | None] = (work.sources.kernel_log, None)
    elif request.replay:
        kernel_log = (None, "the bundle has no dmesg.txt")
    else:
        kernel_log = collect_kernel_log(work.config.health.command_timeout_s)
    probe = None if request.replay else SubprocessLivenessProbe()
    results = run_health(work.inventory, work.profile, work.config.health, kernel_log, probe, now, own_pids)
    return place_on_node(results, work.label, work.inventory.hostname)


def build_report(
    request: RunRequest,
    started: datetime,
    t0: float,
    head: NodeWork,
    parts: list[dict[str, Any]],
    job_results: list[Result],
) -> Report:
    """One report: every node's part (inventory, results) and the results about the whole job."""
    results = [Result.from_dict(r) for part in parts for r in part["results"]] + job_results
    if request.verb == "accept":
        results += left_out(request.benchmarks, head.inventory.hostname)
    nodes = {part["label"]: part["inventory"] for part in parts}
    results = with_gpu_uuids(results, nodes)
    if len(parts) > 1:
        from gpucert.report.cluster import cluster_results

        results += cluster_results(nodes, results, head.profile)
    meta = RunMeta(
        tool_version=gpucert.__version__,
        method_version=gpucert.METHOD_VERSION,
        verb=request.verb,
        command=request.command,
        host=head.inventory.hostname,
        started_at=started.isoformat(),
        finished_at=datetime.now(timezone.utc).isoformat(),
        duration_s=round(time.perf_counter() - t0, 3),
        profile=head.profile.name,
        config=dataclasses.asdict(head.config),
        software=head.inventory.to_dict()["software"],
        nodes=[part["label"] for part in parts],
    )
    return Report(
        meta=meta,
        inventory=parts[0]["inventory"] if parts else head.inventory.to_dict(),
        results=results,
        nodes=nodes if len(parts) > 1 else {},
    )


def left_out(benchmarks: list[str], subject: str) -> list[Result]:
    """One SKIP for each benchmark accept was told to leave out (--skip): the report says what the verdict does not
    cover, where it once only lacked those rows."""
    from gpucert.bench.catalog import BENCHMARKS

    return [
        Result(
            name=f"bench.{name}",
            subject=subject,
            status=Status.SKIP,
            message=f"not run: left out with --skip; this verdict does not cover {name}",
            category="benchmark",
        )
        for name in BENCHMARKS
        if name not in benchmarks
    ]


def claim_output(request: RunRequest, head: NodeWork, started: datetime) -> RunDir:
    """The run directory of the node that writes the report: --output or a new one under runs_dir, locked
    until released (a second run pointed at it is refused, exit 3, naming the run that holds it)."""
    return claim_run_dir(request.output, Path(head.config.runs_dir), head.inventory.hostname, started, request.verb)


def check_fits(work: NodeWork, benchmarks: Sequence[str], nproc: int) -> None:
    """Refuse benchmark sizes this node's memory cannot hold, before any worker allocates: host memory
    (MemAvailable) for every rank's host buffers, each GPU's free memory for its rank's device buffers. And
    refuse a GPU profile's benchmarks on a host whose NVML shows no GPU: they ran on the CPU at the GPU's sizes
    (collectives for many minutes, memory FAILed "HBM below floor" on a CPU, matmul PASSed a CPU figure)."""
    from gpucert.bench.footprint import GIB, fit_problems, footprints

    inventory = work.inventory
    profile = work.profile
    # /dev/nvidiactl: the driver is there (a container given CUDA's libraries but not NVML's may still use the
    # GPUs): the ranks find out.
    no_gpu = not inventory.gpu.gpus and not Path("/dev/nvidiactl").exists()
    if benchmarks and no_gpu and (profile.match or (profile.gpu.gpus_per_node or 0) > 0):
        reason = inventory.gpu.nvml_error or "NVML lists none"
        raise ConfigError(
            f"{work.label}: profile {profile.name} is for NVIDIA GPUs, and this host has none ({reason}); its "
            f"benchmarks ({', '.join(benchmarks)}) would run on the CPU at the GPUs' sizes. On a GPU node, "
            "`gpucert health` says what is missing (the driver, the GPUs on the PCI bus); to run them on the CPU, "
            "--profile cpu"
        )
    on_gpu = bool(inventory.gpu.gpus)
    needs = [need for name in benchmarks for need in footprints(name, work.config.bench, on_gpu)]
    available = inventory.memory.available_gib if inventory.memory else None
    gpu_free = {
        g.index: int((g.memory_total_gib - g.memory_used_gib) * GIB)
        for g in inventory.gpu.gpus
        if g.memory_total_gib is not None and g.memory_used_gib is not None
    }
    problems = fit_problems(needs, nproc, int(available * GIB) if available is not None else None, gpu_free)
    if problems:
        raise ConfigError(f"{work.label}: " + "; ".join(problems))


def check_output_writable(request: RunRequest, config: RunConfig) -> None:
    """Refuse an output directory the report could not be written to, or one holding another verb's report
    (store.check_reuse), before anything runs; creates nothing (store.write_problem probes it)."""
    target = (request.output or Path(config.runs_dir)).absolute()
    what = "--output" if request.output else "runs_dir"
    if request.output is not None and request.output.is_dir():
        check_reuse(request.output, request.verb)
    existing, problem = write_problem(target)
    if problem == NOT_A_DIRECTORY:
        raise ConfigError(f"{what} {target}: {existing} is not a directory")
    if problem is not None:
        where = "" if existing == target else f" ({existing}, where it would be created)"
        raise ConfigError(f"{what} {target}: cannot write there{where}: {problem}; choose another {what}")


@dataclass
class RunOutcome:
    report: Report | None  # None on the nodes and ranks that do not write it
    path: Path | None
    exit_code: int


def run_local(request: RunRequest, job_results: Callable[[], list[Result]] | None = None) -> RunOutcome:
    """discover/health of this node, or checks of what surrounds it (job_results: `cluster slurm`): nothing to
    meet, no process group."""
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    check_output_writable(request, load_run_config(request))  # before the inventory, which takes seconds
    work = collect_node(request)
    with claim_output(request, work, started) as run_dir:
        work.results = check_health(work, request, started)
        report = build_report(request, started, t0, work, [work.part()], job_results() if job_results else [])
        path = write_report(report, run_dir.path)
    return RunOutcome(report, path, report.status.exit_code)


# Where node rank 0's process tells its ranks the run directory it claimed (rank 0 writes the report there).
RUN_DIR_VARIABLE = "GPUCERT_RUN_DIR"


def run_on_nodes(
    request: RunRequest, plan: Any, nproc: int | None, argv: list[str], say: Callable[[str], None]
) -> RunOutcome:
    """This node's process: check the request, claim the run directory (node 0), and start the node's ranks on
    torchrun's engine (runtime/launcher.py); each rank runs `argv` (this same command), rank 0 writes the
    report. The exit code is the run's verdict, or 3 with the cause in one line."""
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    if plan.node_rank == 0:
        check_output_writable(request, load_run_config(request))  # before the inventory, which takes seconds
    # This node's hardware and profile: its sizes are refused here if they do not fit, before any rank starts.
    work = collect_node(request)
    config = work.config
    # torch loads with these (seconds): a bad file or key above is refused before.
    from gpucert.bench.suite import rank_env
    from gpucert.runtime.device import default_nproc
    from gpucert.runtime.launcher import NO_VERDICT, LaunchOutcome, launch_ranks

    if nproc is None:
        nproc = (config.bench.nproc or default_nproc()) if request.benchmarks else 1
    if nproc < 1:
        raise ConfigError(f"bench.nproc must be >= 1, found {nproc}")
    check_fits(work, request.benchmarks, nproc)
    env = rank_env(config, request.benchmarks)
    host = work.inventory.hostname  # a replayed node is named by its bundle's host, as its results are
    if request.replay:
        env["GPUCERT_NODE_LABEL"] = host
    elif plan.node_name:
        env["GPUCERT_NODE_LABEL"] = plan.node_name
    runs_dir = Path(config.runs_dir)
    with (
        claim_run_dir(request.output, runs_dir, host, started, request.verb)
        if plan.node_rank == 0
        else _unclaimed(request.output or default_run_dir(runs_dir, host, started)) as run_dir
    ):
        env[RUN_DIR_VARIABLE] = str(run_dir.path.absolute())
        report_json = run_dir.path / "report.json"
        before = file_identity(report_json)  # an --output may hold an earlier run's report
        # One round of fresh workers a benchmark: a benchmark that fails or hangs costs that benchmark.
        restarts = len(request.benchmarks)
        if request.benchmarks:
            # Each rank imports torch and sets up its GPU before the first benchmark: seconds, said, not silent.
            say(f"starting {nproc} rank{'s' if nproc > 1 else ''} on {plan.node_name or host}...")
        try:
            outcome = launch_ranks(plan, nproc, argv, config.runtime, run_dir.path / "logs", env, restarts)
        except RendezvousError as exc:
            if plan.node_rank == 0 and not _lost_node_in_report(report_json, before, str(exc)):
                # The nodes never met, so nothing ran: the report says so (a prolog or a monitor reading
                # report.json finds this run's verdict, not none, and not an earlier run's).
                report = build_report(request, started, t0, work, [work.part()], [_rendezvous_failed(exc, work)])
                path = write_report(report, run_dir.path)
                say_line(str(exc))
                return RunOutcome(report, path, Status.ERROR.exit_code)
            outcome = LaunchOutcome(False, None, str(exc))
        except JobFailed as exc:  # the ranks ended the run (a failure outside a benchmark, or the last one)
            outcome = LaunchOutcome(False, None, str(exc))
        except Interrupted as exc:  # Ctrl-C or SIGTERM here: the one line the CLI prints names what rank 0 wrote
            written = _written_since(report_json, before) if plan.node_rank == 0 else None
            exc.after = f"partial report written to {written}" if written else None
            raise
    if outcome.verdict == BROKEN_PIPE_EXIT:
        # Rank 0 found the reader of its output gone and stopped the run (its partial report says what ran and
        # what did not): nobody reads a word more, and the CLI exits 141.
        raise BrokenPipeError(errno.EPIPE, "the reader of gpucert's output closed it")
    if not outcome.ok:
        written = _written_since(report_json, before) if plan.node_rank == 0 else None
        if written is None:
            raise JobFailed(outcome.cause or "the job failed")
        say_line(outcome.cause or "the job failed")
        from gpucert.report.store import load_report

        report = load_report(written)
        return RunOutcome(report, written, Status.ERROR.exit_code)
    if outcome.verdict is None:
        # Every rank exited 0 and local rank 0 judged nothing: exit 0 here would be a PASS nothing earned.
        raise JobFailed(NO_VERDICT)
    code = outcome.verdict
    if plan.node_rank != 0:
        say(
            f"node {outcome.labels.get(plan.node_rank)}: the report is written by node 0 ({outcome.labels.get(0)}); "
            f"verdict exit code {code}"
        )
        return RunOutcome(None, None, code)
    # Rank 0 printed the report; its path is kept for what this process writes once (--metrics-file).
    return RunOutcome(None, _written_since(report_json, before), code)


def _rendezvous_failed(exc: RendezvousError, work: NodeWork) -> Result:
    label = work.label or work.inventory.hostname
    return Result(
        name="run.rendezvous",
        subject=label,
        node=label,
        status=Status.ERROR,
        message=f"the nodes never met, so nothing was run or judged: {exc}",
        remediation="start gpucert on every node of the job (the same --nnodes, --master-addr and --master-port), "
        "check that each reaches node rank 0's address and port, then run it again",
    )


def _written_since(path: Path, before: tuple[int, int, int] | None) -> Path | None:
    """The report rank 0 wrote in this run: `path` where it is not the file that was there before the ranks
    started (an --output may hold an earlier run's; store.file_identity)."""
    now = file_identity(path)
    return path if now is not None and now != before else None


def _lost_node_in_report(report_json: Path, before: tuple[int, int, int] | None, cause: str) -> bool:
    """A node that did not come back for the next round of workers (runtime/launcher.py): the report that
    rank 0 wrote before the round ended stands, with the lost node named in it. False: there is none."""
    from gpucert.report.store import load_report

    path = _written_since(report_json, before)
    if path is None:
        return False  # the run never got that far: the error alone says it
    run_dir = path.parent
    report = load_report(path)
    lost = Result(
        name="run.aborted",
        subject="run",
        status=Status.ERROR,
        message=f"the run stopped: {cause}",
        remediation="find the named node (its log, dmesg, the network to node 0); nothing after this point ran",
    )
    write_report(dataclasses.replace(report, results=[*report.results, lost]), run_dir)
    return True


def _unclaimed(path: Path) -> RunDir:
    """A node other than node 0: its ranks' logs under the same --output (or its own runs directory)."""
    return RunDir(path, [], None)


def failure_result(record: Any, logs: Path | None, stopped: bool = False) -> Result:
    """What failed: the failed benchmark's ERROR when it failed in one (its rank's own exception, where it was
    raised, the traceback's last lines); else, with `stopped` (the run ends before all of it ran), or when the
    operator stopped it (nobody failed), the `run.aborted` that says the run stopped and why."""
    where = f" (each rank's log is in {logs} on its node)" if logs else ""
    details = {"traceback": record.traceback} if record.traceback else {}
    if record.phase.startswith("bench ") and not stopped and not record.operator:
        name = record.phase.split(" ", 1)[1]
        return Result(
            name=f"bench.{name}",
            subject=record.node or "run",
            node=record.node,
            status=Status.ERROR,
            category="benchmark",
            message=f"the {name} benchmark failed: {record.message()}",
            # Not `stopped`: the run goes on with fresh ranks, and the benchmarks after this one are in the report.
            remediation=f"look at the named rank and its node{where}; the run went on with fresh ranks for the "
            "benchmarks after this one",
            details=details,
        )
    remediation = f"look at the named rank and its node{where}; nothing after this point was judged"
    if record.operator:  # stopped on purpose: no benchmark failed, and no rank is to blame
        remediation, details = "run it again for a full report; nothing after this point was run or judged", {}
    return Result(
        name="run.aborted",
        subject=record.node or "run",
        node=record.node,
        status=Status.ERROR,
        message=f"the run stopped: {record.message()}",
        remediation=remediation,
        details=details,
    )


def reader_left_result(not_run: list[str]) -> Result:
    """The run stopped because the reader of its output left: an ERROR (the suite did not all run, so it is no
    pass) that names what was not run, rather than a failure of the benchmark that was next."""
    return Result(
        name="run.aborted",
        subject="run",
        status=Status.ERROR,
        message=f"the run stopped before benchmark {not_run[0] if not_run else '-'}: the reader of gpucert's output "
        f"closed it (`| head`?); not run: {', '.join(not_run) or 'none'}",
        remediation="run it again with its output read to the end (`| tee run.log`, or a file); "
        "progress goes to stderr, results to stdout",
    )


def run_in_ranks(request: RunRequest, say: Callable[[str], None]) -> RunOutcome:
    """Every rank of the job runs this (started by `run_on_nodes`, or by an outside torchrun or srun); each
    node's local rank 0 checks its node, the benchmarks run in the job's one process group, rank 0 writes the
    report.

    A failure ends the round: every rank leaves, and the culprit is named. Where the launcher has rounds left
    (gpucert's gives one a benchmark), the failed benchmark's ERROR is kept in the run store and the next round
    of fresh workers goes on with the next benchmark; otherwise, or when the failure was not in a benchmark,
    rank 0 writes the partial report and says the run is over."""
    import torch.distributed as dist

    from gpucert.bench.suite import run_in_ranks as bench_in_ranks
    from gpucert.runtime.group import (
        AbortRecord,
        deadline,
        fail,
        leave_failed,
        say_stop,
        start_runtime,
        stop_runtime,
        watch_run_store,
    )
    from gpucert.runtime.launch_env import launched_by_gpucert
    from gpucert.runtime.launcher import write_verdict
    from gpucert.runtime.sigterm import TermWatch, stopped_by_launcher

    pre = load_run_config(request)
    holder: dict[str, Any] = {}
    restarts_left = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) - int(
        os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    )
    written = threading.Lock()  # the main thread, the watchdog's, SIGTERM's and a deadline's: one writes
    reader_left = threading.Event()

    def tell(line: str, record: AbortRecord | None = None) -> None:
        """say(line) (say_stop's rule with the `record` a rank leaves on: an operator's stop is said once, by the
        gpucert process signalled); a reader that closed the output (`gpucert accept 2>&1 | head`) is noted, not
        raised: the loop below stops before the next benchmark, and a thread that says something (the
        watchdog's, SIGTERM's) must not die of it."""
        if reader_left.is_set():
            return
        try:
            if record is None:
                say(line)  # the CLI's progress: raises where its reader left
                written = True
            else:
                written = say_stop(rt, line, record)  # False where stderr's reader left
        except BrokenPipeError:
            written = False
        if not written:
            reader_left.set()

    def write_partial(record: AbortRecord, final: bool = False) -> None:
        """Rank 0, when a rank failed: a benchmark's failure is kept for the next round where there is one;
        otherwise the report says what ran, and who failed. Once only, and never over the whole report."""
        with written:
            if not holder.get("written"):
                _write_partial(record, final)
            holder["written"] = True

    def _write_partial(record: AbortRecord, final: bool) -> None:
        work = holder.get("work")
        if not holder.get("main", rt.is_main):
            return
        # Over the watchdog's connection: this runs on its thread or SIGTERM's while the main thread may be
        # blocked in a store wait on the same one.
        run = watch_run_store(rt)
        if work is None:  # before this node was even checked: nothing to report, and nothing to go on with
            run.set("over", f"the run stopped: {record.message()}")
            return
        run_dir = holder["run_dir"]
        if holder.get("reader_left"):
            # Nothing failed: the run stops because nobody reads it. What ran stands; what did not is named as
            # not run, not as a benchmark's failure, and the node's process exits 141 without a word.
            not_run = [b for b in request.benchmarks if not run.check([f"done/{b}"])]
            results = [*finished(run), reader_left_result(not_run)]
            report = build_report(request, holder["started"], holder["t0"], work, read_parts_so_far(run), results)
            path = write_report(report, run_dir.path)
            write_verdict(BROKEN_PIPE_EXIT)
            run_dir.release()
            run.set("over", f"the reader of gpucert's output closed it; partial report {path}")
            return
        failed = failure_result(record, run_dir.path / "logs")
        # An operator's stop fails no benchmark: the run ends, saying where it was.
        name = record.phase.split(" ", 1)[1] if record.phase.startswith("bench ") and not record.operator else None
        left = [b for b in request.benchmarks if b != name and not run.check([f"done/{b}"])]
        # A new round only where one is left and there are benchmarks for it: the last one's failure is the end.
        going_on = not final and restarts_left > 0 and name is not None and bool(left)
        if name is not None:
            run.set(f"done/{name}", json.dumps([failed.to_dict()]))
        # Also when the run goes on: should a node not come back for the next round, this report stands.
        parts = read_parts_so_far(run)
        results = finished(run)
        if not going_on and (name is None or left):
            # The run ends here, and not everything ran: say so, and why.
            results.append(failure_result(record, None, stopped=True))
        report = build_report(request, holder["started"], holder["t0"], work, parts, results)
        path = write_report(report, run_dir.path)
        write_verdict(Status.ERROR.exit_code)
        if going_on:
            tell(f"{failed.name} failed; the next round of workers goes on: {record.message()}")
            holder["cause_said"] = True
            return
        run_dir.release()
        run.set("over", f"the run stopped: {record.message()}; partial report {path}")
        if not record.operator:  # the gpucert process that was signalled says it, with this path
            tell(f"partial report written to {path}")

    def read_parts_so_far(run: Any) -> list[Any]:
        return read_parts(run, rt.num_nodes, request.benchmarks, 0, skip_missing=True) or [holder["work"].part()]

    def finished(run: Any) -> list[Result]:
        """Every benchmark's judged results so far, in the run store (this round's and earlier rounds')."""
        keys = [f"done/{name}" for name in request.benchmarks]
        return [Result.from_dict(r) for key in keys if run.check([key]) for r in json.loads(run.get(key))]

    rt = start_runtime(pre.runtime, on_abort=write_partial)
    run = rt.run_store

    # A launcher stops every rank as soon as one ends, before the watchdog can read why (runtime/sigterm.py):
    # each rank says it was stopped, so none is taken for the one that ended, and rank 0 writes what ran.
    def terminated() -> None:
        record = stopped_by_launcher(rt)
        if rt.is_main:
            # Nobody else named, or the operator: the job itself was stopped, not a round ended by a failure.
            write_partial(record, final=record.rank == rt.rank or record.operator)
        if not holder.get("cause_said"):  # rank 0 said the cause just now, with what happens next: once is enough
            tell(f"{rt.me.describe()} stops (SIGTERM): {record.message()}", record)

    watch = TermWatch(terminated, Status.ERROR.exit_code).start()
    try:
        rt.set_phase("node checks")
        if rt.is_main:
            _start_clock(run, holder)
        work = collect_node(request, rt.me.node)
        # Refused here, every rank stops (exit 3) and no report is written: nothing was run or judged.
        check_fits(work, request.benchmarks, rt.local_world_size)
        if rt.is_main:
            holder["run_dir"] = rank_run_dir(request, work, holder["started"])
            _keep_last_rounds_failure(rt, request, holder["run_dir"].path / "logs")
        holder.update(work=work, main=rt.is_main)
        if rt.local_rank == 0 and not run.check([f"part/{rt.node_rank}"]):
            # This job's ranks on this host already hold their GPUs: not someone else's work. By host, not node
            # rank: two "nodes" sharing a host see each other's GPUs through NVML.
            mine = frozenset(p.pid for p in rt.peers if p.host == rt.me.host)
            work.results = check_health(work, request, holder.get("started") or datetime.now(timezone.utc), mine)
            run.set(f"part/{rt.node_rank}", json.dumps(work.part()))
        dist.barrier()  # rank 0 has kept the last round's failure: every rank skips the same benchmarks
        if not rt.is_main or not launched_by_gpucert():
            # Said in the rank's log (rank 0 of gpucert's launcher prints to the node's terminal instead): past the
            # rendezvous and the node checks, beating and watched.
            say_line(f"{rt.me.describe()} joined the job ({rt.world_size} ranks)")
        has_gpus = bool(work.inventory.gpu.gpus)
        for name in request.benchmarks:
            if run.check([f"done/{name}"]):
                continue  # judged in an earlier round, or failed there
            # Once stopping (SIGTERM here, or the run ended elsewhere), no further benchmark starts.
            watch.hold_if_stopping()
            if run.check(["over"]):
                raise JobFailed(run.get("over").decode())
            rt.set_phase(f"bench {name}")
            dist.barrier()
            if rt.is_main:
                tell(f"running benchmark {name}...")
                if reader_left.is_set():
                    raise ReaderLeft(f"the reader of gpucert's output closed it before benchmark {name}")
                run.set("current", name)
            # The burn runs for its duration by design: the timeout counts beyond it.
            limit_s = work.config.bench.timeout_s + (work.config.bench.burn.duration_s if name == "burn" else 0)
            with deadline(rt, f"bench {name}", limit_s, "bench.timeout_s", write_partial):
                judged, telemetry = bench_in_ranks(rt, name, work.config, work.profile, has_gpus, work.sources.nvml)
            if rt.local_rank == 0:
                run.set(f"telemetry/{name}/{rt.node_rank}", json.dumps([r.to_dict() for r in telemetry]))
            dist.barrier()  # every node's telemetry is in before the benchmark counts as done
            if rt.is_main:
                run.set(f"done/{name}", json.dumps([r.to_dict() for r in judged]))
        rt.set_phase("report")
        outcome = RunOutcome(None, None, 0)
        if rt.is_main:
            wait = rt.config.collective_timeout_s
            parts = read_parts(run, rt.num_nodes, request.benchmarks, wait, skip_missing=False)
            report = build_report(request, holder["started"], holder["t0"], work, parts, finished(run))
            with written:
                if holder.get("written"):  # a partial one is there: this process is on its way out
                    raise RuntimeError("the run was stopped while its report was being written")
                path = write_report(report, holder["run_dir"].path, html=bool(request.benchmarks))
                holder["written"] = True
            holder["run_dir"].release()
            run.set("verdict", str(report.status.exit_code))
            outcome = RunOutcome(report, path, report.status.exit_code)
        else:
            from datetime import timedelta

            run.wait(["verdict"], timedelta(seconds=rt.config.collective_timeout_s))
            outcome = RunOutcome(None, None, int(run.get("verdict")))
        if rt.local_rank == 0:
            write_verdict(outcome.exit_code)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            watch.stop()
            raise
        holder["reader_left"] = isinstance(exc, ReaderLeft)
        record = fail(rt, exc)  # a reader that left too: the other ranks read it and leave
        if rt.is_main:  # also when the record names a peer: its watchdog may have stopped before reading it
            write_partial(record)
        if not holder["reader_left"]:
            tell(
                record.message() if record.rank == rt.rank else f"{rt.me.describe()} stops: {record.message()}", record
            )
        if holder.get("run_dir") is not None:
            holder["run_dir"].release()
        leave_failed(rt, BROKEN_PIPE_EXIT if holder["reader_left"] else Status.ERROR.exit_code)
    stop_runtime(rt)
    watch.stop()
    if launched_by_gpucert():
        # The node's process returns the verdict (write_verdict): a rank that exited 1 or 2 would look failed
        # to torchrun's agent, which would stop the node's other ranks mid-way.
        return dataclasses.replace(outcome, exit_code=0)
    return outcome


def _start_clock(run: Any, holder: dict[str, Any]) -> None:
    """When the run started: round 0's time, kept in the run store for the rounds after a failure."""
    if not run.check(["started"]):
        run.set("started", datetime.now(timezone.utc).isoformat())
    started = datetime.fromisoformat(run.get("started").decode())
    holder["started"] = started
    holder["t0"] = time.perf_counter() - (datetime.now(timezone.utc) - started).total_seconds()


def _keep_last_rounds_failure(rt: Any, request: RunRequest, logs: Path) -> None:
    """Rank 0 of a round after a failure: the benchmark the last round was in, if its rank 0 could not keep
    its failure (it was the one that died), becomes that benchmark's ERROR from the record in the store."""
    from gpucert.runtime.group import AbortRecord, previous_round_abort

    run = rt.run_store
    current = run.get("current").decode() if run.check(["current"]) else None
    if current is None or run.check([f"done/{current}"]) or current not in request.benchmarks:
        return
    record = previous_round_abort(rt) or AbortRecord(
        who="a rank of the last round",
        cause="its workers ended with no cause recorded (killed without a word: SIGKILL, the OOM killer?)",
        phase=f"bench {current}",
    )
    run.set(f"done/{current}", json.dumps([failure_result(record, logs).to_dict()]))


def rank_run_dir(request: RunRequest, work: NodeWork, started: datetime) -> RunDir:
    """Rank 0's run directory: the one node 0's process claimed and holds (run_on_nodes), or, under an outside
    launcher, its own claim."""
    claimed = os.environ.get(RUN_DIR_VARIABLE)
    if claimed:
        return RunDir(Path(claimed), [], None)
    check_output_writable(request, work.config)
    return claim_output(request, work, started)


def say_line(line: str) -> None:
    """One line on stderr, flushed (a rank's log, or the node's terminal for local rank 0)."""
    print(f"gpucert: {line}", file=sys.stderr, flush=True)


def read_parts(store: Any, num_nodes: int, benchmarks: list[str], timeout_s: float, skip_missing: bool) -> list[Any]:
    """Every node's checks, with each benchmark's telemetry that node sent, as the nodes put them in the run store.

    timeout_s > 0 waits that long for each node's checks; a node that sent none in time is left out when
    skip_missing (a lost node, already named) and an error naming it otherwise. timeout_s == 0 takes only what
    is there (a run that stopped part-way: the nodes that got that far).
    """
    from datetime import timedelta

    parts = []
    for node in range(num_nodes):
        key = f"part/{node}"
        if timeout_s > 0:
            try:
                store.wait([key], timedelta(seconds=timeout_s))
            except RuntimeError:
                if skip_missing:
                    continue
                raise RendezvousError(f"node rank {node}'s checks did not come within {timeout_s:g} s") from None
        elif not store.check([key]):
            continue
        part = json.loads(store.get(key))
        for name in benchmarks:
            telemetry = f"telemetry/{name}/{node}"
            if store.check([telemetry]):  # a benchmark that failed on the way may have none
                part["results"] += json.loads(store.get(telemetry))
        parts.append(part)
    return parts
