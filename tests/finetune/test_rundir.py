"""The run directory: a second run into a directory another live process holds is refused (exit 3, naming the
directory and the holder pid@host) before it writes anything; the lock dies with its process (SIGKILL); only
rank 0 takes it; and a run that fails before its first step leaves no run directory behind. The lock holders
are real processes holding real fcntl locks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpucert.finetune.config import DataConfig, FinetuneConfig, LoraConfig, ModelConfig, TrainConfig
from gpucert.finetune.train import loop as train
from gpucert.finetune.train.run import FinetuneFailed, main, run_finetune
from gpucert.finetune.train.rundir import claim_run_dir, open_run_dir
from gpucert.runtime.dirlock import LOCK_FILE, DirBusy
from gpucert.runtime.launch_env import RANK_VARIABLES

# Holds the run directory argv[1] as rank 0 of a run would, until killed.
HOLD = """\
import sys, time
from pathlib import Path
from gpucert.finetune.train.rundir import claim_run_dir
run = claim_run_dir(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone rank (pytest may run under a launcher): RANK=0 of WORLD_SIZE=1, no rendezvous."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_PORT", raising=False)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Any]:
    """start(path): another process that holds `path` as a run directory; killed at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(path: Path) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
        child = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started.append(child)
        assert child.stdout is not None and child.stdout.readline().strip() == "locked", child.stderr
        return child

    yield start
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()
        for stream in (child.stdout, child.stderr):
            if stream:
                stream.close()


def tiny(tmp_path: Path, **changes: Any) -> FinetuneConfig:
    cfg = FinetuneConfig(
        model=ModelConfig(name="tiny", dtype="fp32"),
        lora=LoraConfig(r=4, alpha=8, dropout=0.0),
        data=DataConfig(max_length=256, eval_fraction=0.1, cache_dir=str(tmp_path / "cache")),
        train=TrainConfig(micro_batch=2, grad_accum=1, max_steps=2, save_every=2, eval_every=100),
        output_dir=str(tmp_path / "run"),
    )
    return replace(cfg, **changes)


# --- The lock ---------------------------------------------------------------------------------------------


def test_a_held_run_directory_is_refused_naming_it_and_its_holder_until_the_holder_dies(
    tmp_path: Path, holder: Any
) -> None:
    run = tmp_path / "run"
    child = holder(run)
    with pytest.raises(DirBusy) as refused:
        claim_run_dir(run)
    message = str(refused.value)
    host = socket.gethostname()
    assert f"output_dir {run} is in use by another gpucert run (pid {child.pid} on host {host}" in message
    assert "choose another output_dir" in message

    # The kernel releases an fcntl lock with its process: the lock file left behind blocks nothing.
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert (run / LOCK_FILE).exists()
    mine = claim_run_dir(run)
    try:
        assert f"pid {os.getpid()} on host" in (run / LOCK_FILE).read_text()
    finally:
        mine.close(failed=False)


def test_a_second_training_run_into_a_busy_directory_exits_3_and_writes_nothing(
    tmp_path: Path, holder: Any, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("the first run's\n")
    child = holder(run)
    config = tmp_path / "tiny.yaml"
    config.write_text(f"model: {{name: tiny}}\ndata: {{cache_dir: {tmp_path / 'cache'}}}\n")

    assert main([str(config), "--output-dir", str(run)]) == 3
    err = capsys.readouterr().err
    assert f"output_dir {run} is in use by another gpucert run (pid {child.pid} on host" in err
    assert "Traceback" not in err
    # Met in the rank's start-up (the first run took it a moment before): said as bad input, not a rank failure.
    assert f"gpucert: error: output_dir {run} is in use" in err and "raised at" not in err, err
    assert (run / "config.yaml").read_text() == "the first run's\n"
    assert sorted(p.name for p in run.iterdir()) == sorted(["config.yaml", LOCK_FILE])
    assert not (tmp_path / "cache").exists()  # refused before data preparation


def test_ranks_other_than_0_take_no_lock_and_create_nothing(tmp_path: Path, holder: Any) -> None:
    """On a filesystem all nodes share, every node's ranks would otherwise meet rank 0's lock."""
    run = tmp_path / "run"
    holder(run)  # stands for this job's rank 0
    rank_1 = SimpleNamespace(is_main=False, world_size=1)
    opened = open_run_dir(tiny(tmp_path, output_dir=str(run)), rank_1)  # type: ignore[arg-type]
    assert opened.path == run and opened.lock_fd is None
    assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]
    elsewhere = open_run_dir(tiny(tmp_path, output_dir=str(tmp_path / "new")), rank_1)  # type: ignore[arg-type]
    elsewhere.close(failed=True)
    assert not (tmp_path / "new").exists()


# A rank of a 2-rank gloo job that opens the run directory argv[1] and reports whether it holds the lock.
OPEN_AS_A_RANK = """\
import json, sys
from dataclasses import replace
from gpucert.finetune.config import FinetuneConfig
from gpucert.finetune.train.rundir import open_run_dir
from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.group import start_runtime, stop_runtime

rt = start_runtime(RuntimeConfig(rendezvous_timeout_s=30, heartbeat_interval_s=1, heartbeat_timeout_s=6))
run = open_run_dir(FinetuneConfig(output_dir=sys.argv[1]), rt)
print(json.dumps({"rank": rt.rank, "locked": run.lock_fd is not None}))
stop_runtime(rt)
run.close(failed=False)
"""


@pytest.mark.slow
def test_both_ranks_of_a_job_open_one_run_directory_and_only_rank_0_locks_it(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    ranks = []
    for rank in (0, 1):
        env = {**base, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        env |= {"GROUP_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        argv = [sys.executable, "-c", OPEN_AS_A_RANK, str(tmp_path / "run")]
        ranks.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [r.communicate(timeout=60) for r in ranks]
    for r, (_, err) in zip(ranks, outputs, strict=True):
        assert r.returncode == 0, err[-3000:]
    assert [out.strip() for out, _ in outputs] == ['{"rank": 0, "locked": true}', '{"rank": 1, "locked": false}']


# --- No half-made run directory ---------------------------------------------------------------------------


def test_a_run_that_fails_before_its_first_step_leaves_no_run_directory(tmp_path: Path, single_process: None) -> None:
    missing = tmp_path / "not-there.jsonl"
    cfg = tiny(tmp_path, data=DataConfig(source=str(missing), cache_dir=str(tmp_path / "cache")))
    with pytest.raises(FinetuneFailed, match="no such file"):
        run_finetune(cfg)
    assert not (tmp_path / "run").exists()

    made_for_it = tmp_path / "empty"
    made_for_it.mkdir()
    with pytest.raises(FinetuneFailed):
        run_finetune(replace(cfg, output_dir=str(made_for_it)))
    assert made_for_it.is_dir() and not any(made_for_it.iterdir())  # it was there, empty: it stays, empty


def test_a_failed_run_keeps_a_directory_that_held_something_and_one_that_trained(
    tmp_path: Path, single_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine\n")
    cfg = tiny(tmp_path, output_dir=str(used), data=DataConfig(source=str(tmp_path / "nope.jsonl")))
    with pytest.raises(FinetuneFailed):
        run_finetune(cfg)
    assert (used / "notes.txt").read_text() == "mine\n"
    # Only what was there: no config.yaml or TensorBoard file of the failed run.
    assert sorted(p.name for p in used.iterdir() if p.name != LOCK_FILE) == ["notes.txt"]

    # A failure after the first step: the run directory holds a checkpoint and the curves, and stays.
    def broken_save(*args: object) -> None:
        raise RuntimeError("the adapter could not be written")

    monkeypatch.setattr(train, "save_adapter", broken_save)
    with pytest.raises(FinetuneFailed, match="could not be written"):
        run_finetune(tiny(tmp_path, output_dir=str(tmp_path / "trained")))
    assert (tmp_path / "trained" / "config.yaml").is_file()
    assert (tmp_path / "trained" / "checkpoints" / "step-2").is_dir()


@pytest.mark.slow
def test_a_resume_that_fails_before_its_first_step_leaves_the_run_as_it_was(
    tmp_path: Path, single_process: None
) -> None:
    """A resume onto bad data once rewrote the finished run's config.yaml (its data and steps, not the result's)
    and added a TensorBoard file; it now changes nothing, and a resume that trains writes its own config."""
    cfg = tiny(tmp_path, train=replace(tiny(tmp_path).train, max_steps=2, save_every=1))
    run_finetune(cfg)
    run = tmp_path / "run"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != LOCK_FILE}

    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n" * 3)
    more = replace(cfg, resume="auto", train=replace(cfg.train, max_steps=4))
    with pytest.raises(FinetuneFailed, match=r"bad\.jsonl"):
        run_finetune(replace(more, data=replace(cfg.data, source=str(bad))))
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != LOCK_FILE}
    assert after == before

    run_finetune(more)
    assert "max_steps: 4" in (run / "config.yaml").read_text()
