"""`gpucert finetune` and `gpucert evaluate` end to end on the offline default (tiny model, bundled data)."""

from __future__ import annotations

import json
from pathlib import Path

from gpucert.cli import main
from gpucert.report.store import load_report
from gpucert.status import Status


def test_offline_default_trains_saves_and_evaluates(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # the data cache lands in ./.gpucert-cache
    run = tmp_path / "run"
    assert main(["finetune", "--output", str(run)]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    losses = metrics["loss_history"]
    assert len(losses) == 40
    assert sum(losses[-3:]) / 3 < 0.9 * sum(losses[:3]) / 3, losses
    assert metrics["status"] == "PASS"
    assert {c["name"]: c["status"] for c in metrics["criteria"]} == {
        "final_loss": "PASS",
        "checkpoint_present": "PASS",
        "no_oom": "PASS",
    }
    assert (run / "adapter/adapter_config.json").exists()

    # tiny.yaml sets no eval.thresholds: every metric is shown (INFO) or does not apply (SKIP), exit 0.
    assert main(["evaluate", "--adapter", str(run / "adapter"), "--set", "eval.max_examples=8"]) == 0
    report = load_report(run / "evaluation")
    assert report.meta.verb == "evaluate"
    assert [r.name for r in report.results][:8] == [
        "eval.call_accuracy",
        "eval.relevance",
        "eval.irrelevance",
        "eval.name_accuracy",
        "eval.args_valid_json",
        "eval.args_match",
        "eval.overall",
        "eval.loss",
    ]
    assert {r.status for r in report.results} <= {Status.INFO, Status.SKIP}
    assert report.results[7].value > 0
    assert main(["report", str(run / "evaluation")]) == 0
    # The training run's own report is not replaced.
    assert json.loads((run / "report.json").read_text())["meta"]["verb"] == "finetune"


def test_prepare_alone_then_reuse(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["finetune", "prepare"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("prepared ") and "unparsable 10" in first
    assert main(["finetune", "prepare"]) == 0
    assert capsys.readouterr().out.startswith("reused ")


def test_a_bad_key_is_named_and_exits_3(tmp_path: Path, capsys) -> None:
    assert main(["finetune", "--set", "train.lr_max=1"]) == 3
    assert "unknown key 'train.lr_max'" in capsys.readouterr().err


def test_a_failed_run_says_on_the_terminal_which_criterion_failed_and_what_to_do(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Two steps cannot bring the loss under tiny.yaml's final_loss_max: exit 2, and the terminal names the failed
    criterion with its threshold and remedy, not only the verdict and the report's path."""
    monkeypatch.chdir(tmp_path)
    assert main(["finetune", "--output", str(tmp_path / "run"), "--set", "train.max_steps=2"]) == 2
    err = capsys.readouterr().err
    failed = [line for line in err.splitlines() if line.startswith("[finetune] FAIL  | final_loss | run | ")]
    assert len(failed) == 1, err[-2000:]
    assert "<= 6.5, found" in failed[0] and "[threshold: config train.final_loss_max] → train longer" in failed[0]
    assert "checkpoint_present" not in err and "[finetune] FAIL: report in" in err
