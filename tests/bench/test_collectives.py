"""Collectives: the nccl-tests formulas, the exact-answer check, the judge, and one real 2-rank gloo run."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from gpucert.bench import collectives as coll
from gpucert.bench.suite import launch_local
from gpucert.bench.timing import Timing, iters_to_fill, time_batches
from gpucert.config.profiles import BenchmarkExpectations, Profile, load_profile
from gpucert.config.run import CollectivesBenchConfig
from gpucert.status import Status

OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]
GIB = 1 << 30
RESULTS = Path(__file__).parents[2] / "docs/results"


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


def test_graph_batches_are_whole_graphs_of_at_most_graph_calls() -> None:
    # A batch replays one graph; the calls it makes (what time per call divides by) are never fewer than asked.
    assert coll.graph_split(700, 20) == (20, 35)
    assert coll.graph_split(701, 20) == (20, 36)
    assert coll.graph_split(7, 20) == (7, 1)
    assert coll.graph_split(1, 1) == (1, 1)
    with pytest.raises(ValueError, match="graph_calls"):
        coll.graph_split(10, 0)


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


# --- timing arithmetic --------------------------------------------------------------------------------------


def test_batch_rates_are_nccl_tests_arithmetic() -> None:
    # 400 back-to-back 1 KiB all_reduces on 2 ranks in 10 ms: 25 us each (nccl-tests' "time").
    rates = coll.batch_rates("all_reduce", 1024, 400, 0.010, 2)
    assert rates.time_us == pytest.approx(25.0)
    assert rates.algbw_gbps == pytest.approx(1024 / 25e-6 / 1e9)
    assert rates.busbw_gbps == pytest.approx(rates.algbw_gbps)  # 2 ranks: factor 1
    # One 4 GiB all_reduce on 4 ranks in 17.7488 ms: algbw 242.0, busbw 363.0 (acceptance-testing.md §5).
    big = coll.batch_rates("all_reduce", 4 * GIB, 1, 4 * GIB / 242.0e9, 4)
    assert (big.algbw_gbps, big.busbw_gbps) == (pytest.approx(242.0), pytest.approx(363.0))
    assert big.time_us == pytest.approx(4 * GIB / 242.0e9 * 1e6)
    # all_gather on 8 ranks: busbw = algbw x 7/8.
    gather = coll.batch_rates("all_gather", 1 << 20, 10, 1e-3, 8)
    assert gather.busbw_gbps == pytest.approx(gather.algbw_gbps * 7 / 8)


def test_batches_fill_the_target_time() -> None:
    assert iters_to_fill(25e-6, 5e-3, 1000) == 200  # a latency-bound 1 KiB op: many calls per batch
    assert iters_to_fill(17.8e-3, 5e-3, 1000) == 1  # a 4 GiB op: one call is the batch
    assert iters_to_fill(1e-6, 5e-3, 1000) == 1000  # capped
    assert iters_to_fill(0.0, 5e-3, 64) == 64


def test_time_batches_times_whole_batches_of_back_to_back_calls() -> None:
    calls: list[int] = []
    timing = time_batches(calls.append, torch.device("cpu"), warmup=3, iters=7, repeats=4)
    assert calls == list(range(3 + 7 * 4))  # warmup first, then every batch's calls, each index once
    assert len(timing.samples_s) == 4 and all(t >= 0 for t in timing.samples_s)
    replays: list[int] = []
    time_batches(calls.append, torch.device("cpu"), warmup=0, iters=7, repeats=2, replay=lambda: replays.append(1))
    assert replays == [1, 1]  # a captured batch replaces the calls
    with pytest.raises(ValueError, match="iters >= 1"):
        time_batches(calls.append, torch.device("cpu"), warmup=0, iters=0, repeats=1)


def test_timing_summary_keeps_full_precision() -> None:
    timing = Timing.of([1.0, 2.0, 4.0])
    assert timing.summary()["cv"] == timing.cv  # not rounded: rendering rounds, the JSON does not


# --- judge on synthetic curves ----------------------------------------------------------------------------


def _profile(name: str = "h200", **floors: Any) -> Profile:
    return Profile(name=name, description="test", benchmarks=BenchmarkExpectations(busbw_gbps_min=floors))


def _curve(op: str = "all_reduce", busbw: tuple[float, ...] = (100.0, 300.0, 363.0), **over: Any) -> dict:
    sizes = [GIB, 2 * GIB, 4 * GIB][: len(busbw)]
    curve = {
        "op": op,
        "dtype": "bf16",
        "world_size": 4,
        "num_nodes": 1,
        "backend": "nccl",
        "sizes_bytes": sizes,
        "iters": [1] * len(sizes),
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
    # A plain number is one floor for every count: the source is the field itself.
    assert r.threshold_source == "profile h200: benchmarks.busbw_gbps_min.all_reduce"
    assert r.details["sizes_bytes"] == [GIB, 2 * GIB, 4 * GIB] and r.details["busbw_gbps"][-1] == 363.0


def test_judge_fails_below_the_floor_and_uses_the_largest_size_under_the_gate() -> None:
    [r] = coll.judge(_data(_curve()), _profile(all_reduce=340), CollectivesBenchConfig(gate_bytes=3 * GIB))
    assert r.status is Status.FAIL and r.value == 300.0
    assert r.message == (
        "expected busbw >= 340 GB/s at 2 GiB, found 300.0 GB/s, on all_reduce on 4 ranks (nccl), bf16; "
        "latency 1.0 us at 1 GiB, 1.0 us at 2 GiB"
    )
    assert r.remediation


def test_judge_fails_on_any_wrong_element_even_without_a_floor() -> None:
    [r] = coll.judge(_data(_curve(op="all_gather", wrong=[0, 7, 0])), _profile(), CFG)
    assert r.status is Status.FAIL
    assert "all_gather" in r.message and "7 at 2 GiB" in r.message and r.message.startswith("expected 0 wrong")
    assert r.expected == "0 wrong elements" and r.threshold_source == "correctness: exact expected output"
    assert r.remediation


@pytest.mark.parametrize("op", OPS)
def test_an_op_without_a_floor_is_shown_not_judged(op: str) -> None:
    [r] = coll.judge(_data(_curve(op=op)), _profile(all_reduce=340) if op != "all_reduce" else _profile(), CFG)
    assert r.status is Status.INFO and r.value == 363.0
    assert r.expected is None and r.threshold_source is None
    assert r.message.startswith(f"shown, not judged: profile h200 sets no benchmarks.busbw_gbps_min.{op} for 4 GPUs")
    assert "0 wrong elements at every size" in r.message


def test_a_count_without_an_entry_is_info_never_pass() -> None:
    [r] = coll.judge(_data(_curve(world_size=3)), _profile(all_reduce={"2": 300.0, "4": 330.0}), CFG)
    assert r.status is Status.INFO
    assert "sets no benchmarks.busbw_gbps_min.all_reduce for 3 GPUs" in r.message


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


def test_the_message_names_the_latency_of_the_smallest_sizes() -> None:
    curve = _curve(busbw=(0.04, 0.08, 363.0), time_us=[24.91, 25.34, 17748.8])
    curve["sizes_bytes"] = [1024, 2048, 4 * GIB]
    [r] = coll.judge(_data(curve), _profile(all_reduce=340), CFG)
    assert r.status is Status.PASS
    assert r.message == (
        "363.0 GB/s busbw at 4 GiB, floor 340 for 4 GPUs; latency 24.9 us at 1 KiB, 25.3 us at 2 KiB "
        "(all_reduce on 4 ranks (nccl), bf16)"
    )


# --- floors per GPU count ----------------------------------------------------------------------------------

H200 = load_profile("h200")


@pytest.mark.parametrize(
    ("op", "gpus", "floor"),
    [
        ("all_reduce", 2, 310),
        ("all_gather", 2, 260),
        ("reduce_scatter", 2, 250),
        ("all_reduce", 4, 325),
        ("all_gather", 4, 305),
        ("all_to_all", 4, 315),
        ("send_recv", 4, 325),
        ("all_reduce", 8, 325),
        ("reduce_scatter", 8, 305),
    ],
)
def test_h200_floors_follow_the_gpu_count(op: str, gpus: int, floor: float) -> None:
    [r] = coll.judge(_data(_curve(op=op, world_size=gpus, busbw=(floor - 0.1,))), H200, CFG_1G)
    assert r.status is Status.FAIL and r.expected == f">= {floor} GB/s busbw at 1 GiB"
    assert r.threshold_source == f"profile h200: benchmarks.busbw_gbps_min.{op}[{gpus} GPUs]"
    [ok] = coll.judge(_data(_curve(op=op, world_size=gpus, busbw=(floor,))), H200, CFG_1G)
    assert ok.status is Status.PASS and ok.threshold_source == r.threshold_source


CFG_1G = CollectivesBenchConfig(gate_bytes=GIB)

# Healthy lent H200s, busbw at 4 GiB, bf16, NVLS off (../shared/reference/cluster.md §5 for 2 GPUs,
# docs/results/2026-11-21-h200x4-accept.json for 4).
HEALTHY_2XH200 = {"all_reduce": 345.0, "all_gather": 290.0, "reduce_scatter": 278.0}


def test_a_healthy_2xh200_passes_where_the_old_4_gpu_floors_failed_it() -> None:
    curves = [
        _curve(op=op, world_size=2, busbw=(busbw,), sizes_bytes=[4 * GIB]) for op, busbw in HEALTHY_2XH200.items()
    ]
    results = coll.judge(_data(*curves, world_size=2), H200, CFG)
    assert [(r.name, r.status) for r in results] == [(f"collective.{op}", Status.PASS) for op in HEALTHY_2XH200]
    assert [r.threshold_source for r in results] == [
        f"profile h200: benchmarks.busbw_gbps_min.{op}[2 GPUs]" for op in HEALTHY_2XH200
    ]
    old = _profile(all_reduce=340, all_gather=300, reduce_scatter=300)
    assert [r.status for r in coll.judge(_data(*curves, world_size=2), old, CFG)] == [
        Status.PASS,
        Status.FAIL,
        Status.FAIL,
    ]


def test_the_captured_4xh200_report_passes_when_judged_again() -> None:
    report = json.loads((RESULTS / "2026-11-21-h200x4-accept.json").read_text())
    curves = [r["details"] for r in report["results"] if r["name"].startswith("collective.")]
    assert [c["op"] for c in curves] == OPS
    results = coll.judge(_data(*curves), H200, CFG)
    assert [r.status for r in results] == [Status.PASS] * len(OPS)
    assert all(r.expected and r.threshold_source.endswith("[4 GPUs]") for r in results)


def test_the_captured_two_node_report_is_shown_not_judged_without_a_fabric_floor() -> None:
    report = json.loads((RESULTS / "2026-11-22-h200x2-two-nodes-accept.json").read_text())
    curves = [r["details"] for r in report["results"] if r["name"].startswith("collective.")]
    results = coll.judge(_data(*curves, world_size=2, num_nodes=2), H200, CollectivesBenchConfig(gate_bytes=256 << 20))
    assert {r.status for r in results} == {Status.INFO}
    assert "sets no benchmarks.busbw_gbps_min.all_reduce for 2 nodes x 1 GPU" in results[0].message


def test_multi_node_floors_exact_count_first_then_any_count() -> None:
    profile = _profile(all_reduce={"8": 325.0, "2x8": 350.0, "Nx8": 340.0})
    two = _curve(world_size=16, num_nodes=2, busbw=(345.0,))
    four = _curve(world_size=32, num_nodes=4, busbw=(345.0,))
    [r2] = coll.judge(_data(two), profile, CFG_1G)
    [r4] = coll.judge(_data(four), profile, CFG_1G)
    assert (r2.status, r2.threshold_source) == (Status.FAIL, "profile h200: benchmarks.busbw_gbps_min.all_reduce[2x8]")
    assert (r4.status, r4.threshold_source) == (Status.PASS, "profile h200: benchmarks.busbw_gbps_min.all_reduce[Nx8]")
    assert r2.subject == "2 nodes x 8 ranks (nccl)"
    # Ranks spread unevenly have no count to look up.
    [uneven] = coll.judge(_data(_curve(world_size=3, num_nodes=2)), profile, CFG_1G)
    assert uneven.status is Status.INFO and "3 ranks spread unevenly over 2 nodes" in uneven.message


def test_intra_node_curves_use_the_single_node_floor() -> None:
    curve = {**_curve(world_size=8, busbw=(330.0,)), "node": "gpu-a"}
    [r] = coll.judge(_data(curve, world_size=16, num_nodes=2), H200, CFG_1G)
    assert (r.name, r.status, r.node) == ("collective.intra_node.all_reduce", Status.PASS, "gpu-a")
    assert r.threshold_source == "profile h200: benchmarks.busbw_gbps_min.all_reduce[8 GPUs]"


# --- a real run: two gloo processes through the launcher ----------------------------------------------------


@pytest.mark.slow
def test_two_rank_gloo_run_measures_and_checks_every_op(tmp_path: Path) -> None:
    cfg = CollectivesBenchConfig(
        dtype="fp32", min_bytes=1024, max_bytes=65536, gate_bytes=65536, warmup=1, repeats=3, batch_ms=2.0
    )
    data = launch_local(2, {"benchmark": "collectives", "config": asdict(cfg)}, tmp_path, timeout_s=120)
    assert data["backend"] == "gloo" and data["world_size"] == 2 and data["nccl_version"] is None
    assert data["timing"]["batch_ms"] == 2.0 and data["timing"]["cuda_graph"] is False
    assert data["timing"]["buffers"] == "torch" and {c["buffers"] for c in data["ops"]} == {"torch"}
    assert [c["op"] for c in data["ops"]] == OPS
    for curve in data["ops"]:
        assert curve["sizes_bytes"] == [1024 << k for k in range(7)]
        assert all(b > 0 for b in curve["busbw_gbps"]) and all(t > 0 for t in curve["time_us"])
        assert all(1 <= i <= cfg.max_iters for i in curve["iters"])
        assert curve["wrong"] == [0] * 7, curve["op"]
    results = coll.judge(data, _profile(), cfg)
    assert [r.status for r in results] == [Status.INFO] * len(OPS)
    floored = coll.judge(data, _profile(all_reduce=1e-9), cfg)
    assert floored[0].status in (Status.PASS, Status.WARN) and floored[0].threshold_source


def test_batch_settings_are_refused_out_of_range() -> None:
    assert CollectivesBenchConfig().problems() == []
    bad = CollectivesBenchConfig(batch_ms=0, max_iters=0, repeats=0)
    assert bad.problems() == [
        "bench.collectives.repeats must be >= 1, found 0",
        "bench.collectives.batch_ms must be > 0, found 0",
        "bench.collectives.max_iters must be >= 1, found 0",
    ]
    assert CollectivesBenchConfig(batch_ms=5000.0).problems() == [
        "bench.collectives.batch_ms must be <= 1000.0 (a batch per size and repeat: longer only slows the sweep), "
        "found 5000.0"
    ]


def test_the_captured_2xh200_report_passes_every_op_when_judged_again() -> None:
    """docs/results/2026-11-22-h200x2-accept.json: `gpucert accept` on the idle lent 2xH200. Captured before
    the 2-GPU floors of all_to_all, broadcast and send_recv existed (INFO there); judged again, all six PASS
    against their [2 GPUs] entries, and each FAILs 15 % lower."""
    report = json.loads((RESULTS / "2026-11-22-h200x2-accept.json").read_text())
    curves = [r["details"] for r in report["results"] if r["name"].startswith("collective.")]
    assert [c["op"] for c in curves] == OPS
    results = coll.judge(_data(*curves, world_size=2), H200, CFG)
    assert [r.status for r in results] == [Status.PASS] * len(OPS)
    assert all(r.threshold_source.endswith("[2 GPUs]") for r in results)
    slowed = [{**c, "busbw_gbps": [0.85 * b for b in c["busbw_gbps"]]} for c in curves]
    assert [r.status for r in coll.judge(_data(*slowed, world_size=2), H200, CFG)] == [Status.FAIL] * len(OPS)


def test_nccl_buffers_are_refused_on_gloo_with_the_key_named() -> None:
    cfg = asdict(CollectivesBenchConfig(buffers="nccl"))
    with pytest.raises(ValueError, match=r"bench\.collectives\.buffers=nccl: .* uses gloo"):
        coll.measure(SimpleNamespace(backend="gloo"), cfg)  # type: ignore[arg-type]


def test_the_captured_nccl_buffers_report_is_shown_not_judged() -> None:
    """docs/results/2026-11-22-h200x2-nccl-buffers-collectives.json: `bench collectives` with buffers=nccl on
    the lent 2xH200 (within 3 % of nccl-tests -G). The floors are set for torch buffers, and zero-copy lifts
    all_gather 16 % at 4 GiB, so a floor would pass it 15 % slow: every op is INFO, naming the buffers, and a
    wrong element still FAILs."""
    report = json.loads((RESULTS / "2026-11-22-h200x2-nccl-buffers-collectives.json").read_text())
    curves = [r["details"] for r in report["results"] if r["name"].startswith("collective.")]
    assert [c["op"] for c in curves] == OPS and {c["buffers"] for c in curves} == {"nccl"}
    results = coll.judge(_data(*curves, world_size=2), H200, CFG)
    assert [r.status for r in results] == [Status.INFO] * len(OPS)
    assert all("buffers=torch" in r.message and "ncclMemAlloc buffers" in r.message for r in results)
    assert all(r.expected is None for r in results)
    broken = {**curves[1], "wrong": [0] * (len(curves[1]["wrong"]) - 1) + [3]}
    assert coll.judge_op(broken, H200, CFG).status == Status.FAIL
