"""Health inside a launched job: the job's own ranks hold their GPUs, and must not make them look busy."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from gpucert.config.profiles import load_profile
from gpucert.config.run import HealthConfig
from gpucert.hardware.inventory import bundle_sources, collect_inventory
from gpucert.health.suite import run_health
from gpucert.status import Status


def test_only_processes_outside_the_run_make_a_gpu_busy(bundle_copy) -> None:
    bundle: Path = bundle_copy("h200x4")
    snapshot = json.loads((bundle / "nvml-snapshot.json").read_text())
    snapshot["devices"][0]["nvmlDeviceGetComputeRunningProcesses"] = [{"pid": 4242, "usedGpuMemory": 1 << 30}]
    snapshot["devices"][1]["nvmlDeviceGetComputeRunningProcesses"] = [{"pid": 777, "usedGpuMemory": 1 << 30}]
    (bundle / "nvml-snapshot.json").write_text(json.dumps(snapshot))
    inventory = collect_inventory(bundle_sources(bundle))
    now = datetime.now(timezone.utc)
    args = (inventory, load_profile("h200"), HealthConfig(liveness=False), ("", None), None, now)
    idle = {r.gpu_index: r.status for r in run_health(*args, own_pids=frozenset({4242})) if r.name == "gpu.idle"}
    assert idle[0] is Status.PASS  # our own rank
    assert idle[1] is Status.WARN  # somebody else's process
    before = {r.gpu_index: r.status for r in run_health(*args) if r.name == "gpu.idle"}
    assert before[0] is Status.WARN
