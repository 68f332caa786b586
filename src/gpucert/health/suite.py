"""`gpucert health`: every health check of one node, in a fixed order, as a list of Results."""

from __future__ import annotations

import dataclasses
import importlib.util
from datetime import datetime

from gpucert.config.profiles import Profile
from gpucert.config.run import HealthConfig
from gpucert.hardware.inventory import NodeInventory
from gpucert.health.checks import (
    PER_GPU_CHECKS,
    check_gpu_count,
    check_infiniband,
    check_nvlink,
    check_software,
    check_uniform_firmware,
    check_xid,
    judge_liveness,
)
from gpucert.health.liveness import LivenessError, LivenessProbe
from gpucert.report.schema import Result
from gpucert.status import Status


def run_liveness(inv: NodeInventory, config: HealthConfig, probe: LivenessProbe | None) -> list[Result]:
    if not inv.gpu.gpus:
        return []
    if config.liveness and probe is not None and importlib.util.find_spec("torch") is None:
        return [
            Result(
                name="gpu.liveness",
                subject=inv.hostname,
                status=Status.SKIP,
                message="not run: the liveness matmul needs torch, which is not installed here (a light "
                "`pip install gpucert`); install gpucert[bench] to prove every GPU computes",
            )
        ]
    if not config.liveness or probe is None:
        return [
            Result(
                name="gpu.liveness",
                subject=inv.hostname,
                status=Status.SKIP,
                message="liveness check turned off (health.liveness: false)"
                if not config.liveness
                else "liveness needs the live node; a replayed bundle has no GPUs to run on",
            )
        ]
    try:
        answers = probe.run(timeout_s=max(60.0, 15.0 * len(inv.gpu.gpus)))
        if not answers:
            # NVML sees GPUs and CUDA none: a CPU-only torch, CUDA_VISIBLE_DEVICES="" or a broken CUDA install.
            raise LivenessError(f"NVML sees {len(inv.gpu.gpus)} GPUs but CUDA in this Python sees none")
        return judge_liveness(inv, answers)
    except LivenessError as exc:
        return [
            Result(
                name="gpu.liveness",
                subject=inv.hostname,
                status=Status.FAIL if exc.hung else Status.ERROR,
                message=f"GPU liveness probe failed: {exc}",
                remediation="find the hung GPU with nvidia-smi and dmesg; reset it"
                if exc.hung
                else "install torch with CUDA support to run the liveness check",
            )
        ]


def _without_own_processes(inv: NodeInventory, own_pids: frozenset[int]) -> NodeInventory:
    gpus = [
        dataclasses.replace(
            gpu,
            process_pids=[p for p in gpu.process_pids if p not in own_pids],
            process_count=len([p for p in gpu.process_pids if p not in own_pids]),
        )
        if gpu.process_count is not None and len(gpu.process_pids) == gpu.process_count
        else gpu
        for gpu in inv.gpu.gpus
    ]
    return dataclasses.replace(inv, gpu=dataclasses.replace(inv.gpu, gpus=gpus))


def run_health(
    inv: NodeInventory,
    profile: Profile,
    config: HealthConfig,
    kernel_log: tuple[str | None, str | None],
    probe: LivenessProbe | None,
    now: datetime,
    own_pids: frozenset[int] = frozenset(),
) -> list[Result]:
    """kernel_log is (text, None) or (None, why it could not be read). own_pids: this run's own ranks, which
    hold the GPUs already when health runs inside a launched job and must not count as someone else's work."""
    if own_pids:
        inv = _without_own_processes(inv, own_pids)
    results = check_gpu_count(inv, profile, config)
    for gpu in inv.gpu.gpus:
        per_gpu = [r for check in PER_GPU_CHECKS for r in check(gpu, profile)]
        per_gpu += check_nvlink(gpu, profile, len(inv.gpu.gpus))
        results += [dataclasses.replace(r, gpu_index=gpu.index) for r in per_gpu]
    results += check_uniform_firmware(inv)
    if inv.gpu.gpus or (profile.gpu.gpus_per_node or 0) > 0:
        results += check_software(inv, profile)
    results += check_infiniband(inv.infiniband, profile, inv.hostname)
    results += check_xid(kernel_log[0], kernel_log[1], inv, config.xid_window_h, now)
    results += run_liveness(inv, config, probe)
    return results
