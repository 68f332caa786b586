"""Collectives: the nccl-tests formulas, the exact-answer check, the judge, and one real 2-rank gloo run."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from gpucert.bench import collectives as coll
from gpucert.bench.suite import launch_local
from gpucert.config.profiles import BenchmarkExpectations, Profile
from gpucert.config.run import CollectivesBenchConfig
from gpucert.status import Status

OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]
GIB = 1 << 30


def test_busbw_factors_are_nccl_tests() -> None:
    assert coll.busbw_factor("all_reduce", 4) == 1.5
    assert coll.busbw_factor("all_reduce", 8) == 1.75
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert coll.busbw_factor(op, 8) == 0.875
    assert coll.busbw_factor("broadcast", 8) == coll.busbw_factor("send_recv", 8) == 1.0
    with pytest.raises(ValueError, match="unknown collective"):
        coll.busbw_factor("gather", 2)


def test_bus_bandwidth_units_and_two_ranks() -> None:
    # The lent 4xH200 run: 4 GiB all_reduce at algbw 242.0 GB/s is busbw 363.0 (acceptance-testing.md §5).
    algbw, busbw = coll.bus_bandwidth("all_reduce", 4 * GIB, 4 * GIB / 242.0e9, 4)
    assert algbw == pytest.approx(242.0)
    assert busbw == pytest.approx(363.0)
    algbw, busbw = coll.bus_bandwidth("all_reduce", 1 << 20, 1e-3, 2)
    assert algbw == busbw == pytest.approx((1 << 20) / 1e-3 / 1e9)


def test_message_sizes_and_element_counts() -> None:
    assert coll.message_sizes(1024, 65536) == [1024 << k for k in range(7)]
    assert coll.message_sizes(1000, 5000) == [1000, 2000, 4000]
    with pytest.raises(ValueError):
        coll.message_sizes(2048, 1024)
    # Split ops round down to a multiple of the rank count, as nccl-tests does.
    assert coll.element_counts("all_gather", 1024, 3, 4) == (85, 255, 1020)
    assert coll.element_counts("reduce_scatter", 1024, 3, 4) == (255, 85, 1020)
    assert coll.element_counts("all_reduce", 1024, 3, 2) == (512, 512, 1024)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("n", [2, 3, 8, 16, 64, 256])
def test_pattern_sums_stay_exact_and_vary(dtype: str, n: int) -> None:
    exact = coll.EXACT_INTEGER_MAX[dtype]
    for op in ("all_reduce", "all_gather"):
        pattern = coll.choose_pattern(op, dtype, n)
        assert pattern is not None
        assert pattern.period >= 2  # never a constant along the buffer
        assert max(max(pattern.table(r)) for r in range(n)) <= exact
        assert len(set(pattern.sum_table(n))) > 1
    # Every partial sum of a reduction is at most the sum of every rank's largest value.
    reduction = coll.choose_pattern("all_reduce", dtype, n)
    assert reduction is not None and sum(max(reduction.table(r)) for r in range(n)) <= exact
    if n <= 16:
        assert len(set(reduction.table(0) + reduction.table(1))) >= 8


def test_no_exact_reduction_pattern_beyond_the_dtype() -> None:
    assert coll.choose_pattern("all_reduce", "bf16", 257) is None  # checked in fp32 instead
    assert coll.choose_pattern("all_gather", "bf16", 257) is not None


def _simulate(op: str, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
    """What rank's output of op is, computed on the CPU from every rank's input (sums in the dtype)."""
    n = len(inputs)
    total = inputs[0].clone()
    for x in inputs[1:]:
        total += x
    if op == "all_reduce":
        return total
    if op == "broadcast":
        return inputs[0].clone()
    if op == "all_gather":
        return torch.cat(inputs)
    chunk = inputs[0].numel() // n
    if op == "reduce_scatter":
        return total[rank * chunk : (rank + 1) * chunk].clone()
    if op == "all_to_all":
        return torch.cat([x[rank * chunk : (rank + 1) * chunk] for x in inputs])
    partner = coll.send_recv_partner(rank, n)
    return inputs[partner].clone() if partner is not None else torch.empty(0, dtype=total.dtype)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [2, 3, 8])
def test_expected_segments_match_the_op_and_catch_one_wrong_element(op: str, n: int) -> None:
    pattern = coll.choose_pattern(op, "bf16", n)
    assert pattern is not None
    count_in, _, _ = coll.element_counts(op, 4000, n, 2)
    inputs = []
    for rank in range(n):
        x = torch.empty(count_in, dtype=torch.bfloat16)
        coll.fill_segment(x, coll.input_segment(pattern, rank, count_in))
        inputs.append(x)
    assert len(set(inputs[0].tolist())) > 1
    for rank in range(n):
        out = _simulate(op, inputs, rank)
        segments = coll.expected_segments(op, pattern, rank, n, count_in)
        assert coll.count_wrong(out, segments) == 0
        if out.numel():
            out[out.numel() // 2] += 1
            out[-1] = float("nan")
            assert coll.count_wrong(out, segments) == 2


def test_unwritten_output_is_counted_wrong() -> None:
    pattern = coll.choose_pattern("all_gather", "fp32", 2)
    assert pattern is not None
    out = torch.full((100,), coll.SENTINEL)
    assert coll.count_wrong(out, coll.expected_segments("all_gather", pattern, 0, 2, 50)) == 100


def test_nccl_environment_keeps_only_nccl_variables() -> None:
    env = {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "0", "XNCCL_X": "1"}
    assert coll.nccl_environment(env) == {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN"}
    assert coll.ring_env() == {"NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "0", "NCCL_COLLNET_ENABLE": "0"}


# --- judge on synthetic curves ----------------------------------------------------------------------------


def _profile(**floors: float) -> Profile:
    return Profile(name="h200", description="test", benchmarks=BenchmarkExpectations(busbw_gbps_min=floors))


def _curve(op: str = "all_reduce", busbw: tuple[float, ...] = (100.0, 300.0, 363.0), **over: Any) -> dict:
    sizes = [GIB, 2 * GIB, 4 * GIB][: len(busbw)]
    curve = {
        "op": op,
        "dtype": "bf16",
        "world_size": 4,
        "backend": "nccl",
        "sizes_bytes": sizes,
        "time_us": [1.0] * len(sizes),
        "algbw_gbps": [b / 1.5 for b in busbw],
        "busbw_gbps": list(busbw),
        "cv": [0.01] * len(sizes),
        "wrong": [0] * len(sizes),
        "nccl_version": "2.28.3",
        "nccl_env": {},
    }
    return {**curve, **over}


def _data(*curves: dict, **over: Any) -> dict:
    return {"applicable": True, "world_size": 4, "backend": "nccl", "nccl_env": {}, "ops": list(curves), **over}


CFG = CollectivesBenchConfig(gate_bytes=4 * GIB)


def test_judge_passes_above_the_floor_at_the_gate_size() -> None:
    [r] = coll.judge(_data(_curve()), _profile(all_reduce=340), CFG)
    assert (r.name, r.status, r.value, r.unit, r.category) == (
        "collective.all_reduce",
        Status.PASS,
        363.0,
        "GB/s",
        "benchmark",
    )
    assert r.subject == "4 ranks (nccl)"
    assert r.expected == ">= 340 GB/s busbw at 4 GiB"
    assert r.threshold_source == "profile h200: benchmarks.busbw_gbps_min.all_reduce"
    assert r.details["sizes_bytes"] == [GIB, 2 * GIB, 4 * GIB] and r.details["busbw_gbps"][-1] == 363.0


def test_judge_fails_below_the_floor_and_uses_the_largest_size_under_the_gate() -> None:
    [r] = coll.judge(_data(_curve()), _profile(all_reduce=340), CollectivesBenchConfig(gate_bytes=3 * GIB))
    assert r.status is Status.FAIL and r.value == 300.0
    assert r.message == "expected busbw >= 340 GB/s at 2 GiB, found 300.0 GB/s, on all_reduce on 4 ranks (nccl), bf16"
    assert r.remediation


def test_judge_fails_on_any_wrong_element_even_without_a_floor() -> None:
    [r] = coll.judge(_data(_curve(op="all_gather", wrong=[0, 7, 0])), _profile(), CFG)
    assert r.status is Status.FAIL
    assert "all_gather" in r.message and "7 at 2 GiB" in r.message and r.message.startswith("expected 0 wrong")
    assert r.remediation


def test_judge_without_a_floor_passes_and_says_so() -> None:
    [r] = coll.judge(_data(_curve(op="broadcast")), _profile(all_reduce=340), CFG)
    assert r.status is Status.PASS and r.value == 363.0
    assert "no floor set" in r.message and "busbw_gbps_min.broadcast" in r.message


def test_judge_warns_on_spread_at_the_gate_size() -> None:
    [r] = coll.judge(_data(_curve(cv=[0.5, 0.01, 0.08])), _profile(all_reduce=340), CFG)
    assert r.status is Status.WARN and "0.080" in r.message


def test_judge_errors_when_no_size_is_at_or_below_the_gate() -> None:
    [r] = coll.judge(_data(_curve()), _profile(all_reduce=340), CollectivesBenchConfig(gate_bytes=1024))
    assert r.status is Status.ERROR and r.value is None


def test_judge_errors_when_force_ring_was_not_in_effect() -> None:
    cfg = CollectivesBenchConfig(gate_bytes=4 * GIB, force_ring=True)
    results = coll.judge(_data(_curve(), ring_env_in_effect=False), _profile(all_reduce=340), cfg)
    assert [r.status for r in results] == [Status.PASS, Status.ERROR]
    assert results[1].name == "collective.force_ring" and "NCCL_ALGO=Ring" in results[1].message
    ok = coll.judge(_data(_curve(), ring_env_in_effect=True), _profile(all_reduce=340), cfg)
    assert [r.status for r in ok] == [Status.PASS]


def test_judge_skips_a_single_rank() -> None:
    data = {"applicable": False, "reason": "one rank: a collective needs a peer", "world_size": 1, "ops": []}
    [r] = coll.judge(data, _profile(), CFG)
    assert r.status is Status.SKIP and "one rank" in r.message


# --- a real run: two gloo processes through the launcher ----------------------------------------------------


def test_two_rank_gloo_run_measures_and_checks_every_op(tmp_path: Path) -> None:
    cfg = CollectivesBenchConfig(dtype="fp32", min_bytes=1024, max_bytes=65536, gate_bytes=65536, warmup=1, repeats=3)
    data = launch_local(2, {"benchmark": "collectives", "config": asdict(cfg)}, tmp_path, timeout_s=120)
    assert data["backend"] == "gloo" and data["world_size"] == 2 and data["nccl_version"] is None
    assert [c["op"] for c in data["ops"]] == OPS
    for curve in data["ops"]:
        assert curve["sizes_bytes"] == [1024 << k for k in range(7)]
        assert all(b > 0 for b in curve["busbw_gbps"]) and all(t > 0 for t in curve["time_us"])
        assert curve["wrong"] == [0] * 7, curve["op"]
    results = coll.judge(data, _profile(), cfg)
    assert [r.status for r in results] == [Status.PASS] * len(OPS)
