"""Run benchmarks by name: launch the workers (or join an outside torchrun), sample telemetry, judge.

A benchmark that crashes or hangs becomes an ERROR result naming what happened; it never stops the suite
and never passes.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from gpucert.bench import catalog, worker
from gpucert.bench.distributed import LaunchError, default_nproc, launch_local, ranks_from_env
from gpucert.bench.telemetry import TelemetrySampler, judge_telemetry
from gpucert.config.profiles import Profile
from gpucert.config.run import RunConfig
from gpucert.hardware.inventory import NodeInventory
from gpucert.report.schema import Result
from gpucert.status import Status


def _spec(name: str, config: RunConfig, profile: Profile, has_gpus: bool) -> tuple[dict[str, Any], dict[str, str]]:
    section = getattr(config.bench, name)
    cfg = dataclasses.asdict(section)
    env: dict[str, str] = {}
    if name == "train":
        cfg["peak_tflops"] = profile.bf16_peak_tflops if has_gpus else None
    if name == "collectives" and section.force_ring:
        from gpucert.bench.collectives import ring_env

        env = ring_env()
    return {"benchmark": name, "config": cfg}, env


def run_benchmark(
    name: str, config: RunConfig, profile: Profile, inventory: NodeInventory, workdir: Path, nvml: Any | None
) -> list[Result]:
    """Results of one benchmark on rank 0; an empty list on the other ranks of an outside launcher."""
    spec, env = _spec(name, config, profile, bool(inventory.gpu.gpus))
    outside = ranks_from_env(os.environ)
    sampler = TelemetrySampler(nvml).start() if nvml is not None and inventory.gpu.gpus else None
    try:
        if outside:
            # Already one rank of a torchrun/srun job: measure here, with the others.
            data = worker.run(spec)
        else:
            nproc = config.bench.nproc or default_nproc()
            data = launch_local(nproc, spec, workdir / name, config.bench.timeout_s, env)
    except (LaunchError, RuntimeError) as exc:
        return [
            Result(
                name=f"bench.{name}",
                subject=inventory.hostname,
                status=Status.ERROR,
                category="benchmark",
                message=f"the {name} benchmark did not finish: {exc}",
                remediation="re-run `gpucert bench " + name + "` alone to see the workers' output",
            )
        ]
    finally:
        telemetry = sampler.stop() if sampler else None
    if data is None:
        return []
    section = getattr(config.bench, name)
    results = catalog.load(name).judge(data, profile, section)
    return nvml_indexed(results, data, inventory) + judge_telemetry(name, telemetry, inventory.hostname)


def nvml_indexed(results: list[Result], data: dict[str, Any], inventory: NodeInventory) -> list[Result]:
    """Per-GPU benchmark results carry the worker's CUDA index; health results carry NVML's. Under
    CUDA_VISIBLE_DEVICES=4,5,6,7 CUDA's 0 is NVML's 4: match by UUID so a slow GPU is named as health names it."""
    by_uuid = {gpu.uuid: gpu.index for gpu in inventory.gpu.gpus}
    cuda_to_nvml = {
        rank["local_rank"]: by_uuid[rank["uuid"]]
        for rank in data.get("ranks", [])
        if isinstance(rank, dict) and rank.get("uuid") in by_uuid
    }
    return [
        dataclasses.replace(r, gpu_index=cuda_to_nvml[r.gpu_index])
        if r.gpu_index is not None and r.gpu_index in cuda_to_nvml
        else r
        for r in results
    ]
