"""The config tree of `gpucert discover | health | accept`.

Each field says what it changes; units live in the names. YAML files (`--config`) fill it and `--set
health.expected_gpus=8` overrides one key; the resolved tree is saved in every report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucert.runtime.config import RuntimeConfig


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


GIB = 1 << 30


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


@dataclass(frozen=True)
class MemoryBenchConfig:
    # Each device buffer; far above L2 (50-60 MB on H100/H200) so the cache cannot flatter.
    size_mib: int = 2048
    pcie_size_mib: int = 512
    warmup: int = 5
    repeats: int = 30


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
    warmup: int = 5
    repeats: int = 20
    # NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0 NCCL_COLLNET_ENABLE=0, for network gates comparable across sites.
    force_ring: bool = False
    # Also run within each node of a multi-node run (NVLink there, the network across): one curve per node.
    intra_node_ops: list[str] = field(default_factory=lambda: ["all_reduce"])


@dataclass(frozen=True)
class P2pBenchConfig:
    size_mib: int = 1024
    warmup: int = 5
    repeats: int = 20


@dataclass(frozen=True)
class TrainBenchConfig:
    # "1b" (a ~1B-parameter Llama-style model, GPUs) or "tiny" (CPU CI).
    model: str = "1b"
    seq_len: int = 2048
    micro_batch: int = 4
    steps: int = 30
    # Steps excluded from throughput (compilation, allocator warm-up).
    warmup_steps: int = 5


@dataclass(frozen=True)
class BenchConfig:
    # Processes per node; None: one per visible GPU (two gloo processes on a CPU machine).
    nproc: int | None = None
    # A benchmark that gives no answer within this is ERROR (a hung collective must not hang the suite).
    timeout_s: float = 900.0
    matmul: MatmulBenchConfig = field(default_factory=MatmulBenchConfig)
    memory: MemoryBenchConfig = field(default_factory=MemoryBenchConfig)
    collectives: CollectivesBenchConfig = field(default_factory=CollectivesBenchConfig)
    p2p: P2pBenchConfig = field(default_factory=P2pBenchConfig)
    train: TrainBenchConfig = field(default_factory=TrainBenchConfig)


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
    # Rounds after the first that re-pair suspects with known-good nodes (more when suspects outnumber them).
    max_rounds: int = 3

    def problems(self) -> list[str]:
        found = []
        for key in ("size_mib", "matmul_size", "max_rounds"):
            if getattr(self, key) < 1:
                found.append(f"localize.{key} must be >= 1, found {getattr(self, key)}")
        if self.matmul_warmup_s < 0:
            found.append(f"localize.matmul_warmup_s must be >= 0, found {self.matmul_warmup_s}")
        if self.pair_timeout_s <= 0:
            found.append(f"localize.pair_timeout_s must be > 0, found {self.pair_timeout_s}")
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
