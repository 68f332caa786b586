"""The config tree of `gpucert discover | health | accept`.

Each field says what it changes; units live in the names. YAML files (`--config`) fill it and `--set
health.expected_gpus=8` overrides one key; the resolved tree is saved in every report.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class RunConfig:
    # A profile name from configs/profiles/ or a path to a profile YAML; "auto" picks by GPU name.
    profile: str = "auto"
    # Reports go to <runs_dir>/<timestamp>-<host>/ unless --output names a directory.
    runs_dir: str = "runs"
    health: HealthConfig = field(default_factory=HealthConfig)
