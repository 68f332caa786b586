"""torch.compile's work done once and reused: by later runs, and by every rank of a job.

The compiled decoder layers of a 7B model cost the first step of a run minutes on a cold cache (dynamo's trace,
inductor's code generation, the tuning of its kernels' block sizes, Triton's compiles) and seconds on a warm one.
Two things keep that work:

- One cache directory (`train.compile_cache_dir`, default the per-user ~/.cache/gpucert/compile) holds inductor's
  FX graph and AOTAutograd caches, its tuned block sizes and every Triton kernel, inductor's and gpucert's own
  (loss and MLP kernels). Inductor writes each entry atomically (a file renamed into place), so one directory on
  a shared filesystem serves every node and every later job as it is written. That is why this is a directory
  and not torch.compiler.save_cache_artifacts' single blob: a blob would be a second copy, written by one rank
  after its compile and loaded by every other before its first, for what the directory already shares.
- A compile warm-up before the first step (`warm_up`): one forward and backward of the step's first micro-batch.
  When the cache has not been warmed for this run's shape, one rank for each device compiles first and the
  others wait, then load what it wrote: no rank compiles what another already compiled. A marker written after
  the warm-up (`<cache>/gpucert-warm/<signature>.json`) tells the next job that the cache is warm, and then every
  rank loads at once instead of one after the other. So a cluster's cache is warmed by the first job (or a
  one-step run) that compiles the recipe there, on a GPU of the job's kind: Triton kernels and tuned block sizes
  are specific to the GPU, so a login node without one cannot warm it.

Inductor keys its compiled graphs by device index too (cuda:0 and cuda:1 are different entries): ranks that see
their GPU under the same index share entries, which is every rank where the launcher gives each rank one visible
GPU, else the ranks of the same local index on each node. A rank that waits is told apart from one that compiles
in the run's metrics ("compile": per rank its warm-up time and torch's cache hits and misses).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpucert.config.loader import ConfigError

INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"
MARKERS = "gpucert-warm"
CUSTOM_FUNCTIONS_FLAG = "autograd_cache_allow_custom_autograd_functions"  # torch._functorch.config, torch >= 2.7
# torch's counters that say whether a compile was done or loaded (torch._dynamo.utils.counters), and how many
# kernel timings inductor's block-size tuning ran.
CACHE_COUNTERS = {
    "inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass", "coordesc_tuning_bench"),
    "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass"),
}


def default_cache_dir(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """~/.cache/gpucert/compile, or under $XDG_CACHE_HOME: per user, and on most clusters on the shared home."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpucert" / "compile"


def resolve_cache_dir(setting: str | None, environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """train.compile_cache_dir when set, else $TORCHINDUCTOR_CACHE_DIR when set, else the per-user default."""
    if setting is not None:
        if not setting.strip():
            raise ConfigError("train.compile_cache_dir must be a directory or null (the per-user default), found ''")
        return Path(setting).expanduser().absolute()
    if environ.get(INDUCTOR_ENV):
        return Path(environ[INDUCTOR_ENV]).expanduser().absolute()
    return default_cache_dir(environ)


def use_cache_dir(path: Path) -> None:
    """Point inductor's caches and Triton's at `path` (through the environment, which both read when they first
    look and inductor's compile workers inherit), and let AOTAutograd's cache keep graphs that call a custom
    autograd.Function (a setting of this process). Before the first compile of the process."""
    try:
        (path / "triton").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"train.compile_cache_dir: cannot create {path}: {exc.strerror}; set train.compile_cache_dir to a "
            "writable directory (a shared one for multi-node jobs)"
        ) from None
    os.environ[INDUCTOR_ENV] = str(path)
    os.environ[TRITON_ENV] = str(path / "triton")
    # torch 2.11 bypasses AOTAutograd's cache for any graph that calls an autograd.Function, unless this flag is
    # set: FP8's frozen projections and fused MLP are such Functions, so every warm FP8 start traced and partitioned
    # the decoder layer's forward and backward again (2 bypasses a run; the 7B FP8 line's warm first step took
    # 21.4 s on one H200, 2026-11-29). dynamo traces the Function's forward and backward into the graph (the
    # autograd_function_apply operator), so the cache key covers both; torch's authors found that operator pure in
    # its inputs and mean to turn the flag on by default (pytorch/pytorch#149751). Its environment variable,
    # TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD, wins over this when set (0 turns it off). The flag is part
    # of the cache key: a cache filled without it misses once at this level (inductor's own graphs still load).
    # torch < 2.7 has no such flag (a torch config module refuses unknown names), and caches no such graph.
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, CUSTOM_FUNCTIONS_FLAG):
        setattr(functorch_config, CUSTOM_FUNCTIONS_FLAG, True)


def signature(parts: dict[str, Any]) -> str:
    """A short hash of what decides the compiled graphs (model and adapter settings, shapes, versions, GPU)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_counters() -> dict[str, int]:
    """torch's compile-cache counters so far in this process (hits, misses, bypasses)."""
    from torch._dynamo.utils import counters

    return {name: int(counters[group][name]) for group, names in CACHE_COUNTERS.items() for name in names}


def compile_phases_s() -> dict[str, float]:
    """torch's compile time so far in this process by phase (dynamo's trace, inductor, backward, kernel tuning)."""
    from torch._dynamo.utils import calculate_time_spent

    return {k: round(v, 3) for k, v in calculate_time_spent().items() if v}


@dataclass
class WarmUp:
    """This rank's compile warm-up."""

    rank: int
    device: str
    # "alone" (one process), "first" (compiled while others waited), "after" (waited, then loaded), "together"
    # (the cache was warm: every rank at once), "none" (nothing compiled: model.compile off).
    order: str
    seconds: float = 0.0  # the warm-up's own time: compile or cache loads, plus one forward and backward
    waited_s: float = 0.0  # waiting for the ranks that compiled first
    counters: dict[str, int] = field(default_factory=dict)
    phases_s: dict[str, float] = field(default_factory=dict)
    # How many ranks compiled first (one for each device index), and how many waited for them.
    first_ranks: int = 1
    waiting_ranks: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _marker(cache_dir: Path, sig: str, device: str) -> Path:
    # The device index is part of inductor's keys: a marker per device.
    return cache_dir / MARKERS / f"{sig}-{device.replace(':', '')}.json"


def _write_marker(path: Path, record: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # the marker only orders the next job's ranks; without it they compile one after the other again


def warm_up(
    step: Callable[[], None], rank: int, world_size: int, device: torch.device, cache_dir: Path, sig: str
) -> WarmUp:
    """Run `step` (a forward and backward that compiles everything the first step compiles) on every rank, in an
    order that has no rank compile what another compiles: when every device's marker says the cache is warm, all
    ranks at once; else the lowest rank of each device first, while the others wait at a barrier, then the
    others. Collective when world_size > 1 (every rank calls it)."""
    here = str(device)
    marker = _marker(cache_dir, sig, here)
    views: list[Any] = [(here, marker.is_file())]
    if world_size > 1:
        views = [None] * world_size
        dist.all_gather_object(views, (here, marker.is_file()))
    leaders: dict[str, int] = {}
    for r, (dev, _) in enumerate(views):
        leaders.setdefault(dev, r)
    together = world_size == 1 or all(views[r][1] for r in leaders.values())
    first = leaders[here] == rank
    order = "alone" if world_size == 1 else "together" if together else "first" if first else "after"
    waited = 0.0
    if not together and not first:
        began = time.perf_counter()
        _barrier(device)  # the ranks that compile first are inside their warm-up
        waited = time.perf_counter() - began
    began = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    waiting = 0 if together else world_size - len(leaders)
    record = WarmUp(rank, here, order, seconds, waited, cache_counters(), compile_phases_s(), len(leaders), waiting)
    if first:
        _write_marker(marker, {**record.to_dict(), "signature": sig, "written_at": time.time()})
    if not together and first:
        _barrier(device)  # the others start loading now
    return record


def _barrier(device: torch.device) -> None:
    """A barrier over the job, bounded by runtime.collective_timeout_s: the ranks that wait wait at most that long for
    the first ones' compile. NCCL is told the device rather than left to guess it."""
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index if device.index is not None else torch.cuda.current_device()])
    else:
        dist.barrier()
