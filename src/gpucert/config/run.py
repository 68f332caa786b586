"""The config tree of `gpucert discover | health | accept`.

Each field says what it changes; units live in the names. YAML files (`--config`) fill it and `--set
health.expected_gpus=8` overrides one key; the resolved tree is saved in every report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpucert.runtime.config import MAX_SECONDS, RuntimeConfig

GIB = 1 << 30
MIB = 1 << 20

# What the benchmarks can run, kept here without torch so a bad name is refused before any worker starts (the
# light install has no torch). tests/config/test_validation.py checks them against the bench modules:
# matmul.PEAK_RATIO, collectives.BUSBW_FACTORS and DTYPES, train_proxy.PRESETS.
MATMUL_DTYPES = ("bf16", "fp16", "tf32", "fp8", "fp32")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
COLLECTIVE_DTYPES = ("bf16", "fp16", "fp32")
COLLECTIVE_BUFFERS = ("torch", "nccl")
TRAIN_MODELS = ("1b", "tiny")
# train.loss_decreasing compares the first 3 losses with the last 3 (train_proxy.LOSS_WINDOW): fewer steps
# cannot be judged.
TRAIN_MIN_STEPS = 6

# The largest buffer one benchmark may ask for. Each holds two or three of its size at once (a collective's
# input and output, STREAM's a, b and c, a p2p source and target on every GPU), so 32 GiB is already 64-96 GiB
# on one GPU: what an 80 GB H100 to a 141 GB H200 can hold beside NCCL's buffers and the CUDA context. Above
# it a run cannot fit; under gloo the buffers are host memory, once per rank (a 1 TiB message ran 230 s into
# the OOM killer).
MAX_BUFFER_BYTES = 32 * GIB
# The longest timed batch of collectives: 23 sizes x 6 ops x repeats batches of this already take minutes.
MAX_BATCH_MS = 1000.0
# The largest square matmul: its fp32 A, B and C (3 x 4 x N^2 bytes) are 48 GiB at 65536.
MAX_MATMUL_SIZE = 65536


def _at_least(key: str, value: float, low: float) -> list[str]:
    return [] if value >= low else [f"{key} must be >= {low}, found {value}"]


def _positive(key: str, value: float) -> list[str]:
    if not value > 0:
        return [f"{key} must be > 0, found {value}"]
    seconds = value * 3600 if key.endswith("_h") else value
    if key.endswith(("_s", "_h")) and seconds > MAX_SECONDS:
        return [f"{key} must be at most 30 days ({MAX_SECONDS:g} s), found {value:g}"]
    return []


def _mib_in_range(key: str, value: int) -> list[str]:
    cap = MAX_BUFFER_BYTES // MIB
    if 1 <= value <= cap:
        return []
    why = "" if value < 1 else f" ({cap // 1024} GiB: the benchmark holds 2-3 buffers of this size on a GPU)"
    return [f"{key} must be in 1..{cap}{why}, found {value}"]


def _known(key: str, values: list[str], allowed: tuple[str, ...], empty_ok: bool = False) -> list[str]:
    if not values and not empty_ok:
        return [f"{key} must name at least one of {', '.join(allowed)}, found []"]
    unknown = [v for v in values if v not in allowed]
    return [f"{key}: unknown {', '.join(map(repr, unknown))}; expected any of {', '.join(allowed)}"] if unknown else []


@dataclass(frozen=True)
class HealthConfig:
    # GPUs this node must show. None takes the profile's gpus_per_node; 0 turns the count check off.
    expected_gpus: int | None = None
    # Run a small matmul on every GPU and check its result (the only check that proves a GPU computes).
    liveness: bool = True
    # Kernel log XID events newer than this count against the node.
    xid_window_h: float = 24.0
    # Seconds an external command (nvidia-smi, dmesg) may take before its check is ERROR.
    command_timeout_s: float = 20.0

    def problems(self) -> list[str]:
        found = [] if self.expected_gpus is None else _at_least("health.expected_gpus", self.expected_gpus, 0)
        return (
            found
            + _positive("health.xid_window_h", self.xid_window_h)
            + _positive("health.command_timeout_s", self.command_timeout_s)
        )


@dataclass(frozen=True)
class MatmulBenchConfig:
    # Square seed sizes (M = N = K) timed per dtype; dtypes a GPU cannot run (fp8 before Hopper) are SKIP.
    dtypes: list[str] = field(default_factory=lambda: ["bf16", "fp16", "tf32", "fp8"])
    sizes: list[int] = field(default_factory=lambda: [4096, 8192, 16384])
    # Seconds for the max-achievable (MAMF-style) shape sweep per GPU, bf16 only; 0 turns it off.
    sweep_budget_s: float = 60.0
    # The GPU runs this long before anything is timed: a cold H100 reports clocks it cannot sustain.
    warmup_s: float = 10.0
    repeats: int = 30

    def problems(self) -> list[str]:
        found = _known("bench.matmul.dtypes", self.dtypes, MATMUL_DTYPES)
        if not self.sizes:
            found.append("bench.matmul.sizes must name at least one size, found []")
        bad = [n for n in self.sizes if not 1 <= n <= MAX_MATMUL_SIZE]
        if bad:
            found.append(f"bench.matmul.sizes must each be in 1..{MAX_MATMUL_SIZE}, found {bad}")
        return [
            *found,
            *_at_least("bench.matmul.sweep_budget_s", self.sweep_budget_s, 0),
            *_at_least("bench.matmul.warmup_s", self.warmup_s, 0),
            *_at_least("bench.matmul.repeats", self.repeats, 1),
        ]


# What the burn benchmark's load can be made of (fp8 needs scales and is left to the matmul benchmark).
BURN_DTYPES = ("bf16", "fp16", "tf32", "fp32")
# Fewer windows than this have no median worth judging.
BURN_MIN_WINDOWS = 3
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration_s(text: str) -> float:
    """'90s', '10m', '1h', '1.5h' or plain seconds ('45') as seconds; ValueError says what is accepted."""
    value = text.strip().lower()
    scale = _DURATION_UNITS.get(value[-1:])
    try:
        seconds = float(value[:-1] if scale else value) * (scale or 1.0)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(
            f"expected a duration such as 90s, 10m or 1h (a positive number; unit s, m or h), found {text!r}"
        )
    if seconds > MAX_SECONDS:
        raise ValueError(f"at most 30 days (720h), found {text!r}")
    return seconds


@dataclass(frozen=True)
class BurnBenchConfig:
    # Seconds every GPU stays under matmul load, all at once: 30 s in accept; `gpucert bench burn --duration 10m`
    # for a burn-in. A GPU is judged by its median window, so one slow most of the time cannot hide behind a peak.
    duration_s: float = 30.0
    # Throughput is recorded per window of about this length (TFLOP/s over time; the median is judged).
    window_s: float = 1.0
    # The square matmul (M = N = K) repeated as load: 8192^3 bf16 is gpu-fryer's load (~1.4 ms on an H100).
    size: int = 8192
    # bf16 on GPUs (the profile's burn floor is for bf16); CPU ranks run fp32 (the cpu profile sets it).
    dtype: str = "bf16"
    # Every GPU also multiplies identical seeded inputs before and after the load and compares result checksums
    # with itself and the other GPUs: a GPU whose bits differ from the majority computes wrong.
    sdc_check: bool = True

    def problems(self) -> list[str]:
        key = "bench.burn"
        found = [
            *_positive(f"{key}.duration_s", self.duration_s),
            *_positive(f"{key}.window_s", self.window_s),
        ]
        if self.duration_s > 0 and self.window_s > 0 and self.duration_s < BURN_MIN_WINDOWS * self.window_s:
            found.append(
                f"{key}.duration_s must be >= {BURN_MIN_WINDOWS} x {key}.window_s ({self.window_s} s) so a median "
                f"window can be judged, found {self.duration_s}"
            )
        if not 1 <= self.size <= MAX_MATMUL_SIZE:
            found.append(f"{key}.size must be in 1..{MAX_MATMUL_SIZE}, found {self.size}")
        if self.dtype not in BURN_DTYPES:
            found.append(f"{key}.dtype must be one of {', '.join(BURN_DTYPES)}, found {self.dtype!r}")
        return found


@dataclass(frozen=True)
class MemoryBenchConfig:
    # Each device buffer; far above L2 (50-60 MB on H100/H200) so the cache cannot flatter.
    size_mib: int = 2048
    pcie_size_mib: int = 512
    warmup: int = 5
    repeats: int = 30

    def problems(self) -> list[str]:
        return [
            *_mib_in_range("bench.memory.size_mib", self.size_mib),
            *_mib_in_range("bench.memory.pcie_size_mib", self.pcie_size_mib),
            *_at_least("bench.memory.warmup", self.warmup, 0),
            *_at_least("bench.memory.repeats", self.repeats, 1),
        ]


@dataclass(frozen=True)
class CollectivesBenchConfig:
    ops: list[str] = field(
        default_factory=lambda: ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]
    )
    dtype: str = "bf16"
    min_bytes: int = 1024
    max_bytes: int = 4 * GIB
    # Judged at this size (or the largest measured below it); gate on big messages only, never the sweep average.
    gate_bytes: int = 4 * GIB
    # Untimed calls per size before anything is timed.
    warmup: int = 5
    # Timed batches per size: the median batch gives time, algbw and busbw; their spread gives cv.
    repeats: int = 10
    # A batch is back-to-back calls between one pair of CUDA events (nccl-tests), about this long: a probe
    # sizes it, so a 1 KiB message runs hundreds of calls (its launch overhead hidden behind the queue, as in an
    # application) and 4 GiB runs one.
    batch_ms: float = 5.0
    max_iters: int = 1000
    # Capture each batch as a CUDA graph and time its replay (nccl-tests -G), so the time is NCCL's and not the
    # host's: an eager torch.distributed call costs 35-45 us of Python and launch on the lent 2xH200, more than
    # a 1 MiB all_reduce takes on the GPU (14 us replayed). NCCL only; gloo times eagerly. false: time eager
    # calls, the launch-bound rate an eager application sees at small sizes.
    cuda_graph: bool = True
    # Calls per captured graph; a batch replays the graph to fill batch_ms (nccl-tests: -n calls per graph, -G
    # launches). Per call, a replayed send/recv exchange at 1 KiB took 8 us in graphs of 25 calls, 14 in graphs of
    # 100 and 47 in graphs of 400 (torch's P2P work adds cross-stream edges to the graph); all_reduce took 6 us in
    # all three (lent 2xH200, 2026-11-22).
    graph_calls: int = 20
    # Who allocates the timed buffers. torch: the caching allocator, as a training job's tensors are. nccl:
    # ncclMemAlloc through a torch MemPool, as nccl-tests allocates; NCCL then registers them itself when a
    # CUDA graph captures the call and copies all_gather, all_to_all and send/recv straight between the users'
    # buffers (zero-copy), which nccl-tests -G shows and a caching-allocator buffer does not get. NCCL only.
    # The profiles' floors are set for torch buffers: with nccl, curves are shown, not judged (wrong output FAILs).
    buffers: str = "torch"
    # NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0 NCCL_COLLNET_ENABLE=0, for network gates comparable across sites.
    force_ring: bool = False
    # Also run within each node of a multi-node run (NVLink there, the network across): one curve per node.
    intra_node_ops: list[str] = field(default_factory=lambda: ["all_reduce"])

    def problems(self) -> list[str]:
        key = "bench.collectives"
        found = [
            *_known(f"{key}.ops", self.ops, COLLECTIVE_OPS),
            *_known(f"{key}.intra_node_ops", self.intra_node_ops, COLLECTIVE_OPS, empty_ok=True),
            *_at_least(f"{key}.warmup", self.warmup, 0),
            *_at_least(f"{key}.repeats", self.repeats, 1),
            *_positive(f"{key}.batch_ms", self.batch_ms),
            *_at_least(f"{key}.max_iters", self.max_iters, 1),
            *_at_least(f"{key}.graph_calls", self.graph_calls, 1),
        ]
        if self.batch_ms > MAX_BATCH_MS:
            found.append(
                f"{key}.batch_ms must be <= {MAX_BATCH_MS} (a batch per size and repeat: longer only slows the "
                f"sweep), found {self.batch_ms}"
            )
        if self.dtype not in COLLECTIVE_DTYPES:
            found.append(f"{key}.dtype must be one of {', '.join(COLLECTIVE_DTYPES)}, found {self.dtype!r}")
        if self.buffers not in COLLECTIVE_BUFFERS:
            found.append(f"{key}.buffers must be one of {', '.join(COLLECTIVE_BUFFERS)}, found {self.buffers!r}")
        if self.min_bytes < 1:
            found.append(f"{key}.min_bytes must be >= 1, found {self.min_bytes}")
        elif self.max_bytes < self.min_bytes:
            found.append(f"{key}.max_bytes must be >= {key}.min_bytes ({self.min_bytes}), found {self.max_bytes}")
        elif not self.min_bytes <= self.gate_bytes <= self.max_bytes:
            found.append(
                f"{key}.gate_bytes must be in {key}.min_bytes..{key}.max_bytes "
                f"({self.min_bytes}..{self.max_bytes}), found {self.gate_bytes}"
            )
        if self.max_bytes > MAX_BUFFER_BYTES:
            found.append(
                f"{key}.max_bytes must be <= {MAX_BUFFER_BYTES} (32 GiB: every rank holds an input and an output "
                f"buffer of this size beside NCCL's, more than an 80-141 GB GPU can hold), found {self.max_bytes}"
            )
        return found


@dataclass(frozen=True)
class P2pBenchConfig:
    size_mib: int = 1024
    warmup: int = 5
    repeats: int = 20

    def problems(self) -> list[str]:
        return [
            *_mib_in_range("bench.p2p.size_mib", self.size_mib),
            *_at_least("bench.p2p.warmup", self.warmup, 0),
            *_at_least("bench.p2p.repeats", self.repeats, 1),
        ]


@dataclass(frozen=True)
class TrainBenchConfig:
    # "1b" (a ~1B-parameter Llama-style model, GPUs) or "tiny" (CPU CI).
    model: str = "1b"
    seq_len: int = 2048
    micro_batch: int = 4
    steps: int = 30
    # Steps excluded from throughput (compilation, allocator warm-up).
    warmup_steps: int = 5

    def problems(self) -> list[str]:
        found = []
        if self.model not in TRAIN_MODELS:
            found.append(f"bench.train.model must be one of {', '.join(TRAIN_MODELS)}, found {self.model!r}")
        found += _at_least("bench.train.seq_len", self.seq_len, 1) + _at_least(
            "bench.train.micro_batch", self.micro_batch, 1
        )
        if self.warmup_steps < 0:
            found.append(f"bench.train.warmup_steps must be >= 0, found {self.warmup_steps}")
        elif self.steps <= self.warmup_steps:
            # Throughput is timed over the steps after warm-up: at least one must remain.
            found.append(
                f"bench.train.steps must be > bench.train.warmup_steps ({self.warmup_steps}), found {self.steps}"
            )
        if self.steps < TRAIN_MIN_STEPS:
            found.append(
                f"bench.train.steps must be >= {TRAIN_MIN_STEPS} (the loss check compares the first 3 losses with "
                f"the last 3), found {self.steps}"
            )
        return found


@dataclass(frozen=True)
class BenchConfig:
    # Processes per node; None: one per visible GPU (two gloo processes on a CPU machine).
    nproc: int | None = None
    # A benchmark that gives no answer within this is ERROR (a hung collective must not hang the suite); the
    # burn gets its bench.burn.duration_s on top, so a long burn-in needs no second setting.
    timeout_s: float = 900.0
    matmul: MatmulBenchConfig = field(default_factory=MatmulBenchConfig)
    burn: BurnBenchConfig = field(default_factory=BurnBenchConfig)
    memory: MemoryBenchConfig = field(default_factory=MemoryBenchConfig)
    collectives: CollectivesBenchConfig = field(default_factory=CollectivesBenchConfig)
    p2p: P2pBenchConfig = field(default_factory=P2pBenchConfig)
    train: TrainBenchConfig = field(default_factory=TrainBenchConfig)

    def problems(self) -> list[str]:
        found = [] if self.nproc is None else _at_least("bench.nproc", self.nproc, 1)
        return [
            *found,
            *_positive("bench.timeout_s", self.timeout_s),
            *self.matmul.problems(),
            *self.burn.problems(),
            *self.memory.problems(),
            *self.collectives.problems(),
            *self.p2p.problems(),
            *self.train.problems(),
        ]


@dataclass(frozen=True)
class LocalizeConfig:
    """`gpucert cluster localize`: pair jobs of a Ring all_gather across two nodes and a matmul on every GPU."""

    # The all_gather message of every pair job: large, so the wires are timed and not the latency.
    size_mib: int = 1024
    # The per-GPU figure: one square matmul size and dtype, timed after matmul_warmup_s of load.
    matmul_dtype: str = "bf16"
    matmul_size: int = 8192
    matmul_warmup_s: float = 3.0
    # A pair this far below the others (the median of the other pairs; the best of them when fewer than 3) is a
    # suspect. None: the profile's benchmarks.cluster_deviation_pct; null there turns the relative rule off.
    deviation_pct: float | None = None
    # A pair below this busbw (GB/s) is a suspect. None: the profile's benchmarks.pair_busbw_gbps_min.
    pair_busbw_gbps_min: float | None = None
    # Seconds one pair job may take before it is stopped and counted as ERROR.
    pair_timeout_s: float = 900.0
    # Pair k of a round meets on base_port + k (node rank 0 of the pair serves it).
    base_port: int = 29600
    # Seeds the random pairing of round 1; None draws one (recorded in the report, to rerun the same pairs).
    seed: int | None = None
    # Rounds after the first (re-pairs, reruns, a second screen), at least log2 of the node count: the search stops
    # sooner when it has nothing left to learn (docs/localize.md).
    max_rounds: int = 3

    def problems(self) -> list[str]:
        found = []
        for key in ("size_mib", "matmul_size", "max_rounds"):
            if getattr(self, key) < 1:
                found.append(f"localize.{key} must be >= 1, found {getattr(self, key)}")
        if not 0 <= self.matmul_warmup_s <= MAX_SECONDS:
            found.append(f"localize.matmul_warmup_s must be >= 0 and at most 30 days, found {self.matmul_warmup_s}")
        found += _positive("localize.pair_timeout_s", self.pair_timeout_s)
        if self.deviation_pct is not None and not 0 < self.deviation_pct < 100:
            found.append(f"localize.deviation_pct must be in (0, 100), found {self.deviation_pct}")
        if self.pair_busbw_gbps_min is not None and self.pair_busbw_gbps_min < 0:
            found.append(f"localize.pair_busbw_gbps_min must be >= 0, found {self.pair_busbw_gbps_min}")
        if not 1024 <= self.base_port <= 65000:
            found.append(f"localize.base_port must be in 1024..65000, found {self.base_port}")
        return found


@dataclass(frozen=True)
class RunConfig:
    # A profile name from configs/profiles/ or a path to a profile YAML; "auto" picks by GPU name.
    profile: str = "auto"
    # Reports go to <runs_dir>/<timestamp>-<host>/ unless --output names a directory.
    runs_dir: str = "runs"
    health: HealthConfig = field(default_factory=HealthConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    # Rendezvous, collective and heartbeat timeouts of multi-process runs (runtime/config.py).
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    localize: LocalizeConfig = field(default_factory=LocalizeConfig)

    def problems(self) -> list[str]:
        """Every value out of its range or not among the known names, each message naming its key."""
        found = self.health.problems() + self.bench.problems() + self.runtime.problems() + self.localize.problems()
        if self.localize.matmul_dtype not in MATMUL_DTYPES:
            found.append(
                f"localize.matmul_dtype must be one of {', '.join(MATMUL_DTYPES)}, found {self.localize.matmul_dtype!r}"
            )
        return found
