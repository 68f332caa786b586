"""The tiny fine-tuning run on the node's GPUs in bf16: DDP over all of them (one process on a 1-GPU node), and
FSDP2 with activation checkpointing where there are two or more. Run on the lent GPU machine:

    python -m pytest tests/gpu/test_finetune.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.gpu

CONFIG = """\
model: {name: tiny, dtype: bf16, attn_implementation: sdpa}
lora: {r: 8, alpha: 16, dropout: 0.0}
data: {max_length: 512, eval_fraction: 0.1, cache_dir: CACHE}
train: {micro_batch: 2, grad_accum: 2, lr: 1.0e-2, warmup_ratio: 0.1, max_steps: 10, eval_every: 5, save_every: 5,
        keep_checkpoints: 1}
"""


def finetune(tmp_path: Path, name: str, nproc: int, *overrides: str) -> dict[str, Any]:
    config = tmp_path / "tiny-gpu.yaml"
    config.write_text(CONFIG.replace("CACHE", str(tmp_path / "cache")))
    run_dir = tmp_path / name
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    argv += ["-m", "gpucert.finetune.train", str(config), "--output-dir", str(run_dir)]
    for item in overrides:
        argv += ["--set", item]
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540, env=env, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((run_dir / "metrics.json").read_text())


def assert_learned_on_gpus(m: dict[str, Any], nproc: int) -> None:
    losses = m["loss_history"]
    assert len(losses) == 10
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    assert m["status"] == "PASS", m["criteria"]
    assert m["world_size"] == nproc
    assert "NVIDIA" in m["device"]
    assert m["peak_memory_gib"] > 0
    assert m["tokens_per_s"]["effective"] > 0
    if m["peak_tflops"]:
        assert 0 < m["mfu"] < 1
    assert m["outputs"]["adapter"] and m["outputs"]["checkpoint"]


def test_tiny_bf16_ddp_on_all_gpus(tmp_path: Path) -> None:
    nproc = torch.cuda.device_count()
    m = finetune(tmp_path, "ddp", nproc)
    assert m["parallel"] == ("ddp" if nproc > 1 else "none")
    assert_learned_on_gpus(m, nproc)


def test_tiny_bf16_fsdp2_with_checkpointing(tmp_path: Path) -> None:
    nproc = torch.cuda.device_count()
    if nproc < 2:
        pytest.skip("FSDP2 across GPUs needs two or more")
    m = finetune(tmp_path, "fsdp2", nproc, "train.parallel=fsdp2", "model.gradient_checkpointing=true")
    assert m["parallel"] == "fsdp2"
    assert m["hfu"] is None or m["hfu"] > m["mfu"]
    assert_learned_on_gpus(m, nproc)
