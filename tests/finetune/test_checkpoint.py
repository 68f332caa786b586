"""Checkpoints: incomplete ones are never picked, retention keeps the newest, a round trip restores every
state, and a run killed with SIGKILL then resumed with `resume: auto` repeats the uninterrupted loss curve
bit for bit (fp32 CPU; LoRA dropout on, so the restored RNG matters)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gpucert.finetune.checkpoint import (
    COMPLETE,
    TrainerState,
    complete_checkpoints,
    find_latest,
    load_checkpoint,
    prune,
    save_checkpoint,
)
from gpucert.finetune.config import DataConfig, FinetuneConfig, LoraConfig, ModelConfig, TrainConfig
from gpucert.finetune.model import forward_loss, load_model
from gpucert.finetune.packing import collate
from gpucert.finetune.tokenizer import load_tokenizer
from gpucert.finetune.train import FinetuneFailed, run_finetune
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
from gpucert.finetune import train

real_save = train.save_checkpoint

def save_then_stall(run_dir, model, optimizer, scheduler, state, rt, keep):
    path = real_save(run_dir, model, optimizer, scheduler, state, rt, keep)
    if state.step == 6:
        time.sleep(600)
    return path

train.save_checkpoint = save_then_stall
sys.exit(train.main(sys.argv[1:]))
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
    with pytest.raises(FinetuneFailed, match="expected a global batch of 4 rows, found 2"):
        run_finetune(replace(cfg, resume="auto", train=replace(cfg.train, grad_accum=2, max_steps=4)))
