"""A fine-tuning run's report built from its metrics dict: which results are judged, which only shown, the
per-step series, the command line, and the schema (a real run's report is checked in test_train.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from jsonschema import Draft202012Validator
from tests.finetune.test_train import METRICS_KEYS, REPORT_RESULTS
from tests.training_runs import synthetic_metrics, training_report

import gpucert.report
from gpucert.finetune.train import report as run_report
from gpucert.finetune.train.report import invocation, run_results, step_series, write_run_files
from gpucert.finetune.train.summary import step_time_spread
from gpucert.report.store import load_report
from gpucert.status import Status

SCHEMA = json.loads((Path(gpucert.report.__file__).parent / "report.schema.json").read_text())


def by_name(metrics: dict) -> dict:
    return {r.name: r for r in run_results(metrics)}


def test_the_synthetic_metrics_have_a_real_runs_keys() -> None:
    assert set(synthetic_metrics()) == METRICS_KEYS


def test_a_gpu_run_report_validates_and_only_the_criteria_are_judged() -> None:
    report = training_report()
    validator = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    assert [e.message for e in validator.iter_errors(report.to_dict())] == []
    results = {r.name: r for r in report.results}
    # A GPU run with checkpointing also has HFU; every number has a value.
    assert list(results) == [*REPORT_RESULTS[:7], "hfu", *REPORT_RESULTS[7:]]
    judged = [r.name for r in report.results if r.status not in (Status.INFO, Status.SKIP)]
    assert judged == ["final_loss", "checkpoint_present", "no_oom"]
    assert all(r.expected and r.threshold_source for r in report.results if r.status is Status.PASS)
    assert all(r.expected is None for r in report.results if r.status is Status.INFO)
    assert report.status is Status.PASS
    assert results["mfu"].value == pytest.approx(18.7) and results["mfu"].unit == "%"
    assert "profile h100-sxm: bf16_peak_tflops" in results["mfu"].message
    assert results["hfu"].value == pytest.approx(18.7 * 1.44)
    assert results["peak_memory_gib"].value == 31.7 and "33.80 GiB reserved" in results["peak_memory_gib"].message
    assert results["tokens_per_s_per_gpu"].message.startswith("5,397 effective (non-pad) tokens/s per GPU over 38")
    assert results["tokens_per_s_per_gpu"].message.endswith(
        "the data's host work 0.70 % of the step time; step time median 1.517 s"
    )
    assert results["eval_loss"].message.startswith("held-out loss at step 40 over 51,000 supervised tokens")
    assert report.meta.verb == "finetune" and report.meta.profile == "h100-sxm" and report.meta.nodes == ["vm"]
    assert report.meta.duration_s == 95.0


def test_a_stalled_step_is_named_beside_the_mean_tokens_per_s() -> None:
    metrics = synthetic_metrics()
    steady = by_name(metrics)["tokens_per_s_per_gpu"].message
    metrics["step_log"][9]["step_time_s"] = 2.6  # step 10: 1.7x the others, as one step of an H200 run was
    metrics["step_time_s"] = step_time_spread([r for r in metrics["step_log"] if not r["warmup"]])
    stalled = by_name(metrics)["tokens_per_s_per_gpu"]
    assert "x the median" not in steady
    assert stalled.message.endswith(
        "step time median 1.517 s, step 10 2.600 s (1.7x the median: a stall, which lowers this mean; a run of more "
        "steps, or the median, tells the speed)"
    )
    spread = stalled.details["step_time_s"]
    assert spread == {"median": pytest.approx(1.517, abs=5e-4), "slowest": 2.6, "slowest_step": 10}
    del metrics["step_time_s"]  # a run from before it was measured
    assert by_name(metrics)["tokens_per_s_per_gpu"].message.endswith("0.70 % of the step time")


def test_a_failed_criterion_fails_the_report_and_a_missing_threshold_is_info() -> None:
    failed = training_report(synthetic_metrics(final_loss_max=0.5))
    assert failed.status is Status.FAIL
    assert [r.name for r in failed.results if r.status is Status.FAIL] == ["final_loss"]
    unjudged = training_report(synthetic_metrics(final_loss_max=None))
    assert {r.name: r.status for r in unjudged.results}["final_loss"] is Status.INFO
    # Adapter and checkpoint still judged: the verdict is theirs.
    assert unjudged.status is Status.PASS


def test_a_cpu_run_skips_what_it_cannot_measure() -> None:
    results = by_name(synthetic_metrics(mfu=None, peak_gib=None))
    assert results["mfu"].status is Status.SKIP and "train.peak_tflops" in results["mfu"].message
    assert results["hfu"].status is Status.SKIP
    assert results["peak_memory_gib"].status is Status.SKIP and results["peak_memory_gib"].value is None
    assert results["peak_rss_gib"].status is Status.INFO
    assert "hfu" not in by_name(synthetic_metrics(gradient_checkpointing=False))


def test_step_series_are_aligned_per_gpu_and_in_percent() -> None:
    metrics = synthetic_metrics(steps=5)
    series = step_series(metrics)
    assert series["step"] == [1, 2, 3, 4, 5]
    assert {len(v) for k, v in series.items() if not k.startswith("eval_")} == {5}
    assert series["warmup"] == [True, True, False, False, False]
    assert series["mfu_pct"][2] == pytest.approx(100 * metrics["step_log"][2]["mfu"])
    assert series["eval_step"] == [20, 40]
    # Per GPU: a step's all-rank rate over the world size it ran with.
    metrics["step_log"][0]["world_size"] = 4
    assert step_series(metrics)["tokens_per_s_per_gpu"][0] == metrics["step_log"][0]["tokens_per_s"]["effective"] / 4


def test_steps_logged_before_memory_was_recorded_read_as_gaps() -> None:
    # A run resumed from a checkpoint of an older gpucert: its first steps have no memory or world size.
    metrics = synthetic_metrics(steps=3)
    for record in metrics["step_log"][:2]:
        del record["memory_gib"], record["world_size"]
    series = step_series(metrics)
    assert series["memory_peak_gib"][:2] == [None, None] and series["memory_peak_gib"][2] is not None
    assert series["tokens_per_s_per_gpu"][0] == metrics["step_log"][0]["tokens_per_s"]["effective"]


def test_the_data_preparation_report_is_carried_whole() -> None:
    data = by_name(synthetic_metrics())["data.preparation"]
    assert data.status is Status.INFO and data.category == "data" and data.value == 112890
    assert data.details["train"]["repairs"] == {"arguments_key": 41}
    assert data.message.startswith(
        "112960 rows from glaiveai/glaive-function-calling-v2: 112890 parsed, 70 unparsable; "
        "2 of 112962 lines skipped (not JSON objects); dropped 70 rows (bad_arguments 52, undeclared_function 18); "
        "repaired 43 rows (arguments_key 43); train: "
    )
    assert "train: 107245 conversations -> 21034 rows, 85,950,000 tokens (31.0% supervised)" in data.message


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["/usr/bin/gpucert", "finetune", "-o", "r"], ["gpucert", "finetune", "-o", "r"]),
        (["/x/site-packages/gpucert/__main__.py", "finetune"], ["gpucert", "finetune"]),
        (["/x/src/gpucert/finetune/train/__main__.py", "c.yaml"], ["python", "-m", "gpucert.finetune.train", "c.yaml"]),
        (["other", "a"], ["other", "a"]),
        ([], []),
    ],
)
def test_invocation(argv: list[str], command: list[str]) -> None:
    assert invocation(argv) == command


def test_run_files_are_written_whole(tmp_path: Path) -> None:
    metrics = synthetic_metrics()
    report = training_report(metrics)
    write_run_files(tmp_path, metrics, report)
    assert json.loads((tmp_path / "metrics.json").read_text()) == json.loads(json.dumps(metrics))
    assert load_report(tmp_path).to_dict() == report.to_dict()
    assert (tmp_path / "report.md").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "report.json", "report.md"]


def test_a_failed_metrics_write_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(*_: object, **__: object) -> str:
        raise OSError(28, "No space left on device")

    # Only this module's json: the report before it is written whole.
    monkeypatch.setattr(run_report, "json", SimpleNamespace(dumps=disk_full))
    with pytest.raises(OSError, match="No space left"):
        write_run_files(tmp_path, synthetic_metrics(), training_report())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]


def test_tokens_per_gpu_count_each_steps_own_processes() -> None:
    """A run of 2 processes resumed on 1: every step was divided by the last world size, 1, so the 2-process
    steps counted as one GPU's (24,249 tokens/s per GPU reported where they ran at 11,673 and 26,286)."""
    from gpucert.finetune.train.summary import per_gpu_rates

    def step(seconds: float, world: int) -> dict:
        return {
            "step_time_s": seconds,
            "world_size": world,
            "tokens": {"padded": 100, "effective": 80, "supervised": 40},
        }

    two, one = [step(1.0, 2)] * 3, [step(0.5, 1)] * 2
    assert per_gpu_rates(two, 2)["effective"] == 40.0
    assert per_gpu_rates(one, 1)["effective"] == 160.0
    # 400 tokens over 3 x 2 + 2 x 0.5 = 7 GPU-seconds, not over 4 seconds of 1 GPU.
    assert per_gpu_rates(two + one, 1)["effective"] == 400 / 7
