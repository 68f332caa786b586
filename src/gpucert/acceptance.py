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

import contextlib
import dataclasses
import json
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gpucert
from gpucert.config.loader import ConfigError, load_config
from gpucert.config.profiles import Profile, load_profile, select_profile
from gpucert.config.run import RunConfig
from gpucert.hardware.inventory import NodeInventory, NodeSources, bundle_sources, collect_inventory, live_sources
from gpucert.report.schema import Report, Result, RunMeta
from gpucert.report.store import NOT_A_DIRECTORY, RunDir, claim_run_dir, default_run_dir, write_problem, write_report
from gpucert.runtime.errors import RendezvousError
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


def load_run_config(request: RunRequest, base: dict[str, Any] | None = None) -> RunConfig:
    """The resolved config, every range and name checked (ConfigError naming each bad key) before any work."""
    config = load_config(RunConfig, request.config_path, request.overrides, base=base)
    if base is None and config.profile != "auto":
        # A named profile's run defaults sit under the file and --set values: judge the values the run will use.
        base = load_profile(config.profile).run_defaults
        config = load_config(RunConfig, request.config_path, request.overrides, base=base)
    # "auto": the profile, whose run defaults may change a related key (gate_bytes against max_bytes), is known
    # once collect_node has read the hardware and loads again; only the timeouts are judged now.
    problems = config.problems() if base is not None else config.runtime.problems() + config.localize.problems()
    if problems:
        raise ConfigError("; ".join(problems))
    return config


def collect_node(request: RunRequest, label: str | None = None) -> NodeWork:
    """This node's inventory, the profile it selects, and the config with that profile's run defaults."""
    config = load_run_config(request)
    sources = bundle_sources(request.replay) if request.replay else live_sources()
    inventory = collect_inventory(sources)
    named = [g.name for g in inventory.gpu.gpus if "nvmlDeviceGetName" not in g.unreadable]
    if inventory.gpu.gpus and not named and config.profile == "auto":
        raise ConfigError("no GPU answered NVML's name query, so no profile can be chosen: name one with --profile")
    profile = select_profile(named) if config.profile == "auto" else load_profile(config.profile)
    # Now that the hardware is known, its profile's run defaults sit under the file and --set values.
    config = load_run_config(request, base=profile.run_defaults)
    return NodeWork(label or inventory.hostname, sources, inventory, profile, config)


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


def output_dir(request: RunRequest, head: NodeWork, started: datetime) -> Path:
    """Where a node that does not write the report puts its workers' logs (node 0 claims its directory)."""
    return request.output or default_run_dir(Path(head.config.runs_dir), head.inventory.hostname, started)


def claim_output(request: RunRequest, head: NodeWork, started: datetime) -> RunDir:
    """The run directory of the node that writes the report: --output or a new one under runs_dir, locked
    until released (a second run pointed at it is refused, exit 3, naming the run that holds it)."""
    return claim_run_dir(request.output, Path(head.config.runs_dir), head.inventory.hostname, started)


def node_output(
    request: RunRequest, work: NodeWork, started: datetime, node_rank: int
) -> RunDir | contextlib.nullcontext[None]:
    """Node 0's claimed run directory (it writes the report), released when the block ends; None elsewhere."""
    return claim_output(request, work, started) if node_rank == 0 else contextlib.nullcontext()


def check_fits(work: NodeWork, benchmarks: Sequence[str], nproc: int) -> None:
    """Refuse benchmark sizes this node's memory cannot hold, before any worker allocates: host memory
    (MemAvailable) for every rank's host buffers, each GPU's free memory for its rank's device buffers."""
    from gpucert.bench.footprint import GIB, fit_problems, footprints

    inventory = work.inventory
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
    """Refuse an output directory the report could not be written to, before anything runs; creates nothing
    (store.write_problem probes it)."""
    target = (request.output or Path(config.runs_dir)).absolute()
    what = "--output" if request.output else "runs_dir"
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


def run_with_agents(request: RunRequest, plan: Any, nproc: int | None, say: Callable[[str], None]) -> RunOutcome:
    """This node's agent: meet the other nodes, check this node, run every benchmark as a step across nodes."""
    from gpucert.runtime.device import default_nproc

    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    check_output_writable(request, load_run_config(request))  # before the inventory, which takes seconds
    work = collect_node(request)
    nproc = nproc or work.config.bench.nproc or default_nproc()
    if nproc < 1:
        raise ConfigError(f"bench.nproc must be >= 1, found {nproc}")
    check_fits(work, request.benchmarks, nproc)
    # Node 0 writes the report; the other nodes only put their workers' logs under the same --output.
    with node_output(request, work, started, plan.node_rank) as run_dir:
        return _run_steps(request, plan, nproc, say, work, started, t0, run_dir)


def _run_steps(
    request: RunRequest,
    plan: Any,
    nproc: int,
    say: Callable[[str], None],
    work: NodeWork,
    started: datetime,
    t0: float,
    run_dir: RunDir | None,
) -> RunOutcome:
    from gpucert.bench.suite import run_step
    from gpucert.runtime.agent import NodeAgent

    with tempfile.TemporaryDirectory(prefix="gpucert-run-") as tmp:
        agent = NodeAgent.start(plan, nproc, work.config.runtime, Path(tmp), work.inventory.hostname)
        agent.log_dir = (run_dir.path if run_dir else output_dir(request, work, started)) / "logs"
        work.label = agent.label
        work.results = check_health(work, request, started)
        agent.put(f"part/{agent.node_rank}", work.part())
        job_results: list[Result] = []
        ran: list[str] = []
        lost = False
        has_gpus = bool(work.inventory.gpu.gpus)
        for name in request.benchmarks:
            if agent.is_head:
                say(f"running benchmark {name}...")
            try:
                judged, telemetry, gone = run_step(
                    agent, name, work.config, work.profile, has_gpus, Path(tmp), work.sources.nvml
                )
            except RendezvousError as exc:
                judged, telemetry, gone = [], [], str(exc)
            job_results += judged
            if gone is not None:
                if not agent.is_head:
                    raise RendezvousError(gone)
                # A node is gone: what ran so far is still reported, with the lost node named.
                job_results.append(_aborted(f"the run stopped during the {name} benchmark: {gone}", work.label))
                lost = True
                break
            ran.append(name)
            agent.put(f"telemetry/{name}/{agent.node_rank}", [r.to_dict() for r in telemetry])
        if not agent.is_head:
            code = agent.finish(None)
            say(f"node {agent.label}: the report is written by node 0 ({agent.labels[0]}); verdict exit code {code}")
            return RunOutcome(None, None, code)
        try:
            # After a lost node: whatever the remaining nodes sent, briefly.
            runtime = work.config.runtime
            wait = runtime.heartbeat_timeout_s if lost else runtime.collective_timeout_s
            parts = read_parts(agent.store, agent.num_nodes, ran, wait, skip_missing=lost, prefix="data/")
            report = build_report(request, started, t0, work, parts, job_results)
            assert run_dir is not None  # node 0 claimed it
            path = write_report(report, run_dir.path, html=bool(request.benchmarks))
        except BaseException:
            agent.finish(Status.ERROR.exit_code, lost)  # the other nodes must not wait for a verdict never sent
            raise
        agent.finish(report.status.exit_code, lost)
        return RunOutcome(report, path, report.status.exit_code)


def _aborted(message: str, node: str | None) -> Result:
    return Result(
        name="run.aborted",
        subject=node or "run",
        node=node,
        status=Status.ERROR,
        message=message,
        remediation="find the named node or rank (its log, dmesg, the network to node 0); nothing after this "
        "point was judged",
    )


def run_in_ranks(request: RunRequest, say: Callable[[str], None]) -> RunOutcome:
    """Every rank of an outside launcher's job runs this; rank 0 writes the report, all exit with its verdict."""
    import torch.distributed as dist

    from gpucert.bench.suite import run_in_ranks as bench_in_ranks
    from gpucert.runtime.group import AbortRecord, fail, leave_failed, start_runtime, stop_runtime, watch_store
    from gpucert.runtime.sigterm import TermWatch, stopped_by_launcher

    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    pre = load_run_config(request)
    done: list[Result] = []
    holder: dict[str, Any] = {}

    written = threading.Lock()  # the main thread, the watchdog's and SIGTERM's may each get here: one writes

    def write_partial(record: AbortRecord) -> None:
        """Rank 0, when a rank failed: the report still says what ran, and who failed. Once only, and never
        over the whole report."""
        with written:
            if not holder.get("written"):
                _write_partial(record)
            holder["written"] = True

    def _write_partial(record: AbortRecord) -> None:
        work = holder.get("work")
        if work is None or not holder.get("main"):
            if holder.get("run_dir") is not None:
                holder["run_dir"].release()  # claimed, nothing written yet: no empty directory left
            return
        failed = Result(
            name="run.aborted",
            subject=record.node or work.label,
            node=record.node,
            status=Status.ERROR,
            message=f"the run stopped: {record.message()}",
            remediation="look at that rank's output and node; nothing after this point was judged",
        )
        parts = read_parts(watch_store(rt), rt.num_nodes, request.benchmarks, 0, skip_missing=True) or [work.part()]
        report = build_report(request, started, t0, work, parts, [*done, failed])
        run_dir = holder["run_dir"]
        path = write_report(report, run_dir.path)
        run_dir.release()
        say(f"partial report written to {path}")

    rt = start_runtime(pre.runtime, on_abort=write_partial)

    # A launcher stops every rank as soon as one ends, before the watchdog can read why (runtime/sigterm.py):
    # each rank says it was stopped, so none is taken for the one that ended, and rank 0 writes what ran.
    def terminated() -> None:
        record = stopped_by_launcher(rt)
        if rt.is_main:
            write_partial(record)
        say(f"{rt.me.describe()} stops (SIGTERM): {record.message()}")

    watch = TermWatch(terminated, Status.ERROR.exit_code).start()
    try:
        rt.set_phase("node checks")
        work = collect_node(request, rt.me.node)
        # Refused here, every rank stops (exit 3) and no report is written: nothing was run or judged.
        check_fits(work, request.benchmarks, rt.local_world_size)
        if rt.is_main:
            check_output_writable(request, work.config)
            holder["run_dir"] = claim_output(request, work, started)
        holder.update(work=work, main=rt.is_main)
        if rt.local_rank == 0:
            # This job's ranks on this host already hold their GPUs: not someone else's work. By host, not node
            # rank: two "nodes" sharing a host see each other's GPUs through NVML.
            mine = frozenset(p.pid for p in rt.peers if p.host == rt.me.host)
            work.results = check_health(work, request, started, mine)
            rt.store.set(f"part/{rt.node_rank}", json.dumps(work.part()))
        has_gpus = bool(work.inventory.gpu.gpus)
        for name in request.benchmarks:
            rt.set_phase(f"bench {name}")
            dist.barrier()
            if rt.is_main:
                say(f"running benchmark {name}...")
            judged, telemetry = bench_in_ranks(rt, name, work.config, work.profile, has_gpus, work.sources.nvml)
            done += judged
            if rt.local_rank == 0:
                rt.store.set(f"telemetry/{name}/{rt.node_rank}", json.dumps([r.to_dict() for r in telemetry]))
        rt.set_phase("report")
        outcome = RunOutcome(None, None, 0)
        if rt.is_main:
            wait = rt.config.collective_timeout_s
            parts = read_parts(rt.store, rt.num_nodes, request.benchmarks, wait, skip_missing=False)
            report = build_report(request, started, t0, work, parts, done)
            with written:
                if holder.get("written"):  # a partial one is there: this process is on its way out
                    raise RuntimeError("the run was stopped while its report was being written")
                path = write_report(report, holder["run_dir"].path, html=bool(request.benchmarks))
                holder["written"] = True
            holder["run_dir"].release()
            rt.store.set("verdict", str(report.status.exit_code))
            outcome = RunOutcome(report, path, report.status.exit_code)
        else:
            from datetime import timedelta

            rt.store.wait(["verdict"], timedelta(seconds=rt.config.collective_timeout_s))
            outcome = RunOutcome(None, None, int(rt.store.get("verdict")))
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            watch.stop()
            raise
        record = fail(rt, exc)
        if rt.is_main:  # also when the record names a peer: its watchdog may have stopped before reading it
            write_partial(record)
        say(record.message() if record.rank == rt.rank else f"{rt.me.describe()} stops: {record.message()}")
        if holder.get("run_dir") is not None:
            holder["run_dir"].release()
        leave_failed(rt, Status.ERROR.exit_code)
    stop_runtime(rt)
    watch.stop()
    return outcome


def read_parts(
    store: Any, num_nodes: int, benchmarks: list[str], timeout_s: float, skip_missing: bool, prefix: str = ""
) -> list[dict[str, Any]]:
    """Every node's checks and the telemetry of each benchmark, as the nodes put them in the run's store.

    timeout_s > 0 waits that long for each node's keys; a node that sent nothing in time is left out when
    skip_missing (a lost node, already named) and an error naming it otherwise. timeout_s == 0 takes only what
    is there (a run that stopped part-way: the nodes and benchmarks that got that far).
    """
    from datetime import timedelta

    parts = []
    for node in range(num_nodes):
        keys = [f"{prefix}part/{node}"] + [f"{prefix}telemetry/{name}/{node}" for name in benchmarks]
        if timeout_s > 0:
            try:
                store.wait(keys, timedelta(seconds=timeout_s))
            except RuntimeError:
                if skip_missing:
                    continue
                raise RendezvousError(
                    f"node rank {node}'s checks and telemetry did not come within {timeout_s:g} s"
                ) from None
        present = keys if timeout_s > 0 else [k for k in keys if store.check([k])]
        if keys[0] not in present:
            continue
        part = json.loads(store.get(keys[0]))
        for key in present[1:]:
            part["results"] += json.loads(store.get(key))
        parts.append(part)
    return parts
