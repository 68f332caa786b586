"""Run comparison: the synthetic 4xH200 accept report against the same node with a few numbers worse, two real
back-to-back CPU accept runs of one node and a real FAIL run of it, and small hand-made reports for each rule
(direction by threshold and unit, noise band, INFO not judged, status changes, pairing), through the CLI too.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from rich.console import Console
from tests.conftest import FIXTURES
from tests.training_runs import evaluation_report, synthetic_metrics, training_report

import gpucert.report
from gpucert.cli import main
from gpucert.report.compare import (
    HIGHER,
    LOWER,
    Comparison,
    compare_reports,
    comparison_status,
    mismatches,
    parse_tolerances,
    print_comparison,
    render_comparison_markdown,
)
from gpucert.report.compare_html import render_comparison_html
from gpucert.report.direction import noise_band_pct, relative_spread
from gpucert.report.schema import Report, Result, RunMeta
from gpucert.report.store import load_report
from gpucert.status import Status

SYNTHETIC = FIXTURES / "reports" / "accept-4xh200-synthetic.json"
REGRESSED = FIXTURES / "reports" / "accept-4xh200-synthetic-regressed.json"
HEALTH = FIXTURES.parent.parent / "docs" / "examples" / "h200x4-health.json"
# `gpucert accept --profile cpu` twice, back to back, on one 2-core VM; then with a copy floor no CPU meets.
CPU_A = FIXTURES / "reports" / "accept-cpu-a.json"
CPU_B = FIXTURES / "reports" / "accept-cpu-b.json"
CPU_FAIL = FIXTURES / "reports" / "accept-cpu-copy-floor-fail.json"

META = RunMeta(
    tool_version="0.1.0",
    method_version="1",
    verb="accept",
    command=["gpucert", "accept"],
    host="n1",
    started_at="2026-11-22T09:00:00+00:00",
    finished_at="2026-11-22T09:20:00+00:00",
    duration_s=1200.0,
    profile="h200",
    config={},
    software={},
)
INVENTORY: dict[str, Any] = {"hostname": "n1", "summary": "s", "gpus": [], "topology": {"matrix": []}}


def result(name: str, value: Any, unit: str | None = None, **fields: Any) -> Result:
    fields.setdefault("status", Status.PASS)
    fields.setdefault("subject", "n1")
    # Measured performance: the only category compared by value (health readings compare by status).
    fields.setdefault("category", "benchmark")
    if fields["status"] is Status.PASS:
        fields.setdefault("expected", "a test threshold")  # a PASS names one; no comparison sign: the unit rules
    return Result(name=name, message=f"{name} {value}", value=value, unit=unit, **fields)


def report(*results: Result, host: str = "n1") -> Report:
    meta = dataclasses.replace(META, host=host)
    return Report(meta=meta, inventory={**INVENTORY, "hostname": host}, results=list(results))


def only(comparisons: list[Comparison]) -> Comparison:
    assert len(comparisons) == 1, comparisons
    return comparisons[0]


@pytest.fixture(scope="module")
def synthetic_comparisons() -> list[Comparison]:
    return compare_reports(load_report(SYNTHETIC), load_report(REGRESSED))


def test_the_regressed_fixture_regresses_where_it_was_made_worse(synthetic_comparisons: list[Comparison]) -> None:
    regressed = {(c.name, c.subject): round(c.change_pct or 0, 1) for c in synthetic_comparisons if c.regressed}
    assert regressed == {
        ("matmul.bf16.max", "GPU 2"): -14.0,
        ("memory.copy", "GPU 3"): -8.0,
        ("memory.h2d", "GPU 1"): -12.0,
        ("collective.all_reduce", "4 ranks (nccl)"): -12.0,
    }
    # Made worse too, but held to no threshold: the schema 1.0 fixture's PASS there is read as INFO (shown, not
    # judged), so they move beyond their band as INFO rows and are not counted.
    unjudged = {(c.name, c.subject): round(c.change_pct or 0, 1) for c in synthetic_comparisons if c.moved_unjudged}
    assert {
        ("matmul.bf16.8192", "GPU 2"): -15.0,
        ("train.tokens_per_s_per_gpu", "4 x NVIDIA H200"): -11.0,
        ("train.mfu", "4 x NVIDIA H200"): -11.0,
    }.items() <= unjudged.items()
    improved = [(c.name, c.subject) for c in synthetic_comparisons if c.improved]
    assert improved == [("p2p.matrix", "4 GPUs"), ("p2p.pair", "GPU 1 -> GPU 2"), ("p2p.pair", "GPU 2 -> GPU 1")]
    assert comparison_status(synthetic_comparisons) is Status.FAIL


def test_status_changes_are_reported(synthetic_comparisons: list[Comparison]) -> None:
    changes = {
        (c.name, c.subject): (c.baseline_status, c.candidate_status, c.newly_failing)
        for c in synthetic_comparisons
        if c.status_changed
    }
    assert changes == {
        ("matmul.bf16.max", "GPU 2"): (Status.PASS, Status.FAIL, True),
        ("collective.all_reduce", "4 ranks (nccl)"): (Status.PASS, Status.FAIL, True),
        # 3 % lower is within the threshold; the WARN is the repeat spread.
        ("collective.all_gather", "4 ranks (nccl)"): (Status.PASS, Status.WARN, False),
    }


def test_directions_of_the_fixture_results(synthetic_comparisons: list[Comparison]) -> None:
    directions = {c.name: c.direction for c in synthetic_comparisons}
    assert directions["matmul.bf16.max"] == HIGHER
    assert directions["memory.copy"] == HIGHER
    assert directions["collective.all_reduce"] == HIGHER
    assert directions["train.tokens_per_s_per_gpu"] == HIGHER
    assert directions["train.mfu"] == HIGHER
    # Telemetry and health readings compare by status only: a new ECC error shows as PASS -> FAIL.
    for name in ("telemetry.matmul", "gpu.temperature", "gpu.ecc_uncorrectable", "gpu.power_limit", "gpu.count"):
        assert directions[name] is None, name


def test_a_report_against_itself_is_a_pass() -> None:
    base = load_report(SYNTHETIC)
    comparisons = compare_reports(base, base)
    assert comparisons
    assert all(c.change_pct == 0.0 and not c.changed for c in comparisons)
    assert comparison_status(comparisons) is Status.PASS


def test_non_numeric_results_are_left_out_unless_they_changed() -> None:
    base = load_report(SYNTHETIC)
    names = {c.name for c in compare_reports(base, base)}
    assert "gpu.ecc_mode" not in names and "software.driver" not in names
    assert "gpu.memory" in names and "matmul.bf16.max" in names


@pytest.mark.parametrize(
    ("unit", "before", "after", "direction", "regressed"),
    [
        ("GB/s", 100.0, 90.0, HIGHER, True),
        ("GB/s", 100.0, 110.0, HIGHER, False),
        ("TB/s", 4.2, 3.7, HIGHER, True),
        ("TFLOP/s", 790.0, 700.0, HIGHER, True),
        ("tokens/s", 45000.0, 40000.0, HIGHER, True),
        ("%", 40.0, 35.0, HIGHER, True),
        ("C", 60.0, 70.0, LOWER, True),
        ("C", 70.0, 60.0, LOWER, False),
        ("W", 600.0, 700.0, LOWER, True),
        ("errors", 10, 12, LOWER, True),
        ("events", 10, 12, LOWER, True),
        ("s", 100.0, 120.0, LOWER, True),
        ("s", 120.0, 100.0, LOWER, False),
        ("GiB", 140.4, 100.0, None, False),
        (None, 1.0, 100.0, None, False),
    ],
)
def test_direction_comes_from_the_unit(
    unit: str | None, before: float, after: float, direction: str | None, regressed: bool
) -> None:
    c = only(compare_reports(report(result("x", before, unit)), report(result("x", after, unit))))
    assert (c.direction, c.regressed) == (direction, regressed)
    assert c.change_pct == pytest.approx(100 * (after - before) / before)
    assert c.improved == (direction is not None and not regressed)


@pytest.mark.parametrize(("expected", "direction"), [(">= 690", HIGHER), ("> 1", HIGHER), ("< 80", LOWER)])
def test_the_threshold_comparison_overrides_the_unit(expected: str, direction: str) -> None:
    before, after = result("x", 700.0, "W", expected=expected), result("x", 600.0, "W", expected=expected)
    c = only(compare_reports(report(before), report(after)))
    assert c.direction == direction
    assert c.regressed == (direction == HIGHER)


@pytest.mark.parametrize(
    ("after", "threshold", "regressed"),
    [(95.0, 5.0, False), (94.9, 5.0, True), (92.0, 10.0, False), (89.0, 10.0, True), (99.9, 0.0, True)],
)
def test_the_threshold_is_respected(after: float, threshold: float, regressed: bool) -> None:
    comparisons = compare_reports(report(result("bw", 100.0, "GB/s")), report(result("bw", after, "GB/s")), threshold)
    assert only(comparisons).regressed is regressed
    assert comparison_status(comparisons) is (Status.FAIL if regressed else Status.PASS)


def test_the_fixture_copy_regression_depends_on_the_threshold() -> None:
    base, cand = load_report(SYNTHETIC), load_report(REGRESSED)
    at_10 = {(c.name, c.subject) for c in compare_reports(base, cand, threshold_pct=10.0) if c.regressed}
    assert ("memory.copy", "GPU 3") not in at_10
    assert ("memory.h2d", "GPU 1") in at_10


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="threshold_pct"):
        compare_reports(report(), report(), threshold_pct=-1)


def test_newly_failing_without_a_number_is_a_fail() -> None:
    c = only(
        compare_reports(
            report(result("gpu.pcie_link", "Gen5 x16")),
            report(result("gpu.pcie_link", "Gen4 x16", status=Status.FAIL)),
        )
    )
    assert c.newly_failing and c.status_changed and not c.regressed and c.change_pct is None
    assert comparison_status([c]) is Status.FAIL


@pytest.mark.parametrize(
    ("before", "after", "status"),
    [
        (Status.PASS, Status.WARN, Status.WARN),
        (Status.WARN, Status.ERROR, Status.FAIL),
        (Status.FAIL, Status.ERROR, Status.WARN),
        (Status.FAIL, Status.PASS, Status.PASS),
        (Status.SKIP, Status.PASS, Status.PASS),
    ],
)
def test_comparison_status_of_status_changes(before: Status, after: Status, status: Status) -> None:
    comparisons = compare_reports(report(result("x", "a", status=before)), report(result("x", "a", status=after)))
    assert comparison_status(comparisons) is status


def test_a_value_that_changed_without_a_number_is_listed() -> None:
    c = only(compare_reports(report(result("software.driver", "550.54")), report(result("software.driver", "580.1"))))
    assert c.changed and not c.regressed and c.change_pct is None
    assert comparison_status([c]) is Status.PASS


def test_from_zero_errors_is_a_regression_without_a_percentage() -> None:
    c = only(compare_reports(report(result("ecc", 0, "errors")), report(result("ecc", 3, "errors"))))
    assert c.regressed and c.change_pct is None
    c = only(compare_reports(report(result("util", 0, "%")), report(result("util", 5, "%"))))
    assert not c.regressed and c.change_pct is None


def test_results_in_one_report_only() -> None:
    comparisons = compare_reports(
        report(result("kept", 1.0, "GB/s"), result("lost", 2.0, "GB/s")),
        report(result("kept", 1.0, "GB/s"), result("new", 3.0, "GB/s", status=Status.PASS)),
    )
    by_name = {c.name: c for c in comparisons}
    assert [c.name for c in comparisons] == ["kept", "lost", "new"]
    assert by_name["lost"].only_in == "baseline" and by_name["lost"].candidate is None
    assert by_name["new"].only_in == "candidate" and by_name["new"].baseline_status is None
    assert not by_name["lost"].regressed and not by_name["new"].status_changed
    # A check that stopped running hides whatever it used to catch.
    assert comparison_status(comparisons) is Status.WARN
    assert comparison_status([by_name["kept"], by_name["new"]]) is Status.PASS


def test_a_new_failing_result_is_a_warning() -> None:
    comparisons = compare_reports(report(), report(result("p2p.matrix", 250.0, "GB/s", status=Status.FAIL)))
    assert comparison_status(comparisons) is Status.WARN


def test_a_candidate_that_could_not_run_to_its_end_fails_the_comparison() -> None:
    """A partial candidate (its run.aborted ERROR, only in it) compared as WARN, exit 1, though its own verdict
    was ERROR: a result newly ERROR is FAIL (docs/reports.md)."""
    aborted = result("run.aborted", None, None, status=Status.ERROR)
    comparisons = compare_reports(report(result("kept", 1.0, "GB/s")), report(result("kept", 1.0, "GB/s"), aborted))
    assert comparison_status(comparisons) is Status.FAIL


def test_two_nodes_pair_by_gpu_index_and_node() -> None:
    def node(host: str, bus: str, tflops: float, busbw: float) -> Report:
        return report(
            result("matmul.bf16.max", tflops, "TFLOP/s", subject=f"GPU 0 ({bus})", gpu_index=0),
            result("collective.all_reduce", busbw, "GB/s", subject=host),
            host=host,
        )

    comparisons = compare_reports(node("a", "0000:18:00.0", 800.0, 360.0), node("b", "0000:2a:00.0", 700.0, 362.0))
    assert [(c.name, c.subject, c.regressed) for c in comparisons] == [
        ("matmul.bf16.max", "GPU 0", True),
        ("collective.all_reduce", "node", False),
    ]


def test_repeated_results_pair_in_order() -> None:
    comparisons = compare_reports(
        report(result("ib.port", 400.0, "Gb/s"), result("ib.port", 400.0, "Gb/s")),
        report(result("ib.port", 400.0, "Gb/s"), result("ib.port", 200.0, "Gb/s")),
    )
    assert [c.regressed for c in comparisons] == [False, True]


def test_markdown_comparison(synthetic_comparisons: list[Comparison]) -> None:
    text = render_comparison_markdown(
        synthetic_comparisons, "runs/a/report.json", "runs/b/report.json", threshold_pct=5.0, changed_only=True
    )
    lines = text.splitlines()
    assert lines[0] == "# gpucert comparison: FAIL"
    assert "- **Baseline:** runs/a/report.json" in lines
    assert "- **Rule:** a result newly FAIL or ERROR regresses; a number judged in both runs" in text
    assert (
        "- **Summary:** 4 regressed, 3 improved, 2 now failing, 3 changed status, 4 moved but not judged "
        "(INFO or no direction) (86 results compared, 23 judged by value)" in lines
    )
    assert (
        "| **FAIL** | collective.all_reduce | 4 ranks (nccl) | 360.6 GB/s | 317.3 GB/s | PASS → FAIL | -12.0 % | "
        "±5 % | higher is better | **REGRESSED** |" in lines
    )
    # The all_gather's repeats spread (cv 0.081 at the gate size) make its band 16.2 %: -3 % is noise.
    # (Its status got worse short of FAIL: WARN.)
    assert (
        "| WARN | collective.all_gather | 4 ranks (nccl) | 340.7 GB/s | 330.4 GB/s | PASS → WARN | -3.0 % | ±16.2 % |"
        in text
    )
    # Still passing its profile, but slower beyond its band: the comparison's FAIL leads, the run's PASS beside it.
    assert "| **FAIL** | memory.copy | GPU 3 | 4.217 TB/s | 3.88 TB/s | PASS |" in text
    # Slower too, but held to no threshold in either run: shown, not judged.
    assert "| INFO | train.tokens_per_s_per_gpu | 4 x NVIDIA H200 | 44,591 tokens/s | 39,686 tokens/s | INFO |" in text
    # Still failing its profile, but better: nothing regressed there.
    assert "| PASS | p2p.pair | GPU 1 -> GPU 2 | 250.3 GB/s | 290.4 GB/s | FAIL | +16.0 % | ±5 % |" in text
    # Telemetry has no better direction: its peak temperature is shown, never counted.
    assert "| INFO | telemetry.matmul | node | 66 C | 80 C | PASS | +21.2 % | ±5 % |  | not judged |" in lines
    assert len([line for line in lines if line.startswith("| ")]) == 1 + 12  # header + changed rows
    full = render_comparison_markdown(synthetic_comparisons)
    assert len([line for line in full.splitlines() if line.startswith("| ")]) == 1 + len(synthetic_comparisons)


def test_markdown_escapes_pipes_and_says_when_nothing_changed() -> None:
    same = compare_reports(report(result("a|b", 1.0, "GB/s")), report(result("a|b", 1.0, "GB/s")))
    assert "| PASS | a\\|b | node | 1 GB/s | 1 GB/s | PASS | +0.0 % | ±5 % |" in render_comparison_markdown(same)
    text = render_comparison_markdown(same, changed_only=True)
    assert "No result changed." in text
    assert "no change beyond the noise band" in text


def test_terminal_comparison_highlights_regressions(synthetic_comparisons: list[Comparison]) -> None:
    console = Console(record=True, width=200, color_system="truecolor", force_terminal=True)
    print_comparison(console, synthetic_comparisons, "last week", "today", changed_only=True)
    text = console.export_text(styles=False, clear=False)
    assert "last week → today" in text
    assert "REGRESSED" in text and "PASS → FAIL" in text and "improved" in text
    assert "gpu.memory" not in text  # unchanged rows are left out with changed_only
    assert (
        "comparison: FAIL  4 regressed, 3 improved, 2 now failing, 3 changed status, 4 moved but not judged "
        "(INFO or no direction) (86 results compared, 23 judged by value)" in text
    )
    styled = console.export_text(styles=True)
    assert "\x1b[1;31mcollective.all_reduce" in styled  # bold red


def test_terminal_comparison_of_identical_reports() -> None:
    base = load_report(HEALTH)
    console = Console(record=True, width=200)
    print_comparison(console, compare_reports(base, base), changed_only=True)
    text = console.export_text()
    assert text.strip() == "comparison: PASS  no change beyond the noise band (35 results compared, 0 judged by value)"


def test_health_readings_compare_by_status_not_by_value() -> None:
    """An idle GPU 3 C warmer, or less busy, is weather, not a regression."""
    warmer = result("gpu.temperature", 33.0, "C", category="health", gpu_index=0)
    idler = result("gpu.idle", 0, "%", category="health", gpu_index=0)
    base = report(
        result("gpu.temperature", 30.0, "C", category="health", gpu_index=0),
        result("gpu.idle", 4, "%", category="health", gpu_index=0),
    )
    comparisons = compare_reports(base, report(warmer, idler))
    assert not any(c.regressed for c in comparisons)
    assert comparison_status(comparisons) is Status.PASS


# --- Fine-tuning runs and evaluations ------------------------------------------------------------------------


def by_name(comparisons: list[Comparison]) -> dict[str, Comparison]:
    return {c.name: c for c in comparisons}


def test_training_runs_compare_each_number_the_right_way() -> None:
    baseline = training_report()
    slower = training_report(synthetic_metrics(tokens_per_s=4800.0, mfu=0.166, peak_gib=36.0, loss_scale=1.1))
    comparisons = by_name(compare_reports(baseline, slower))
    directions = {name: c.direction for name, c in comparisons.items()}
    # checkpoint_present is left out: the same text on both sides says nothing about the change.
    assert directions == {
        "final_loss": LOWER,
        "no_oom": LOWER,
        "steps": None,
        "eval_loss": LOWER,
        "tokens_per_s_per_gpu": HIGHER,
        "mfu": HIGHER,
        "hfu": HIGHER,
        "peak_memory_gib": LOWER,
        "peak_rss_gib": LOWER,
        "data.preparation": None,
        "train.memory_plan": None,  # an estimate, not a measurement
        "time_to_first_step": LOWER,
    }
    # Only the final loss is held to a threshold (train.final_loss_max); the rest are INFO: shown as moved,
    # never counted.
    regressed = [name for name, c in comparisons.items() if c.regressed]
    assert regressed == ["final_loss"]
    moved = [name for name, c in comparisons.items() if c.moved_unjudged]
    assert moved == ["eval_loss", "tokens_per_s_per_gpu", "mfu", "hfu", "peak_memory_gib"]
    assert comparisons["tokens_per_s_per_gpu"].change_pct == pytest.approx(100 * (4800 / 5397 - 1))
    assert comparison_status(list(comparisons.values())) is Status.FAIL
    # The other way round the final loss improved, and nothing regressed.
    back = compare_reports(slower, baseline)
    assert [c.name for c in back if c.improved] == regressed
    assert comparison_status(back) is Status.PASS


def test_a_training_run_against_itself_changes_nothing() -> None:
    comparisons = compare_reports(training_report(), training_report(host="other-node"))
    assert not any(c.changed for c in comparisons)
    assert {c.subject for c in comparisons} == {"run", "prepared data"}


def test_a_failed_final_loss_is_newly_failing() -> None:
    failed = training_report(synthetic_metrics(final_loss_max=0.5))
    final = by_name(compare_reports(training_report(), failed))["final_loss"]
    assert final.newly_failing and final.baseline_status is Status.PASS and final.candidate_status is Status.FAIL


def test_evaluations_compare_scores_higher_and_loss_lower() -> None:
    comparisons = compare_reports(evaluation_report(call_accuracy=91.0), evaluation_report(call_accuracy=80.0))
    call = by_name(comparisons)["eval.call_accuracy"]
    assert call.direction == HIGHER and call.regressed and call.newly_failing
    assert by_name(comparisons)["eval.loss"].direction == LOWER
    # One row per tool: eval.tool pairs by its subject.
    assert sorted(c.subject for c in comparisons if c.name == "eval.tool") == [
        "tool <b>book</b>",
        "tool convert_currency",
        "tool get_weather",
    ]


# --- Two real runs of one node, and a real FAIL ----------------------------------------------------------------


def test_two_back_to_back_runs_of_one_healthy_node_compare_pass(capsys: pytest.CaptureFixture[str]) -> None:
    """Every benchmark on the cpu profile is INFO; its figures moved up to +397 % between the runs."""
    comparisons = compare_reports(load_report(CPU_A), load_report(CPU_B))
    assert not [c for c in comparisons if c.regressed or c.improved or c.newly_failing]
    moved = [c for c in comparisons if c.moved_unjudged]
    assert len(moved) == 13 and {c.candidate_status for c in moved} == {Status.INFO}
    assert comparison_status(comparisons) is Status.PASS
    assert main(["report", str(CPU_A), str(CPU_B)]) == 0
    assert "comparison: PASS  13 moved but not judged" in capsys.readouterr().out


def test_a_run_with_a_fail_against_one_that_passed_exits_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    """The only counted rows are the two new FAILs, not the noise of the figures around them."""
    comparisons = compare_reports(load_report(CPU_A), load_report(CPU_FAIL))
    counted = [(c.name, c.subject) for c in comparisons if c.regressed or c.newly_failing]
    assert counted == [("memory.copy", "rank 0 (cpu)"), ("memory.copy", "rank 1 (cpu)")]
    assert main(["report", str(CPU_A), str(CPU_FAIL), "--markdown"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("# gpucert comparison: FAIL")
    assert (
        "| **FAIL** | memory.copy | rank 0 (cpu) | 0.01217 TB/s | 0.009837 TB/s | INFO → FAIL | -19.2 % | ±111 % | "
        "higher is better | **NOW FAILING** |" in out
    )
    # The other way round the failure went away: nothing got worse.
    assert main(["report", str(CPU_FAIL), str(CPU_A)]) == 0


def test_a_result_newly_failing_from_info_or_skip_is_a_fail() -> None:
    for before in (Status.INFO, Status.SKIP):
        comparisons = compare_reports(
            report(result("memory.copy", 0.012, "TB/s", status=before)),
            report(result("memory.copy", 0.012, "TB/s", status=Status.FAIL, expected=">= 1")),
        )
        assert only(comparisons).newly_failing and not only(comparisons).regressed
        assert comparison_status(comparisons) is Status.FAIL


def test_info_rows_are_shown_not_counted() -> None:
    slower = {"unit": "tokens/s", "status": Status.INFO}
    c = only(compare_reports(report(result("tps", 8622.0, **slower)), report(result("tps", 5153.0, **slower))))
    assert c.direction == HIGHER and not c.judged and not c.regressed and c.moved_unjudged and c.changed
    assert comparison_status([c]) is Status.PASS
    assert "| INFO | tps | node | 8622 tokens/s | 5153 tokens/s | INFO | -40.2 % | ±5 % |" in (
        render_comparison_markdown([c])
    )
    # Judged on one side only (a floor added to the profile since): the status change shows, the number not.
    c = only(compare_reports(report(result("tps", 8622.0, **slower)), report(result("tps", 5153.0, "tokens/s"))))
    assert c.status_changed and not c.judged and comparison_status([c]) is Status.PASS
    # The same move between two judged results is a regression.
    c = only(compare_reports(report(result("tps", 8622.0, "tokens/s")), report(result("tps", 5153.0, "tokens/s"))))
    assert c.judged and c.regressed and comparison_status([c]) is Status.FAIL


def timed(value: float, cv: float, **fields: Any) -> Result:
    return result("memory.copy", value, "TB/s", details={"tbps": value, "timing": {"cv": cv, "repeats": 20}}, **fields)


@pytest.mark.parametrize(
    ("cv_before", "cv_after", "after", "band", "regressed"),
    [
        (0.01, 0.01, 3.75, 5.0, True),  # -6.25 %: beyond the 5 % tolerance, the spread is narrower
        (0.05, 0.01, 3.75, 10.0, False),  # twice the larger cv: 10 %
        (0.01, 0.05, 3.75, 10.0, False),  # either run's spread widens the band
        (0.05, 0.05, 3.5, 10.0, True),  # -12.5 %: beyond the band
    ],
)
def test_the_noise_band_is_the_tolerance_or_twice_the_repeats_spread(
    cv_before: float, cv_after: float, after: float, band: float, regressed: bool
) -> None:
    c = only(compare_reports(report(timed(4.0, cv_before)), report(timed(after, cv_after))))
    assert c.band_pct == pytest.approx(band)
    assert c.regressed is regressed and c.judged


def test_the_spread_is_read_where_each_benchmark_writes_it() -> None:
    synthetic = load_report(SYNTHETIC)
    spreads = {(r.name, r.subject): relative_spread(r) for r in synthetic.results}
    copy = next(r for r in synthetic.results if r.name == "memory.copy")
    assert spreads[(copy.name, copy.subject)] == copy.details["timing"]["cv"]
    gather = next(r for r in synthetic.results if r.name == "collective.all_gather")
    gate = gather.details["busbw_gbps"].index(gather.value)
    assert relative_spread(gather) == gather.details["cv"][gate] > 0
    matrix = next(r for r in synthetic.results if r.name == "p2p.matrix")
    assert relative_spread(matrix) is not None
    real = load_report(CPU_A)
    train = next(r for r in real.results if r.name == "train.tokens_per_s_per_gpu")
    assert relative_spread(train) == train.details["step_timing"][-1]["cv"]
    # Nothing to read: the tolerance alone.
    assert relative_spread(result("x", 1.0, "GB/s")) is None
    assert noise_band_pct([result("x", 1.0, "GB/s"), None], 5.0) == 5.0


def test_a_per_metric_tolerance_widens_one_metric_only() -> None:
    base = report(result("a", 100.0, "GB/s"), result("b", 100.0, "GB/s"))
    cand = report(result("a", 92.0, "GB/s"), result("b", 92.0, "GB/s"))
    comparisons = compare_reports(base, cand, tolerances={"a": 10.0})
    assert [(c.name, c.band_pct, c.regressed) for c in comparisons] == [("a", 10.0, False), ("b", 5.0, True)]
    with pytest.raises(ValueError, match="tolerance of a must be >= 0"):
        compare_reports(base, cand, tolerances={"a": -1.0})
    with pytest.raises(ValueError, match="tolerance for c: no result of that name in either report"):
        compare_reports(base, cand, tolerances={"a": 10.0, "c": 10.0})


@pytest.mark.parametrize("item", ["matmul.bf16.max", "=8", "x=-1", "x=many", "x=nan"])
def test_bad_tolerances_are_refused_naming_the_item(item: str) -> None:
    with pytest.raises(ValueError, match="expected NAME=PCT"):
        parse_tolerances([item])


def test_tolerance_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_tolerances(["matmul.bf16.max=8", " memory.h2d = 12.5"]) == {"matmul.bf16.max": 8.0, "memory.h2d": 12.5}
    # memory.h2d on GPU 1 is 12 % slower in the regressed fixture: 13 % of room lets it through.
    args = ["report", str(SYNTHETIC), str(REGRESSED), "--markdown", "--tolerance", "memory.h2d=13"]
    assert main(args) == 2
    out = capsys.readouterr().out
    assert "- **Summary:** 3 regressed," in out and "memory.h2d" not in out
    assert main([*args[:-1], "memory.h2d=11"]) == 2
    assert (
        "| **FAIL** | memory.h2d | GPU 1 | 53.16 GB/s | 46.78 GB/s | PASS | -12.0 % | ±11 % |"
        in capsys.readouterr().out
    )
    assert main(["report", str(SYNTHETIC), str(REGRESSED), "--tolerance", "memory.h2d"]) == 3
    assert "--tolerance 'memory.h2d': expected NAME=PCT" in capsys.readouterr().err
    assert main(["report", str(SYNTHETIC), str(REGRESSED), "--tolerance", "memory.hd2=13"]) == 3
    err = capsys.readouterr().err
    # The nearest names these reports have, not a name from elsewhere (it once suggested matmul.bf16.max to a user
    # whose reports had no such row).
    assert "tolerance for memory.hd2: no result of that name in either report; the check column names them, here " \
        "memory.h2d" in err, err  # fmt: skip


# --- HTML ---------------------------------------------------------------------------------------------------


def test_html_comparison_is_written_where_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pages" / "week-48"
    assert main(["report", str(CPU_A), str(CPU_FAIL), "--html", "-o", str(out)]) == 2
    page = out / "comparison.html"
    assert f"html: {page}" in capsys.readouterr().out
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html and "http" not in html
    assert '<span class="badge s-FAIL">FAIL</span>' in html
    assert 'profile cpu-copy-floor, verdict <span class="s-FAIL">FAIL</span>' in html
    assert '<tr class="regressed"><td class="s-FAIL">FAIL</td><td>memory.copy</td>' in html
    assert "<td>INFO → FAIL</td>" in html and '<td class="verdict">NOW FAILING</td>' in html
    assert html.count('<tr class="regressed">') == 2 * 2  # in "what changed" and in the full table
    assert '<tr class="unjudged"><td class="s-INFO">INFO</td><td>burn.fp32</td>' in html


def test_html_comparison_goes_beside_the_candidate_by_default(tmp_path: Path) -> None:
    for name, source in (("a", CPU_A), ("b", CPU_B)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(source.read_text())
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--html"]) == 0
    html = (tmp_path / "b" / "comparison.html").read_text()
    assert '<span class="badge s-PASS">PASS</span>' in html
    assert "13 moved but not judged" in html


def test_html_comparison_escapes_report_text() -> None:
    comparisons = compare_reports(
        report(result("eval.tool", 91.0, "%", subject="tool <b>book</b>")),
        report(result("eval.tool", 80.0, "%", subject="tool <b>book</b>")),
    )
    html = render_comparison_html(comparisons, "<a>", "b&c")
    assert "<b>book</b>" not in html and "tool &lt;b&gt;book&lt;/b&gt;" in html
    assert "&lt;a&gt; → b&amp;c" in html
    assert "No result changed" in render_comparison_html(compare_reports(report(), report()))


def test_the_real_fixtures_are_the_runs_they_say() -> None:
    """Trimmed copies: a run's big lists (sweep shapes, burn windows, loss curves) are left out."""
    schema = json.loads((Path(gpucert.report.__file__).parent / "report.schema.json").read_text())
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    for path, profile, status in ((CPU_A, "cpu", "PASS"), (CPU_B, "cpu", "PASS"), (CPU_FAIL, "cpu-copy-floor", "FAIL")):
        data = json.loads(path.read_text())
        assert list(validator.iter_errors(data)) == []
        assert (data["meta"]["profile"], data["status"], data["meta"]["host"]) == (profile, status, "vm")


def test_terminal_table_keeps_check_names_whole() -> None:
    """With the band column the table is wider than 120 columns: a table there would fold a figure or a name, so
    120 columns get one whole line per pair, 140 the table with every name and figure on one line."""
    comparisons = compare_reports(load_report(CPU_A), load_report(CPU_FAIL))
    console = Console(record=True, width=120, force_terminal=True, color_system=None)
    print_comparison(console, comparisons, changed_only=True)
    text = console.export_text()
    assert "needs 140 columns, this terminal has 120" in text and "┏" not in text
    assert "INFO  | train.tokens_per_s_per_gpu | 2 x cpu | 8622 tokens/s | 1819 tokens/s | INFO | " in text
    console = Console(record=True, width=140, force_terminal=True, color_system=None)
    print_comparison(console, comparisons, changed_only=True)
    text = console.export_text()
    assert re.search(r"│ train.tokens_per_s_per_gpu │ 2 x cpu +│ 8622 tokens/s +│ 1819 tokens/s +│", text), text
    assert "│ collective.broadcast " in text
    assert max(len(line) for line in text.splitlines() if line.startswith("│")) <= 140


def test_markdown_cells_show_quoted_markup_and_keep_comparisons_readable() -> None:
    """An evaluation's `found a malformed <tool_call> block` lost its tag in rendered Markdown (HTML escaped it)."""
    from gpucert.report.markdown import md_cell

    assert md_cell("found a malformed <tool_call> block") == "found a malformed &lt;tool_call> block"
    assert md_cell("<= 6.5 | GPU 1 -> GPU 2\nnext") == "<= 6.5 \\| GPU 1 -> GPU 2<br>next"


def test_runs_that_are_not_like_for_like_are_said_so_and_other_methods_numbers_not_judged(tmp_path: Path) -> None:
    """Another method version: numbers shown, not judged (its statuses still compared); another verb, profile or GPU
    model: a note above the rows in every view."""
    base = load_report(FIXTURES / "reports/accept-4xh200-synthetic.json")
    worse = load_report(FIXTURES / "reports/accept-4xh200-synthetic-regressed.json")
    older = dataclasses.replace(worse, meta=dataclasses.replace(worse.meta, method_version="0", profile="h100-sxm"))
    comparisons = compare_reports(base, older)
    assert not [c for c in comparisons if c.regressed] and not [c for c in comparisons if c.judged]
    # Newly failing is a status change, judged against each run's own profile: it still counts.
    assert comparison_status(comparisons) is Status.FAIL
    notes = mismatches(base, older)
    assert notes[0].startswith("method versions differ (1 in the baseline, 0 in the candidate")
    assert notes[1] == "profiles differ (h200 in the baseline, h100-sxm in the candidate): not like for like"
    assert mismatches(base, worse) == []
    markdown = render_comparison_markdown(comparisons, notes=notes)
    assert f"- **Note:** {notes[1]}" in markdown


def test_a_figure_judged_before_and_only_shown_now_is_a_warn() -> None:
    """A fine-tuning run without train.final_loss_max: its loss 32 % worse compared PASS, exit 0, since an INFO
    row is never counted. The baseline judged it; the candidate does not: that lost judgement is a WARN."""
    judged = Result("final_loss", "run", Status.PASS, "ok", 5.978, "nats/token", expected="<= 6.5")
    shown = Result("final_loss", "run", Status.INFO, "shown, not judged", 7.915, "nats/token")
    meta = RunMeta("0.1.0", "3", "finetune", [], "h", "2026-11-29T00:00:00+00:00", "2026-11-29T00:01:00+00:00", 60.0,
                   "cpu", {}, {})  # fmt: skip
    (row,) = compare_reports(Report(meta, {}, [judged]), Report(meta, {}, [shown]))
    assert row.status is Status.WARN and not row.regressed
    assert comparison_status([row]) is Status.WARN
    assert "| WARN | final_loss | run | 5.978 nats/token | 7.915 nats/token | PASS → INFO |" in (
        render_comparison_markdown([row])
    )
    assert "no longer judged" in render_comparison_markdown([row])
