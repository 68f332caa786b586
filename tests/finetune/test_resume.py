"""Resuming: every rank continues from the checkpoint rank 0 chose (two ranks that see different checkpoint
listings, as NFS attribute caching can show them), and a checkpoint is only continued on the prepared data it
trained on: another fingerprint is refused with both named, unless resume_allow_data_change; a checkpoint from
before fingerprints were recorded resumes with a warning. A newest checkpoint whose files do not read back
(truncated safetensors or optimizer state, garbage trainer state) is named, set aside, and `resume: auto`
continues from the previous complete one, saying so."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import yaml
from tests.finetune.checkpoint_files import DAMAGES, truncate, write_checkpoint

from gpucert.finetune.config import DataConfig, FinetuneConfig, LoraConfig, ModelConfig, TrainConfig
from gpucert.finetune.train.checkpoint import (
    STATE_FILE,
    CheckpointError,
    check_resume_config,
    choose_checkpoint,
    complete_checkpoints,
    judge_data_change,
    resume_settings,
)
from gpucert.finetune.train.run import FinetuneFailed, run_finetune
from gpucert.runtime.launch_env import RANK_VARIABLES

FP_OLD, FP_NEW = "a" * 64, "b" * 64
# One rank of a 2-rank gloo job (RANK etc. from the environment): print the checkpoint it will resume from,
# given the run directory *this* rank sees.
AGREE = """\
import json, sys
from pathlib import Path
from gpucert.finetune.train.checkpoint import agree_on_checkpoint
from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.group import start_runtime, stop_runtime

rt = start_runtime(RuntimeConfig(rendezvous_timeout_s=30, heartbeat_interval_s=1, heartbeat_timeout_s=6))
chosen = agree_on_checkpoint(rt, "auto", Path(sys.argv[1 + rt.rank]))
print(json.dumps(str(chosen)))
stop_runtime(rt)
"""


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone rank (pytest may run under a launcher): RANK=0 of WORLD_SIZE=1, no rendezvous."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_PORT", raising=False)


# --- What a rank would choose, and what data it may continue on -------------------------------------------


def test_choose_checkpoint(tmp_path: Path) -> None:
    assert choose_checkpoint("none", tmp_path) is None
    assert choose_checkpoint("auto", tmp_path) is None
    first = write_checkpoint(tmp_path, 4)
    latest = write_checkpoint(tmp_path, 8)
    assert choose_checkpoint("auto", tmp_path) == latest
    assert choose_checkpoint(str(first), tmp_path) == first


# --- An unreadable newest checkpoint ----------------------------------------------------------------------


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_resume_auto_names_an_unreadable_latest_checkpoint_and_takes_the_previous(tmp_path: Path, damage: str) -> None:
    previous = write_checkpoint(tmp_path, 4)
    latest = write_checkpoint(tmp_path, 8)
    name, harm = DAMAGES[damage]
    harm(latest / name)
    notes: list[str] = []
    assert choose_checkpoint("auto", tmp_path, notes.append) == previous
    assert len(notes) == 1
    assert str(latest / name) in notes[0] and "resuming from the previous complete checkpoint, step 4" in notes[0]
    # Set aside, not deleted: no later listing picks it, and a person can still look at it.
    assert "moved to step-8.corrupt" in notes[0] and (tmp_path / "checkpoints" / "step-8.corrupt").is_dir()
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [4]
    assert choose_checkpoint("auto", tmp_path, notes.append) == previous and len(notes) == 1


def test_no_readable_checkpoint_is_an_error_naming_each(tmp_path: Path) -> None:
    for step in (4, 8):
        truncate(write_checkpoint(tmp_path, step) / "optimizer.pt")
    with pytest.raises(CheckpointError) as refused:
        choose_checkpoint("auto", tmp_path)
    message = str(refused.value)
    for step in (4, 8):
        assert str(tmp_path / "checkpoints" / f"step-{step}" / "optimizer.pt") in message
    assert "Restore one from a backup, or start over" in message
    # The same command again (a requeue): it started over at step 0 beside the two set aside, without a word.
    with pytest.raises(
        CheckpointError, match=r"only checkpoints an earlier run found unreadable and set aside "
    ) as again:
        choose_checkpoint("auto", tmp_path)
    assert "(step-4.corrupt, step-8.corrupt)" in str(again.value)


def test_a_failed_resume_keeps_the_checkpoints_it_set_aside(tmp_path: Path) -> None:
    """No checkpoint readable: the run fails before its first step, and its clean-up took the step-N.corrupt
    directories (new paths since the claim) with the rest, where the message said they were kept."""
    from gpucert.finetune.train.rundir import claim_run_dir

    for step in (4, 8):
        truncate(write_checkpoint(tmp_path, step) / "optimizer.pt")
    run = claim_run_dir(tmp_path)
    with pytest.raises(CheckpointError, match=r"moved to step-8\.corrupt"):
        choose_checkpoint("auto", tmp_path)
    (tmp_path / "config.yaml").write_text("new: 1\n")  # what the failed run wrote: taken back
    run.close(failed=True)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-4.corrupt", "step-8.corrupt"]
    assert (tmp_path / "checkpoints" / "step-8.corrupt" / "optimizer.pt").is_file()
    assert not (tmp_path / "config.yaml").exists()


def test_a_named_unreadable_checkpoint_is_refused_without_fallback(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 4)
    named = write_checkpoint(tmp_path, 8)
    (named / "trainer_state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"resume: .*step-8/trainer_state.json: unreadable"):
        choose_checkpoint(str(named), tmp_path)
    assert named.is_dir()  # asked for by name: left where it is


def test_the_command_line_refuses_a_named_unreadable_checkpoint_in_one_line(
    tmp_path: Path, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpucert finetune --resume DIR` on a damaged checkpoint: exit 3 and the one line naming the file and what to
    do, no traceback (its message says it all, as for bad input)."""
    from gpucert.cli import main

    named = write_checkpoint(tmp_path / "old", 8)
    (named / "trainer_state.json").write_text("{not json")
    # The settings it was trained with, as every run writes them beside its checkpoints: the defaults here.
    from gpucert.finetune.config import load_finetune_config, resolve_recipe

    default = load_finetune_config(resolve_recipe(None))  # what `gpucert finetune` with no --config trains
    (tmp_path / "old" / "config.yaml").write_text(yaml.safe_dump(asdict(default)))
    assert main(["finetune", "--resume", str(named), "--output", str(tmp_path / "new")]) == 3
    err = capsys.readouterr().err
    assert "step-8/trainer_state.json: unreadable" in err and "or --resume auto" in err
    assert "Traceback" not in err, err[-3000:]


@pytest.mark.slow
def test_a_run_falls_back_past_a_truncated_checkpoint_and_continues_exactly(
    tmp_path: Path, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = replace(tiny(tmp_path), train=replace(tiny(tmp_path).train, max_steps=4, save_every=2))
    first = run_finetune(cfg)
    broken = tmp_path / "run" / "checkpoints" / "step-4" / "optimizer.pt"
    truncate(broken)
    capsys.readouterr()

    resumed = run_finetune(replace(cfg, resume="auto"))
    err = capsys.readouterr().err
    assert resumed["resumed_from"] == str(tmp_path / "run" / "checkpoints" / "step-2")
    assert f"checkpoint step 4 cannot be resumed from: {broken}: unreadable" in err
    assert "resuming from the previous complete checkpoint, step 2" in err
    # Steps 3 and 4 trained again from step 2's state give the first run's losses: an exact continuation. (With
    # more train.max_steps the schedule is the longer run's from step 3 on, so step 4's loss would differ.)
    assert resumed["loss_history"] == first["loss_history"]


def test_same_data_resumes_silently_another_is_refused_with_both_fingerprints() -> None:
    path = Path("run/checkpoints/step-8")
    assert judge_data_change(FP_OLD, FP_OLD, path, allow_change=False) is None
    # A CheckpointError: the command line says it in one line, without a traceback.
    with pytest.raises(CheckpointError) as refused:
        judge_data_change(FP_OLD, FP_NEW, path, allow_change=False)
    message = str(refused.value)
    assert str(path) in message and FP_OLD[:12] in message and FP_NEW[:12] in message
    assert "resume_allow_data_change: true" in message
    allowed = judge_data_change(FP_OLD, FP_NEW, path, allow_change=True)
    assert allowed is not None and FP_OLD[:12] in allowed and FP_NEW[:12] in allowed


def test_a_checkpoint_without_a_fingerprint_resumes_with_a_warning() -> None:
    warning = judge_data_change(None, FP_NEW, Path("run/checkpoints/step-8"), allow_change=False)
    assert warning is not None and "does not record which data" in warning


# --- Every rank loads rank 0's choice ---------------------------------------------------------------------


@pytest.mark.slow
def test_every_rank_resumes_from_rank_0s_choice(tmp_path: Path) -> None:
    """Rank 0 sees checkpoints 4 and 8; rank 1's (stale) view only 4. Both must take 8."""
    seen_by_0, seen_by_1 = tmp_path / "view0", tmp_path / "view1"
    write_checkpoint(seen_by_0, 4)
    newest = write_checkpoint(seen_by_0, 8)
    write_checkpoint(seen_by_1, 4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    ranks = []
    for rank in (0, 1):
        env = {**base, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        env |= {"GROUP_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        argv = [sys.executable, "-c", AGREE, str(seen_by_0), str(seen_by_1)]
        ranks.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [r.communicate(timeout=60) for r in ranks]
    for r, (_, err) in zip(ranks, outputs, strict=True):
        assert r.returncode == 0, err[-3000:]
    assert [json.loads(out) for out, _ in outputs] == [str(newest), str(newest)]


# --- A run on other data ----------------------------------------------------------------------------------


def tiny(tmp_path: Path) -> FinetuneConfig:
    return FinetuneConfig(
        model=ModelConfig(name="tiny", dtype="fp32"),
        lora=LoraConfig(r=4, alpha=8, dropout=0.0),
        data=DataConfig(max_length=256, eval_fraction=0.1, cache_dir=str(tmp_path / "cache")),
        train=TrainConfig(micro_batch=2, grad_accum=1, max_steps=2, save_every=2, eval_every=100),
        output_dir=str(tmp_path / "run"),
    )


@pytest.mark.slow
def test_resume_on_changed_data_is_refused_unless_allowed(
    tmp_path: Path, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tiny(tmp_path)
    first = run_finetune(cfg)
    checkpoint = tmp_path / "run" / "checkpoints" / "step-2"
    saved = json.loads((checkpoint / "trainer_state.json").read_text())
    assert saved["data_fingerprint"] == first["dataset"]["fingerprint"]

    # Another held-out share: other prepared rows, another fingerprint.
    changed = replace(
        cfg, resume="auto", data=replace(cfg.data, eval_fraction=0.2), train=replace(cfg.train, max_steps=4)
    )
    with pytest.raises(FinetuneFailed) as refused:
        run_finetune(changed)
    allowed = run_finetune(replace(changed, resume_allow_data_change=True))
    new_fingerprint = allowed["dataset"]["fingerprint"]
    assert new_fingerprint != first["dataset"]["fingerprint"]
    message = str(refused.value)
    assert str(checkpoint) in message
    assert first["dataset"]["fingerprint"][:12] in message and new_fingerprint[:12] in message
    assert refused.value.record.phase == "data preparation"  # refused before the model loads

    assert allowed["resumed_from"] == str(checkpoint) and len(allowed["loss_history"]) == 4
    assert "continuing on the new data" in capsys.readouterr().err
    # What the new checkpoints trained on from now: the new data.
    latest = json.loads((tmp_path / "run" / "checkpoints" / "step-4" / "trainer_state.json").read_text())
    assert latest["data_fingerprint"] == new_fingerprint


@pytest.mark.slow
def test_a_checkpoint_from_before_fingerprints_resumes_with_a_warning(
    tmp_path: Path, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tiny(tmp_path)
    run_finetune(cfg)
    state_file = tmp_path / "run" / "checkpoints" / "step-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["data_fingerprint"]
    state_file.write_text(json.dumps(state))
    capsys.readouterr()

    resumed = run_finetune(replace(cfg, resume="auto", train=replace(cfg.train, max_steps=4)))
    assert resumed["resumed_from"] == str(state_file.parent)
    assert "does not record which data it trained on" in capsys.readouterr().err


@pytest.mark.slow
def test_a_checkpoint_past_the_runs_last_step_is_said_not_passed_over(
    tmp_path: Path, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resume whose config asks for fewer steps than the checkpoint has trains nothing; it once re-reported the
    checkpoint's run without a word."""
    cfg = replace(tiny(tmp_path), train=replace(tiny(tmp_path).train, max_steps=4, save_every=2))
    first = run_finetune(cfg)
    capsys.readouterr()
    again = run_finetune(replace(cfg, resume="auto", train=replace(cfg.train, max_steps=2)))
    err = capsys.readouterr().err
    assert "warning: the checkpoint is at step 4, past this run's last step 2" in err, err[-2000:]
    assert "raise train.max_steps to train on" in err
    assert again["loss_history"] == first["loss_history"]
    # The same steps (a requeued job that had finished): a note, no warning.
    run_finetune(replace(cfg, resume="auto"))
    err = capsys.readouterr().err
    assert "note: the checkpoint is at step 4, at this run's last step 4" in err and "warning" not in err, err[-2000:]


def test_a_run_that_starts_over_in_a_directory_with_an_earlier_runs_checkpoints_is_refused(
    tmp_path: Path, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --resume, a second run into the same output_dir once trained, pruned its own checkpoints beside the
    earlier run's by step number, and reported the earlier run's step-40 as its own."""
    from gpucert.cli import main

    out = tmp_path / "run"
    write_checkpoint(out, 20)
    write_checkpoint(out, 40)
    assert main(["finetune", "--output", str(out), "--set", "train.max_steps=30"]) == 3
    err = capsys.readouterr().err
    assert f"output_dir {out} holds checkpoints of an earlier run (step-20, step-40): --resume auto continues" in err
    assert "Traceback" not in err, err[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-20", "step-40"]
    assert not (out / "metrics.json").exists()


def test_a_resume_with_other_training_settings_is_refused_naming_them(
    tmp_path: Path, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new train.lr on resume was ignored by the restored optimizer while config.yaml recorded it; a new
    lora.alpha jumped the loss. Either is refused before any work; what may change (more steps, how often it
    saves) is not."""
    cfg = replace(tiny(tmp_path), train=replace(tiny(tmp_path).train, max_steps=2, save_every=2))
    run_finetune(cfg)
    capsys.readouterr()
    resumed = replace(cfg, resume="auto")
    for changed, said in (
        (replace(resumed, train=replace(cfg.train, lr=0.1)), f"train.lr {cfg.train.lr} there, 0.1 now"),
        (replace(resumed, lora=replace(cfg.lora, alpha=64)), "lora.alpha 8 there, 64 now"),
        (replace(resumed, train=replace(cfg.train, seed=7)), "train.seed 42 there, 7 now"),
    ):
        with pytest.raises(CheckpointError, match="trained with other settings") as refused:
            check_resume_config(changed)
        assert said in str(refused.value), str(refused.value)
    check_resume_config(replace(resumed, train=replace(cfg.train, max_steps=4, save_every=1)))
    # Every changed key, not the first four (the next four came only on the next run).
    many = replace(resumed, train=replace(cfg.train, lr=0.1, seed=7, weight_decay=0.5, warmup_ratio=0.5))
    many = replace(many, lora=replace(cfg.lora, alpha=64))
    with pytest.raises(CheckpointError) as refused:
        check_resume_config(many)
    for key in ("lora.alpha", "train.lr", "train.seed", "train.warmup_ratio", "train.weight_decay"):
        assert f"{key} " in str(refused.value), key
    # The checkpoint records its settings itself: the run's config.yaml unreadable or gone changes nothing.
    saved = Path(cfg.output_dir or "") / "config.yaml"
    saved.write_text("{{{garbage")
    with pytest.raises(CheckpointError, match=r"lora.alpha 8 there, 64 now, from .*trainer_state.json"):
        check_resume_config(replace(resumed, lora=replace(cfg.lora, alpha=64)))
    saved.unlink()
    check_resume_config(resumed)
    # A checkpoint of an older gpucert records none: the run's config.yaml is what says; unreadable or gone,
    # nothing says the settings match, so a changed one would pass.
    for state_file in Path(cfg.output_dir or "").glob("checkpoints/step-*/trainer_state.json"):
        state = json.loads(state_file.read_text())
        del state["settings"]
        state_file.write_text(json.dumps(state))
    saved.write_text("{{{garbage")
    with pytest.raises(CheckpointError, match=r"config\.yaml is unreadable"):
        check_resume_config(replace(resumed, lora=replace(cfg.lora, alpha=64)))
    saved.unlink()
    with pytest.raises(CheckpointError, match=r"config\.yaml is missing: it holds the settings"):
        check_resume_config(resumed)


@pytest.mark.slow
def test_more_steps_on_resume_continue_the_schedule_at_the_restored_step(
    tmp_path: Path, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The optimizer's saved lr was the old schedule's last (0), and the first resumed step trained at it, then
    jumped: the resumed step now has the lr a run of the new length has at that step."""
    cfg = replace(tiny(tmp_path), train=replace(tiny(tmp_path).train, max_steps=4, save_every=2))
    run_finetune(cfg)
    longer = replace(cfg, resume="auto", train=replace(cfg.train, max_steps=8))
    resumed = run_finetune(longer)
    whole = run_finetune(replace(longer, resume="none", output_dir=str(tmp_path / "whole")))
    after = [round(r["lr"], 9) for r in resumed["step_log"] if r["step"] > 4]
    assert after and after == [round(r["lr"], 9) for r in whole["step_log"] if r["step"] > 4]


def test_a_finished_runs_report_stands_when_a_requeued_job_resumes_it(
    tmp_path: Path, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job that had finished, started again with --resume auto (a Slurm requeue), trains nothing: it once
    rewrote the report with its own process's numbers (no time to the first step, another peak RSS)."""
    cfg = replace(tiny(tmp_path), train=replace(tiny(tmp_path).train, max_steps=2, save_every=2))
    first = run_finetune(cfg)
    run = tmp_path / "run"
    before = {name: (run / name).read_bytes() for name in ("report.json", "metrics.json", "config.yaml")}
    capsys.readouterr()
    again = run_finetune(replace(cfg, resume="auto"))
    out = capsys.readouterr().out
    assert f"{first['status']}: the run had finished; its report stands: {run / 'report.json'}" in out
    assert {name: (run / name).read_bytes() for name in before} == before
    assert again["status"] == first["status"] and again["loss_history"] == first["loss_history"]


@pytest.mark.slow
def test_a_run_trained_further_says_its_evaluations_are_of_the_old_adapter(
    tmp_path: Path, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Resumed to more steps, a run rewrote its adapter while evaluation/ still scored the old one, and a
    report.html drawn before still showed the old curves, with nothing said."""
    cfg = replace(tiny(tmp_path), train=replace(tiny(tmp_path).train, max_steps=2, save_every=2))
    run_finetune(cfg)
    run = tmp_path / "run"
    (run / "evaluation").mkdir()
    (run / "evaluation" / "report.json").write_text("{}")
    (run / "report.html").write_text("<html>old curves</html>")
    capsys.readouterr()
    run_finetune(replace(cfg, resume="auto", train=replace(cfg.train, max_steps=4)))
    err = capsys.readouterr().err
    assert f"note: {run / 'evaluation'} scored the adapter before this run trained it on" in err, err[-2000:]
    assert not (run / "report.html").exists()


def test_a_run_directory_given_to_resume_is_named_as_such_before_any_worker(tmp_path: Path) -> None:
    """`--resume RUN` or `--resume RUN/checkpoints` failed in the rank, after the model loaded, with "no COMPLETE
    marker: its write did not finish", which was not why."""
    run = tmp_path / "run"
    write_checkpoint(run, 4)
    newest = write_checkpoint(run, 12)
    for given in (run, run / "checkpoints"):
        cfg = replace(tiny(tmp_path), resume=str(given), output_dir=str(tmp_path / "new"))
        (problem,) = cfg.path_problems()
        assert "not a checkpoint: give one of its checkpoints" in problem, problem
        assert f"({newest} is the newest)" in problem and f"--output {run} --resume auto" in problem
    assert replace(tiny(tmp_path), resume=str(newest)).path_problems() == []


def test_a_checkpoint_copied_out_of_its_run_is_held_to_the_settings_it_records(tmp_path: Path) -> None:
    """A backup of step-N outside <run>/checkpoints has no config.yaml two levels up: it resumed with a new lr,
    alpha, seed or warm-up without a word (the lr not even used: the restored optimizer kept the old schedule).
    Its trainer state records the settings now; one of an older gpucert, which records none, is refused."""
    copied = write_checkpoint(tmp_path / "run", 5)
    backup = tmp_path / "backup" / "step-5"
    backup.parent.mkdir()
    copied.rename(backup)
    cfg = replace(tiny(tmp_path), resume=str(backup), output_dir=str(tmp_path / "new"))
    with pytest.raises(CheckpointError, match="this checkpoint records no settings"):
        check_resume_config(cfg)
    state = json.loads((backup / STATE_FILE).read_text())
    (backup / STATE_FILE).write_text(json.dumps({**state, "settings": resume_settings(cfg)}))
    check_resume_config(cfg)
    with pytest.raises(CheckpointError, match=r"train.lr .* there, 0.05 now"):
        check_resume_config(replace(cfg, train=replace(cfg.train, lr=0.05)))
