"""A model of a cluster for `gpucert cluster localize`: the real planner and judges (localize.drive, judge_pair,
plan_round, conclude, and the cross-node GPU outlier rule) run on modelled pair jobs, and what they name is
scored against the faults injected.

    python -m gpucert.cluster.localize_sim --nodes 1024 --faults node,link --seeds 100
    python -m gpucert.cluster.localize_sim --table --seeds 100                   # docs/localize.md's first table
    python -m gpucert.cluster.localize_sim --table --seeds 30 --racks-unknown    # its second

Each line says, over the seeds: rounds (mean and most), pair jobs, modelled wall time, faults found of those
injected, false accusations (a FAIL naming a healthy node, link or rack: the number that must stay 0), and
suspicions of healthy nodes (WARN). Exhaustive pairwise testing is N-1 rounds of N/2 pairs in the same model.

The model (assumptions, not measurements, except where said; docs/localize.md lists them):
- N nodes of 8 GPUs in racks of `rack_size` under one leaf switch each, a non-blocking fabric above.
- A pair job's Ring all_gather busbw: 360 GB/s (two 8x400G nodes), times each node's NIC factor (1 % spread),
  per-run noise (2 %), and one run in 500 hit by transient congestion (70-90 %).
- Each GPU's bf16 matmul: 700 TFLOP/s with 2 % spread between GPUs and 1 % per run. Healthy parts' spreads
  are cut at 2.5 sd (a GPU 5 % or a NIC 2.5 % below the others is a fault, injected as one).
- A pair job takes 30 +- 3 s to start and 14 s to run (the 2xH200 pair job of tests/fixtures/localize took 44 s);
  one that crashes ends early; pair jobs start at 50 per second (srun steps or ssh from one host).
- Faults: `node` (its NICs at 40-70 %), `dead` (cannot run a pair job), `link` (one leaf-to-spine uplink of a
  rack at half rate: a cross-rack pair from that rack hashes onto it one run in two), `gpu` (one GPU at 50-80 %),
  `flaky` (its pair job crashes one run in three).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpucert.cluster.localize import (
    PARTNER_GRACE_S,
    NodeSpec,
    Pair,
    PairOutcome,
    conclude,
    drive,
    round_budget,
    rule_of,
    slow_gpu_nodes,
)
from gpucert.config.profiles import load_profile
from gpucert.config.run import RunConfig
from gpucert.report.cluster import cross_node_outliers
from gpucert.report.schema import Result
from gpucert.status import Status

KINDS = ("node", "dead", "link", "gpu", "flaky")
NODE_KINDS = ("node", "dead", "gpu", "flaky")
PROFILE = "h100-sxm"


@dataclass(frozen=True)
class Model:
    """The cluster's numbers (see the module docstring for where they come from)."""

    busbw_gbps: float = 360.0
    nic_spread: float = 0.01
    noise: float = 0.02
    blip_p: float = 0.002
    blip: tuple[float, float] = (0.7, 0.9)
    gpus: int = 8
    tflops: float = 700.0
    gpu_spread: float = 0.02
    gpu_noise: float = 0.01
    bad_nic: tuple[float, float] = (0.4, 0.7)
    slow_gpu: tuple[float, float] = (0.5, 0.8)
    uplink_hit_p: float = 0.5
    uplink_factor: float = 0.5
    flaky_p: float = 1 / 3
    start_s: float = 30.0
    start_sd_s: float = 3.0
    run_s: float = 14.0
    launch_per_s: float = 50.0
    rack_size: int = 32


@dataclass(frozen=True)
class Fault:
    kind: str  # one of KINDS
    where: str  # a node's name; a rack's for `link`


@dataclass
class Cluster:
    nodes: list[NodeSpec]
    rack_of: dict[str, str]
    faults: list[Fault]
    nic: dict[str, float]
    gpu_base: dict[str, list[float]]
    model: Model
    rng: random.Random

    def kind_of(self, name: str) -> str | None:
        return next((f.kind for f in self.faults if f.where == name and f.kind != "link"), None)

    @property
    def bad_racks(self) -> set[str]:
        return {f.where for f in self.faults if f.kind == "link"}


def build(n: int, kinds: Sequence[str], seed: int, racks_known: bool, model: Model = Model()) -> Cluster:
    """N nodes with one fault of each kind in `kinds` (a kind twice: two faults of it), placed by `seed`."""
    rng = random.Random(seed)
    size = min(model.rack_size, max(2, n // 4))  # at least four racks, so there is a fabric above the leaves
    names = [f"n{i:04d}" for i in range(n)]
    rack_of = {name: f"r{i // size:02d}" for i, name in enumerate(names)}
    nodes = [NodeSpec(name, name, rack=rack_of[name] if racks_known else None) for name in names]
    picked = rng.sample(names, sum(k in NODE_KINDS for k in kinds))
    racks = sorted(set(rack_of.values()))
    faults: list[Fault] = []
    for kind in kinds:
        if kind == "link":
            faults.append(Fault(kind, rng.choice([r for r in racks if r not in {f.where for f in faults}])))
        else:
            faults.append(Fault(kind, picked.pop()))
    nic = {name: _healthy(rng, model.nic_spread) for name in names}
    gpu_base = {name: [model.tflops * _healthy(rng, model.gpu_spread) for _ in range(model.gpus)]
                for name in names}  # fmt: skip
    for f in faults:
        if f.kind == "node":
            nic[f.where] *= rng.uniform(*model.bad_nic)
        elif f.kind == "gpu":
            gpu_base[f.where][rng.randrange(model.gpus)] *= rng.uniform(*model.slow_gpu)
    return Cluster(nodes, rack_of, faults, nic, gpu_base, model, rng)


def _healthy(rng: random.Random, spread: float) -> float:
    """A healthy part's factor: normal, cut at 2.5 spreads (one further off is a fault, which `kinds` injects)."""
    return 1.0 + max(-2.5 * spread, min(2.5 * spread, rng.gauss(0.0, spread)))


def run_pair(cluster: Cluster, pair: Pair) -> tuple[PairOutcome, float]:
    """One modelled pair job: what it measured (or why not) and how long it took, in seconds."""
    m, rng = cluster.model, cluster.rng
    a, b = (n.name for n in pair.nodes)
    took = max(5.0, rng.gauss(m.start_s, m.start_sd_s))
    where = Path("sim") / pair.dirname
    for name in (a, b):
        kind = cluster.kind_of(name)
        if kind == "dead":
            error = f"{name}: exit code 255: ssh: connect to host {name} port 22: No route to host (modelled)"
            return PairOutcome(pair, where, error=error, exits={name: 255}), 1.0
        if kind == "flaky" and rng.random() < m.flaky_p:
            error = f"{name}: exit code 1: gpucert: error: NCCL error: unhandled system error (modelled)"
            return PairOutcome(pair, where, error=error, exits={name: 1}), took + rng.uniform(
                0, m.run_s
            ) + PARTNER_GRACE_S
    busbw = m.busbw_gbps * min(cluster.nic[a], cluster.nic[b]) * rng.gauss(1.0, m.noise)
    if rng.random() < m.blip_p:
        busbw *= rng.uniform(*m.blip)
    ra, rb = cluster.rack_of[a], cluster.rack_of[b]
    if ra != rb and {ra, rb} & cluster.bad_racks and rng.random() < m.uplink_hit_p:
        busbw *= m.uplink_factor
    return PairOutcome(pair, where, busbw_gbps=busbw, exits={a: 0, b: 0}), took + m.run_s


def gpu_results(cluster: Cluster, outcomes: Sequence[PairOutcome]) -> list[Result]:
    """Every GPU's matmul figure from the pair jobs that ran, as a pair job's report carries it."""
    m, rng = cluster.model, cluster.rng
    results = []
    seen: set[str] = set()
    for o in outcomes:
        for node in o.pair.nodes:
            if not o.ran or node.name in seen:
                continue
            seen.add(node.name)
            for i, base in enumerate(cluster.gpu_base[node.name]):
                value = base * rng.gauss(1.0, m.gpu_noise)
                results.append(Result(name="matmul.bf16.8192", subject=f"{node.name} GPU {i}", status=Status.PASS,
                                      message="modelled", expected="modelled", threshold_source="localize_sim",
                                      value=value, unit="TFLOP/s", category="benchmark", gpu_index=i,
                                      node=node.name))  # fmt: skip
    return results


@dataclass
class Outcome:
    """One simulated search: its cost and what it named, scored."""

    rounds: int
    pair_jobs: int
    wall_s: float
    found: int  # injected faults named (a node's FAIL; a rack's FAIL or, racks unknown, a link through it)
    faults: int
    false: list[str] = field(default_factory=list)  # FAILs naming nothing faulty
    wrong_warns: list[str] = field(default_factory=list)  # WARNs on healthy nodes
    named: list[str] = field(default_factory=list)


def score(cluster: Cluster, results: Sequence[Result]) -> tuple[int, list[str], list[str], list[str]]:
    bad_nodes = {f.where for f in cluster.faults if f.kind != "link"}
    bad_racks = cluster.bad_racks
    found: set[str] = set()
    false, warns, named = [], [], []
    for r in results:
        if r.status is Status.FAIL:
            named.append(f"{r.name} {r.subject}")
        if r.name == "localize.node":
            if r.status is Status.FAIL:
                (found.add(r.subject) if r.subject in bad_nodes else false.append(r.subject))
            elif r.status is Status.WARN and r.subject not in bad_nodes:
                warns.append(r.subject)
        elif r.name == "localize.rack" and r.status is Status.FAIL:
            racks = set(r.details["racks"])
            (found.update(racks & bad_racks) if racks & bad_racks else false.append(r.subject))
        elif r.name == "localize.link" and r.status is Status.FAIL:
            a, b = r.subject.split(" <-> ")
            ra, rb = cluster.rack_of[a], cluster.rack_of[b]
            through = {ra, rb} & bad_racks if ra != rb else set()
            if through:
                found.update(through)  # racks unknown, a link through the bad uplink is as near as it gets
            elif not {a, b} & bad_nodes:
                false.append(r.subject)
    return len(found & (bad_nodes | bad_racks)), false, warns, named


def simulate(
    n: int, kinds: Sequence[str], seed: int, racks_known: bool = True, max_rounds: int | None = None,
    model: Model = Model(), screens: int | None = None,
) -> Outcome:  # fmt: skip
    """One search over a modelled cluster of n nodes with the faults `kinds`; max_rounds (rounds after the first)
    defaults to localize's budget (log2 n from 8 nodes on); screens (rounds that pair every free node) to
    localize's default."""
    cluster = build(n, kinds, seed, racks_known, model)
    profile = load_profile(PROFILE)
    rule = rule_of(RunConfig(), profile)
    walls: list[float] = []

    def run_round(pairs: list[Pair]) -> list[PairOutcome]:
        done = [run_pair(cluster, p) for p in pairs]
        walls.append(max(i / model.launch_per_s + took for i, (_o, took) in enumerate(done)))
        return [o for o, _took in done]

    slow: dict[str, list[str]] = {}

    def slow_of(first: list[PairOutcome]) -> dict[str, list[str]]:
        slow.update(slow_gpu_nodes(cross_node_outliers(gpu_results(cluster, first), profile)))
        return slow

    rounds = max_rounds if max_rounds is not None else round_budget(RunConfig().localize.max_rounds, n)
    judged, left_out = drive(cluster.nodes, seed, rounds, run_round, slow_of, rule, "Ring all_gather 1 GiB", screens)
    results = conclude(cluster.nodes, judged, slow, left_out)
    found, false, warns, named = score(cluster, results)
    return Outcome(len(walls), len(judged), sum(walls), found, len(cluster.faults), false, warns, named)


def pairwise_wall_s(n: int, model: Model = Model(), seed: int = 0) -> float:
    """Exhaustive pairwise testing in the same model: every pair once, N/2 at a time, N-1 rounds (N even)."""
    rng = random.Random(seed)
    per = n // 2
    sample = [max(i / model.launch_per_s + max(5.0, rng.gauss(model.start_s, model.start_sd_s)) + model.run_s
                  for i in range(per)) for _ in range(5)]  # fmt: skip
    return (n - 1 if n % 2 == 0 else n) * statistics.mean(sample)


@dataclass
class Row:
    n: int
    kinds: tuple[str, ...]
    racks_known: bool
    seeds: int
    rounds_mean: float
    rounds_max: int
    jobs_mean: float
    wall_mean_s: float
    found: int
    faults: int
    false: int
    false_seeds: int
    wrong_warns: int
    pairwise_s: float


def sweep(
    n: int,
    kinds: Sequence[str],
    seeds: int,
    racks_known: bool = True,
    screens: int | None = None,
    model: Model = Model(),
    max_rounds: int | None = None,
) -> Row:
    runs = [simulate(n, kinds, s, racks_known, max_rounds, model, screens) for s in range(seeds)]
    return Row(
        n, tuple(kinds), racks_known, seeds,
        statistics.mean(r.rounds for r in runs), max(r.rounds for r in runs),
        statistics.mean(r.pair_jobs for r in runs), statistics.mean(r.wall_s for r in runs),
        sum(r.found for r in runs), sum(r.faults for r in runs),
        sum(len(r.false) for r in runs), sum(bool(r.false) for r in runs),
        sum(len(r.wrong_warns) for r in runs), pairwise_wall_s(n),
    )  # fmt: skip


HEADER = (
    "| N | faults | racks | seeds | rounds (mean / max) | pair jobs | wall (min) | found | false accusations "
    "(seeds) | healthy nodes warned | pairwise (h) | faster |\n"
    "|---:|---|---|---:|---|---:|---:|---|---|---:|---:|---:|"
)


def markdown(row: Row) -> str:
    faults = "+".join(row.kinds) or "none"
    return (
        f"| {row.n:,} | {faults} | {'known' if row.racks_known else 'unknown'} | {row.seeds} | "
        f"{row.rounds_mean:.1f} / {row.rounds_max} | {row.jobs_mean:,.0f} | {row.wall_mean_s / 60:.1f} | "
        f"{row.found} / {row.faults} | {row.false} ({row.false_seeds}) | {row.wrong_warns} | "
        f"{row.pairwise_s / 3600:,.1f} | {row.pairwise_s / row.wall_mean_s:,.0f}x |"
    )


SCENARIOS: tuple[tuple[str, ...], ...] = (
    (),
    ("node",),
    ("dead",),
    ("link",),
    ("gpu",),
    ("flaky",),
    ("node", "node"),
    ("node", "link"),
    ("node", "gpu", "flaky", "link"),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpucert.cluster.localize_sim", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--nodes", type=int, nargs="+", help="N (default: 64; with --table, 16 64 256 1024)")
    parser.add_argument("--faults", default="node", help=f"comma-separated, of {', '.join(KINDS)}; 'none' for none")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--racks-unknown", action="store_true", help="plan without rack labels")
    parser.add_argument("--screens", type=int, help="rounds that pair every free node (default: localize's)")
    parser.add_argument("--max-rounds", type=int, help="rounds after the first (default: ceil(log2 N))")
    parser.add_argument("--gpu-spread", type=float, default=Model.gpu_spread, help="GPU-to-GPU matmul spread (sd)")
    parser.add_argument("--table", action="store_true", help="every N of 16..1,024 and every scenario")
    args = parser.parse_args(argv)
    kinds = [] if args.faults == "none" else args.faults.split(",")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"--faults: unknown kind(s) {', '.join(unknown)}; expected {', '.join(KINDS)}")
    # Refused here, not as a traceback from inside the sweep: a pair needs two nodes, each node fault a node of
    # its own, an average at least one seed.
    faulty = sum(k in NODE_KINDS for k in kinds)
    for n in args.nodes or []:
        if n < max(2, faulty):
            parser.error(
                f"--nodes {n}: localize pairs nodes, and {faulty} node fault(s) need a node each: give >= "
                f"{max(2, faulty)}"
            )
    for flag, value in (("--seeds", args.seeds), ("--screens", args.screens), ("--max-rounds", args.max_rounds)):
        least = 1 if flag == "--seeds" else 0
        if value is not None and value < least:
            parser.error(f"{flag} must be >= {least}, found {value}")
    if args.gpu_spread < 0:
        parser.error(f"--gpu-spread is a standard deviation: >= 0, found {args.gpu_spread:g}")
    print(HEADER)
    if args.table:
        for n in args.nodes or (16, 64, 256, 1024):
            for scenario in SCENARIOS:
                print(markdown(sweep(n, scenario, args.seeds, not args.racks_unknown)), flush=True)
        return 0
    for n in args.nodes or [64]:
        model = Model(gpu_spread=args.gpu_spread)
        row = sweep(n, kinds, args.seeds, not args.racks_unknown, args.screens, model, args.max_rounds)
        print(markdown(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
