"""The training proxy on every GPU of a real node: the 1B preset learns and reaches a plausible MFU.

Run there with `python -m pytest -m gpu tests/gpu/test_bench_train.py`; elsewhere it is skipped.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from gpucert.bench.suite import launch_local
from gpucert.bench.train_proxy import judge
from gpucert.config.profiles import select_profile
from gpucert.config.run import TrainBenchConfig
from gpucert.status import Status

pytestmark = pytest.mark.gpu


def test_1b_proxy_on_all_gpus(tmp_path: Path) -> None:
    n = torch.cuda.device_count()
    profile = select_profile([torch.cuda.get_device_name(0)])
    cfg = TrainBenchConfig(model="1b", seq_len=2048, micro_batch=4, steps=12)
    spec = {"benchmark": "train", "config": {**asdict(cfg), "peak_tflops": profile.bf16_peak_tflops}}
    data = launch_local(n, spec, tmp_path, timeout_s=600)

    assert data["world_sizes"] == ([1, n] if n > 1 else [1])
    assert 1.1e9 < data["params"] < 1.3e9
    assert all(0.05 < m < 1 for m in data["mfu"]), data["mfu"]
    results = {r.name: r for r in judge(data, profile, cfg)}
    assert results["train.loss_decreasing"].status is Status.PASS, results["train.loss_decreasing"].message
    assert results["train.mfu"].status in (Status.PASS, Status.FAIL)
