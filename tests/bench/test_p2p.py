"""p2p: judging the pair matrix (floor, deviation from the median, wrong bytes) and the no-GPU path."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpucert.bench import p2p
from gpucert.config.profiles import BenchmarkExpectations, Profile
from gpucert.config.run import P2pBenchConfig
from gpucert.runtime.group import start_runtime, stop_runtime
from gpucert.status import Status

CFG = P2pBenchConfig()


def _profile(floor: float | None = 330.0, deviation_pct: float = 15.0) -> Profile:
    benchmarks = BenchmarkExpectations(p2p_gbps_min=floor, p2p_pair_deviation_pct=deviation_pct)
    return Profile(name="h200", description="test", benchmarks=benchmarks)


def _data(n: int = 4, gbps: float = 370.0, **pairs: Any) -> dict:
    """n GPUs copying at gbps; pairs like p2_3=200.0 override one ordered pair."""
    matrix = [[None if i == j else gbps for j in range(n)] for i in range(n)]
    for key, value in pairs.items():
        i, j = map(int, key[1:].split("_"))
        matrix[i][j] = value
    return {
        "applicable": True,
        "gpus": n,
        "size_bytes": 1 << 30,
        "matrix_gbps": matrix,
        "cv": [[None if i == j else 0.01 for j in range(n)] for i in range(n)],
        "wrong": [[None if i == j else 0 for j in range(n)] for i in range(n)],
        "peer_access": [[i != j for j in range(n)] for i in range(n)],
        "uuids": [f"GPU-{i}" for i in range(n)],
        "warmup": 5,
        "repeats": 20,
    }


def test_healthy_matrix_passes_with_the_lowest_pair_as_value() -> None:
    [r] = p2p.judge(_data(p0_1=360.0), _profile(), CFG)
    assert (r.name, r.status, r.value, r.unit, r.category) == ("p2p.matrix", Status.PASS, 360.0, "GB/s", "benchmark")
    assert r.expected.startswith(">= 330 GB/s per pair")
    assert (
        r.threshold_source == "profile h200: benchmarks.p2p_gbps_min; profile h200: benchmarks.p2p_pair_deviation_pct"
    )
    assert len(r.details["matrix_gbps"]) == 4 and r.details["matrix_gbps"][2][2] is None
    assert r.details["size_bytes"] == 1 << 30


def test_values_keep_full_precision() -> None:
    [r] = p2p.judge(_data(p0_1=361.23456789), _profile(), CFG)
    assert r.value == 361.23456789  # rendering rounds, the JSON does not
    assert "lowest pair 361.2 GB/s" in r.message


def test_a_weak_pair_fails_and_is_named() -> None:
    matrix, pair = p2p.judge(_data(p2_3=200.0), _profile(), CFG)
    assert matrix.status is Status.FAIL and matrix.value == 200.0 and "GPU 2 -> GPU 3" in matrix.message
    assert (pair.name, pair.subject, pair.status, pair.value) == ("p2p.pair", "GPU 2 -> GPU 3", Status.FAIL, 200.0)
    assert "200.0 GB/s, below the floor 330" in pair.message and "median 370.0" in pair.message
    assert pair.message.startswith("expected >= 330 GB/s") and pair.message.endswith("on GPU 2 -> GPU 3")
    assert pair.details["src"] == 2 and pair.details["dst"] == 3 and pair.remediation


def test_deviation_from_the_median_fails_without_a_floor() -> None:
    # 15 % below a 370 median is 314.5: 300 fails, 330 (11 % below) passes.
    matrix, pair = p2p.judge(_data(p1_0=300.0, p0_1=330.0), _profile(floor=None), CFG)
    assert matrix.status is Status.FAIL and pair.subject == "GPU 1 -> GPU 0"
    assert "19 % below the median 370.0" in pair.message
    [ok] = p2p.judge(_data(p0_1=330.0), _profile(floor=None), CFG)
    assert ok.status is Status.PASS and "no floor set" in ok.message


def test_wrong_bytes_fail_even_at_full_speed() -> None:
    data = _data()
    data["wrong"][3][1] = 12
    _, pair = p2p.judge(data, _profile(floor=None), CFG)
    assert pair.subject == "GPU 3 -> GPU 1" and "12 wrong bytes" in pair.message


def test_one_gpu_and_no_gpu_are_skipped() -> None:
    [one] = p2p.judge(_data(n=1), _profile(), CFG)
    assert one.status is Status.SKIP and "no peer" in one.message
    [none] = p2p.judge({"applicable": False, "reason": "no GPUs"}, _profile(), CFG)
    assert none.status is Status.SKIP and "no GPUs" in none.message


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_measure_on_a_cpu_is_not_applicable() -> None:
    rt = start_runtime(environ={})
    try:
        data = p2p.measure(rt, {"size_mib": 4, "warmup": 1, "repeats": 3})
    finally:
        stop_runtime(rt)
    assert data == {"nodes": [{"applicable": False, "reason": "no GPUs", "node": rt.me.node}]}
    [skip] = p2p.judge(data, _profile(), CFG)
    assert (skip.status, skip.subject, skip.node) == (Status.SKIP, rt.me.node, rt.me.node)
