"""Run benchmarks by name inside the job's ranks and judge them, sampling telemetry meanwhile.

A benchmark that crashes or hangs ends the job; rank 0's partial report names the rank, its node and the cause
(the rank's own exception: its type, message and where it was raised), and it never passes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpucert.bench import catalog, worker
from gpucert.bench.telemetry import TelemetrySampler, judge_telemetry
from gpucert.config.profiles import Profile
from gpucert.config.run import RunConfig
from gpucert.report.schema import Result
from gpucert.runtime.group import Runtime


def bench_spec(name: str, config: RunConfig, profile: Profile, has_gpus: bool) -> dict[str, Any]:
    """What a worker needs: the benchmark, its config and the runtime's timeouts."""
    cfg = dataclasses.asdict(getattr(config.bench, name))
    if name == "train":
        cfg["peak_tflops"] = profile.bf16_peak_tflops if has_gpus else None
    return {"benchmark": name, "config": cfg, "runtime": dataclasses.asdict(config.runtime)}


def rank_env(config: RunConfig, benchmarks: Sequence[str]) -> dict[str, str]:
    """The environment the ranks of a run of these benchmarks start with. NCCL reads its algorithm when a
    communicator is created, and the ranks start once for every benchmark of the run, so a forced Ring
    (bench.collectives.force_ring) is set at their start: it holds for every NCCL call of the run, not only the
    collectives benchmark's."""
    if "collectives" in benchmarks and config.bench.collectives.force_ring:
        from gpucert.bench.collectives import ring_env

        return ring_env()
    return {}


def judge(name: str, data: dict[str, Any], config: RunConfig, profile: Profile) -> list[Result]:
    return catalog.load(name).judge(data, profile, getattr(config.bench, name))


def sampler_for(nvml: Any | None, has_gpus: bool) -> TelemetrySampler | None:
    return TelemetrySampler(nvml).start() if nvml is not None and has_gpus else None


def telemetry_results(name: str, sampler: TelemetrySampler | None, label: str) -> list[Result]:
    telemetry = sampler.stop() if sampler else None
    return judge_telemetry(name, telemetry, label)


def run_in_ranks(
    rt: Runtime, name: str, config: RunConfig, profile: Profile, has_gpus: bool, nvml: Any | None
) -> tuple[list[Result], list[Result]]:
    """One benchmark inside an outside launcher's job (every rank calls this); a failure raises (the caller
    records it so every rank stops) instead of becoming ERROR: the job's process group cannot recover."""
    spec = bench_spec(name, config, profile, has_gpus)
    rt.set_phase(f"bench {name}")
    sampler = sampler_for(nvml, has_gpus) if rt.local_rank == 0 else None
    try:
        data = worker.run(rt, spec)
    finally:
        telemetry = telemetry_results(name, sampler, rt.me.node) if rt.local_rank == 0 else []
    return (judge(name, data, config, profile) if data is not None else []), telemetry


class LaunchError(RuntimeError):
    """The benchmark's workers failed or hung: the message names the rank, its node and the cause."""


def launch_local(
    nproc: int,
    spec: dict[str, Any],
    workdir: Path,
    timeout_s: float,
    env_overrides: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One benchmark on this node alone in nproc ranks (gpucert's launcher); rank 0's data (tests, GPU plans).
    timeout_s bounds the benchmark (a hung one raises LaunchError naming where each rank was)."""
    from gpucert.runtime.config import RuntimeConfig
    from gpucert.runtime.launch_env import NodeEnv
    from gpucert.runtime.launcher import launch_ranks, python_module

    spec = {"runtime": {}, **spec, "timeout_s": timeout_s}
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = workdir / "spec.json", workdir / "result.json"
    out_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec))
    argv = python_module("gpucert.bench.worker", str(spec_path), str(out_path))
    node = NodeEnv("local", 0, 1, "127.0.0.1", 0)
    outcome = launch_ranks(node, nproc, argv, RuntimeConfig(**spec["runtime"]), workdir / "logs", env_overrides)
    if not outcome.ok:
        raise LaunchError(f"{spec['benchmark']}: {outcome.cause}")
    if not out_path.exists():
        raise LaunchError(f"{spec['benchmark']}: rank 0 wrote no result")
    return json.loads(out_path.read_text())
