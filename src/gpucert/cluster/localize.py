"""`gpucert cluster localize`: find the slow node, link or rack with pairwise jobs (reference cluster.md §4, §7).

A pair job is a two-node `gpucert accept` of what localizes: a matmul on every GPU of both nodes, and an
all_gather across the two nodes with NCCL's Ring forced (tree and NVLS report busbw above what the wires carry).
A pair below the reference (the median busbw of the other pairs; the best of them when fewer than 3) or below
the floor fails, and so does a pair job that did not finish. All pair jobs of a round run at once.

Round 1 pairs every node: at random, or rack by rack where racks are known (`host@rack`, or Slurm's
topology.conf), then round 2 across racks. Each later round is planned from what the rounds so far found
(plan_round): a node of a failed pair is re-paired with known-good nodes (of its own rack first) until two
re-pairs agree (one, for a pair job that could not run at all); a failed pair whose nodes both pass elsewhere is
run again, and named a bad link if it keeps failing; failed cross-rack pairs that gather on one rack name its
uplinks. A node that fails with known-good partners and never passes is a bad node; one that crashes with
several and passes with others is intermittent. The search stops when nothing is left to learn, or after
round_budget's rounds past the first: a handful of rounds at any N, where exhaustive pairwise testing takes
N-1 (docs/localize.md has the simulator's figures up to 1,024 nodes).

Every GPU's matmul is also held to the median of all GPUs (`cluster.outlier.*`, the accept rule), so with no
known-good node to re-pair with (two nodes; every pair failing) a slow GPU still names its node; otherwise
the failed pair is named as such, and the report says why it could not narrow it down.

The planner and judges are pure functions of the judged pair jobs (drive, plan_round, assess, conclude):
localize_sim runs them on a model of a cluster. Pair jobs run as one `srun` step each inside a Slurm
allocation, or from a host list as one gpucert per node (ssh to hosts other than this one). Each writes its own
report under `<run>/pairs/`; localize writes one report of its own, in the project's schema, with every node's
inventory and health from its pair jobs.
"""

from __future__ import annotations

import math
import random
import re
import secrets
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpucert.config.loader import ConfigError, not_text
from gpucert.config.profiles import Profile
from gpucert.config.run import RunConfig
from gpucert.report.cluster import CLUSTER
from gpucert.report.schema import Report, Result
from gpucert.runtime.spawn import STDIN_EOF_STOPS
from gpucert.status import Status

# Exit codes of a job that ran and judged (PASS, WARN, FAIL); 3 and deaths by signal mean it did not.
VERDICT_CODES = (0, 1, 2)
# ssh's exit code for its own failures (the remote command's are its own: gpucert's 0-3, 130, 143).
SSH_FAILED = 255
# What a node's gpucert exits with when localize stops it: SIGTERM, handled (runtime.errors.Interrupted).
STOPPED_EXIT = 128 + signal.SIGTERM
# Variables a pair job on another host needs from ours (ssh passes no environment).
FORWARDED_PREFIXES = ("NCCL_", "GPUCERT_", "UCX_", "FI_")
# Seconds a pair's surviving process gets, after its partner failed, to say why before it is stopped.
PARTNER_GRACE_S = 5.0
_HOST = re.compile(r"^[A-Za-z0-9_.-]+$")
_GPUS = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


@dataclass(frozen=True)
class NodeSpec:
    """One node of the search: where its pair jobs run, and (host lists) which GPUs of that host it is."""

    name: str
    host: str
    gpus: str | None = None  # CUDA_VISIBLE_DEVICES of the node's processes; None: all the host's GPUs
    # Its leaf switch (rack), from `host@rack` or Slurm's topology; None: the topology is unknown.
    rack: str | None = None


def _expand_gpus(text: str) -> str:
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        lo, hi = int(first), int(last or first)
        if hi < lo:
            raise ConfigError(f"GPU range {part!r} runs backwards")
        out += range(lo, hi + 1)
    return ",".join(str(i) for i in out)


def parse_node(text: str) -> NodeSpec:
    """`host` or `host:GPUS` (GPUS like 0, 0-3 or 0,2: that host's GPUs, as one node of the search), either
    followed by `@RACK`, the node's leaf switch (pairs are then planned rack by rack, then across racks)."""
    where, at, rack = text.strip().partition("@")
    if at and not _HOST.match(rack):
        raise ConfigError(f"{text!r}: expected host@RACK with RACK a switch or rack name (letters, digits, _.-)")
    host, sep, gpus = where.partition(":")
    if not _HOST.match(host):
        raise ConfigError(f"host {host!r} (in {text!r}): expected a hostname or IPv4 address (letters, digits, _.-)")
    if not sep:
        return NodeSpec(host, host, rack=rack or None)
    if not _GPUS.match(gpus):
        raise ConfigError(f"{text!r}: expected host:GPUS with GPUS like 0, 0-3 or 0,2 (CUDA_VISIBLE_DEVICES)")
    # The name travels as --node-name, whose alphabet has no comma: `box:0,2` is node `box:0+2`.
    return NodeSpec(f"{host}:{gpus.replace(',', '+')}", host, _expand_gpus(gpus), rack or None)


def parse_hosts(items: Sequence[str]) -> list[NodeSpec]:
    nodes = [parse_node(item) for item in items]
    names = [n.name for n in nodes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"node(s) listed twice: {', '.join(twice)}")
    if len(nodes) < 2:
        raise ConfigError(f"localize needs at least 2 nodes to pair, found {len(nodes)}: {', '.join(names) or '-'}")
    unlabelled = [n.name for n in nodes if n.rack is None]
    if unlabelled and len(unlabelled) < len(nodes):
        raise ConfigError(
            f"node(s) {', '.join(unlabelled[:5])}{' ...' if len(unlabelled) > 5 else ''} have no @RACK where others "
            "do: label every node (host@rack) or none"
        )
    return nodes


def read_hostfile(path: Path) -> list[str]:
    """One node per line (MPI-style `host slots=8`: words with `=` after the host are its settings, not
    nodes); `#` starts a comment. A second host on a line is refused, naming the line: it was dropped unsaid."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"--hostfile {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--hostfile {path}: {not_text(exc)}; expected one host name a line") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        words = line.split("#")[0].split()
        if not words:
            continue
        if others := [w for w in words[1:] if "=" not in w]:
            raise ConfigError(
                f"--hostfile {path}:{number}: expected one host a line (then settings like slots=8), found "
                f"{words[0]} and {' '.join(others)}: put each host on its own line"
            )
        hosts.append(words[0])
    return hosts


def slurm_nodes(env: Mapping[str, str], run: Callable[[list[str]], str]) -> list[NodeSpec]:
    """The nodes of the Slurm allocation we run in (`scontrol show hostnames $SLURM_JOB_NODELIST`)."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise ConfigError(
            "no nodes to localize: give --hosts H1 H2 ... (or --hostfile), or run inside a Slurm allocation "
            "(`gpucert launch slurm localize --nodes N`, or sbatch/salloc)"
        )
    nodes = parse_hosts(run(["scontrol", "show", "hostnames", nodelist]).split())
    racks = slurm_racks(run)
    if not all(n.host in racks for n in nodes):
        return nodes  # a topology that leaves some of our nodes out: plan as if none were known
    return [NodeSpec(n.name, n.host, n.gpus, racks[n.host]) for n in nodes]


def slurm_racks(run: Callable[[list[str]], str]) -> dict[str, str]:
    """Each node's leaf switch from Slurm's topology (topology.conf, `scontrol show topology`): the switches
    of level 0. Empty where Slurm has no tree topology (topology/none) or cannot say."""
    from gpucert.launch.slurm import SlurmError

    try:
        text = run(["scontrol", "show", "topology"])
    except SlurmError:
        return {}
    racks: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("Level") == "0" and fields.get("SwitchName") and fields.get("Nodes"):
            try:
                hosts = run(["scontrol", "show", "hostnames", fields["Nodes"]]).split()
            except SlurmError:
                return {}
            racks.update((h, fields["SwitchName"]) for h in hosts)
    return racks


# Pairing


@dataclass(frozen=True)
class Pair:
    round: int
    index: int
    head: NodeSpec  # node rank 0 of the pair job: serves its rendezvous and writes its report
    other: NodeSpec

    @property
    def subject(self) -> str:
        return f"{self.head.name} <-> {self.other.name}"

    @property
    def nodes(self) -> tuple[NodeSpec, NodeSpec]:
        return (self.head, self.other)

    @property
    def dirname(self) -> str:
        return f"r{self.round}-{self.index:02d}"


def first_round(nodes: Sequence[NodeSpec], seed: int) -> tuple[list[Pair], list[NodeSpec]]:
    """Disjoint random pairs; with an odd count, one node waits for round 2 (paired with a known-good one)."""
    order = list(nodes)
    random.Random(seed).shuffle(order)
    pairs = [Pair(1, i // 2, order[i], order[i + 1]) for i in range(0, len(order) - 1, 2)]
    return pairs, order[2 * len(pairs) :]


def repair_rounds(suspects: Sequence[NodeSpec], goods: Sequence[NodeSpec], max_rounds: int) -> list[list[Pair]]:
    """Each suspect with a different known-good node (the pair's head: it writes the report even when the
    suspect dies); more suspects than good nodes take more rounds, up to max_rounds."""
    rounds: list[list[Pair]] = []
    pending = list(suspects)
    while pending and goods and len(rounds) < max_rounds:
        now, pending = pending[: len(goods)], pending[len(goods) :]
        rounds.append([Pair(len(rounds) + 2, i, good, s) for i, (s, good) in enumerate(zip(now, goods, strict=False))])
    return rounds


# Running pair jobs


@dataclass(frozen=True)
class Launch:
    """One process of a pair job: a gpucert node agent (host list) or the srun of the pair's step (Slurm)."""

    who: str  # node name(s) it runs for
    argv: list[str]
    env: dict[str, str]
    log: Path
    # ssh: its stdin is a pipe localize holds open, whose end tells the remote gpucert to stop (spawn.py).
    hold_stdin: bool = False


@dataclass
class PairOutcome:
    pair: Pair
    directory: Path
    busbw_gbps: float | None = None
    error: str | None = None
    # A pair job that ran but found wrong all_gather output: data corruption, judged FAIL whatever the speed.
    corrupt: str | None = None
    report: Report | None = None
    exits: dict[str, int | None] = field(default_factory=dict)

    @property
    def ran(self) -> bool:
        return self.busbw_gbps is not None


def _is_local(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()) or host.startswith("127.")


def pair_args(
    pair: Pair, directory: Path, config: RunConfig, profile: str, config_path: Path | None, overrides: Sequence[str]
) -> list[str]:
    """`gpucert accept` of a pair job, without its node placement (flags or srun's environment give that)."""
    loc = config.localize
    size = loc.size_mib * 1024 * 1024
    args = ["accept", "--skip", "burn,memory,p2p,train", "--output", str(directory), "--profile", profile]
    if config_path is not None:
        args += ["--config", str(config_path.absolute())]
    for item in overrides:
        args += ["--set", item]
    sets = {
        "bench.collectives.ops": "[all_gather]",
        "bench.collectives.intra_node_ops": "[]",
        "bench.collectives.force_ring": "true",
        "bench.collectives.min_bytes": str(size),
        "bench.collectives.max_bytes": str(size),
        "bench.collectives.gate_bytes": str(size),
        "bench.matmul.dtypes": f"[{loc.matmul_dtype}]",
        "bench.matmul.sizes": f"[{loc.matmul_size}]",
        "bench.matmul.sweep_budget_s": "0",
        "bench.matmul.warmup_s": str(loc.matmul_warmup_s),
    }
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return args


def _clean_env(env: Mapping[str, str]) -> dict[str, str]:
    from gpucert.runtime.launch_env import RANK_VARIABLES

    return {k: v for k, v in env.items() if k not in RANK_VARIABLES}


def host_launches(pair: Pair, args: Sequence[str], port: int, env: Mapping[str, str]) -> list[Launch]:
    """One gpucert per node: this host's directly, other hosts' over ssh (BatchMode: never a password prompt)."""
    local = [_is_local(n.host) for n in pair.nodes]
    addr = "127.0.0.1" if all(local) else (socket.getfqdn() if local[0] else pair.head.host)
    launches = []
    for rank, node in enumerate(pair.nodes):
        flags = ["--nnodes", "2", "--node-rank", str(rank), "--master-addr", addr, "--master-port", str(port)]
        argv = [sys.executable, "-m", "gpucert", *args, *flags, "--node-name", node.name]
        mine = _clean_env(env)
        if node.gpus is not None:
            mine["CUDA_VISIBLE_DEVICES"] = node.gpus
        if not local[rank]:
            passed = {k: v for k, v in mine.items() if k.startswith(FORWARDED_PREFIXES) or k == "CUDA_VISIBLE_DEVICES"}
            passed[STDIN_EOF_STOPS] = "1"
            remote = ["env", *(f"{k}={v}" for k, v in sorted(passed.items())), *argv]
            argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", node.host, shlex.join(remote)]
        log = _node_log(rank, node)
        launches.append(Launch(node.name, argv, mine, log, hold_stdin=not local[rank]))
    return launches


def _node_log(rank: int, node: NodeSpec) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", node.name)
    return Path("logs") / f"node-{rank}-{safe}.log"


def slurm_launches(pair: Pair, args: Sequence[str], port: int, env: Mapping[str, str]) -> list[Launch]:
    """One srun step on the pair's two nodes, one task each: the node agents read their rank from SLURM_NODEID
    and node rank 0's address from the step's node list, so only the port (one per concurrent step) is ours.
    Slurm orders the step's nodes itself, so either node may be the one that writes the pair's report."""
    step_env = {**_clean_env(env), "MASTER_PORT": str(port)}
    srun = [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        f"--nodelist={pair.head.host},{pair.other.host}",
        "--kill-on-bad-exit=1",
        "--job-name=gpucert-localize",
        "--output=logs/node-%n-%N.log",
    ]
    if env.get("SLURM_GPUS_PER_NODE"):
        srun.append(f"--gpus-per-node={env['SLURM_GPUS_PER_NODE']}")
    argv = [*srun, sys.executable, "-m", "gpucert", *args]
    return [Launch(pair.subject, argv, step_env, Path("logs") / "srun.log")]


def _start(launch: Launch, directory: Path) -> subprocess.Popen[bytes]:
    from gpucert.runtime.spawn import term_with_parent

    log = directory / launch.log
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(
            launch.argv,
            env=launch.env,
            cwd=directory,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if launch.hold_stdin else subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=term_with_parent,
        )


def run_pairs(
    jobs: Sequence[tuple[Pair, Path, list[Launch]]], timeout_s: float, grace_s: float, say: Callable[[str], None]
) -> list[PairOutcome]:
    """Every pair job of a round at once; each ends by itself, by its timeout, or soon after a partner process
    failed. Nothing started here outlives this function (Ctrl-C included)."""
    from gpucert.runtime.spawn import stop_all

    running: list[tuple[Pair, Path, list[Launch], list[subprocess.Popen[bytes]]]] = []
    outcomes: dict[int, PairOutcome] = {}
    timed_out: set[int] = set()
    stopped: set[int] = set()
    try:
        for pair, directory, launches in jobs:
            directory.mkdir(parents=True, exist_ok=True)
            procs = []
            try:
                for launch in launches:
                    procs.append(_start(launch, directory))
            except OSError as exc:
                stop_all(procs, grace_s)  # the partner already started would only wait for this one
                error = f"{launch.who}: could not start {launch.argv[0]}: {exc.strerror or exc}"
                outcomes[pair.index] = PairOutcome(pair, directory, error=error)
                continue
            running.append((pair, directory, launches, procs))
        deadline = time.monotonic() + timeout_s
        stop_at: dict[int, float] = {}
        while any(p.poll() is None for *_, procs in running for p in procs):
            now = time.monotonic()
            for pair, _directory, _launches, procs in running:
                codes = [p.poll() for p in procs]
                if None not in codes:
                    continue
                if any(c is not None and c not in VERDICT_CODES for c in codes):
                    # The partner waits on a peer that is gone; its own timeouts would end it, later.
                    stop_at.setdefault(pair.index, now + PARTNER_GRACE_S)
                if now > deadline:
                    timed_out.add(pair.index)
                if now > deadline or now > stop_at.get(pair.index, float("inf")):
                    stopped.add(pair.index)
                    stop_all(procs, grace_s)
            time.sleep(0.2)
    finally:
        stop_all([p for *_, procs in running for p in procs], grace_s)
    for pair, directory, launches, procs in running:
        exits = {launch.who: proc.returncode for launch, proc in zip(launches, procs, strict=True)}
        outcomes[pair.index] = read_outcome(
            pair, directory, launches, exits, timeout_s if pair.index in timed_out else None, pair.index in stopped
        )
    for index in sorted(outcomes):
        o = outcomes[index]
        say(f"  {o.pair.subject}: " + (f"{o.busbw_gbps:.3g} GB/s busbw" if o.ran else f"no result: {o.error}"))
    return [outcomes[k] for k in sorted(outcomes)]


def _last_error(log: Path) -> str | None:
    """The line of a node's log that says what went wrong (gpucert prints `gpucert: error: ...`)."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    # gpucert's own words first; then ssh's or srun's; then an exception; never torch's [W...] warnings.
    for accept in (
        lambda t: t.startswith("gpucert:"),
        lambda t: t.startswith(("ssh:", "srun:")),
        lambda t: "Error" in t.split(":")[0] or "error:" in t,
    ):
        for line in reversed(lines):
            if accept(line) and not line.startswith("[W"):
                return line[:400]
    return None


def read_outcome(
    pair: Pair,
    directory: Path,
    launches: Sequence[Launch],
    exits: dict[str, int | None],
    timed_out_after: float | None = None,
    stopped: bool = False,
) -> PairOutcome:
    """What a finished pair job measured, read from the report its node rank 0 wrote; why not, otherwise."""
    from gpucert.report.store import load_report
    from gpucert.runtime.spawn import exit_cause

    outcome = PairOutcome(pair, directory, exits=exits)
    path = directory / "report.json"
    if path.exists():
        try:
            outcome.report = load_report(path)
        except ValueError as exc:
            outcome.error = str(exc)
            return outcome
        gathers = [r for r in outcome.report.results if r.name == "collective.all_gather" and r.node is None]
        aborted = [r for r in outcome.report.results if r.name == "run.aborted"]
        if gathers and isinstance(gathers[0].value, (int, float)) and gathers[0].status is not Status.ERROR:
            outcome.busbw_gbps = float(gathers[0].value)
            if (gathers[0].threshold_source or "").startswith("correctness"):
                outcome.corrupt = gathers[0].message
        elif aborted:
            outcome.error = aborted[0].message
        elif gathers:
            outcome.error = gathers[0].message
        else:
            outcome.error = f"{path} has no all_gather result across the two nodes"
        return outcome
    if timed_out_after is not None:
        outcome.error = f"no report after {timed_out_after:g} s (localize.pair_timeout_s): stopped"
        return outcome
    causes = []
    for launch in launches:
        code = exits.get(launch.who)
        if stopped and (code is None or code < 0 or code == STOPPED_EXIT):
            continue  # we stopped it: its partner's failure is the cause
        if code not in VERDICT_CODES:
            said = _last_error(directory / launch.log)
            causes.append(f"{launch.who}: {exit_cause(code)}" + (f": {said}" if said else ""))
    outcome.error = "; ".join(causes) or f"no report at {path} (is the run directory on a filesystem both nodes share?)"
    return outcome


def ssh_failure(outcome: PairOutcome, name: str) -> str | None:
    """What ssh said where it could not run this node's gpucert (ssh exits 255 on its own errors: a name that does
    not resolve, a refused connection, a key not accepted); None where the node ran."""
    if outcome.exits.get(name) != SSH_FAILED or not outcome.error:
        return None
    mine = [part for part in outcome.error.split("; ") if part.startswith(f"{name}: ")]
    return mine[0].removeprefix(f"{name}: ") if mine and "ssh:" in mine[0] else None


# Judging


@dataclass(frozen=True)
class Rule:
    """What a pair's busbw is held to: a floor, a share of the reference, or both (the higher wins)."""

    floor: float | None
    floor_source: str | None
    pct: float | None
    pct_source: str | None


def rule_of(config: RunConfig, profile: Profile) -> Rule:
    loc = config.localize
    floor: float | None
    pct: float | None
    if loc.pair_busbw_gbps_min is not None:
        floor, floor_source = loc.pair_busbw_gbps_min, "config: localize.pair_busbw_gbps_min"
    else:
        floor = profile.benchmarks.pair_busbw_gbps_min
        floor_source = f"profile {profile.name}: benchmarks.pair_busbw_gbps_min"
    if loc.deviation_pct is not None:
        pct, pct_source = loc.deviation_pct, "config: localize.deviation_pct"
    else:
        pct = profile.benchmarks.cluster_deviation_pct
        pct_source = f"profile {profile.name}: benchmarks.cluster_deviation_pct"
    return Rule(floor, floor_source if floor is not None else None, pct, pct_source if pct is not None else None)


def reference(values: Sequence[float]) -> float | None:
    """What the other pairs reach: their median, or their best when fewer than 3 (a median of two is their
    mean, which a slow pair drags down)."""
    if not values:
        return None
    return statistics.median(values) if len(values) >= 3 else max(values)


def judge_pair(
    outcome: PairOutcome, others: Sequence[float], rule: Rule, what: str, others_ran: bool = False
) -> Result:
    """One `localize.pair` result. others: busbw of the pairs this one is compared with. A pair job that gave
    no figure is FAIL where other pair jobs of the run did (these nodes could not run what others ran), and
    ERROR where none did (then the run itself is in question: config, install, shared run directory) or where
    ssh could not reach one of its nodes for a reason on this host (nothing ran there: `unreached_nodes`)."""
    pair = outcome.pair
    base: dict[str, Any] = dict(
        name="localize.pair",
        subject=pair.subject,
        unit="GB/s",
        category=CLUSTER,
        details={
            "round": pair.round,
            "nodes": [n.name for n in pair.nodes],
            "report": str(outcome.directory / "report.json"),
            "exits": outcome.exits,
        },
    )
    where = f"on {pair.subject} (round {pair.round}, {what})"
    if not outcome.ran:
        unreached = any(this_hosts_fault(ssh_failure(outcome, n.name)) for n in pair.nodes)
        return Result(
            **base,
            status=Status.FAIL if others_ran and not unreached else Status.ERROR,
            message=f"the pair job gave no busbw {where}: {outcome.error}",
            remediation=f"read the pair's logs in {outcome.directory / 'logs'}; a node that cannot run a pair "
            "with a known-good node either is named below",
        )
    busbw = outcome.busbw_gbps or 0.0
    base["value"] = busbw
    if outcome.corrupt:
        return Result(
            **base,
            status=Status.FAIL,
            threshold_source="correctness: exact expected output",
            expected="0 wrong elements",
            message=f"expected exact all_gather output, found wrong elements {where}: {outcome.corrupt}",
            remediation="wrong data across the network means a bad NIC, cable or GPU: drain both nodes until "
            "the re-pairs below name one",
        )
    ref = reference(others)
    limits: list[tuple[float, str, str]] = []
    if rule.floor is not None and rule.floor_source is not None:
        limits.append((rule.floor, rule.floor_source, f"the floor {rule.floor:g} GB/s"))
    if rule.pct is not None and rule.pct_source is not None and ref is not None:
        kind = "median" if len(others) >= 3 else "best"
        text = f"within {rule.pct:g} % of the {kind} of {len(others)} other pair(s), {ref:.3g} GB/s"
        limits.append((ref * (1 - rule.pct / 100), rule.pct_source, text))
    if not limits:
        why = "no other pair to compare with" if ref is None else "the relative rule is off"
        # Measured, with nothing to hold it to: INFO (shown, not judged), as every view reads it; SKIP would say
        # the pair did not apply.
        return Result(
            **base,
            status=Status.INFO,
            message=f"not judged: {busbw:.3g} GB/s busbw {where}; {why} and no floor is set "
            "(localize.pair_busbw_gbps_min or the profile's benchmarks.pair_busbw_gbps_min)",
        )
    threshold, source, text = max(limits)
    base.update(expected=f">= {threshold:.3g} GB/s", threshold_source=source)
    base["details"] = {**base["details"], "reference_gbps": ref, "threshold_gbps": threshold}
    if busbw < threshold:
        return Result(
            **base,
            status=Status.FAIL,
            message=f"expected busbw >= {threshold:.3g} GB/s ({text}), found {busbw:.3g} GB/s {where}",
            remediation="a suspect pair: the re-pairs with known-good nodes below say which node or link",
        )
    return Result(**base, status=Status.PASS, message=f"{busbw:.3g} GB/s busbw {where}, {text}")


def _failed(result: Result) -> bool:
    return result.status in (Status.FAIL, Status.ERROR)


def slow_gpu_nodes(results: Sequence[Result]) -> dict[str, list[str]]:
    """Nodes the cross-node GPU outlier rule failed, with what it said (the per-GPU lines)."""
    found: dict[str, list[str]] = {}
    # The per-GPU lines first: they name the GPU.
    for r in sorted(results, key=lambda r: r.gpu_index is None):
        if r.name.startswith("cluster.outlier.") and r.status is Status.FAIL and r.node is not None:
            found.setdefault(r.node, []).append(r.message)
    return found


# Planning: what the pair jobs so far say of each node, and which pairs run next
#
# Every round runs its pair jobs at once, so a round costs one pair job's time whether it holds 2 pairs or 500:
# the planner fills rounds, it does not save jobs. Round 1 screens every node (rack by rack where racks are
# known: a pair then tests two nodes and their leaf switch); where racks are known, round 2 screens again across
# racks (the leaf's uplinks and the spine). A node whose pair failed is re-paired with known-good nodes (of its
# own rack first, so a fault above the leaf does not condemn it) until two re-pairs say the same (one, where the
# job could not run at all: a crash is never a noisy reading); a failed pair whose two nodes both pass with
# known-good ones is run once more before its link is named. Where racks are known, failed cross-rack pairs that
# gather on one rack name that rack's uplinks, not its nodes.

# Failures with known-good partners that make an intermittent node (some pass, some fail).
INTERMITTENT_FAILS = 2
# Runs of a pair between two nodes that pass elsewhere before its link is named, where the rounds allow: each
# run after the first fails by noise alone about one time in 500 (docs/localize.md), so two such are a fault.
LINK_RUNS = 3
# A rack's uplinks are named from this many failed cross-rack pairs (each of whose nodes passes with
# known-good ones) towards at least 2 other racks: fewer is a noisy pair or a single path.
RACK_MIN_FAILS = 3


def _other(outcome: PairOutcome, name: str) -> str:
    head, other = outcome.pair.nodes
    return other.name if head.name == name else head.name


def _crashed(outcome: PairOutcome) -> bool:
    return not outcome.ran and not outcome.corrupt


@dataclass
class Standing:
    """What the pair jobs so far say of one node: the pairs it failed and passed with partners that vouch for
    themselves (not slow, not condemned, no failure of their own that nothing explains)."""

    name: str
    rack: str | None
    runs: int = 0  # judged pair jobs it was in (PASS, FAIL or ERROR)
    suspect: bool = False  # a failed pair job that no condemned partner explains
    fails: list[tuple[PairOutcome, Result]] = field(default_factory=list)
    passes: list[tuple[PairOutcome, Result]] = field(default_factory=list)
    partners: set[str] = field(default_factory=set)

    @property
    def firm_fails(self) -> int:
        """Failures no noisy reading makes: a crash, or a slow pair with a known-good node of its own rack."""
        return sum(
            _crashed(o) or (self.rack is not None and o.pair.head.rack == o.pair.other.rack) for o, _r in self.fails
        )

    @property
    def condemned(self) -> str | None:
        if self.fails and not self.passes:
            # Where racks are known, failures across racks alone may be the uplinks': not the node's, yet.
            return "bad" if self.rack is None or self.firm_fails else None
        # Crashes with known-good partners (never noise), or slow pairs within the rack one more than that (a
        # single slow reading is one run in a few hundred).
        crashes = sum(_crashed(o) for o, _r in self.fails)
        if crashes >= INTERMITTENT_FAILS or self.firm_fails > INTERMITTENT_FAILS:
            return "intermittent"
        return None

    @property
    def settled(self) -> bool:
        """Enough said to stop re-pairing it (the round budget may stop it first)."""
        if not self.fails:
            return bool(self.passes)
        if not self.passes:
            # Two re-pairs that failed; or a crash with a re-pair partner, where another pair failed too (one
            # crash alone may be that partner's).
            later = [o for o, _r in self.fails if o.pair.round > 1]
            return len(later) >= 2 or (any(_crashed(o) for o in later) and len(self.fails) >= 2)
        if any(_crashed(o) for o, _r in self.fails):
            # A crash with a known-good partner is no noisy reading: look harder for a node that fails at times.
            return len(self.fails) >= INTERMITTENT_FAILS or len(self.passes) >= 3
        return len(self.fails) + len(self.passes) >= 3


@dataclass
class Findings:
    """What the pair jobs so far say: each node's standing, the racks whose uplinks failed cross-rack pairs point
    at, and the pairs that failed between two nodes that pass elsewhere (those the racks do not explain)."""

    standing: dict[str, Standing]
    racks: dict[tuple[str, ...], list[tuple[PairOutcome, Result]]]
    links: dict[frozenset[str], list[tuple[PairOutcome, Result]]]
    unreached: dict[str, str] = field(default_factory=dict)  # node -> what ssh said (`unreached_nodes`)


def assess(nodes: Sequence[NodeSpec], judged: Sequence[tuple[PairOutcome, Result]], slow: Collection[str]) -> Findings:
    """A condemned node explains its partners' failures and a named rack the failed pairs through its uplinks,
    which can clear nodes and so make them vouch for others: repeated until nothing changes (a few passes).
    A pair job with a node ssh could not reach for a reason on this host (`unreached_nodes`) says nothing of
    either node: it is left out."""
    unreached = unreached_nodes(judged)
    judged = [(o, r) for o, r in judged if not any(n.name in unreached for n in o.pair.nodes)]
    racks = {n.name: n.rack for n in nodes}
    runs: dict[str, list[tuple[PairOutcome, Result]]] = {n.name: [] for n in nodes}
    for o, r in judged:
        for n in o.pair.nodes:
            runs[n.name].append((o, r))
    # Where round 1 could judge no pair (too few to compare, no floor), a pair job that ran vouches for its
    # nodes: that still tells a node that cannot run a pair job at all.
    first_passed = any(o.pair.round == 1 and r.status is Status.PASS for o, r in judged)
    passing = {Status.PASS} if first_passed else {Status.PASS, Status.INFO}
    named = rack_faults(_uplink_runs(judged, runs), len({n.rack for n in nodes}))
    explained = {id(o) for rs in named.values() for o, _r in rs} | _transient(judged)
    condemned: set[str] = set()
    for _ in range(6):
        standing = _standings(runs, racks, slow, condemned, explained, passing)
        now = {name for name, st in standing.items() if st.condemned}
        if now == condemned:
            break
        condemned = now
    links = {
        k: rs for k, rs in link_candidates(judged, standing).items() if not any(id(o) in explained for o, _r in rs)
    }
    return Findings(standing, named, links, unreached)


# What ssh says when the fault is this host's way to a node (its name, DNS, keys), not the node: no pair job
# can say anything of such a node. A node that does not answer (no route, refused, timed out) may be down: that
# is a node that cannot run a pair job, re-paired and named like any other.
NOT_THE_NODES = (
    "Could not resolve hostname",
    "Name or service not known",
    "Temporary failure in name resolution",
    "Permission denied",
    "Host key verification failed",
    "Bad configuration option",
)


def this_hosts_fault(said: str | None) -> bool:
    """Whether ssh's words (ssh_failure) put the fault on this host's way to the node (NOT_THE_NODES)."""
    return said is not None and any(words in said for words in NOT_THE_NODES)


def unreached_nodes(judged: Sequence[tuple[PairOutcome, Result]]) -> dict[str, str]:
    """Nodes ssh could not run gpucert on for a reason on this host (NOT_THE_NODES), in any pair job so far, with
    what ssh said. Such a node ran nothing, so it is no suspect (it is ERROR, not reached: a name, DNS or key to
    fix here) and is not paired again; its partner in that job was stopped by localize, so the job says nothing
    of the partner either."""
    found: dict[str, str] = {}
    for o, _r in judged:
        for n in o.pair.nodes:
            said = ssh_failure(o, n.name)
            if n.name not in found and said and this_hosts_fault(said):
                found[n.name] = said
    return found


def _transient(judged: Sequence[tuple[PairOutcome, Result]]) -> set[int]:
    """Slow pairs that passed when the same two nodes ran again: a noisy reading, held against neither node."""
    passed = {frozenset(n.name for n in o.pair.nodes) for o, r in judged if r.status is Status.PASS}
    return {id(o) for o, r in judged if _failed(r) and o.ran and frozenset(n.name for n in o.pair.nodes) in passed}


def _uplink_runs(
    judged: Sequence[tuple[PairOutcome, Result]], runs: Mapping[str, list[tuple[PairOutcome, Result]]]
) -> list[tuple[PairOutcome, Result]]:
    """Failed cross-rack pairs that measured, both of whose nodes passed a pair within their rack and failed
    none there: what a fault above the leaf switches looks like."""

    def in_rack(o: PairOutcome) -> bool:
        return o.pair.head.rack == o.pair.other.rack

    def fine_in_rack(name: str) -> bool:
        mine = [r for o, r in runs[name] if in_rack(o)]
        return any(r.status is Status.PASS for r in mine) and not any(_failed(r) for r in mine)

    return [
        (o, r)
        for o, r in judged
        if _failed(r) and o.ran and o.pair.head.rack is not None and not in_rack(o)
        if all(fine_in_rack(n.name) for n in o.pair.nodes)
    ]


def _standings(
    runs: Mapping[str, list[tuple[PairOutcome, Result]]],
    racks: Mapping[str, str | None],
    slow: Collection[str],
    condemned: Collection[str],
    explained: Collection[int],
    passing: Collection[Status],
) -> dict[str, Standing]:
    unexplained = {
        name: [o for o, r in rs if _failed(r) and _other(o, name) not in condemned and id(o) not in explained]
        for name, rs in runs.items()
    }

    def vouches(name: str, judged: str, failed: bool) -> bool:
        # Its failures with the node it judges do not count against it: they are the question.
        if name in slow or name in condemned or any(_other(o, name) != judged for o in unexplained[name]):
            return False
        # For a failed pair, the partner must have passed with another node: failing together proves nothing.
        return not failed or any(r.status in passing and _other(o, name) != judged for o, r in runs[name])

    standing = {}
    for name, rs in runs.items():
        st = Standing(name, racks[name], len(rs), bool(unexplained[name]), partners={_other(o, name) for o, _ in rs})
        for o, r in rs:
            if id(o) in explained:
                continue
            if (_failed(r) or r.status in passing) and vouches(_other(o, name), name, _failed(r)):
                if _failed(r) and any(_other(f, name) == _other(o, name) for f, _r in st.fails):
                    continue  # a pair run again fails as the link between the two, not again as either node
                (st.fails if _failed(r) else st.passes).append((o, r))
        standing[name] = st
    return standing


def screen_pairs(
    nodes: Sequence[NodeSpec], seed: int, round_no: int, across: bool
) -> tuple[list[Pair], list[NodeSpec]]:
    """Disjoint pairs of `nodes`: at random where racks are unknown (round 1 as first_round draws it), rack by
    rack (the racks' odd ones out across racks), or across racks (`across`: each node with one of another
    rack wherever the racks' sizes allow)."""
    if not nodes or any(n.rack is None for n in nodes):
        if round_no == 1:
            return first_round(nodes, seed)
        order = list(nodes)
        random.Random(f"{seed}/{round_no}").shuffle(order)
    else:
        rng = random.Random(f"{seed}/{round_no}")
        by_rack: dict[str, list[NodeSpec]] = {}
        for n in nodes:
            by_rack.setdefault(n.rack or "", []).append(n)
        racks = sorted(by_rack)
        rng.shuffle(racks)
        for rack in racks:
            rng.shuffle(by_rack[rack])
        if across:
            # Row j holds the j-th node of every rack, in a fresh order per row: neighbours are of different racks,
            # and a rack's nodes meet many racks (a failing uplink then points at one rack, not at a pair of them).
            order = []
            for j in range(max(len(m) for m in by_rack.values())):
                row = [by_rack[rack][j] for rack in racks if j < len(by_rack[rack])]
                rng.shuffle(row)
                order += row
        else:
            order, spare = [], []
            for rack in racks:
                members = by_rack[rack]
                even = len(members) - len(members) % 2
                order += members[:even]
                spare += members[even:]
            order += spare
    pairs = [Pair(round_no, i // 2, order[i], order[i + 1]) for i in range(0, len(order) - 1, 2)]
    return pairs, order[2 * len(pairs) :]


def link_candidates(
    judged: Sequence[tuple[PairOutcome, Result]], standing: Mapping[str, Standing]
) -> dict[frozenset[str], list[tuple[PairOutcome, Result]]]:
    """Pairs that failed although each of their nodes passes with known-good ones and neither is condemned:
    every run of each such pair, by its two node names."""
    runs: dict[frozenset[str], list[tuple[PairOutcome, Result]]] = {}
    for o, r in judged:
        runs.setdefault(frozenset(n.name for n in o.pair.nodes), []).append((o, r))
    found = {}
    for key, rs in runs.items():
        sts = [standing[name] for name in key]
        if any(_failed(r) for _o, r in rs) and all(st.passes and not st.condemned for st in sts):
            found[key] = rs
    return found


def plan_round(
    nodes: Sequence[NodeSpec],
    judged: Sequence[tuple[PairOutcome, Result]],
    slow: Collection[str],
    round_no: int,
    seed: int,
    screens: int,
    last: int,
) -> list[Pair]:
    """The pairs of round `round_no` (2 on; `last` is the last the budget allows): re-pairs of unsettled
    suspects with known-good nodes, one more run of each pair that failed between two nodes that pass elsewhere,
    then (up to round `screens`, and never in the last two: what a screen finds there could not be re-paired)
    a screen of the nodes still free. Empty: nothing left to learn."""
    findings = assess(nodes, judged, slow)
    standing = findings.standing
    rng = random.Random(f"{seed}/{round_no}/plan")
    busy: set[str] = set()
    pairs: list[Pair] = []

    def add(head: NodeSpec, other: NodeSpec) -> None:
        pairs.append(Pair(round_no, len(pairs), head, other))
        busy.update((head.name, other.name))

    goods = [n for n in nodes if standing[n.name].passes and not standing[n.name].suspect and n.name not in slow]
    rng.shuffle(goods)
    suspects = [
        n for n in nodes if (standing[n.name].suspect or not standing[n.name].runs) and n.name not in findings.unreached
    ]
    for node in suspects:
        st = standing[node.name]
        if st.settled:
            continue
        free = [g for g in goods if g.name not in busy and g.name != node.name]
        if free:
            # Its own rack first (a fault above the leaf does not reach that pair), a partner it has not had.
            add(min(free, key=lambda g: (g.rack != node.rack, g.name in st.partners)), node)
    for rs in findings.links.values():
        o = rs[0][0]
        # A crash is not rerun on the same two nodes: re-pairs with others tell which of them crashes.
        again = len(rs) < LINK_RUNS and o.ran and not any(r.status is Status.PASS for _o, r in rs)
        if again and not busy & {n.name for n in o.pair.nodes}:
            add(o.pair.head, o.pair.other)
    if round_no <= min(screens, last - 2):
        free = [
            n
            for n in nodes
            if n.name not in busy and not standing[n.name].condemned and n.name not in findings.unreached
        ]
        racks_known = bool(nodes) and all(n.rack is not None for n in nodes)
        more, _ = screen_pairs(free, seed, round_no, across=racks_known and round_no % 2 == 0)
        for p in more:
            add(p.head, p.other)
    return pairs


def default_screens(nodes: Sequence[NodeSpec]) -> int:
    """Screening rounds: one, and a second across racks where racks are known and there are several."""
    return 2 if len({n.rack for n in nodes}) > 1 and all(n.rack is not None for n in nodes) else 1


def rack_faults(
    crossing: list[tuple[PairOutcome, Result]], racks: int
) -> dict[tuple[str, ...], list[tuple[PairOutcome, Result]]]:
    """Racks whose uplinks the failed cross-rack pairs point at: the rack that most of them touch, named when
    they reach RACK_MIN_FAILS towards at least 2 other racks; its pairs set aside, then the next. With only two
    racks (`racks`) the pairs cannot tell which leaf's uplinks: both racks are named, as one finding."""
    named: dict[tuple[str, ...], list[tuple[PairOutcome, Result]]] = {}
    if racks == 2:
        if len(crossing) >= RACK_MIN_FAILS:
            named[tuple(sorted({n.rack or "" for o, _r in crossing for n in o.pair.nodes}))] = crossing
        return named
    while crossing:
        by_rack: dict[str, list[tuple[PairOutcome, Result]]] = {}
        for o, r in crossing:
            for n in o.pair.nodes:
                by_rack.setdefault(n.rack or "", []).append((o, r))
        rack, rs = max(by_rack.items(), key=lambda kv: (len(kv[1]), kv[0]))
        towards = {n.rack for o, _r in rs for n in o.pair.nodes if n.rack != rack}
        if len(rs) < RACK_MIN_FAILS or len(towards) < 2:
            break
        named[(rack,)] = rs
        crossing = [x for x in crossing if x not in rs]
    return named


def conclude(
    nodes: Sequence[NodeSpec],
    judged: Sequence[tuple[PairOutcome, Result]],
    slow_gpus: Mapping[str, list[str]],
    left_out: Sequence[NodeSpec],
) -> list[Result]:
    """One `localize.node` result per node, one `localize.rack` per rack whose uplinks are found bad and one
    `localize.link` per other link found bad."""
    first = [(o, r) for o, r in judged if o.pair.round == 1]
    round1 = {n.name: r.status for o, r in first for n in o.pair.nodes}
    findings = assess(nodes, judged, slow_gpus)
    standing = findings.standing

    def partner_text(name: str) -> str:
        # A re-pair partner passed round 1, or (where no pair could be judged) at least ran its pair job.
        return f"known-good {name}" if round1.get(name) is Status.PASS else f"{name} (its round-1 pair ran, unjudged)"

    def latest(runs: Sequence[tuple[PairOutcome, Result]], node: NodeSpec) -> tuple[PairOutcome, Result]:
        # The last re-pair it was the subject of, else its last pair.
        return max(runs, key=lambda x: (x[0].pair.other == node and x[0].pair.round > 1, x[0].pair.round))

    results = []
    for node in nodes:
        st = standing[node.name]
        subject: dict[str, Any] = dict(subject=node.name, node=node.name, category=CLUSTER, name="localize.node")
        gpus = slow_gpus.get(node.name)
        if node.name in findings.unreached:
            # ssh's own failure (exit 255): the host ran nothing, so there is nothing to suspect it of
            # (unreached_nodes' docstring); more nodes or rounds would not tell anything apart.
            results.append(
                Result(
                    **subject,
                    status=Status.ERROR,
                    message=f"not reached: {findings.unreached[node.name]}",
                    remediation=f"check the name {node.host}, DNS and ssh from this host (BatchMode: key login, "
                    "known_hosts; `ssh -o BatchMode=yes HOST true`), then rerun localize",
                )
            )
            continue
        if st.condemned:
            o, r = latest(st.fails, node)
            partner = _other(o, node.name)
            tally = f"; {len(st.fails)} of {len(st.fails) + len(st.passes)} pairs with known-good partners failed"
            if st.condemned == "bad":
                how = "re-pair" if o.pair.round > 1 and o.pair.other == node else "pair"
                message = f"bad node {node.name}: its {how} with {partner_text(partner)} failed too ({r.message})"
            else:
                crashed = sum(_crashed(x) for x, _r in st.fails)
                message = (
                    f"intermittent node {node.name}: {len(st.fails)} of {len(st.fails) + len(st.passes)} pair jobs "
                    f"with known-good partners failed ({crashed} gave no result); the last, with {partner}: "
                    f"{r.message}"
                )
            results.append(
                Result(
                    **subject,
                    status=Status.FAIL,
                    message=message + (tally if st.condemned == "bad" and len(st.fails) > 1 else ""),
                    expected=f"a passing pair with {partner_text(partner)}",
                    threshold_source="localize: re-pair with a known-good node",
                    remediation=f"drain {node.name}; check its NICs (ibstat, port rates, errors), GPU clocks "
                    "and the pair jobs' logs",
                    details={"partner": partner, "round": o.pair.round, "failed_with": sorted(_other(x, node.name)
                             for x, _r in st.fails)},
                )
            )  # fmt: skip
            continue
        if gpus:
            results.append(
                Result(
                    **subject,
                    status=Status.FAIL,
                    message=f"bad node {node.name}: a GPU below its peers: {gpus[0]}",
                    threshold_source="cluster.outlier: the GPUs' median",
                    remediation=f"drain {node.name}: see its cluster.outlier results for the GPU, and its clocks, "
                    "power and processes",
                )
            )
            continue
        if st.passes and len(st.fails) >= INTERMITTENT_FAILS:
            results.append(
                Result(
                    **subject,
                    status=Status.WARN,
                    message=f"intermittent: {len(st.fails)} of {len(st.fails) + len(st.passes)} pair jobs with "
                    f"known-good partners were slow; {node.name} or a path it shares (its leaf switch's uplinks)",
                    remediation="rerun localize with every node's rack (host@rack, or Slurm's topology.conf): "
                    "pairs within the rack tell the node from the uplinks",
                )
            )
            continue
        if st.fails and not st.passes:
            results.append(
                Result(
                    **subject,
                    status=Status.WARN,
                    message=f"suspect, not narrowed down: {node.name} failed {len(st.fails)} pair job(s), all with "
                    f"known-good nodes of other racks ({', '.join(sorted(_other(o, node.name) for o, _ in st.fails))})"
                    ", and no pair within its rack could tell the node from its rack's uplinks",
                    remediation="rerun localize with more rounds (localize.max_rounds), or test the node with a "
                    "known-good node of its own rack",
                )
            )
            continue
        judged_passes = [(o, r) for o, r in st.passes if r.status is Status.PASS]
        if judged_passes:
            o, r = latest(judged_passes, node)
            partner = _other(o, node.name)
            said = partner_text(partner) if o.pair.round > 1 else partner
            results.append(
                Result(
                    **subject,
                    status=Status.PASS,
                    message=f"{node.name} passes with {said} ({r.message})",
                    # What its pair job was held to (judge_pair's threshold), the node's verdict resting on it.
                    expected=r.expected,
                    threshold_source=r.threshold_source,
                )
            )
            continue
        mine = [(o, r) for o, r in first if node in o.pair.nodes]
        if not mine:
            why = "was left out of round 1 (odd count) and no known-good node was found to pair it with"
            if node not in left_out:
                why = "took part in no pair"
            results.append(Result(**subject, status=Status.SKIP, message=f"not judged: {node.name} {why}"))
            continue
        o, r = mine[0]
        partner = _other(o, node.name)
        if unreached := ssh_failure(o, node.name):
            # A host that did not answer ssh (no route, refused, timed out) in its only pair, with no known-good
            # node to try it again with: it ran nothing, so nothing says it is bad rather than down for a while.
            # Said first: where neither side of a pair answered, each is not reached, not the other's partner.
            results.append(
                Result(
                    **subject,
                    status=Status.ERROR,
                    message=f"not reached: {unreached}",
                    remediation=f"check that {node.host} is up and sshd answers (`ssh -o BatchMode=yes HOST true` "
                    "from this host), then rerun localize",
                )
            )
        elif partner in findings.unreached or ssh_failure(o, partner):
            # Its partner ran nothing (ssh failed there) and localize stopped this side: nothing is said of it.
            results.append(
                Result(
                    **subject,
                    status=Status.INFO,
                    message=f"not judged: its pair's partner {partner} was not reached (localize stopped "
                    f"{node.name}'s side), and no known-good node was free to pair it with",
                )
            )
        elif r.status is Status.PASS:
            results.append(
                Result(
                    **subject,
                    status=Status.PASS,
                    message=f"{node.name} passes with {partner} ({r.message})",
                    expected=r.expected,
                    threshold_source=r.threshold_source,
                )
            )
        elif r.status is Status.INFO:
            reason = r.message.removeprefix("not judged: ")
            results.append(
                Result(**subject, status=Status.INFO, message=f"not judged: its pair with {partner}: {reason}")
            )
        elif slow_gpus.get(partner):
            results.append(
                Result(
                    **subject,
                    status=Status.INFO,  # measured, and not to be held against it: shown, not judged
                    message=f"not judged: {node.name}'s only pair failed, which its partner {partner}'s slow GPU "
                    "explains; no known-good node was free to clear it",
                )
            )
        else:
            results.append(
                Result(
                    **subject,
                    status=Status.WARN,
                    message=f"suspect, not narrowed down: {node.name}'s pair with {partner} failed and no known-good "
                    "node was free to re-pair it with",
                    remediation="rerun localize with more nodes (a node of a passing pair tells the two apart)",
                )
            )
    for racks, rs in sorted(findings.racks.items()):
        towards = sorted({n.rack or "" for o, _r in rs for n in o.pair.nodes if n.rack not in racks})
        if len(racks) == 1:
            where = f"rack {racks[0]}'s uplinks"
            message = (
                f"{where}: {len(rs)} pairs from it to racks {', '.join(towards)} failed while each of their "
                "nodes passes with known-good ones (its nodes pass within the rack)"
            )
        else:
            where = f"the uplinks of rack {racks[0]} or {racks[1]}"
            message = (
                f"{where}: {len(rs)} pairs between the two racks failed while each of their nodes passes with "
                "known-good ones; with two racks, pairs cannot tell which leaf switch's uplinks"
            )
        results.append(
            Result(
                name="localize.rack",
                subject="rack " + " + ".join(racks),
                status=Status.FAIL,
                category=CLUSTER,
                message=message,
                threshold_source="localize: failed cross-rack pairs whose nodes are cleared",
                remediation=f"check the cables and ports between {' and '.join(racks)}'s leaf switch(es) and the "
                "spines (port error counters, ibdiagnet, link speeds)",
                details={"racks": list(racks), "pairs": [o.pair.subject for o, _r in rs], "towards": towards},
            )
        )
    for rs in findings.links.values():
        if any(r.status is Status.PASS for _o, r in rs):
            continue  # failed once, passed when run again: a noisy reading, not a bad link
        o, r = rs[-1]
        slowed = sum(x.ran for x, _r in rs)
        # One slow run is what noise gives one time in 500 (LINK_RUNS): named a suspect, not a bad link.
        if slowed >= 2:
            said = f"bad link {o.pair.subject}: each node passes with a known-good node, but not with the other "
        elif slowed and len(rs) == 1:
            said = (
                f"suspect link {o.pair.subject}, not confirmed: each node passes with a known-good node, but their "
                "pair failed its one run and the rounds ended before a second (localize.max_rounds) "
            )
        elif slowed:
            said = (
                f"suspect link {o.pair.subject}, not confirmed: each node passes with a known-good node; their pair "
                f"was slow once and gave no result in the other {len(rs) - 1} run(s) "
            )
        else:
            said = f"the pair job {o.pair.subject} gave no result, although each node passes with a known-good node "
        results.append(
            Result(
                name="localize.link",
                subject=o.pair.subject,
                status=Status.FAIL if slowed >= 2 else Status.WARN,
                category=CLUSTER,
                message=said + f"({len(rs)} of {len(rs)} runs failed; {r.message})",
                threshold_source="localize: both nodes cleared by re-pairs",
                remediation="the path between these two nodes is slow: check the switch ports and cables on "
                "it (ibdiagnet, port error counters) and the rails each NIC is on",
            )
        )
    return results


# The whole search


@dataclass(frozen=True)
class Plan:
    """What localize runs: its nodes, how pair jobs start, where they write, and how they are judged."""

    nodes: list[NodeSpec]
    slurm: bool  # one srun step per pair; else one gpucert per node (ssh for other hosts)
    run_dir: Path
    config: RunConfig  # its localize.seed is the seed drawn for this run
    profile: Profile
    config_path: Path | None
    overrides: tuple[str, ...]


def choose_seed(config: RunConfig) -> int:
    return config.localize.seed if config.localize.seed is not None else secrets.randbelow(2**31)


def _what(config: RunConfig) -> str:
    from gpucert.bench.collectives import format_bytes

    return f"Ring all_gather {format_bytes(config.localize.size_mib * 1024 * 1024)}"


def node_parts(outcomes: Sequence[PairOutcome], figure: str) -> list[dict[str, Any]]:
    """Each node's inventory, health and per-GPU figure (`figure`, e.g. matmul.bf16.8192) from the first pair
    report it is in. Nothing else: the pair jobs' other results judge a benchmark cut down to localize (no
    max-achievable sweep), and their cluster.* judgements cover two nodes, where localize judges them all."""
    parts: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        if o.report is None:
            continue
        for node in o.pair.nodes:
            if node.name in parts or node.name not in o.report.meta.nodes:
                continue
            mine = [r for r in o.report.results if r.node == node.name and (r.category == "health" or r.name == figure)]
            parts[node.name] = {
                "label": node.name,
                "inventory": o.report.nodes.get(node.name, {}),
                "results": [r.to_dict() for r in mine],
            }
    return list(parts.values())


def figure_name(config: RunConfig) -> str:
    return f"matmul.{config.localize.matmul_dtype}.{config.localize.matmul_size}"


def _profile_arg(config: RunConfig, profile: Profile) -> str:
    """The pair jobs' --profile: the one this run resolved (a path made absolute, for every node)."""
    if config.profile == "auto":
        return profile.name
    path = Path(config.profile)
    return str(path.absolute()) if path.suffix in (".yaml", ".yml") else config.profile


def search(
    plan: Plan, say: Callable[[str], None], env: Mapping[str, str]
) -> tuple[list[tuple[PairOutcome, Result]], list[NodeSpec]]:
    """The search with real pair jobs (host list or srun steps): every pair job with its judged result, and the
    nodes round 1 left out."""
    from gpucert.report.cluster import cross_node_outliers

    config, loc = plan.config, plan.config.localize
    rule, what = rule_of(config, plan.profile), _what(config)
    launcher = slurm_launches if plan.slurm else host_launches
    profile_arg = _profile_arg(config, plan.profile)

    def run_round(pairs: list[Pair]) -> list[PairOutcome]:
        jobs = []
        for pair in pairs:
            directory = plan.run_dir / "pairs" / pair.dirname
            args = pair_args(pair, directory, config, profile_arg, plan.config_path, plan.overrides)
            jobs.append((pair, directory, launcher(pair, args, loc.base_port + pair.index, env)))
        say(f"round {pairs[0].round}: {len(pairs)} pair job(s) at once: " + ", ".join(p.subject for p in pairs))
        return run_pairs(jobs, loc.pair_timeout_s, config.runtime.kill_grace_s, say)

    def slow_of(first: list[PairOutcome]) -> dict[str, list[str]]:
        parts = node_parts(first, figure_name(config))
        return slow_gpu_nodes(
            cross_node_outliers([Result.from_dict(r) for p in parts for r in p["results"]], plan.profile)
        )

    return drive(plan.nodes, choose_seed(config), round_budget(loc.max_rounds, len(plan.nodes)), run_round, slow_of,
                 rule, what)  # fmt: skip


def round_budget(max_rounds: int, nodes: int) -> int:
    """Rounds after the first: localize.max_rounds, and at least log2 of the node count. With fewer, on hundreds of
    nodes, a pair that failed late cannot be run again and its link is named on one reading (docs/localize.md:
    false accusations with 3 rounds, none with log2 N, over the simulator's 100 seeds)."""
    return max(max_rounds, math.ceil(math.log2(max(nodes, 2))))


def drive(
    nodes: Sequence[NodeSpec],
    seed: int,
    max_rounds: int,
    run_round: Callable[[list[Pair]], list[PairOutcome]],
    slow_of: Callable[[list[PairOutcome]], Mapping[str, list[str]]],
    rule: Rule,
    what: str,
    screens: int | None = None,
) -> tuple[list[tuple[PairOutcome, Result]], list[NodeSpec]]:
    """The search over `nodes`, whatever runs the pair jobs (`run_round`: real jobs, or the simulator's model
    of them): round 1, then plan_round's rounds until it has nothing left or max_rounds re-pair rounds ran.
    Returns every pair job with its judged result, and the nodes round 1 left out. slow_of names the nodes with
    a slow GPU from round 1's pair jobs; those are never taken as known-good partners."""
    pairs, left_out = screen_pairs(nodes, seed, 1, across=False)
    first = run_round(pairs)
    measured = {id(o): o.busbw_gbps for o in first if o.busbw_gbps is not None and not o.corrupt}
    ran = bool(measured)
    judged = [(o, judge_pair(o, [v for k, v in measured.items() if k != id(o)], rule, what, ran)) for o in first]
    slow = slow_of(first)
    # Round 2 on is held to what passing pairs reached (all measured pairs, where none passed by a rule).
    passing = [o.busbw_gbps for o, r in judged if r.status is Status.PASS and o.busbw_gbps is not None]
    level = passing or list(measured.values())
    screens = default_screens(nodes) if screens is None else screens
    for round_no in range(2, max_rounds + 2):
        later = plan_round(nodes, judged, slow, round_no, seed, screens, max_rounds + 1)
        if not later:
            break
        judged += [(o, judge_pair(o, level, rule, what, ran)) for o in run_round(later)]
    return judged, left_out


def run_localize(request: Any, hosts: Sequence[str] | None, say: Callable[[str], None], env: Mapping[str, str]) -> Any:
    """The whole search from this host (a login node, or the batch host of a Slurm allocation): one report."""
    from gpucert.acceptance import check_output_writable, claim_output, collect_node, load_run_config
    from gpucert.launch.slurm import SlurmError, _run

    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    check_output_writable(request, load_run_config(request))
    work = collect_node(request)
    if work.config.profile == "auto" and not work.inventory.gpu.gpus:
        raise ConfigError(
            f"localize sizes its pair jobs by the nodes' GPU profile, and this host ({work.inventory.hostname}) has "
            "no NVIDIA GPU to choose one by: pass --profile (e.g. h100-sxm, h200; cpu for CPU nodes)"
        )
    if hosts:
        nodes, slurm = parse_hosts(hosts), False
    else:
        try:
            nodes, slurm = slurm_nodes(env, lambda argv: _run(argv)), True
        except SlurmError as exc:
            raise ConfigError(str(exc)) from exc
    # Locked for the whole search: a second localize pointed at the same --output is refused (exit 3).
    with claim_output(request, work, started) as claimed:
        run_dir = claimed.path.absolute()
        earlier = earlier_run(run_dir)
        if earlier is not None:
            raise ConfigError(earlier)
        try:
            (run_dir / "pairs").mkdir()
        except OSError as exc:
            raise ConfigError(f"cannot create the run directory {run_dir}: {exc.strerror or exc}") from exc
        return _search_and_report(request, nodes, slurm, work, run_dir, started, t0, say, env)


def earlier_run(run_dir: Path) -> str | None:
    """Why `run_dir` cannot take a localize run (it holds one already: its pair jobs' directories would mix), or
    None. `gpucert launch slurm localize` asks it too, before the job queues."""
    if (run_dir / "pairs").exists():
        return f"{run_dir.absolute()} holds an earlier localize run (pairs/): choose another --output"
    return None


def _search_and_report(
    request: Any,
    nodes: list[NodeSpec],
    slurm: bool,
    work: Any,
    run_dir: Path,
    started: datetime,
    t0: float,
    say: Callable[[str], None],
    env: Mapping[str, str],
) -> Any:
    import dataclasses

    from gpucert.acceptance import RunOutcome, build_report
    from gpucert.report.store import write_report

    seed = choose_seed(work.config)
    # The seed actually used is in the report's config: `--set localize.seed=N` reruns the same pairs.
    work.config = dataclasses.replace(work.config, localize=dataclasses.replace(work.config.localize, seed=seed))
    overrides = tuple(o for o in request.overrides if not o.startswith("profile="))
    plan = Plan(nodes, slurm, run_dir, work.config, work.profile, request.config_path, overrides)
    how = "one srun step per pair" if slurm else "a host list"
    say(f"localizing over {len(nodes)} nodes ({how}; seed {seed}); pair jobs in {run_dir / 'pairs'}")
    judged, left_out = search(plan, say, env)
    parts = node_parts([o for o, _r in judged], figure_name(work.config))
    report = build_report(request, started, t0, work, parts, [r for _o, r in judged])
    verdicts = conclude(nodes, judged, slow_gpu_nodes(report.results), left_out)
    meta = dataclasses.replace(report.meta, nodes=[n.name for n in nodes])
    report = dataclasses.replace(report, meta=meta, results=[*report.results, *verdicts])
    path = write_report(report, run_dir)
    return RunOutcome(report, path, report.status.exit_code)
