"""On a GPU node: collectives over NCCL on every visible GPU, and the p2p matrix.

Run there with `python -m pytest -m gpu tests/gpu/test_bench_collectives.py`; elsewhere these are skipped.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from gpucert.bench import collectives, p2p
from gpucert.bench.suite import launch_local
from gpucert.config.profiles import load_profile
from gpucert.config.run import CollectivesBenchConfig, P2pBenchConfig
from gpucert.status import Status

pytestmark = pytest.mark.gpu

MIB = 1 << 20


def test_collectives_on_every_gpu_are_correct(tmp_path: Path) -> None:
    n = torch.cuda.device_count()
    cfg = CollectivesBenchConfig(min_bytes=MIB, max_bytes=256 * MIB, gate_bytes=256 * MIB, warmup=2, repeats=5)
    data = launch_local(n, {"benchmark": "collectives", "config": asdict(cfg)}, tmp_path, timeout_s=600)
    if n < 2:
        assert data["applicable"] is False
        return
    assert data["backend"] == "nccl" and data["world_size"] == n and data["nccl_version"]
    assert [c["op"] for c in data["ops"]] == cfg.ops
    for curve in data["ops"]:
        assert curve["dtype"] == "bf16" and len(curve["sizes_bytes"]) == 9
        assert curve["wrong"] == [0] * 9, curve["op"]
    all_reduce = data["ops"][0]
    assert all(b > 0 for b in all_reduce["busbw_gbps"])
    results = collectives.judge(data, load_profile("h200"), cfg)
    assert all(r.status is not Status.ERROR for r in results)


def test_force_ring_reaches_nccl(tmp_path: Path) -> None:
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("needs two GPUs")
    cfg = CollectivesBenchConfig(
        ops=["all_reduce"], min_bytes=MIB, max_bytes=4 * MIB, gate_bytes=4 * MIB, force_ring=True
    )
    spec = {"benchmark": "collectives", "config": asdict(cfg)}
    data = launch_local(n, spec, tmp_path, timeout_s=300, env_overrides=collectives.ring_env())
    assert data["ring_env_in_effect"] and data["nccl_env"]["NCCL_ALGO"] == "Ring"
    assert data["ops"][0]["wrong"] == [0, 0, 0]


def test_p2p_matrix_covers_every_pair(tmp_path: Path) -> None:
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("needs two GPUs")
    cfg = P2pBenchConfig(size_mib=256, warmup=2, repeats=5)
    data = launch_local(n, {"benchmark": "p2p", "config": asdict(cfg)}, tmp_path, timeout_s=300)
    (node,) = data["nodes"]  # one node's matrix, measured by its local rank 0
    matrix = node["matrix_gbps"]
    assert len(matrix) == n and all(len(row) == n for row in matrix)
    for i in range(n):
        for j in range(n):
            assert (matrix[i][j] is None) if i == j else matrix[i][j] > 0
            assert (node["wrong"][i][j] or 0) == 0
    results = p2p.judge(data, load_profile("h200"), cfg)
    assert results[0].name == "p2p.matrix" and results[0].status is not Status.ERROR
    assert results[0].node == node["node"] and results[0].subject.startswith(node["node"])
