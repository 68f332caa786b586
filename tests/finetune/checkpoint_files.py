"""Small checkpoints in the real on-disk format (safetensors, torch.save zips, trainer_state.json), without a
model or a training run, and the ways the issue saw them break."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from gpucert.finetune.train.checkpoint import ADAPTER_FILE, COMPLETE, STATE_FILE


def write_checkpoint(run: Path, step: int, complete: bool = True, name: str | None = None) -> Path:
    """checkpoints/step-<step> with every file of a real one (random tensors of a plausible shape)."""
    path = run / "checkpoints" / (name or f"step-{step}")
    path.mkdir(parents=True)
    g = torch.Generator().manual_seed(step)
    save_file({"base_model.model.layer.lora_A.weight": torch.randn(8, 64, generator=g)}, str(path / ADAPTER_FILE))
    state = {"state": {0: {"exp_avg": torch.randn(8, 64, generator=g), "step": torch.tensor(float(step))}}}
    torch.save({**state, "param_groups": [{"lr": 1e-3, "params": [0]}]}, path / "optimizer.pt")
    torch.save({"last_epoch": step, "base_lrs": [1e-3]}, path / "scheduler.pt")
    torch.save([{"torch": torch.get_rng_state(), "python": (3, tuple(range(5)), None)}], path / "rng.pt")
    (path / STATE_FILE).write_text(json.dumps({"step": step, "global_batch": 4, "loss_history": [1.0] * step}))
    if complete:
        (path / COMPLETE).write_text(f"{step}\n")
    return path


def truncate(file: Path, keep: float = 0.5) -> None:
    """Cut a file to a share of its size, as a full disk or an interrupted copy leaves it."""
    with open(file, "r+b") as f:
        f.truncate(int(os.path.getsize(file) * keep))


# How the issue saw a latest checkpoint break: (file, damage).
DAMAGES = {
    "truncated adapter": (ADAPTER_FILE, lambda f: truncate(f)),
    "truncated optimizer state": ("optimizer.pt", lambda f: truncate(f)),
    "truncated rng state": ("rng.pt", lambda f: truncate(f, 0.9)),
    "garbage trainer state": (STATE_FILE, lambda f: f.write_bytes(os.urandom(64))),
    "trainer state of another program": (STATE_FILE, lambda f: f.write_text('{"global_step": 8}')),
    "missing scheduler": ("scheduler.pt", lambda f: f.unlink()),
}
