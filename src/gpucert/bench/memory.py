"""Memory bandwidth per GPU: device copy/read/write/triad and pinned host<->device (PCIe) transfers.

Bytes counted are the bytes that cross the memory bus: copy reads and writes (2x the buffer), read 1x,
write 1x, triad (a = b + s*c) 3x, as BabelStream counts them. Note that nvbandwidth's `device_local_copy`
prints the buffer size over time, half of what we report for copy (nvbandwidth#48). Buffers are 2 GiB by
default, far beyond L2, and the host side of PCIe copies is pinned memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from gpucert.bench.timing import time_repeats
from gpucert.config.profiles import Profile
from gpucert.config.run import MemoryBenchConfig
from gpucert.report.numbers import sig
from gpucert.report.schema import Result
from gpucert.runtime.group import Runtime, gather_to_main, host_barrier, rank_row
from gpucert.runtime.identity import row_identity
from gpucert.status import Status

# kernel -> bytes moved per element of one buffer
TRAFFIC = {"copy": 2, "read": 1, "write": 1, "triad": 3}
LABELS = {
    "copy": "copy (read + write counted)",
    "read": "read",
    "write": "write",
    "triad": "triad (2 reads + 1 write counted)",
    "h2d": "host to device (pinned)",
    "d2h": "device to host (pinned)",
}


def _device_kernels(n: int, device: torch.device) -> dict[str, Callable[[int], object]]:
    gen = torch.Generator(device=device).manual_seed(7)
    a = torch.randn(n, device=device, generator=gen)
    b = torch.randn(n, device=device, generator=gen)
    c = torch.randn(n, device=device, generator=gen)
    partial = torch.empty((), device=device)
    return {
        "copy": lambda i: b.copy_(a),
        # A sum reads every element once; its one-value output costs nothing.
        "read": lambda i: torch.sum(a, dim=0, out=partial),
        # A different value each repeat, so no layer can skip a write that changes nothing.
        "write": lambda i: c.fill_(float(i)),
        "triad": lambda i: torch.add(b, c, alpha=0.5, out=a),
    }


def _pcie_rows(config: MemoryBenchConfig, device: torch.device) -> dict[str, Any]:
    size = config.pcie_size_mib << 20
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True).random_(0, 255)
    dev = torch.empty(size, dtype=torch.uint8, device=device)
    rows = {}
    for direction, fn in (
        ("h2d", lambda i: dev.copy_(host, non_blocking=True)),
        ("d2h", lambda i: host.copy_(dev, non_blocking=True)),
    ):
        timing = time_repeats(fn, device, config.warmup, config.repeats)
        rows[direction] = {"bytes": size, "gbps": size / timing.median_s / 1e9, "timing": timing.summary()}
    return rows


def measure(env: Runtime, cfg: dict[str, Any]) -> dict[str, Any] | None:
    config = MemoryBenchConfig(**cfg)
    device = env.device
    n = config.size_mib * (1 << 20) // 4
    rows: dict[str, Any] = {}
    for kernel, fn in _device_kernels(n, device).items():
        timing = time_repeats(fn, device, config.warmup, config.repeats)
        rows[kernel] = {
            "bytes": TRAFFIC[kernel] * n * 4,
            "tbps": TRAFFIC[kernel] * n * 4 / timing.median_s / 1e12,
            "timing": timing.summary(),
        }
    if device.type == "cuda":
        # One GPU at a time, as nvbandwidth and the reference figures do: four GPUs pulling from host memory at
        # once measure the host's memory system and IOMMU, not each GPU's link (4xH200 VM: 44 vs 54 GB/s).
        # The others wait on the host: an NCCL barrier's kernel would spin on their GPUs meanwhile, polling host
        # memory over PCIe where NCCL goes through it (host_barrier).
        for turn in range(env.world_size):
            host_barrier(env, f"before pcie turn {turn}")
            if turn == env.rank:
                rows.update(_pcie_rows(config, device))
        host_barrier(env, "after the pcie turns")  # the gather below is a collective: it waits for the last turn
    mine = {**rank_row(env), "rows": rows}
    ranks = gather_to_main(env, mine)
    return None if ranks is None else {"ranks": ranks, "config": asdict(config)}


# The profile key holding each row's floor. Read and write have none: no public reference figure to set one
# by (../shared/reference/acceptance-testing.md §4 has BabelStream copy and triad), so they are INFO.
FLOOR_KEYS = {
    "copy": "hbm_copy_tbps_min",
    "triad": "hbm_triad_tbps_min",
    "h2d": "pcie_h2d_gbps_min",
    "d2h": "pcie_d2h_gbps_min",
}


def judge(data: dict[str, Any], profile: Profile, cfg: MemoryBenchConfig) -> list[Result]:
    del cfg
    return [judge_row(kernel, row, rank, profile) for rank in data["ranks"] for kernel, row in rank["rows"].items()]


def judge_row(kernel: str, row: dict[str, Any], rank: dict[str, Any], profile: Profile) -> Result:
    """One bandwidth of one GPU: FAIL below the profile's floor, PASS at or above it, INFO where none is set."""
    subject, gpu, node = row_identity(rank)
    pcie = kernel in ("h2d", "d2h")
    value, unit = (row["gbps"], "GB/s") if pcie else (row["tbps"], "TB/s")
    label = LABELS[kernel]
    key = FLOOR_KEYS.get(kernel)
    floor = getattr(profile.benchmarks, key, None) if key else None
    measured = f"{label}: {sig(value)} {unit} (cv {sig(row['timing']['cv'])})"
    # Full precision in the report; the views round.
    base: dict[str, Any] = dict(
        name=f"memory.{kernel}",
        subject=subject,
        category="benchmark",
        gpu_index=gpu,
        node=node,
        value=value,
        unit=unit,
        details=row,
    )
    if floor is None:
        why = f"profile {profile.name} sets no benchmarks.{key}" if key else f"no reference figure for HBM {kernel}"
        return Result(**base, status=Status.INFO, message=f"{measured}; shown, not judged: {why}")
    base.update(expected=f">= {floor:g} {unit}", threshold_source=f"profile {profile.name}: benchmarks.{key}")
    if value >= floor:
        return Result(**base, status=Status.PASS, message=measured)
    return Result(
        **base,
        status=Status.FAIL,
        message=f"expected {label} >= {floor:g} {unit}, found {sig(value)} {unit} on {subject}",
        remediation="PCIe below floor: check the link (gpu.pcie_link), NUMA placement of the process and IOMMU settings"
        if pcie
        else "HBM below floor: check clocks in telemetry; RMA if it persists",
    )
