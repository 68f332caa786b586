"""On a GPU node: fp32 matmuls are true fp32, the burn runs on every GPU with NVML telemetry and equal checksums,
and a GPU that another process keeps busy FAILs the burn by name (with 2 or more GPUs).

Run there with `python -m pytest -m gpu tests/gpu/test_bench_burn.py`; elsewhere these tests are skipped.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from gpucert.bench import burn, matmul
from gpucert.bench.suite import launch_local
from gpucert.config.profiles import load_profile
from gpucert.config.run import BurnBenchConfig
from gpucert.status import Status

pytestmark = pytest.mark.gpu

LOAD_GPU = Path(__file__).parents[2] / "tools" / "load_gpu.py"


def relative_error(dtype: str) -> float:
    device = torch.device("cuda", 0)
    a, b = matmul.make_operands(dtype, 4096, 4096, 4096, device, 1)[0]
    with matmul.float32_math(dtype):
        out = matmul.matmul_fn(dtype, [(a, b)])(0)
    reference = a.double() @ b.double()
    return float((out.double() - reference).abs().max() / reference.abs().max())


def test_fp32_is_true_fp32_and_tf32_is_not() -> None:
    # fp32 accumulates 4096 products with a 24-bit mantissa (~1e-6 relative); TF32 keeps 10 bits (~1e-3).
    assert relative_error("fp32") < 1e-5
    assert relative_error("tf32") > 1e-4


def profile_of_this_gpu():
    name = torch.cuda.get_device_name(0)
    return load_profile("h200" if "H200" in name else "h100-sxm")


def test_the_burn_runs_on_every_gpu_with_telemetry_and_equal_checksums(tmp_path: Path) -> None:
    n = torch.cuda.device_count()
    cfg = BurnBenchConfig(duration_s=8, window_s=0.5)
    data = launch_local(n, {"benchmark": "burn", "config": asdict(cfg)}, tmp_path, timeout_s=300)
    for row in data["ranks"]:
        assert len(row["windows"]) >= 12 and row["telemetry_note"] is None
        assert any(c for c in row["telemetry"]["sm_clock_mhz"]) and any(p for p in row["telemetry"]["power_w"])
        assert row["sdc"]["cold"] == row["sdc"]["hot"]
    assert len({row["sdc"]["hot"] for row in data["ranks"]}) == 1
    results = burn.judge(data, profile_of_this_gpu(), cfg)
    assert [r.status for r in results if r.name == "burn.bf16"] == [Status.PASS] * n, [r.message for r in results]
    assert [r.status for r in results if r.name == "burn.sdc"] == [Status.PASS] * n


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU to compare with")
def test_a_gpu_busy_with_another_process_fails_by_name(tmp_path: Path) -> None:
    load = subprocess.Popen(
        [sys.executable, str(LOAD_GPU), "--gpu", "1", "--seconds", "60"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert load.stdout is not None and "loading GPU 1" in load.stdout.readline()
        cfg = BurnBenchConfig(duration_s=10, window_s=0.5)
        data = launch_local(torch.cuda.device_count(), {"benchmark": "burn", "config": asdict(cfg)}, tmp_path, 300)
    finally:
        load.kill()
        load.wait()
    results = {r.gpu_index: r for r in burn.judge(data, profile_of_this_gpu(), cfg) if r.name == "burn.bf16"}
    busy = [r for r in results.values() if r.status is Status.FAIL]
    assert [r.gpu_index for r in busy] == [data["ranks"][1]["gpu_index"]], [r.message for r in results.values()]
    assert "below the node's best" in busy[0].message
