"""Checkpoints: incomplete ones are never picked, retention keeps the newest, a round trip restores every
state, and a run killed with SIGKILL then resumed with `resume: auto` repeats the uninterrupted loss curve
bit for bit (fp32 CPU; LoRA dropout on, so the restored RNG matters). A disk that fills mid-checkpoint gives
"no space left on <dir>" and leaves no half-written checkpoint: on a real 1-checkpoint-and-a-half tmpfs where
this machine lets an unprivileged user namespace mount one, and through a write that fails with ENOSPC."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gpucert.finetune.config import DataConfig, FinetuneConfig, LoraConfig, ModelConfig, TrainConfig
from gpucert.finetune.data.packing import collate
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.disk import NoSpaceError, is_no_space
from gpucert.finetune.model.lora import forward_loss, load_model
from gpucert.finetune.train import checkpoint
from gpucert.finetune.train.checkpoint import (
    COMPLETE,
    TrainerState,
    complete_checkpoints,
    find_latest,
    load_checkpoint,
    prune,
    save_adapter,
    save_checkpoint,
    verify_checkpoint,
)
from gpucert.finetune.train.run import FinetuneFailed, run_finetune
from gpucert.runtime.group import start_runtime, stop_runtime

CONFIG = """\
model: {name: tiny, dtype: fp32, attn_implementation: sdpa}
lora: {r: 8, alpha: 16, dropout: 0.1}
data: {max_length: 256, eval_fraction: 0.1, cache_dir: CACHE}
train: {micro_batch: 2, grad_accum: 2, lr: 1.0e-2, warmup_ratio: 0.1, max_steps: 12, eval_every: 4, save_every: 3,
        keep_checkpoints: 2}
"""
# Runs the training entry point, but stops dead (sleeps) once the step-6 checkpoint is written, so the parent's
# SIGKILL always lands after that checkpoint and before the run ends.
KILLED_RUN = """\
import sys, time
from gpucert.finetune.train import loop, run

real_save = loop.save_checkpoint

def save_then_stall(run_dir, model, optimizer, scheduler, state, rt, keep):
    path = real_save(run_dir, model, optimizer, scheduler, state, rt, keep)
    if state.step == 6:
        time.sleep(600)
    return path

loop.save_checkpoint = save_then_stall
sys.exit(run.main(sys.argv[1:]))
"""


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch):
    """A lone rank (pytest may run under a launcher): RANK=0 of WORLD_SIZE=1, no rendezvous."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_PORT", raising=False)


def fake_checkpoint(run: Path, step: int, complete: bool = True, name: str | None = None) -> Path:
    path = run / "checkpoints" / (name or f"step-{step}")
    path.mkdir(parents=True)
    if complete:
        (path / COMPLETE).write_text(f"{step}\n")
    return path


def test_find_latest_ignores_incomplete_checkpoints(tmp_path: Path) -> None:
    assert find_latest(tmp_path) is None
    fake_checkpoint(tmp_path, 4)
    fake_checkpoint(tmp_path, 12)
    fake_checkpoint(tmp_path, 16, complete=False)  # renamed, killed before the marker
    fake_checkpoint(tmp_path, 20, complete=False, name=".tmp-step-20")  # killed while writing
    fake_checkpoint(tmp_path, 99, name="step-99-old")  # not ours
    assert find_latest(tmp_path) == tmp_path / "checkpoints" / "step-12"
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [4, 12]


def test_prune_keeps_the_newest_and_drops_debris(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 5, complete=False, name=".tmp-step-5")
    fake_checkpoint(tmp_path, 7, complete=False)
    fake_checkpoint(
        tmp_path, 10, complete=False, name=".tmp-step-10"
    )  # newer than the newest complete: may be in progress
    prune(tmp_path, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [".tmp-step-10", "step-6", "step-8"]


def test_round_trip_restores_model_optimizer_scheduler_rng(tmp_path: Path, single_process: None) -> None:
    rt = start_runtime()
    try:
        cfg = ModelConfig(name="tiny", dtype="fp32")
        lora = LoraConfig(r=4, alpha=8, dropout=0.0)
        tokenizer = load_tokenizer(cfg, DataConfig())
        batch = collate(
            [{"input_ids": list(range(3, 30)), "labels": list(range(3, 30)), "position_ids": list(range(27))}], 0
        )

        def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
            model, _ = load_model(cfg, lora, tokenizer, rt.device)
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
            return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))

        torch.manual_seed(0)
        model, opt, sched = fresh()
        for _ in range(3):
            loss, n = forward_loss(model, batch, "sdpa")
            (loss / n).backward()
            opt.step()
            sched.step()
            opt.zero_grad()
        state = TrainerState(step=3, epoch=1, index=8, global_batch=4, loss_history=[3.0, 2.0, 1.0])
        path = save_checkpoint(tmp_path, model, opt, sched, state, rt, keep=2)
        assert path == tmp_path / "checkpoints" / "step-3" and (path / COMPLETE).is_file()
        expected_rand = torch.rand(3)

        torch.manual_seed(123)
        model2, opt2, sched2 = fresh()
        restored = load_checkpoint(path, model2, opt2, sched2, rt)
    finally:
        stop_runtime(rt)
    assert restored == state
    assert torch.equal(torch.rand(3), expected_rand)
    trainable = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert all(torch.equal(model2.state_dict()[k], v) for k, v in trainable.items())
    for a, b in zip(opt.state.values(), opt2.state.values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    assert sched2.state_dict() == sched.state_dict()
    assert set(load_file(str(path / "adapter_model.safetensors"))) == set(trainable)


@pytest.mark.slow
def test_killed_run_resumes_exactly(tmp_path: Path, single_process: None) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.replace("CACHE", str(tmp_path / "cache")))
    from gpucert.config.loader import load_config

    cfg = load_config(FinetuneConfig, config)
    straight = run_finetune(replace(cfg, output_dir=str(tmp_path / "straight")))

    run = tmp_path / "killed"
    (tmp_path / "killed_run.py").write_text(KILLED_RUN)
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    argv = [sys.executable, str(tmp_path / "killed_run.py"), str(config), "--output-dir", str(run)]
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (run / "checkpoints" / "step-6" / COMPLETE).exists():
            assert child.poll() is None, child.stderr.read().decode()[-3000:] if child.stderr else ""
            assert time.monotonic() < deadline, "no step-6 checkpoint within 120 s"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        if child.stderr:
            child.stderr.close()
    assert not (run / "metrics.json").exists()
    assert find_latest(run) == run / "checkpoints" / "step-6"

    resumed = run_finetune(replace(cfg, output_dir=str(run), resume="auto"))
    assert resumed["resumed_from"] == str(run / "checkpoints" / "step-6")
    assert len(resumed["loss_history"]) == 12
    assert resumed["loss_history"] == straight["loss_history"]  # bitwise: exact float equality
    assert resumed["eval_losses"] == straight["eval_losses"]
    assert [s["grad_norm"] for s in resumed["step_log"]] == [s["grad_norm"] for s in straight["step_log"]]
    final = [load_file(str(tmp_path / r / "adapter" / "adapter_model.safetensors")) for r in ("straight", "killed")]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    assert [s for s, _ in complete_checkpoints(run)] == [9, 12]


def test_resume_refuses_another_global_batch(tmp_path: Path, single_process: None) -> None:
    cfg = FinetuneConfig(
        model=ModelConfig(name="tiny", dtype="fp32"),
        lora=LoraConfig(r=4, alpha=8, dropout=0.0),
        data=DataConfig(max_length=256, eval_fraction=0.1, cache_dir=str(tmp_path / "cache")),
        train=TrainConfig(micro_batch=2, grad_accum=1, max_steps=2, save_every=2, eval_every=100),
        output_dir=str(tmp_path / "run"),
    )
    run_finetune(cfg)
    with pytest.raises(FinetuneFailed, match=r"was trained with a global batch of 2 rows; this run.s is 4"):
        run_finetune(replace(cfg, resume="auto", train=replace(cfg.train, grad_accum=2, max_steps=4)))


# --- A disk that fills up -----------------------------------------------------------------------------------


class FillingDisk:
    """os.write on a disk with `free` bytes left: a short write takes what fits, the next one fails with ENOSPC,
    as the kernel does. A fake of the one call save_checkpoint writes through."""

    def __init__(self, free: int) -> None:
        self.free = free

    def __call__(self, fd: int, data: memoryview) -> int:
        if self.free == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, data[: self.free])
        self.free -= n
        return n


def tiny_training_state(rt):
    cfg = ModelConfig(name="tiny", dtype="fp32")
    model, _ = load_model(cfg, LoraConfig(r=4, alpha=8, dropout=0.0), load_tokenizer(cfg, DataConfig()), rt.device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = collate(
        [{"input_ids": list(range(3, 30)), "labels": list(range(3, 30)), "position_ids": list(range(27))}], 0
    )
    loss, n = forward_loss(model, batch, "sdpa")
    (loss / n).backward()
    opt.step()
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def checkpoint_bytes(path: Path, marker: bool) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if marker or f.name != COMPLETE)


@pytest.mark.parametrize("where", ["first file", "optimizer state", "completion marker"])
def test_a_full_disk_mid_checkpoint_is_named_and_leaves_no_half_checkpoint(
    tmp_path: Path, single_process: None, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    rt = start_runtime()
    try:
        model, opt, sched = tiny_training_state(rt)
        previous = save_checkpoint(tmp_path, model, opt, sched, TrainerState(step=2), rt, keep=3)
        assert previous is not None
        files = checkpoint_bytes(previous, marker=False)
        adapter = (previous / "adapter_model.safetensors").stat().st_size
        free = {"first file": 0, "optimizer state": adapter + 100, "completion marker": files + 1}[where]
        monkeypatch.setattr(checkpoint, "write_chunk", FillingDisk(free))
        with pytest.raises(NoSpaceError) as full:
            save_checkpoint(tmp_path, model, opt, sched, TrainerState(step=4), rt, keep=3)
    finally:
        stop_runtime(rt)
    message = str(full.value)
    root = tmp_path / "checkpoints"
    assert (
        message.startswith(f"no space left on {root} (")
        and "free there now) while writing checkpoint step 4" in message
    )
    assert "the newest complete one is step-2" in message and "--resume auto" in message
    assert "inline_container" not in message and "enforce fail" not in message
    # Neither .tmp-step-4 nor a renamed step-4 without its marker: only the previous checkpoint, still whole.
    assert sorted(p.name for p in root.iterdir()) == ["step-2"]
    assert verify_checkpoint(previous) is None


def test_a_ctrl_c_after_the_marker_keeps_the_whole_checkpoint(
    tmp_path: Path, single_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first checkpoint, its COMPLETE marker written, then Ctrl-C during the directory syncs after it: the
    clean-up of a half-written checkpoint took this whole one, the run's only (a run stopped at that moment exited
    130 with nothing for --resume auto)."""
    rt = start_runtime()
    real_fsync = checkpoint._fsync

    def interrupted_after_the_marker(path: Path) -> None:
        if (Path(path) / COMPLETE).exists():
            raise KeyboardInterrupt
        real_fsync(path)

    try:
        model, opt, sched = tiny_training_state(rt)
        monkeypatch.setattr(checkpoint, "_fsync", interrupted_after_the_marker)
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(tmp_path, model, opt, sched, TrainerState(step=2), rt, keep=3)
    finally:
        stop_runtime(rt)
    (kept,) = complete_checkpoints(tmp_path)
    assert kept[0] == 2 and verify_checkpoint(kept[1]) is None


def test_a_full_disk_while_saving_the_adapter_keeps_the_previous_one(
    tmp_path: Path, single_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = start_runtime()
    try:
        model, _, _ = tiny_training_state(rt)
        tokenizer = load_tokenizer(ModelConfig(name="tiny"), DataConfig())
        out = tmp_path / "adapter"
        save_adapter(model, tokenizer, out, rt)
        before = {f.name: f.read_bytes() for f in out.iterdir()}

        def full(*args: object, **kwargs: object) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(tokenizer, "save_pretrained", full)
        with pytest.raises(NoSpaceError, match=rf"^no space left on {tmp_path} \(.* the final adapter {out}"):
            save_adapter(model, tokenizer, out, rt)
    finally:
        stop_runtime(rt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # no .tmp-adapter left
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


def test_no_space_is_recognised_in_every_form_the_writers_give() -> None:
    assert is_no_space(OSError(errno.ENOSPC, "No space left on device"))
    assert is_no_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    # safetensors' Rust writer, and an error raised while handling one.
    rust = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert is_no_space(rust)
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534") from None
    except RuntimeError as wrapped:
        assert is_no_space(wrapped)
    assert not is_no_space(OSError(errno.EIO, "Input/output error"))
    assert not is_no_space(RuntimeError("out of memory"))


# Runs inside `unshare -rm` (its own mount namespace, as root of a user namespace): measures one checkpoint of
# the tiny run, mounts a tmpfs of two and a half checkpoints on <run>/checkpoints, and trains 4 steps saving
# every step while keeping 2: the third checkpoint cannot fit.
ON_A_SMALL_DISK = """\
import json, math, os, subprocess, sys
from dataclasses import replace
from pathlib import Path
from gpucert.config.loader import load_config
from gpucert.finetune.config import FinetuneConfig
from gpucert.finetune.train.run import FinetuneFailed, run_finetune

config, tmp = Path(sys.argv[1]), Path(sys.argv[2])
cfg = load_config(FinetuneConfig, config)
cfg = replace(cfg, train=replace(cfg.train, save_every=1, keep_checkpoints=2, eval_every=100))
run_finetune(replace(cfg, output_dir=str(tmp / "measure"), train=replace(cfg.train, max_steps=1)))
pages = sum(math.ceil(f.stat().st_size / 4096) for f in (tmp / "measure/checkpoints/step-1").iterdir())
run = tmp / "run"
(run / "checkpoints").mkdir(parents=True)
size = int(2.5 * pages) * 4096
subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(run / "checkpoints")], check=True)
try:
    run_finetune(replace(cfg, output_dir=str(run), train=replace(cfg.train, max_steps=4)))
    result = {"failed": None}
except FinetuneFailed as exc:
    result = {"failed": exc.record.cause, "phase": exc.record.phase}
result["left"] = sorted(p.name for p in (run / "checkpoints").iterdir())
print(json.dumps(result))
"""


def can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d"
    return subprocess.run(["unshare", "-rm", "sh", "-c", probe], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not can_mount_tmpfs(), reason="no unprivileged user+mount namespace to mount a small tmpfs in")
def test_a_real_full_disk_mid_checkpoint(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.replace("CACHE", str(tmp_path / "cache")))
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    argv = ["unshare", "-rm", sys.executable, "-c", ON_A_SMALL_DISK, str(config), str(tmp_path)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    run = tmp_path / "run"
    assert result["phase"] == "checkpoint step 3"
    assert result["failed"].startswith(f"NoSpaceError: no space left on {run / 'checkpoints'}"), result
    assert "the newest complete one is step-2" in result["failed"]
    assert result["left"] == ["step-1", "step-2"]  # no .tmp-step-3
    assert "inline_container" not in done.stderr
