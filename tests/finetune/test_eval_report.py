"""`gpucert evaluate`'s report: metrics judged against eval.thresholds (INFO without one), the loss, per-tool rows,
example failures, and a report that `gpucert report` reads and renders."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from gpucert.cli import main
from gpucert.config.loader import ConfigError
from gpucert.finetune.commands import check_evaluation_output, split_warning, threshold_source
from gpucert.finetune.config import EvalThresholds, load_finetune_config
from gpucert.finetune.eval.evaluate import EvalScores, expected_turns, score
from gpucert.finetune.eval.report import (
    MAX_TOOL_RESULTS,
    evaluation_report,
    evaluation_results,
    loss_result,
    scores_to_results,
    tool_results,
)
from gpucert.hardware.inventory import bundle_sources, collect_inventory
from gpucert.report.markdown import render_markdown
from gpucert.report.store import load_report, write_report
from gpucert.status import Status

CASES_FILE = Path(__file__).parent.parent / "fixtures" / "finetune_eval" / "cases.jsonl"
CASES = [json.loads(line) for line in CASES_FILE.read_text().splitlines()]
METRIC_NAMES = [
    "eval.call_accuracy",
    "eval.relevance",
    "eval.irrelevance",
    "eval.name_accuracy",
    "eval.args_valid_json",
    "eval.args_match",
    "eval.overall",
]
REPO = Path(__file__).parent.parent.parent


def _fixture_scores() -> EvalScores:
    turns = [t for i, c in enumerate(CASES) for t in expected_turns(c["conversation"], index=i)]
    return score(turns, [c["output"] for c in CASES])


def test_without_thresholds_every_metric_is_info_never_pass() -> None:
    results = scores_to_results(_fixture_scores())

    # Values counted from the `expect` fields of cases.jsonl (test_evaluate.py checks the counts).
    assert [(r.name, r.value, r.unit, r.status, r.expected) for r in results] == [
        ("eval.call_accuracy", 93.75, "%", Status.INFO, None),
        ("eval.relevance", 96.55, "%", Status.INFO, None),
        ("eval.irrelevance", 66.67, "%", Status.INFO, None),
        ("eval.name_accuracy", 85.71, "%", Status.INFO, None),
        ("eval.args_valid_json", 86.21, "%", Status.INFO, None),
        ("eval.args_match", 42.86, "%", Status.INFO, None),
        ("eval.overall", 43.75, "%", Status.INFO, None),
    ]
    assert {r.category for r in results} == {"evaluation"}
    assert results[0].message == (
        "right call / no-call decision: 30 of 32 (93.8 %), over all turns; e.g. conversation 23, message 2: "
        "expected no call, found a call to get_weather"
    )
    assert results[1].details == {
        "correct": 28,
        "total": 29,
        "examples": [{"turn": "conversation 25, message 2", "reasons": ["expected a call to get_weather, found none"]}],
    }
    overall = results[-1].details
    assert len(overall["failures"]) == 18 and len(overall["examples"]) == 3
    assert overall["counts"]["turns"] == 32
    # The counts as a reader takes them in (the HTML report shows this, not the keys).
    assert overall["summary"] == (
        "32 held-out turns: 29 expected a call (2 of them parallel), 3 expected none; the model called in 29 "
        "(28 calls parsed, 2 blocks malformed); 14 fully right."
    )
    # Counted from the `expect` fields of the cases whose reference calls get_weather.
    assert overall["per_tool"]["get_weather"] == {
        "turns": 18,
        "called": 17,
        "names_ok": 13,
        "args_match": 8,
        "correct": 8,
    }
    json.dumps([r.to_dict() for r in results])  # the report writes them as JSON


def test_thresholds_judge_pass_and_fail_exactly_at_the_floor() -> None:
    scores = _fixture_scores()
    # 30 of 32 is 93.75 %: a floor of exactly 93.75 passes, a hair above fails.
    at = scores_to_results(scores, EvalThresholds(call_accuracy_min_pct=93.75), "recipe.yaml")[0]
    above = scores_to_results(scores, EvalThresholds(call_accuracy_min_pct=93.76), "recipe.yaml")[0]
    assert (at.status, above.status) == (Status.PASS, Status.FAIL)
    assert above.expected == ">= 93.76 %"
    assert above.threshold_source == "eval.thresholds.call_accuracy_min_pct in recipe.yaml"
    assert above.message.startswith("expected >= 93.76 % (right call / no-call decision), found 30 of 32 (93.8 %)")
    assert above.remediation and "template" in above.remediation
    assert at.remediation is None
    # Only the metrics given a threshold are judged.
    statuses = [r.status for r in scores_to_results(scores, EvalThresholds(overall_min_pct=90), "recipe.yaml")]
    assert statuses == [Status.INFO] * 6 + [Status.FAIL]


def test_no_turn_at_all_is_an_error_for_every_metric() -> None:
    results = evaluation_results(score([], []), loss=None)
    assert [r.status for r in results] == [Status.ERROR] * 9
    assert results[-1].name == "eval.verdict" and results[-1].message.startswith("could not be judged: 8 results")
    assert results[0].message == "expected at least one scorable turn (all turns), found no held-out turn"


def test_a_model_that_never_calls_skips_the_call_metrics_unless_a_threshold_asks_for_them() -> None:
    weather = CASES[0]["conversation"]  # exact_match
    scores = score(expected_turns(weather), ["It is sunny."])
    results = scores_to_results(scores)
    assert [(r.name, r.status, r.value) for r in results] == [
        ("eval.call_accuracy", Status.INFO, 0.0),
        ("eval.relevance", Status.INFO, 0.0),
        ("eval.irrelevance", Status.SKIP, None),
        ("eval.name_accuracy", Status.SKIP, None),
        ("eval.args_valid_json", Status.SKIP, None),
        ("eval.args_match", Status.SKIP, None),
        ("eval.overall", Status.INFO, 0.0),
    ]
    assert results[3].message == (
        "nothing to score over turns that expected a call and got one: the model made no call where one was "
        "expected (see eval.relevance)"
    )
    # A recipe that asks for name accuracy gets a FAIL, not a SKIP that would leave the verdict at INFO.
    judged = scores_to_results(scores, EvalThresholds(name_accuracy_min_pct=90), "recipe.yaml")[3]
    assert judged.status is Status.FAIL
    assert judged.message.startswith("expected >= 90 % (right functions called), found no turn to score")


def test_data_without_tool_calls_cannot_meet_a_call_threshold() -> None:
    chat = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], "tools": []}
    scores = score(expected_turns(chat), ["Hello!"])
    assert [r.status for r in scores_to_results(scores)] == [
        Status.INFO,
        Status.SKIP,
        Status.INFO,
        Status.SKIP,
        Status.SKIP,
        Status.SKIP,
        Status.INFO,
    ]
    judged = scores_to_results(scores, EvalThresholds(args_match_min_pct=80), "recipe.yaml")[5]
    assert judged.status is Status.ERROR
    assert judged.message == (
        "eval.thresholds.args_match_min_pct is set, but this data has no turn to score it over (turns that "
        "expected a call and got one): no held-out turn expects a tool call"
    )


def test_overall_on_data_without_tool_calls_is_never_a_pass() -> None:
    """A turn expecting no call is right whenever no call is made, so on data without tool calls (alpaca)
    eval.overall and eval.call_accuracy read 100 % for any model that never calls: before 2026-11-29 a floor on
    them was a PASS. They count what eval.irrelevance counts, and say so."""
    chat = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], "tools": []}
    scores = score(expected_turns(chat), ["Something else entirely."])
    why = (
        "no held-out turn expects a tool call, so a turn counts as right whenever it makes no call (its text is not "
        "scored): the same count as eval.irrelevance, not a function-calling score"
    )
    unjudged = evaluation_results(scores, 1.0)
    call_accuracy, overall = unjudged[0], unjudged[6]
    assert (overall.name, overall.status, overall.value) == ("eval.overall", Status.INFO, 100.0)
    assert overall.message == f"turn fully right: 1 of 1 (100.0 %), over all turns; {why}"
    assert call_accuracy.status is Status.INFO and call_accuracy.message.endswith(why)
    # The floor worth suggesting on such data is the one it can exercise.
    assert unjudged[-1].message.endswith("e.g. eval.thresholds.irrelevance_min_pct (docs/evaluation.md)")

    thresholds = EvalThresholds(overall_min_pct=90, call_accuracy_min_pct=90, irrelevance_min_pct=90)
    judged = evaluation_results(scores, 1.0, thresholds, "recipe.yaml")
    call_accuracy, irrelevance, overall = judged[0], judged[2], judged[6]
    assert (overall.status, overall.value, overall.expected) == (Status.ERROR, None, ">= 90 %")
    assert overall.message == (
        f"eval.thresholds.overall_min_pct is set, but this data cannot exercise it: {why}; found 1 of 1 (100.0 %), "
        "over all turns"
    )
    assert overall.remediation == (
        "evaluate on held-out data with tool calls, or set eval.thresholds.overall_min_pct to null for this data "
        "(eval.thresholds.irrelevance_min_pct judges the no-call turns)"
    )
    assert call_accuracy.status is Status.ERROR
    assert irrelevance.status is Status.PASS  # what the data can say: the model made no stray call
    verdict = judged[-1]
    assert verdict.status is Status.ERROR
    assert verdict.details["not_computed"] == ["eval.call_accuracy", "eval.overall"]

    # One turn that expects a call is enough for eval.overall to be a function-calling score again.
    weather = CASES[0]["conversation"]  # exact_match
    mixed = score([*expected_turns(chat), *expected_turns(weather)], ["Hello!", CASES[0]["output"]])
    assert evaluation_results(mixed, 1.0, EvalThresholds(overall_min_pct=90), "recipe.yaml")[6].status is Status.PASS


def test_loss_is_info_judged_or_an_error() -> None:
    assert (loss_result(0.41234).status, loss_result(0.41234).value, loss_result(0.41234).unit) == (
        Status.INFO,
        0.4123,
        "nats/token",
    )
    assert loss_result(0.4, EvalThresholds(loss_max=0.5), "r.yaml").status is Status.PASS
    over = loss_result(0.6, EvalThresholds(loss_max=0.5), "r.yaml")
    assert (over.status, over.expected, over.threshold_source) == (
        Status.FAIL,
        "<= 0.5 nats/token",
        "eval.thresholds.loss_max in r.yaml",
    )
    assert loss_result(None).status is Status.ERROR


def _turns_calling(names: list[str]) -> EvalScores:
    def conversation(name: str) -> dict[str, Any]:
        call = {"type": "function", "function": {"name": name, "arguments": {}}}
        return {"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [call]}]}

    turns = [t for i, n in enumerate(names) for t in expected_turns(conversation(n), index=i)]
    # Every other turn right: the first of each tool's turns.
    outputs = [
        f'<tool_call>\n{{"name": "{n}", "arguments": {{}}}}\n</tool_call>' if names.index(n) == i else "no"
        for i, n in enumerate(names)
    ]
    return score(turns, outputs)


def test_per_tool_rows_most_frequent_first_the_rest_summed() -> None:
    names = ["b", "a", "a", "c"] + [f"t{i:02d}" for i in range(MAX_TOOL_RESULTS)]
    rows = tool_results(_turns_calling(names))
    assert [(r.subject, r.value, r.status) for r in rows[:3]] == [
        ("tool a", 50.0, Status.INFO),
        ("tool b", 100.0, Status.INFO),
        ("tool c", 100.0, Status.INFO),
    ]
    assert rows[0].message == "1 of 2 turns that expect a fully right; called in 1, right functions in 1, " + (
        "arguments matched in 1"
    )
    assert len(rows) == MAX_TOOL_RESULTS + 1
    assert (rows[-1].subject, rows[-1].details) == ("other tools", {"tools": 3, "turns": 3, "correct": 3})


def _report(scores: EvalScores, thresholds: EvalThresholds | None = None) -> Any:
    results = evaluation_results(scores, 0.5, thresholds, "configs/finetune/x.yaml")
    inventory = collect_inventory(bundle_sources(REPO / "tests/fixtures/nodes/h100"), probe_torch=False).to_dict()
    return evaluation_report(
        results,
        command=["gpucert", "evaluate", "--adapter", "runs/x/adapter"],
        config={"eval": {"max_examples": 200}},
        started_at=datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc),
        finished_at=datetime(2026, 11, 30, 12, 3, tzinfo=timezone.utc),
        inventory=inventory,
    )


def test_the_report_is_read_and_rendered_by_gpucert_report(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    report = _report(_fixture_scores(), EvalThresholds(overall_min_pct=40, args_match_min_pct=50))
    assert (report.meta.verb, report.meta.profile, report.meta.duration_s) == ("evaluate", "none", 180.0)
    assert report.meta.method_version.endswith(", scoring 3")
    assert report.status is Status.FAIL  # args_match 42.86 % < 50 %
    write_report(report, tmp_path)

    assert load_report(tmp_path).to_dict() == json.loads(json.dumps(report.to_dict()))
    markdown = render_markdown(report)
    assert "| FAIL | eval.args_match | held-out turns | 42.86 % | >= 50 % |" in markdown
    assert "| INFO | eval.tool | tool get_weather | 44.44 % |" in markdown
    assert main(["report", str(tmp_path)]) == 2
    assert "eval.args_match" in capsys.readouterr().out
    assert main(["report", str(tmp_path), "--markdown"]) == 2


def test_a_report_of_info_alone_exits_0(tmp_path: Path) -> None:
    report = _report(_fixture_scores())
    assert report.status is Status.INFO and report.status.exit_code == 0


def test_an_output_directory_holding_another_report_is_refused(tmp_path: Path) -> None:
    check_evaluation_output(tmp_path / "run" / "evaluation")  # not there yet: fine
    # A training run's report.json would be replaced: refused.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text(json.dumps({"meta": {"verb": "finetune"}}))
    with pytest.raises(ConfigError, match="holds a gpucert finetune report, which the evaluation report would"):
        check_evaluation_output(tmp_path / "run")
    (tmp_path / "run" / "report.json").write_text("{")
    with pytest.raises(ConfigError, match=r"holds a report\.json that is no gpucert evaluation"):
        check_evaluation_output(tmp_path / "run")
    (tmp_path / "run" / "evaluation").mkdir()
    (tmp_path / "run" / "evaluation" / "report.json").write_text(json.dumps({"meta": {"verb": "evaluate"}}))
    check_evaluation_output(tmp_path / "run" / "evaluation")  # an earlier evaluation: replaced
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_evaluation_output(tmp_path / "file" / "evaluation")


def test_evaluate_refuses_a_training_run_directory_as_output_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "run"
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "adapter_config.json").write_text("{}")
    (run / "report.json").write_text(json.dumps({"meta": {"verb": "finetune"}}))
    assert main(["evaluate", "--adapter", str(run / "adapter"), "--output", str(run)]) == 3
    assert "holds a gpucert finetune report" in capsys.readouterr().err
    assert json.loads((run / "report.json").read_text()) == {"meta": {"verb": "finetune"}}


def _evaluation(directory: Path, suite: str | None) -> dict[str, Any]:
    """A report.json of `gpucert evaluate` in `directory`: `suite` in its config, or none (a held-out report
    written before the key existed)."""
    directory.mkdir(parents=True, exist_ok=True)
    content = {"meta": {"verb": "evaluate", "config": {"evaluate": {} if suite is None else {"suite": suite}}}}
    (directory / "report.json").write_text(json.dumps(content))
    return content


def test_an_output_directory_holding_another_suites_evaluation_is_refused(tmp_path: Path) -> None:
    """Before 2026-11-29 `evaluate --output RUN/evaluation-bfcl` replaced the BFCL report with a held-out one."""
    bfcl, held_out, old = tmp_path / "evaluation-bfcl", tmp_path / "evaluation", tmp_path / "old"
    _evaluation(bfcl, "bfcl")
    _evaluation(held_out, "held-out")
    _evaluation(old, None)
    with pytest.raises(ConfigError) as refused:
        check_evaluation_output(bfcl, "held-out")
    assert str(refused.value) == (
        f"--output {bfcl}: holds a gpucert evaluate --suite bfcl report, which this --suite held-out evaluation "
        "would replace; choose another --output (the default for --suite held-out is evaluation/ beside the "
        f"adapter), or remove {bfcl / 'report.json'} to replace it"
    )
    with pytest.raises(ConfigError, match="holds a gpucert evaluate --suite held-out report, which this --suite bfcl"):
        check_evaluation_output(held_out, "bfcl")
    with pytest.raises(ConfigError, match="--suite held-out report"):
        check_evaluation_output(old, "bfcl")
    # The same suite re-run in place replaces its own report.
    for directory, suite in ((bfcl, "bfcl"), (held_out, "held-out"), (old, "held-out")):
        check_evaluation_output(directory, suite)


@pytest.mark.parametrize(("earlier", "suite"), [("bfcl", []), ("held-out", ["--suite", "bfcl"])])
def test_evaluate_refuses_another_suites_output_before_any_work(
    earlier: str, suite: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    adapter = tmp_path / "run" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")  # never read: the output is checked first
    out = tmp_path / "run" / "evaluation-x"
    content = _evaluation(out, earlier)
    data = ["--bfcl-data", str(REPO / "tests" / "fixtures" / "bfcl")] if suite else []
    assert main(["evaluate", "--adapter", str(adapter), "--output", str(out), *suite, *data]) == 3
    assert f"holds a gpucert evaluate --suite {earlier} report" in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text()) == content


def test_evaluates_config_help_says_it_defaults_to_the_runs_own() -> None:
    """Before 2026-11-29 `gpucert evaluate --help` said the default was the offline tiny recipe."""
    from gpucert.cli import build_parser

    verbs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    (config,) = [a for a in verbs.choices["evaluate"]._actions if "--config" in a.option_strings]
    assert config.help is not None and "the config.yaml of the run that wrote the adapter" in config.help
    (trains,) = [a for a in verbs.choices["finetune"]._actions if "--config" in a.option_strings]
    assert trains.help == "finetune YAML (default: the offline tiny recipe)"


def test_the_split_warning_names_the_option_that_changed_the_split(tmp_path: Path) -> None:
    """Before 2026-11-29 `evaluate --set data.eval_fraction=0.5` was told to evaluate "with the run's config (no
    --config)", though it gave no --config."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text((REPO / "configs" / "finetune" / "tiny.yaml").read_text())
    head = f"warning: {run} trained on prepared data {'a' * 12}; this held-out split comes from {'b' * 12}"

    def warning(config: str | None, *overrides: str) -> str:
        args = argparse.Namespace(config=config, overrides=list(overrides))
        cfg = load_finetune_config(run / "config.yaml", list(overrides))
        return split_warning(args, run, "a" * 64, "b" * 64, cfg)

    assert warning(None, "data.eval_fraction=0.5") == (
        f"{head} and may hold rows the adapter trained on: data.eval_fraction is 0.5, 0.1 in training (--set "
        "data.eval_fraction=0.5). Drop --set data.eval_fraction=0.5 to evaluate on the turns the run held out, or "
        "--data a file it never saw"
    )
    other = tmp_path / "other.yaml"
    other.write_text((run / "config.yaml").read_text().replace("eval_fraction: 0.1", "eval_fraction: 0.3"))
    args = argparse.Namespace(config=other, overrides=[])
    from_config = split_warning(args, run, "a" * 64, "b" * 64, load_finetune_config(other))
    assert from_config.endswith(
        f"data.eval_fraction is 0.3, 0.1 in training (--config {other}). Drop --config {other} to evaluate on the "
        "turns the run held out, or --data a file it never saw"
    )
    # The split as in training, the rows prepared otherwise: nothing to drop, and not said so.
    same_split = warning(None, "data.max_length=256")
    assert same_split.startswith(f"{head}: its rows are split as in training (data.source, data.format,")
    assert "Drop" not in same_split and "--config" not in same_split


def test_threshold_source_names_the_file_or_the_override_that_set_each_key() -> None:
    """Each key where it came from: a --set names only the key it set (before 2026-11-29 every result named the
    file and the --set together, even a key the file set)."""
    recipe = Path("configs/finetune/qwen2-7b-glaive.yaml")
    args = argparse.Namespace(overrides=["eval.max_examples=8"])
    overall, loss = "eval.thresholds.overall_min_pct", "eval.thresholds.loss_max"
    assert threshold_source(args, recipe).of(overall) == f"{overall} in configs/finetune/qwen2-7b-glaive.yaml"
    args.overrides += [f"{overall}=70", f"{overall}=80"]
    sources = threshold_source(args, recipe)
    assert sources.of(overall) == f"--set {overall}=80"  # the last one wins, as the config loader applies them
    assert sources.of(loss) == f"{loss} in configs/finetune/qwen2-7b-glaive.yaml"
    args.overrides.append("eval.thresholds={loss_max: 2}")  # the whole mapping
    assert threshold_source(args, recipe).of(loss) == "--set eval.thresholds={loss_max: 2}"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("eval.thresholds.overall_min_pct=101", "eval.thresholds.overall_min_pct must be null or in [0, 100], found"),
        ("eval.thresholds.relevance_min_pct=-1", "eval.thresholds.relevance_min_pct must be null or in [0, 100]"),
        ("eval.thresholds.loss_max=0", "eval.thresholds.loss_max must be a finite number > 0, found 0.0"),
        ("eval.thresholds.overal_min_pct=1", "unknown key 'eval.thresholds.overal_min_pct'"),
    ],
)
def test_bad_thresholds_are_refused_at_load(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_finetune_config(None, [override])


def test_the_recipes_thresholds() -> None:
    tiny = load_finetune_config(REPO / "configs/finetune/tiny.yaml")
    assert tiny.eval.thresholds == EvalThresholds()  # the offline recipe judges nothing: a random model
    glaive = load_finetune_config(REPO / "configs/finetune/qwen2-7b-glaive.yaml").eval.thresholds
    held_out = {k: v for k, v in vars(glaive).items() if k.endswith("_min_pct") and not k.startswith("bfcl_")}
    assert held_out and all(v is not None for v in held_out.values())
    # No BFCL floor until a trained adapter's BFCL scores have been measured: shown as INFO, never invented.
    assert all(v is None for k, v in vars(glaive).items() if k.startswith("bfcl_"))


def test_the_verdict_says_whether_the_result_is_good() -> None:
    scores = _fixture_scores()
    unjudged = evaluation_results(scores, loss=0.5)[-1]
    assert (unjudged.name, unjudged.status) == ("eval.verdict", Status.INFO)
    assert unjudged.message.startswith("not judged: the recipe sets no eval.thresholds, so nothing says whether")
    # A floor set for BFCL only: the held-out verdict said none was set.
    bfcl_only = evaluation_results(scores, 0.5, EvalThresholds(bfcl_simple_min_pct=50), "--set")[-1]
    assert bfcl_only.status is Status.INFO
    assert bfcl_only.message.startswith(
        "not judged: the thresholds set (eval.thresholds.bfcl_simple_min_pct) are for --suite bfcl, none for this one"
    )
    good = evaluation_results(scores, 0.5, EvalThresholds(overall_min_pct=40, loss_max=1.0), "recipe.yaml")[-1]
    assert good.status is Status.PASS
    assert good.message == "good: all 2 thresholds met (eval.overall, eval.loss)"
    bad = evaluation_results(scores, 0.5, EvalThresholds(overall_min_pct=40, args_match_min_pct=50), "recipe.yaml")[-1]
    assert bad.status is Status.FAIL
    assert bad.message == ("not good enough: 1 of 2 thresholds not met: eval.args_match 42.86 % (expected >= 50 %)")
    assert bad.details["not_met"] == ["eval.args_match"]


def test_the_html_report_words_the_counts_and_says_when_no_call_was_right(monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.axes import Axes

    from gpucert.report.html import render_html
    from gpucert.report.plots import plot_evaluation

    html = render_html(_report(_fixture_scores()))
    assert "32 held-out turns: 29 expected a call" in html
    assert "counts.turns" not in html
    # Every tool at 0 %: the chart says so in words, instead of an empty frame.
    written: list[str] = []
    text = Axes.text
    monkeypatch.setattr(Axes, "text", lambda ax, x, y, s, *a, **k: written.append(s) or text(ax, x, y, s, *a, **k))
    weather = CASES[0]["conversation"]
    (tool,) = tool_results(score(expected_turns(weather), ["It is sunny."]))
    assert tool.value == 0 and plot_evaluation([(tool, 0.0)], "t") is not None
    assert written == ["no correct calls: every score here is 0 %"]
    written.clear()
    plot_evaluation([(tool, 50.0)], "t")
    assert written == []
