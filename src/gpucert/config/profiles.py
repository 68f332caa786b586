"""Per-GPU-model hardware profiles: what a healthy node of that model looks like, in named units.

Profiles are data (`configs/profiles/*.yaml`), chosen by matching the NVML GPU name against each profile's
`match` patterns, or named with `--profile`. Every threshold a check uses comes from here and is printed next
to the measured value with its profile field as the source.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gpucert.config.floors import CountFloors, floor_problems
from gpucert.config.loader import (
    ConfigError,
    build,
    dotted,
    in_file_order,
    key_line,
    load_yaml,
    merge_mappings,
    with_line,
)
from gpucert.config.run import COLLECTIVE_OPS


@dataclass(frozen=True)
class GpuExpectations:
    # GPUs per node for this platform (8 on HGX); None leaves the count unchecked unless the run config sets it.
    gpus_per_node: int | None = None
    memory_gib_min: float | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    # Active NVLink links per GPU (18 on H100/H200 SXM); None when the model has no NVLink.
    nvlink_links: int | None = None
    ecc_enabled: bool = True
    mig_enabled: bool = False
    persistence_mode: bool = True
    temperature_c_warn: float = 80.0
    temperature_c_fail: float = 90.0
    # An enforced power limit below this means someone capped the GPU: WARN.
    power_limit_w_min: float | None = None
    # Row-remapping counts above these are WARN (the GPU still works; plan an RMA if they grow).
    remapped_rows_correctable_warn: int = 8
    remapped_rows_uncorrectable_warn: int = 1


@dataclass(frozen=True)
class SoftwareExpectations:
    driver_min: str | None = None
    cuda_driver_min: str | None = None
    nccl_min: str | None = None


@dataclass(frozen=True)
class NetworkExpectations:
    # Active InfiniBand (link layer InfiniBand) ports a node must have; None leaves IB unchecked.
    ib_ports: int | None = None
    ib_rate_gbps: float | None = None


@dataclass(frozen=True)
class BenchmarkExpectations:
    """Floors for measured numbers (../shared/reference/acceptance-testing.md §4), per GPU unless named."""

    matmul_bf16_tflops_min: float | None = None
    # A GPU this far below the node's median matmul is FAIL even above the floor (gpu-fryer's rule);
    # None turns the rule off (CPU ranks sharing cores differ by chance, not by fault).
    matmul_node_deviation_pct: float | None = 10.0
    # Fixed-size matmuls of bench.matmul.sizes (4096 and up: smaller ones cannot fill the GPU) at least this
    # share of their dtype's peak, per dtype ({bf16: 0.6}); a dtype without one is held to the node median only.
    matmul_peak_share_min: dict[str, float] = field(default_factory=dict)
    # The burn's sustained (median window) bf16 TFLOP/s per GPU; None: held to the node's best GPU only. A GPU
    # more than matmul_node_deviation_pct below the node's best median FAILs too (gpu-fryer's rule).
    burn_bf16_tflops_min: float | None = None
    # HBM bandwidth per GPU, BabelStream's counting (copy: read + write; triad: 2 reads + 1 write). Read and
    # write have no public reference figure, so no floor: shown, not judged.
    hbm_copy_tbps_min: float | None = None
    hbm_triad_tbps_min: float | None = None
    pcie_h2d_gbps_min: float | None = None
    pcie_d2h_gbps_min: float | None = None
    p2p_gbps_min: float | None = None
    # A GPU pair this far below the median of all pairs names a weak link.
    p2p_pair_deviation_pct: float = 15.0
    # Bus bandwidth floors per collective, judged at bench.collectives.gate_bytes: per GPU count ({2: 260,
    # 4: 305}, nodes x GPUs as "2x8" or "Nx8"; config/floors.py) or one number for every count. An op or a
    # count without a floor is shown, not judged (INFO).
    busbw_gbps_min: dict[str, CountFloors] = field(default_factory=dict)
    # MFU (0..1) of the training proxy at its largest world size; None: shown, not judged.
    train_mfu_min: float | None = None
    # DDP tokens/s per GPU over one GPU's (0..1], per GPU count like busbw_gbps_min; None: shown, not judged.
    train_scaling_efficiency_min: CountFloors | None = None
    # A GPU or node this far below the cluster median of a per-GPU figure FAILs (gpu-fryer's 10 % rule, taken
    # across the nodes of a run); None turns the rule off, as on CPU ranks sharing cores.
    cluster_deviation_pct: float | None = 10.0
    # Ring all_gather busbw between two nodes (`gpucert cluster localize`), GB/s. A fact of the fabric (NICs
    # per node, their rate), so a site profile sets it: Google's cluster-health-scanner holds 8x400G H200
    # pairs to 250. None: pairs are judged against each other only.
    pair_busbw_gbps_min: float | None = None
    # Shared filesystem (`gpucert cluster fs`), per node with every node at once: create+stat+unlink ops/s and
    # checkpoint-sized write/read GB/s. None: shown, not judged.
    fs_metadata_ops_min: float | None = None
    fs_write_gbps_min: float | None = None
    fs_read_gbps_min: float | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    # Regular expressions tried against the NVML device name; empty for profiles picked only by name.
    match: list[str] = field(default_factory=list)
    # Dense BF16 tensor peak for MFU and % of peak; None on the CPU profile.
    bf16_peak_tflops: float | None = None
    gpu: GpuExpectations = field(default_factory=GpuExpectations)
    software: SoftwareExpectations = field(default_factory=SoftwareExpectations)
    network: NetworkExpectations = field(default_factory=NetworkExpectations)
    benchmarks: BenchmarkExpectations = field(default_factory=BenchmarkExpectations)
    # Run-config values this hardware needs by default (the cpu profile shrinks benchmark sizes); a config
    # file and --set still override them.
    run_defaults: dict[str, Any] = field(default_factory=dict)
    # Where the file came from, filled on load (for threshold sources in reports).
    source: str = ""


def profile_dir() -> Path:
    return Path(str(resources.files("gpucert.configs").joinpath("profiles")))


def available_profiles() -> list[str]:
    return sorted(p.stem for p in profile_dir().glob("*.yaml"))


def _profile_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        return path
    path = profile_dir() / f"{name_or_path}.yaml"
    if not path.exists():
        raise ConfigError(
            f"unknown profile {name_or_path!r}; built-in profiles: {', '.join(available_profiles())} "
            "(or pass a path to a profile YAML)"
        )
    return path


def _load_profile_data(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Raw profile mapping with `extends: <profile>` resolved, so a site profile states only what differs."""
    if path in seen:
        raise ConfigError(f"{path}: extends loops back on itself ({' -> '.join(map(str, seen))})")
    data = load_yaml(path)
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: extends: expected a profile name or path, found {base!r}")
    try:
        base_path = _profile_path(base if not base.endswith((".yaml", ".yml")) else str(path.parent / base))
    except ConfigError as exc:
        raise ConfigError(f"{path}: extends: {exc}") from exc
    return merge_mappings(_load_profile_data(base_path, (*seen, path)), data)


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name (`h100-sxm`) or any profile YAML by path (which may `extends:` another)."""
    path = _profile_path(name_or_path)
    data = _load_profile_data(path)
    data.pop("source", None)
    # Every problem of the file at once, a line each where the key is in it, as a run config's: a site profile
    # is written by hand too. Keys of the wrong type are left at their defaults to judge the rest.
    problems: list[str] = []
    try:
        profile = build(Profile, data, str(path))
    except ConfigError as exc:
        problems += [with_line(problem, path) for problem in exc.problems]
        profile = build(Profile, data, str(path), dropped=[])
    for pattern in profile.match:
        try:
            re.compile(pattern)
        except re.error as exc:
            problems.append(_placed(path, f"match: {pattern!r} is not a regular expression: {exc}"))
    problems += [_placed(path, problem) for problem in count_floor_problems(profile.benchmarks)]
    # `ib_ports: -1` read as "at least -1 active ports" and FAILed a node with none: every count, floor, share
    # and limit of a profile is a number >= 0.
    said = " ".join(problems)  # a floor said out of range above is not said again as negative
    problems += [
        _placed(path, f"{key} must be >= 0, found {value!r}")
        for key, value in negative_values(profile)
        if f"{key} " not in said and f"{key}:" not in said
    ]
    if problems:
        raise ConfigError(problems=in_file_order(problems, path))
    return Profile(**{**profile.__dict__, "source": str(path)})


def _placed(path: Path, problem: str) -> str:
    """`problem`, which starts with the dotted key it is about, at that key's line in the file (the nearest
    enclosing key written there: a count key may be read back as a number)."""
    parts = re.split(r"[: ]", problem, maxsplit=1)[0].split(".")
    for end in range(len(parts), 0, -1):
        line = key_line(path, ".".join(parts[:end]))
        if line:
            return f"{path}:{line}: {problem}"
    return f"{path}: {problem}"


def negative_values(profile: Profile) -> list[tuple[str, Any]]:
    """(dotted key, value) of each number of the gpu, network and benchmarks sections that is below 0 or not
    finite, dict entries (per-count floors, per-dtype shares) included."""
    found = []
    for section in ("gpu", "network", "benchmarks"):
        for key, value in dotted(dataclasses.asdict(getattr(profile, section)), f"{section}.").items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 <= value < math.inf:
                found.append((key, value))
    return found


def count_floor_problems(benchmarks: BenchmarkExpectations) -> list[str]:
    """Unknown collectives, malformed count keys and out-of-range values of the per-count floors."""
    found = []
    for op, floors in benchmarks.busbw_gbps_min.items():
        if op not in COLLECTIVE_OPS:
            found.append(
                f"benchmarks.busbw_gbps_min: unknown collective {op!r}; expected any of {', '.join(COLLECTIVE_OPS)}"
            )
        found += floor_problems(f"benchmarks.busbw_gbps_min.{op}", floors, low=0)
    scaling = benchmarks.train_scaling_efficiency_min
    return found + floor_problems("benchmarks.train_scaling_efficiency_min", scaling, low=0, high=1)


def select_profile(gpu_names: list[str]) -> Profile:
    """The one built-in profile whose patterns match the node's GPUs; `cpu` when there are none."""
    if not gpu_names:
        return load_profile("cpu")
    if len(set(gpu_names)) > 1:
        raise ConfigError(
            f"this node mixes GPU models ({', '.join(sorted(set(gpu_names)))}); name a profile with --profile"
        )
    name = gpu_names[0]
    matches = [
        profile
        for profile in (load_profile(n) for n in available_profiles())
        if any(re.search(p, name, re.IGNORECASE) for p in profile.match)
    ]
    if len(matches) != 1:
        found = ", ".join(p.name for p in matches) or "none"
        raise ConfigError(
            f"GPU {name!r} matches {found} of the built-in profiles; name one with --profile "
            f"({', '.join(available_profiles())}) or a profile YAML"
        )
    return matches[0]
