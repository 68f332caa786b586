"""Run benchmarks by name and judge them: as a step of gpucert's node agents (one set of workers per
benchmark on every node) or inside an outside launcher's ranks (torchrun, srun), sampling telemetry meanwhile.

A benchmark that crashes or hangs becomes an ERROR result naming the rank, its node and the cause (a worker's
own exception: its type, message and where it was raised); under the agents it never stops the suite and
never passes.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from gpucert.bench import catalog, worker
from gpucert.bench.telemetry import TelemetrySampler, judge_telemetry
from gpucert.config.profiles import Profile
from gpucert.config.run import RunConfig
from gpucert.report.schema import Result
from gpucert.runtime.agent import NodeAgent
from gpucert.runtime.group import AbortRecord, Runtime
from gpucert.status import Status


def bench_spec(name: str, config: RunConfig, profile: Profile, has_gpus: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """What a worker needs (benchmark, its config, the runtime's timeouts) and the environment it starts with."""
    section = getattr(config.bench, name)
    cfg = dataclasses.asdict(section)
    env: dict[str, str] = {}
    if name == "train":
        cfg["peak_tflops"] = profile.bf16_peak_tflops if has_gpus else None
    if name == "collectives" and section.force_ring:
        from gpucert.bench.collectives import ring_env

        env = ring_env()
    return {"benchmark": name, "config": cfg, "runtime": dataclasses.asdict(config.runtime)}, env


def judge(name: str, data: dict[str, Any], config: RunConfig, profile: Profile) -> list[Result]:
    return catalog.load(name).judge(data, profile, getattr(config.bench, name))


def error_result(
    name: str,
    subject: str,
    message: str,
    node: str | None = None,
    logs: Path | None = None,
    details: dict[str, Any] | None = None,
) -> Result:
    return Result(
        name=f"bench.{name}",
        subject=subject,
        status=Status.ERROR,
        category="benchmark",
        node=node,
        message=f"the {name} benchmark failed: {message}",
        remediation=f"each rank's log is in {logs} (on its node)"
        if logs
        else f"re-run `gpucert bench {name}` alone to see the workers' output",
        details=details or {},
    )


def worker_failure(step_dir: Path, failure: AbortRecord) -> tuple[str, dict[str, Any]]:
    """What failed, in one line, and the failing rank's own account where it left one on this node
    (worker.write_failure): its exception, where it was raised and the traceback's last lines. The agent's
    record alone can only say how the process ended (a lone rank has no store to record its cause in)."""
    if failure.rank is None:
        return failure.message(), {}
    path = worker.failure_path(step_dir / "result.json", failure.rank)
    try:
        own = json.loads(path.read_text())
    except (OSError, ValueError):
        return failure.message(), {}
    record = AbortRecord(**{k: own[k] for k in ("who", "cause", "phase", "rank", "node")})
    where = f" (raised at {own['where']})" if own.get("where") else ""
    return record.message() + where, {"traceback": own.get("traceback", [])}


def clear_step(step_dir: Path) -> tuple[Path, Path]:
    """The step's spec and result paths, with no result or failure left from an earlier step."""
    step_dir.mkdir(parents=True, exist_ok=True)
    for old in (step_dir / "result.json", *step_dir.glob("failure-rank*.json")):
        old.unlink(missing_ok=True)
    return step_dir / "spec.json", step_dir / "result.json"


def sampler_for(nvml: Any | None, has_gpus: bool) -> TelemetrySampler | None:
    return TelemetrySampler(nvml).start() if nvml is not None and has_gpus else None


def telemetry_results(name: str, sampler: TelemetrySampler | None, label: str) -> list[Result]:
    telemetry = sampler.stop() if sampler else None
    return judge_telemetry(name, telemetry, label)


def run_step(
    agent: NodeAgent,
    name: str,
    config: RunConfig,
    profile: Profile,
    has_gpus: bool,
    workdir: Path,
    nvml: Any | None,
) -> tuple[list[Result], list[Result], str | None]:
    """One benchmark across every node's agent: (judged results on node 0, this node's telemetry results,
    why a node was lost during it, if one was)."""
    spec, env = bench_spec(name, config, profile, has_gpus)
    step_dir = workdir / name
    spec_path, out_path = clear_step(step_dir)
    spec_path.write_text(json.dumps(spec))
    argv = [sys.executable, "-m", "gpucert.bench.worker", str(spec_path), str(out_path)]
    sampler = sampler_for(nvml, has_gpus)
    try:
        # The burn runs for its duration by design: the timeout counts beyond it.
        timeout_s = config.bench.timeout_s + (config.bench.burn.duration_s if name == "burn" else 0)
        step = agent.run_step(name, argv, timeout_s, env)
    finally:
        telemetry = telemetry_results(name, sampler, agent.label)
    if not agent.is_head:
        return [], telemetry, step.lost
    if step.failure is not None:
        failure = step.failure
        message, details = worker_failure(step_dir, failure)
        judged = [error_result(name, failure.node or agent.label, message, failure.node, step.logs, details)]
    elif not out_path.exists():
        judged = [error_result(name, agent.label, "rank 0 wrote no result", agent.label)]
    else:
        judged = judge(name, json.loads(out_path.read_text()), config, profile)
    return judged, telemetry, step.lost


def run_in_ranks(
    rt: Runtime, name: str, config: RunConfig, profile: Profile, has_gpus: bool, nvml: Any | None
) -> tuple[list[Result], list[Result]]:
    """One benchmark inside an outside launcher's job (every rank calls this); a failure raises (the caller
    records it so every rank stops) instead of becoming ERROR: the job's process group cannot recover."""
    spec, _ = bench_spec(name, config, profile, has_gpus)
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
    """One benchmark on this node alone in nproc worker processes; rank 0's data (tests, GPU plans)."""
    from gpucert.runtime.config import RuntimeConfig
    from gpucert.runtime.launch_env import NodeEnv

    spec = {"runtime": {}, **spec}
    agent = NodeAgent.start(NodeEnv("local", 0, 1, "127.0.0.1", 0), nproc, RuntimeConfig(**spec["runtime"]), workdir)
    spec_path, out_path = clear_step(workdir)
    spec_path.write_text(json.dumps(spec))
    argv = [sys.executable, "-m", "gpucert.bench.worker", str(spec_path), str(out_path)]
    step = agent.run_step(spec["benchmark"], argv, timeout_s, env_overrides)
    if step.failure is not None:
        raise LaunchError(f"{spec['benchmark']}: {worker_failure(workdir, step.failure)[0]}")
    if not out_path.exists():
        raise LaunchError(f"{spec['benchmark']}: rank 0 wrote no result")
    return json.loads(out_path.read_text())
