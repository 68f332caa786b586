"""`gpucert finetune` and `gpucert evaluate` end to end on the offline default (tiny model, bundled data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.report.test_finetune_report import CHROMIUM, TRAINING_PLOTS, images_in_browser, screenshot_colours

from gpucert.cli import main
from gpucert.finetune.data.formats import SAMPLE_PATH
from gpucert.report.store import load_report
from gpucert.status import Status


@pytest.mark.slow
def test_offline_default_trains_saves_evaluates_and_renders(tmp_path: Path, monkeypatch, capsys) -> None:
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

    # Both pages with --html, and where Chromium is installed (CI installs it), drawn in it: every plot decoded,
    # text, tables, badges and plots in many colours, not a blank page.
    evaluation = run / "evaluation"
    for directory in (run, evaluation):
        assert main(["report", str(directory), "--html"]) == 0
    if not CHROMIUM.exists():
        return
    images = images_in_browser(run / "report.html", tmp_path)
    assert [i["plot"] for i in images] == TRAINING_PLOTS
    assert all(i["complete"] and i["width"] == 1000 and i["height"] > 200 for i in images), images
    scores = images_in_browser(evaluation / "report.html", tmp_path)
    assert [i["plot"] for i in scores][:1] == ["evaluation.scores"]
    assert all(i["complete"] and i["width"] == 1000 and i["height"] > 100 for i in scores), scores
    assert screenshot_colours(run / "report.html", tmp_path) > 200
    assert screenshot_colours(evaluation / "report.html", tmp_path) > 200


@pytest.mark.slow
def test_evaluate_takes_the_runs_own_config_and_refuses_another_model(tmp_path: Path, monkeypatch, capsys) -> None:
    """Without --config, `gpucert evaluate --adapter RUN` evaluates with RUN/config.yaml: the default recipe's
    other split once scored 19 of 39 "held-out" turns the adapter had trained on, and a run on another base model
    ended in a PEFT size-mismatch traceback."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    split = ["--set", "data.eval_fraction=0.2", "--set", "train.max_steps=2", "--set", "train.save_every=2"]
    # Two steps leave the loss criterion unmet (FAIL, 2); the adapter is written all the same.
    assert main(["finetune", "--output", str(run), *split]) in (0, 2)
    trained_on = json.loads((run / "metrics.json").read_text())["dataset"]
    capsys.readouterr()

    # Two turns of at most 16 new tokens each: what is checked is which config and split are used, not the scores.
    few = ["--set", "eval.max_examples=2", "--set", "eval.max_new_tokens=16"]
    assert main(["evaluate", "--adapter", str(run), *few]) == 0
    err = capsys.readouterr().err
    assert f"evaluating with {run / 'config.yaml'}" in err and "warning" not in err, err
    evaluated = load_report(run / "evaluation").meta.config["evaluate"]
    assert evaluated["prepared_data"] == trained_on["path"]
    assert evaluated["trained_on_data"] == trained_on["fingerprint"]

    # Another config on the same model: allowed, with a warning that the split is not the run's.
    out = ["--output", str(tmp_path / "other-split"), *few]
    assert main(["evaluate", "--adapter", str(run), "--config", "tiny", *out]) == 0
    assert f"warning: {run} trained on prepared data {trained_on['fingerprint'][:12]}" in capsys.readouterr().err

    # Other rows through --data, as the warning advises: no warning.
    rows = tmp_path / "other-rows.jsonl"
    rows.write_text("".join(SAMPLE_PATH.read_text().splitlines(keepends=True)[:200]))
    out = ["--output", str(tmp_path / "other-rows"), *few]
    assert main(["evaluate", "--adapter", str(run), "--data", str(rows), *out]) == 0
    assert "warning" not in capsys.readouterr().err

    # Another model: refused before any model is loaded, naming both.
    other = tmp_path / "other.yaml"
    other.write_text((run / "config.yaml").read_text().replace("name: tiny", "name: Qwen/Qwen2-7B-Instruct", 1))
    assert main(["evaluate", "--adapter", str(run), "--config", str(other)]) == 3
    err = capsys.readouterr().err
    assert "model.name 'Qwen/Qwen2-7B-Instruct', but the adapter was trained on 'tiny'" in err, err
    assert not (tmp_path / "other" / "evaluation").exists()


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


@pytest.mark.slow
def test_a_failed_run_says_on_the_terminal_which_criterion_failed_and_what_to_do(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Two steps cannot bring the loss under tiny.yaml's final_loss_max: exit 2, and the terminal names the failed
    criterion with its threshold and remedy, not only the verdict and the report's path."""
    monkeypatch.chdir(tmp_path)
    assert main(["finetune", "--output", str(tmp_path / "run"), "--set", "train.max_steps=2"]) == 2
    out = capsys.readouterr().out  # results on stdout, progress on stderr, as every verb prints them
    failed = [line for line in out.splitlines() if line.startswith("FAIL  | final_loss | run | ")]
    assert len(failed) == 1, out[-2000:]
    assert "<= 6.5, found" in failed[0] and "[threshold: config train.final_loss_max] → train longer" in failed[0]
    assert "checkpoint_present" not in out and out.splitlines()[-1].startswith("FAIL: report in")


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("model.attn_implementation=varlen", "model.attn_implementation: varlen runs on CUDA GPUs only, this is cpu"),
        ("data.format=alpaca", "format 'alpaca' needs 'instruction', 'output': set data.format to glaive"),
    ],
)
def test_a_setting_that_cannot_run_here_is_one_line_without_a_traceback(
    tmp_path: Path, monkeypatch, capsys, setting: str, said: str
) -> None:
    """varlen on a CPU came after the data was prepared, with a 12-line traceback; a format whose columns the
    data lacks did not say which format they are."""
    monkeypatch.chdir(tmp_path)
    assert main(["finetune", "--output", str(tmp_path / "run"), "--set", setting]) == 3
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err[-3000:]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--set", "data.source=data/missing.jsonl"], "data.source data/missing.jsonl: no such file"),
        (["--set", "model.name=./nomodel"], "model.name: no directory ./nomodel"),
        (["--set", "model.name=a/b/c"], "model.name: no directory a/b/c"),  # no hub id: was found in the rank
        (["--output", "/proc/nope"], "output_dir /proc/nope: cannot write in /proc"),
        (["--nproc", "0"], "--nproc must be >= 1, found 0"),
    ],
)
def test_bad_input_is_refused_before_any_rank_starts(tmp_path: Path, monkeypatch, capsys, argv, said) -> None:
    """Once refused by rank 0 seconds later, in a line wrapped as a rank's failure (`rank 0 ... failed during
    setup: ConfigError: ... (raised at ...)`); now one line, before torch loads."""
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "gpucert.finetune.train.run", raising=False)
    assert main(["finetune", *argv]) == 3
    err = capsys.readouterr().err
    assert err.strip() == f"gpucert: error: {err.strip().removeprefix('gpucert: error: ')}" and said in err, err
    assert "rank 0" not in err and "gpucert.finetune.train.run" not in sys.modules


def test_a_live_runs_directory_and_another_verbs_report_are_refused_at_once(tmp_path: Path, capsys) -> None:
    """A second run into a live run's directory was told to remove the live run's checkpoints as an earlier run's;
    a run into a health report's directory replaced that report without a word."""
    import subprocess
    import sys
    import time

    live = tmp_path / "live"
    live.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from gpucert.runtime.dirlock import "
         "lock_dir; lock_dir(Path(sys.argv[1]), 'output_dir'); print('held', flush=True); time.sleep(60)", str(live)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        (live / "checkpoints" / "step-10").mkdir(parents=True)
        assert main(["finetune", "--output", str(live)]) == 3
        err = capsys.readouterr().err
        assert f"output_dir {live} is in use by another gpucert run (pid {holder.pid} on host" in err, err
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert main(["health", "--profile", "cpu", "-o", str(tmp_path / "h")]) == 0
    capsys.readouterr()
    assert main(["finetune", "--output", str(tmp_path / "h")]) == 3
    assert f"output_dir {tmp_path / 'h'}: holds a gpucert health report" in capsys.readouterr().err


def test_a_mistyped_flag_is_named_not_taken_for_the_stage(capsys) -> None:
    """`gpucert finetune --outptu x` said "argument stage: invalid choice: 'x'": the flag was never named."""
    with pytest.raises(SystemExit) as exited:
        main(["finetune", "--outptu", "x"])
    assert exited.value.code == 3
    assert "unrecognized arguments: --outptu" in capsys.readouterr().err
    assert main(["finetune", "prepar"]) == 3
    assert "finetune 'prepar': the only stage is `prepare`" in capsys.readouterr().err


def test_sigterm_ends_an_evaluation_with_one_line_and_143(monkeypatch, capsys) -> None:
    """`gpucert evaluate` died of SIGTERM without a word (finetune and Ctrl-C say one line); the handler is the
    caller's again afterwards."""
    import os
    import signal
    import time

    from gpucert.finetune import commands

    def killed(args: object) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        return 0

    monkeypatch.setattr(commands, "_evaluate", killed)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["evaluate", "--adapter", "x"]) == 143
    assert "gpucert: terminated by SIGTERM (to gpucert, pid" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
