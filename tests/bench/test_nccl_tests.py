"""Reading nccl-tests output (the lent 4xH200's all_reduce_perf, captured) and the side-by-side table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucert.bench.nccl_tests import Placement, compare_markdown, parse_nccl_tests, side_by_side

RESULTS = Path(__file__).parents[2] / "docs/results"
CAPTURED = (RESULTS / "2026-11-21-h200x4-nccl-tests.txt").read_text()


def test_the_captured_runs_are_read_whole() -> None:
    before, after = parse_nccl_tests(CAPTURED)
    for run in (before, after):
        assert (run.test, run.op, run.version) == ("all_reduce_perf", "all_reduce", "2.19.6")
        assert (run.n_gpus, run.ranks, run.iters, run.graph_launches) == (4, 4, 20, 0)
        assert [row.size_bytes for row in run.rows] == [64 << 20 << k for k in range(7)]
        assert {row.dtype for row in run.rows} == {"bfloat16"} and {row.redop for row in run.rows} == {"sum"}
    assert before.avg_busbw_gbps == 342.646 and after.avg_busbw_gbps == 342.808
    last = before.rows[-1]
    assert (last.count, last.root) == (2147483648, -1)
    assert last.out_of_place == Placement(17780.2, 241.56, 362.34, 0)
    assert last.in_place == Placement(17749.3, 241.98, 362.97, 0)
    assert last.placement(in_place=True) is last.in_place and last.placement(in_place=False) is last.out_of_place


def test_rows_with_n_a_and_without_in_place_columns() -> None:
    header = (
        "# nThread 1 nGpus 2 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 graph: 1"
    )
    text = (
        header
        + """
#  Rank  0 Group  0 Pid   1 on vm device  0 [0000:00:06] NVIDIA H200
#  Rank  1 Group  0 Pid   1 on vm device  1 [0000:00:07] NVIDIA H200
           8             2  bfloat16    none      -1    10.51    0.00    0.00       0    10.40    0.00    0.00     N/A
          16             4  bfloat16    none      -1    10.62    0.00    0.00       0
"""
    )
    [run] = parse_nccl_tests(text)
    assert run.test is None and run.op is None and run.graph_launches == 1 and run.ranks == 2 and run.iters == 20
    assert run.rows[0].in_place == Placement(10.40, 0.0, 0.0, None)
    assert run.rows[1].in_place is None and run.rows[1].placement(in_place=True).time_us == 10.62


def test_a_truncated_row_is_refused() -> None:
    with pytest.raises(ValueError, match="expected 9 or 13"):
        parse_nccl_tests(
            "# nThread 1 nGpus 2 warmup iters: 5 iters: 20 graph: 0\n  1024  512  bfloat16  sum  -1  10.1\n"
        )


def test_the_captured_gpucert_curve_sits_beside_nccl_tests() -> None:
    report = json.loads((RESULTS / "2026-11-21-h200x4-collectives-allreduce.json").read_text())
    [curve] = [r["details"] for r in report["results"] if r["name"] == "collective.all_reduce"]
    pairs = side_by_side(parse_nccl_tests(CAPTURED), curve)
    assert [p.size_bytes for p in pairs] == [64 << 20 << k for k in range(7)]
    # all_reduce runs in place in gpucert: the in-place columns, averaged over the before and after runs.
    assert pairs[-1].nccl_busbw_gbps == pytest.approx((362.97 + 362.78) / 2)
    assert pairs[-1].nccl_time_us == pytest.approx((17749.3 + 17758.4) / 2)
    # Every size within 1.6 % (docs/results/acceptance-benchmarks.md).
    assert all(abs(p.ratio - 1) < 0.016 for p in pairs)
    table = compare_markdown(parse_nccl_tests(CAPTURED), [curve])
    assert table.startswith(
        "## all_reduce, 4 ranks, bf16 (in place; nccl-tests -G 0, gpucert cuda_graph False, buffers torch)"
    )
    assert "| 4294967296 | 17753.85 | 17776.10 | 362.88 | 362.42 | 0.999 |" in table
