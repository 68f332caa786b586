"""Collective bandwidth, latency and correctness, the torch.distributed counterpart of nccl-tests.

Every rank runs `measure` (through `gpucert bench collectives`, or `launch_local`): per op and per message
size S (a power of two from min_bytes to max_bytes, sized as nccl-tests sizes it) it times batches of
back-to-back calls between one pair of CUDA events, as nccl-tests does (time = elapsed / iters; perf_counter on
gloo). A probe picks the calls per batch so a batch lasts about batch_ms (hundreds of calls for a 1 KiB message,
one for 4 GiB), the same on every rank. On NCCL each batch is a captured CUDA graph by default (cuda_graph,
nccl-tests -G), replayed on a non-blocking stream, so what is timed is NCCL on the GPU and not the 35-45 us of
host work an eager torch.distributed call costs. The timed buffers come from torch's caching allocator, as a
training job's do (buffers=torch); buffers=nccl takes them from ncclMemAlloc, as nccl-tests does, and NCCL then
registers them at capture and copies all_gather, all_to_all and send/recv between them directly, which is where
nccl-tests -G gets its extra 20-50 % on those ops (docs/results/2026-11-22-h200x2-nccl-tests.md). Per size
it keeps each rank's median batch and then the slowest rank's, since a collective is as slow as its slowest
rank. Then it runs the op once more on freshly filled buffers and counts the output elements that differ from
the exactly known answer (`wrong`, summed over ranks).

Reading the output: `time_us` is the time of one op (its latency at small sizes); `busbw_gbps` is comparable
across ops and GPU counts (nccl-tests doc/PERFORMANCE.md) and is judged at the gate size against the
profile's floor for this many GPUs and nodes. Under NVLS, Tree or SHARP, busbw can exceed the wire rate;
network gates therefore force Ring with `ring_env()`, which the launcher must set, since NCCL reads it when the
process group is created.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gpucert.bench.timing import iters_to_fill, time_batches
from gpucert.config.floors import Floor, describe_count, floor_for
from gpucert.config.profiles import Profile
from gpucert.config.run import CollectivesBenchConfig
from gpucert.report.schema import Result
from gpucert.runtime.group import Runtime, gather_to_main
from gpucert.status import Status

# busbw = algbw * factor(n), with n ranks (NVIDIA/nccl-tests doc/PERFORMANCE.md and src/*.cu). S is the
# per-rank buffer for all_reduce, broadcast, all_to_all and send_recv, the gathered buffer for the other two.
BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
REDUCING_OPS = ("all_reduce", "reduce_scatter")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Every integer up to this is exact in the dtype (mantissa bits + 1), so sums of small integers stay exact.
EXACT_INTEGER_MAX = {"bf16": 2**8, "fp16": 2**11, "fp32": 2**24}
# nccl-tests' analyzer warns when repeats spread more than this (stdev / mean).
CV_WARN = 0.05
RING_ENV = {"NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "0", "NCCL_COLLNET_ENABLE": "0"}
# Output buffers start at this value, which no pattern produces, so an element the op never wrote is counted.
SENTINEL = -1.0


def ring_env() -> dict[str, str]:
    """The environment that forces NCCL's Ring algorithm (config bench.collectives.force_ring).

    NCCL reads these when a communicator is created, before `measure` runs, so the launcher sets them:
    gpucert's own launcher starts the ranks with them (bench.suite.rank_env), `launch_local` takes them as
    env_overrides; under an outside torchrun or srun, export them in the job script. `measure` records whether
    they were in effect; `judge` is ERROR if not.
    """
    return dict(RING_ENV)


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor of op over n ranks (all_reduce, n=4: 1.5)."""
    if op not in BUSBW_FACTORS:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(BUSBW_FACTORS)}")
    return BUSBW_FACTORS[op](n)


def bus_bandwidth(op: str, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 B/s) of one op moving size_bytes (S as nccl-tests counts it) in seconds."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * busbw_factor(op, n)


@dataclass(frozen=True)
class Rates:
    time_us: float  # one op, the latency at small sizes
    algbw_gbps: float
    busbw_gbps: float


def batch_rates(op: str, size_bytes: int, calls: int, seconds: float, n: int) -> Rates:
    """What `calls` back-to-back ops of size_bytes on n ranks, taking `seconds` together, amount to (nccl-tests:
    time = elapsed / iters, algbw = S / time, busbw = algbw * factor)."""
    per_op = seconds / calls
    algbw, busbw = bus_bandwidth(op, size_bytes, per_op, n)
    return Rates(per_op * 1e6, algbw, busbw)


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """min_bytes, 2*min_bytes, ... up to max_bytes (nccl-tests -b/-e/-f 2)."""
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise ValueError(f"need 0 < min_bytes <= max_bytes, found {min_bytes} and {max_bytes}")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def element_counts(op: str, size_bytes: int, n: int, element_size: int) -> tuple[int, int, int]:
    """(input elements per rank, output elements per rank, S actually moved) for a nominal S.

    Ops that split a buffer into n chunks round the element count down to a multiple of n, as nccl-tests does.
    """
    count = size_bytes // element_size
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count -= count % n
    if op == "all_gather":
        return count // n, count, count * element_size
    if op == "reduce_scatter":
        return count, count // n, count * element_size
    return count, count, count * element_size


# --- the data pattern and its exact expected outputs ------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    """Rank r's input element i is (i mod period) + (r mod ranks_encoded) * period.

    It varies with the index and the rank (never all zeros, never a constant), repeats every `period` elements, and
    keeps every partial sum an integer no larger than the dtype represents exactly, so the answer of every op
    is known exactly and a single wrong element is counted.
    """

    period: int
    ranks_encoded: int

    def table(self, rank: int) -> list[float]:
        """One period of rank's input."""
        return [float(k + (rank % self.ranks_encoded) * self.period) for k in range(self.period)]

    def sum_table(self, n: int) -> list[float]:
        """One period of the element-wise sum of all n ranks' inputs."""
        rank_part = sum(rank % self.ranks_encoded for rank in range(n)) * self.period
        return [float(n * k + rank_part) for k in range(self.period)]


def choose_pattern(op: str, dtype: str, n: int) -> Pattern | None:
    """The widest pattern whose sums over n ranks stay exact in dtype; None if no useful one fits."""
    # Values are 0..levels-1. A reduction adds n of them, so n * (levels - 1) stays within the exact range;
    # other ops only move values.
    levels = min(256, EXACT_INTEGER_MAX[dtype] // n + 1 if op in REDUCING_OPS else EXACT_INTEGER_MAX[dtype])
    if levels < 2:
        return None
    period = min(8, levels)
    return Pattern(period=period, ranks_encoded=levels // period)


@dataclass(frozen=True)
class Segment:
    """Output elements [offset, offset + length) must equal table[(start + j) % len(table)]."""

    offset: int
    length: int
    table: list[float]
    start: int


def input_segment(pattern: Pattern, rank: int, count: int) -> Segment:
    return Segment(0, count, pattern.table(rank), 0)


def expected_segments(op: str, pattern: Pattern, rank: int, n: int, count_in: int) -> list[Segment]:
    """What rank's output of op must hold, when every rank's input is `pattern` of count_in elements."""
    if op == "all_reduce":
        return [Segment(0, count_in, pattern.sum_table(n), 0)]
    if op == "broadcast":
        return [Segment(0, count_in, pattern.table(0), 0)]
    if op == "all_gather":
        return [Segment(src * count_in, count_in, pattern.table(src), 0) for src in range(n)]
    if op == "reduce_scatter":
        chunk = count_in // n
        return [Segment(0, chunk, pattern.sum_table(n), rank * chunk)]
    if op == "all_to_all":
        chunk = count_in // n
        return [Segment(src * chunk, chunk, pattern.table(src), rank * chunk) for src in range(n)]
    if op == "send_recv":
        partner = send_recv_partner(rank, n)
        return [] if partner is None else [Segment(0, count_in, pattern.table(partner), 0)]
    raise ValueError(f"unknown collective {op!r}")


def send_recv_partner(rank: int, n: int) -> int | None:
    """Ranks pair up 0<->1, 2<->3, ...; with an odd count the last rank idles."""
    partner = rank ^ 1
    return partner if partner < n else None


def fill_segment(buf: torch.Tensor, segment: Segment) -> None:
    """Write segment's values into buf in place, a period at a time (no index tensor of buf's size)."""
    for view, row in _periodic_views(buf, segment):
        view.copy_(row.expand_as(view))


def count_wrong(out: torch.Tensor, segments: list[Segment]) -> int:
    """Elements of out that differ from the segments' values (exact comparison)."""
    wrong = 0
    for segment in segments:
        for view, row in _periodic_views(out, segment):
            wrong += int((view != row).sum().item())
    return wrong


# Rows of one period compared or written at once; bounds the temporary bool tensor of a comparison.
_ROWS_PER_CHUNK = 1 << 22


def _periodic_views(buf: torch.Tensor, segment: Segment) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(view of buf, one period of values, broadcastable against the view) covering the segment."""
    period = len(segment.table)
    phase = segment.start % period
    row = torch.tensor(segment.table[phase:] + segment.table[:phase], dtype=buf.dtype, device=buf.device)
    part = buf[segment.offset : segment.offset + segment.length]
    rows = segment.length // period
    views = []
    for first in range(0, rows, _ROWS_PER_CHUNK):
        last = min(rows, first + _ROWS_PER_CHUNK)
        views.append((part[first * period : last * period].view(last - first, period), row.unsqueeze(0)))
    tail = segment.length - rows * period
    if tail:
        views.append((part[rows * period :], row[:tail]))
    return views


# --- running the ops --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """Where a collective runs: the whole job (group None), or one node's ranks (its group)."""

    rank: int  # within the group
    world_size: int
    device: torch.device
    group: Any = None
    # Global ranks of the group in group-rank order; empty for the whole job (group rank = global rank).
    members: tuple[int, ...] = ()

    def global_rank(self, group_rank: int) -> int:
        return self.members[group_rank] if self.members else group_rank


def job_scope(env: Runtime) -> Scope:
    return Scope(env.rank, env.world_size, env.device)


def node_scope(env: Runtime) -> Scope:
    """This node's ranks (collective: every rank of the job calls it)."""
    members = tuple(p.rank for p in env.peers if p.node_rank == env.node_rank)
    return Scope(members.index(env.rank), len(members), env.device, env.node_group(), members)


def _collective(name: str, fallback: str) -> Any:
    """The new torch name of a collective where this torch has it (2.13 deprecates *_into_tensor)."""
    return getattr(dist, name, None) or getattr(dist, fallback)


def make_call(op: str, inp: torch.Tensor, out: torch.Tensor, env: Scope) -> Callable[[int], object]:
    """One blocking call of op (its argument, the repeat index, is unused); all_reduce and broadcast work in
    place on inp."""
    group = env.group
    if op == "all_reduce":
        return lambda _i: dist.all_reduce(inp, group=group)
    if op == "broadcast":
        src = env.global_rank(0)
        return lambda _i: dist.broadcast(inp, src=src, group=group)
    if op == "all_gather":
        gather = _collective("all_gather_single", "all_gather_into_tensor")
        return lambda _i: gather(out, inp, group=group)
    if op == "reduce_scatter":
        scatter = _collective("reduce_scatter_single", "reduce_scatter_tensor")
        return lambda _i: scatter(out, inp, group=group)
    if op == "all_to_all":
        return lambda _i: dist.all_to_all_single(out, inp, group=group)
    if op == "send_recv":
        partner = send_recv_partner(env.rank, env.world_size)
        if partner is None:
            return lambda _i: None
        peer = env.global_rank(partner)

        def exchange(_i: int) -> None:
            ops = [dist.P2POp(dist.isend, inp, peer, group), dist.P2POp(dist.irecv, out, peer, group)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return exchange
    raise ValueError(f"unknown collective {op!r}")


def _buffers(
    op: str, count_in: int, count_out: int, dtype: torch.dtype, device: torch.device, pool: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The timed input and output; from pool (a torch.cuda.MemPool) when given, else the caching allocator."""
    with torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext():
        inp = torch.empty(count_in, dtype=dtype, device=device)
        out = inp if op in ("all_reduce", "broadcast") else torch.empty(count_out, dtype=dtype, device=device)
    return inp, out


def _nccl_pool(cfg: dict[str, Any], env: Runtime) -> Any:
    """With buffers=nccl, a MemPool whose memory comes from ncclMemAlloc (the process group's mem_allocator),
    as nccl-tests allocates its buffers; None for the caching allocator."""
    if cfg.get("buffers", "torch") != "nccl":
        return None
    backend = dist.group.WORLD._get_backend(env.device)  # type: ignore[union-attr]
    allocator = getattr(backend, "mem_allocator", None)
    if allocator is None or not hasattr(torch.cuda, "MemPool"):
        raise RuntimeError(
            f"bench.collectives.buffers=nccl needs a torch whose NCCL process group has mem_allocator (torch "
            f"{torch.__version__} has not); set bench.collectives.buffers=torch"
        )
    return torch.cuda.MemPool(allocator)


def _fill_inputs(op: str, inp: torch.Tensor, out: torch.Tensor, pattern: Pattern, env: Scope) -> None:
    """Inputs get the pattern; outputs (and broadcast receivers) the sentinel, so unwritten elements show."""
    if op == "broadcast" and env.rank != 0:
        inp.fill_(SENTINEL)
    else:
        fill_segment(inp, input_segment(pattern, env.rank, inp.numel()))
    if out is not inp:
        out.fill_(SENTINEL)


def check_once(op: str, size_bytes: int, dtype: str, env: Scope) -> int:
    """Run op once on freshly filled buffers; this rank's count of wrong output elements."""
    pattern = choose_pattern(op, dtype, env.world_size)
    if pattern is None:
        # Too many ranks for exact sums in this dtype: check the same sizes in fp32 instead.
        dtype = "fp32"
        pattern = choose_pattern(op, dtype, env.world_size)
        assert pattern is not None
    torch_dtype = DTYPES[dtype]
    count_in, count_out, _ = element_counts(op, size_bytes, env.world_size, torch_dtype.itemsize)
    inp, out = _buffers(op, count_in, count_out, torch_dtype, env.device)
    _fill_inputs(op, inp, out, pattern, env)
    make_call(op, inp, out, env)(0)
    return count_wrong(out, expected_segments(op, pattern, env.rank, env.world_size, count_in))


# Back-to-back calls timed to size the batches, after the warm-up, in PROBE_REPEATS batches whose median counts:
# one probe batch alone was sometimes stretched by a stall (a rank arriving late), which left a batch of a single
# call of ~50 us, launch overhead included (lent 2xH200, 2026-11-22, tests/gpu/test_collectives_timing.py).
PROBE_CALLS = 4
PROBE_REPEATS = 5


def _measure_op(
    op: str, sizes: list[int], dtype: str, cfg: dict[str, Any], env: Scope, pool: Any = None
) -> dict[str, Any]:
    """This rank's numbers for op: per size, S moved, calls per batch, median batch seconds, cv, wrong elements.
    The timed buffers come from pool (buffers=nccl) when given; the check's from the caching allocator, so the
    check covers the op's arithmetic, not NCCL's zero-copy path, which only a captured graph takes."""
    torch_dtype = DTYPES[dtype]
    pattern = choose_pattern(op, dtype, env.world_size) or choose_pattern(op, "fp32", env.world_size)
    assert pattern is not None
    rows: dict[str, list[Any]] = {"sizes_bytes": [], "iters": [], "batch_s": [], "cv": [], "wrong": []}
    for size in sizes:
        count_in, count_out, moved = element_counts(op, size, env.world_size, torch_dtype.itemsize)
        if count_out == 0:
            continue
        with _timing_stream(env.device):
            inp, out = _buffers(op, count_in, count_out, torch_dtype, env.device, pool)
            _fill_inputs(op, inp, out, pattern, env)
            call = make_call(op, inp, out, env)
            iters = _agreed_iters(op, size, call, cfg, env)
            replay = None
            if _use_graph(cfg, env.device):
                replay, iters = _graph_batch(op, size, call, iters, cfg["graph_calls"])
            timing = time_batches(call, env.device, warmup=0, iters=iters, repeats=cfg["repeats"], replay=replay)
            # Free the timed buffers before the check allocates its own (4 GiB messages on 80 GB GPUs).
            del inp, out, call, replay
        rows["sizes_bytes"].append(moved)
        rows["iters"].append(iters)
        rows["batch_s"].append(timing.median_s)
        rows["cv"].append(timing.cv)
        rows["wrong"].append(check_once(op, size, dtype, env))
    return rows


def _agreed_iters(op: str, size: int, call: Callable[[int], object], cfg: dict[str, Any], env: Scope) -> int:
    """Warm up, probe one call's time, and size a batch to last batch_ms. Every rank must make the same number
    of calls (a rank that stops early leaves the others waiting), so all take the slowest rank's probe.

    With cuda_graph the probe is a replayed graph of PROBE_CALLS calls: a replayed 8 B all_reduce takes 6 us
    against 35-45 us eager (lent 2xH200), so an eager probe would size graph batches 5-7 times too short.
    """
    probe = time_batches(call, env.device, warmup=cfg["warmup"], iters=PROBE_CALLS, repeats=PROBE_REPEATS)
    if _use_graph(cfg, env.device):
        replay = _captured_batch(op, size, call, PROBE_CALLS)
        probe = time_batches(call, env.device, 0, PROBE_CALLS, PROBE_REPEATS, replay=replay)
        del replay
    slowest = torch.tensor([probe.median_s / PROBE_CALLS], dtype=torch.float64, device=env.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=env.group)
    return iters_to_fill(float(slowest.item()), cfg["batch_ms"] / 1e3, cfg["max_iters"])


def _use_graph(cfg: dict[str, Any], device: torch.device) -> bool:
    """cuda_graph applies on CUDA devices only (gloo on CPUs times eagerly)."""
    return bool(cfg.get("cuda_graph", False)) and device.type == "cuda"


def _timing_stream(device: torch.device) -> Any:
    """Run a size's work on a fresh non-blocking stream (CUDA), as nccl-tests does.

    On the legacy default stream, which synchronises with every other blocking stream, a replayed 8 B
    all_reduce took 16 us against 5.9 on a non-blocking stream, and 1 MiB 25.9 against 14.2 (lent 2xH200,
    2026-11-22, tools/latency_probe.py). Everything of the size (buffers, fill, probe, capture, timing, the
    exchange of probe times) stays on that one stream, so no cross-stream ordering is needed.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.Stream(device))


def graph_split(iters: int, graph_calls: int) -> tuple[int, int]:
    """(calls per graph, launches) for a batch of about iters calls in graphs of at most graph_calls: whole
    graphs, so the batch makes per_graph * launches >= iters calls (time per call divides by that)."""
    if iters < 1 or graph_calls < 1:
        raise ValueError(f"need iters >= 1 and graph_calls >= 1, found {iters} and {graph_calls}")
    per_graph = min(iters, graph_calls)
    return per_graph, -(-iters // per_graph)


def _graph_batch(
    op: str, size: int, call: Callable[[int], object], iters: int, graph_calls: int
) -> tuple[Callable[[], object], int]:
    """A batch of about iters calls as replays of one captured graph of at most graph_calls calls; the replay
    function and the number of calls it makes (a whole number of graphs, so never fewer than iters)."""
    per_graph, launches = graph_split(iters, graph_calls)
    graph = _captured_batch(op, size, call, per_graph)

    def replay() -> None:
        for _ in range(launches):
            graph()

    return replay, per_graph * launches


def _captured_batch(op: str, size: int, call: Callable[[int], object], iters: int) -> Callable[[], object]:
    """iters calls captured as one CUDA graph (nccl-tests -G); its replay launches them all at once.

    The probe ran the op eagerly first, so NCCL's communicator (and its p2p connections, for send/recv)
    exist before the capture, as NCCL's CUDA-graph notes require; every rank captures the same calls.
    """
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for i in range(iters):
                call(i)
    except RuntimeError as exc:
        raise RuntimeError(
            f"bench.collectives.cuda_graph: capturing {iters} calls of {op} at {format_bytes(size)} as a CUDA graph "
            f"failed ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); set "
            "bench.collectives.cuda_graph=false to time eager calls instead"
        ) from exc
    return graph.replay


def _dtype_used(requested: str, backend: str) -> str:
    if requested not in DTYPES:
        raise ValueError(f"bench.collectives.dtype: expected one of {', '.join(DTYPES)}, found {requested!r}")
    # gloo's bf16 reductions are not reliable across versions; fp32 is what gloo is built for.
    return "fp32" if backend == "gloo" and requested == "bf16" else requested


def nccl_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Every NCCL_* variable in effect: they change algorithms, protocols and therefore the numbers."""
    environ = dict(os.environ) if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith("NCCL_")}


def _nccl_version(backend: str) -> str | None:
    if backend != "nccl":
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def measure(env: Runtime, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """Every rank times and checks each op; rank 0 returns {"ops": [...], ...}, other ranks None."""
    for key in ("ops", "intra_node_ops"):
        unknown = [op for op in cfg.get(key, []) if op not in BUSBW_FACTORS]
        if unknown:
            raise ValueError(f"bench.collectives.{key}: unknown {unknown}; known: {', '.join(BUSBW_FACTORS)}")
    dtype = _dtype_used(cfg["dtype"], env.backend)
    if cfg.get("buffers", "torch") == "nccl" and env.backend != "nccl":
        raise ValueError(
            f"bench.collectives.buffers=nccl: ncclMemAlloc buffers need the nccl backend, this run uses "
            f"{env.backend}; set bench.collectives.buffers=torch"
        )
    nccl_env = nccl_environment()
    common: dict[str, Any] = {
        "timing": {
            "method": "batches of back-to-back calls between one pair of events, time = elapsed / calls "
            "(nccl-tests); the slowest rank's median batch",
            "batch_ms": cfg["batch_ms"],
            "repeats": cfg["repeats"],
            "warmup": cfg["warmup"],
            "cuda_graph": _use_graph(cfg, env.device),
            "graph_calls": cfg.get("graph_calls"),
            "buffers": cfg.get("buffers", "torch"),
        },
        "world_size": env.world_size,
        "num_nodes": env.num_nodes,
        "backend": env.backend,
        "dtype_requested": cfg["dtype"],
        "nccl_version": _nccl_version(env.backend),
        "nccl_env": nccl_env,
        "force_ring": cfg.get("force_ring", False),
        "ring_env_in_effect": all(nccl_env.get(k) == v for k, v in RING_ENV.items()),
    }
    if env.world_size < 2:
        return {**common, "applicable": False, "reason": "one rank: a collective needs a peer", "ops": []}
    sizes = message_sizes(cfg["min_bytes"], cfg["max_bytes"])
    # A collective before the first send/recv, so NCCL's lazy p2p setup never is the group's first call.
    dist.barrier()
    # One pool for the whole sweep (buffers=nccl), released at its end: a pool dropped after each size could die
    # while the process group still holds the last eager calls' tensors, which would then be freed into it.
    pool = _nccl_pool(cfg, env)
    ops = []
    for op in cfg["ops"]:
        rows = _measure_op(op, sizes, dtype, cfg, job_scope(env), pool)
        gathered = gather_to_main(env, rows)
        if gathered is not None:
            ops.append(_combine(op, dtype, env.backend, env.world_size, env.num_nodes, gathered, common))
    per_node = [p.node_rank for p in env.peers]
    if env.num_nodes > 1 and all(per_node.count(n) > 1 for n in set(per_node)):
        # Across nodes the network sets the pace; within each node NVLink does: every node measures its own
        # ranks at once, each curve judged against the same per-node floors.
        scope = node_scope(env)
        for op in cfg.get("intra_node_ops", []):
            rows = {**_measure_op(op, sizes, dtype, cfg, scope, pool), "node": env.me.node}
            gathered = gather_to_main(env, rows)
            if gathered is not None:
                for node in dict.fromkeys(r["node"] for r in gathered):
                    mine = [r for r in gathered if r["node"] == node]
                    curve = _combine(op, dtype, env.backend, len(mine), 1, mine, common)
                    ops.append({**curve, "node": node})
    if pool is not None:
        torch.cuda.synchronize(env.device)
        dist.barrier()  # every rank's calls are done (gathers above): nothing of the pool is in flight
        del pool
    return {**common, "applicable": True, "ops": ops} if env.is_main else None


def _combine(
    op: str, dtype: str, backend: str, world_size: int, num_nodes: int, ranks: list[dict[str, Any]], common: dict
) -> dict:
    """One op's curve from every rank's rows: the slowest rank's median batch, the widest cv, wrong summed."""
    sizes, iters = ranks[0]["sizes_bytes"], ranks[0]["iters"]
    rates = [
        batch_rates(op, size, iters[k], max(r["batch_s"][k] for r in ranks), world_size) for k, size in enumerate(sizes)
    ]
    return {
        "op": op,
        "dtype": dtype,
        "world_size": world_size,
        "num_nodes": num_nodes,
        "backend": backend,
        "sizes_bytes": sizes,
        "iters": iters,
        "time_us": [r.time_us for r in rates],
        "algbw_gbps": [r.algbw_gbps for r in rates],
        "busbw_gbps": [r.busbw_gbps for r in rates],
        "cv": [max(r["cv"][k] for r in ranks) for k in range(len(sizes))],
        "wrong": [sum(r["wrong"][k] for r in ranks) for k in range(len(sizes))],
        "cuda_graph": common["timing"]["cuda_graph"],
        "buffers": common["timing"]["buffers"],
        "nccl_version": common["nccl_version"],
        "nccl_env": common["nccl_env"],
    }


# --- judging ----------------------------------------------------------------------------------------------


def format_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def gate_index(sizes_bytes: list[int], gate_bytes: int) -> int | None:
    """Index of the largest measured size <= gate_bytes (None when every size is larger)."""
    below = [k for k, s in enumerate(sizes_bytes) if s <= gate_bytes]
    return max(below, key=lambda k: sizes_bytes[k]) if below else None


def _placed(result: Result, curve: dict[str, Any]) -> Result:
    """A curve of one node's ranks (measured beside the job-wide one) is named and subjected by its node."""
    node = curve.get("node")
    if node is None:
        return result
    subject = f"{node} {job_subject(curve)}"
    return dataclasses.replace(
        result,
        name=f"collective.intra_node.{curve['op']}",
        node=node,
        subject=subject,
        message=result.message.replace(job_subject(curve), subject),
    )


def job_subject(data: dict[str, Any]) -> str:
    """What a collective ran on: `4 ranks (nccl)`, or `2 nodes x 8 ranks (nccl)` across nodes."""
    n, nodes, backend = data.get("world_size", 1), data.get("num_nodes", 1), data.get("backend", "?")
    if nodes > 1:
        return f"{nodes} nodes x {n // nodes} ranks ({backend})"
    return f"{n} rank{'s' if n != 1 else ''} ({backend})"


def judge(data: dict[str, Any], profile: Profile, cfg: CollectivesBenchConfig) -> list[Result]:
    """One Result per op, `collective.<op>`: busbw at the gate size against the profile floor."""
    if not data.get("applicable", True):
        return [
            Result(
                name="collectives",
                subject=job_subject(data),
                status=Status.SKIP,
                message=f"collectives not measured: {data.get('reason', 'not applicable')}",
                category="benchmark",
            )
        ]
    results = [_placed(judge_op(op, profile, cfg), op) for op in data["ops"]]
    if cfg.force_ring and not data.get("ring_env_in_effect", False):
        results.append(
            Result(
                name="collective.force_ring",
                subject=job_subject(data),
                status=Status.ERROR,
                message=f"expected {' '.join(f'{k}={v}' for k, v in RING_ENV.items())} in the workers' "
                f"environment (bench.collectives.force_ring), found {data.get('nccl_env') or 'no NCCL_* variables'}",
                expected=" ".join(f"{k}={v}" for k, v in RING_ENV.items()),
                threshold_source="config: bench.collectives.force_ring",
                remediation="the launcher must set gpucert.bench.collectives.ring_env() before the process group "
                "starts; export it in the job script under srun or an outside torchrun",
                category="benchmark",
            )
        )
    return results


def curve_floor(curve: dict[str, Any], profile: Profile) -> tuple[Floor | None, str]:
    """The profile's busbw floor for this curve's op, GPUs per node and nodes, and the count in words."""
    n, nodes = curve.get("world_size", 1), curve.get("num_nodes") or 1
    if n % nodes:
        return None, f"{n} ranks spread unevenly over {nodes} nodes"
    count = describe_count(n // nodes, nodes)
    return floor_for(profile.benchmarks.busbw_gbps_min.get(curve["op"]), n // nodes, nodes), count


# Sizes whose latency the message names: the smallest ones, where an op's time is its latency.
LATENCY_SIZES_SHOWN = 2


def latency_text(curve: dict[str, Any]) -> str:
    """`latency 24.9 us at 1 KiB, 25.3 us at 2 KiB`: one op's time at the smallest sizes."""
    shown = list(zip(curve["sizes_bytes"], curve["time_us"], strict=True))[:LATENCY_SIZES_SHOWN]
    return "latency " + ", ".join(f"{t:.1f} us at {format_bytes(s)}" for s, t in shown)


def judge_op(curve: dict[str, Any], profile: Profile, cfg: CollectivesBenchConfig) -> Result:
    """Wrong elements FAIL; busbw at the gate size against the floor for this many GPUs; INFO with no floor."""
    op = curve["op"]
    subject = job_subject(curve)
    floor, count = curve_floor(curve, profile)
    field_name = f"benchmarks.busbw_gbps_min.{op}"
    base: dict[str, Any] = dict(
        name=f"collective.{op}", subject=subject, unit="GB/s", category="benchmark", details=curve
    )
    sizes = curve["sizes_bytes"]
    bad = [(s, w) for s, w in zip(sizes, curve["wrong"], strict=True) if w]
    k = gate_index(sizes, cfg.gate_bytes)
    if k is None:
        return Result(
            **base,
            status=Status.ERROR,
            message=f"no measured {op} size at or below gate_bytes {format_bytes(cfg.gate_bytes)} "
            f"(measured {format_bytes(sizes[0]) if sizes else 'nothing'} and up)",
            threshold_source="config: bench.collectives.gate_bytes",
            remediation="set bench.collectives.gate_bytes within min_bytes..max_bytes",
        )
    busbw, cv, at = curve["busbw_gbps"][k], curve["cv"][k], format_bytes(sizes[k])
    expected = f">= {floor.value:g} GB/s busbw at {at}" if floor is not None else None
    base.update(value=busbw, expected=expected)
    where = f"{op} on {subject}, {curve['dtype']}"
    if curve.get("buffers") == "nccl":
        where += ", ncclMemAlloc buffers"  # zero-copy in graphs: faster than a training job's buffers get
    latency = latency_text(curve)
    if bad:
        listed = ", ".join(f"{w} at {format_bytes(s)}" for s, w in bad)
        base["expected"] = "0 wrong elements" if floor is None else f"{expected}, 0 wrong elements"
        return Result(
            **base,
            status=Status.FAIL,
            threshold_source="correctness: exact expected output",
            message=f"expected 0 wrong output elements, found {listed}, on {where}",
            remediation="wrong collective results mean data corruption on a GPU, NVLink or NIC: rerun per GPU "
            "pair / per node to localise it, check XIDs and NVLink/IB error counters, drain the node",
        )
    if floor is None:
        return Result(
            **base,
            status=Status.INFO,
            message=f"shown, not judged: profile {profile.name} sets no {field_name} for {count}; "
            f"{busbw:.1f} GB/s busbw at {at}, {latency} ({where}); 0 wrong elements at every size",
        )
    if curve.get("buffers", "torch") != "torch":
        # The floors were measured on caching-allocator buffers; zero-copy on ncclMemAlloc buffers lifts
        # all_gather, all_to_all and send/recv by up to 50 %, so those floors would pass a link 15 % slow.
        return Result(
            **{**base, "expected": None},
            status=Status.INFO,
            message=f"shown, not judged: {field_name} is set for bench.collectives.buffers=torch; "
            f"{busbw:.1f} GB/s busbw at {at}, {latency} ({where}); 0 wrong elements at every size",
        )
    base["threshold_source"] = f"profile {profile.name}: {field_name}{floor.entry}"
    if busbw < floor.value:
        return Result(
            **base,
            status=Status.FAIL,
            message=f"expected busbw >= {floor.value:g} GB/s at {at}, found {busbw:.1f} GB/s, on {where}; {latency}",
            remediation="check NVLink state (nvidia-smi nvlink -s), GPU clocks and the NCCL_* settings in details; "
            "run p2p to find a weak GPU pair; on several nodes check IB port rates and run per-rail pairs",
        )
    if cv > CV_WARN:
        return Result(
            **base,
            status=Status.WARN,
            message=f"expected repeat spread (cv) <= {CV_WARN:g} at {at}, found {cv:.3f} "
            f"({busbw:.1f} GB/s busbw), on {where}; {latency}",
            remediation="something else is using the GPUs or the network: rerun on an idle node, or raise "
            "bench.collectives.repeats",
        )
    return Result(
        **base,
        status=Status.PASS,
        message=f"{busbw:.1f} GB/s busbw at {at}, floor {floor.value:g} for {count}; {latency} ({where})",
    )
