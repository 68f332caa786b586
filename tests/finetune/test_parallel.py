"""Two gloo processes train like one: DDP and FSDP2 on the same global batches give the loss curve of a single
process (fp32, 1e-4 relative), with gradient clipping active so FSDP2's sharded norm is checked too; non-reentrant
checkpointing under DDP changes nothing and raises no "marked ready twice"."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from gpucert.finetune.model.layers import decoder_layers
from gpucert.finetune.train.parallel import resolve_mode, wrap
from gpucert.finetune.train.run import main
from gpucert.runtime.group import start_runtime, stop_runtime

pytestmark = pytest.mark.slow

# 12 steps of 8 rows; max_grad_norm below the tiny model's usual gradient norm (~0.9), so every step clips.
CONFIG = """\
model: {name: tiny, dtype: fp32, attn_implementation: sdpa}
lora: {r: 8, alpha: 16, dropout: 0.0}
data: {max_length: 256, eval_fraction: 0.1, cache_dir: CACHE}
train: {micro_batch: 2, grad_accum: 2, lr: 1.0e-2, warmup_ratio: 0.1, max_steps: 12, max_grad_norm: 0.5,
        eval_every: 6, save_every: 6, keep_checkpoints: 1}
"""
LAUNCH_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parallel")
    path = root / "tiny.yaml"
    path.write_text(CONFIG.replace("CACHE", str(root / "cache")))
    return path


def metrics(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.fixture(scope="module")
def one_process(config: Path) -> dict[str, Any]:
    """The reference: one process, grad_accum 4, so a step sees the same 8 rows as 2 processes x grad_accum 2.
    It also prepares the data cache the 2-process runs then read."""
    run_dir = config.parent / "one"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
            mp.setenv(name, value)
        mp.delenv("MASTER_PORT", raising=False)
        assert main([str(config), "--output-dir", str(run_dir), "--set", "train.grad_accum=4"]) == 0
    return metrics(run_dir)


def launcher_free_env() -> dict[str, str]:
    """This process's environment without a launcher's rank variables (pytest may run under one), one thread
    per process."""
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return {**{k: v for k, v in os.environ.items() if k not in launcher}, "OMP_NUM_THREADS": "1"}


def torchrun(config: Path, run_dir: Path, *overrides: str) -> dict[str, Any]:
    """2 gloo processes under torchrun's --standalone rendezvous (a free port the OS picks)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    argv += ["-m", "gpucert.finetune.train", str(config), "--output-dir", str(run_dir)]
    for item in overrides:
        argv += ["--set", item]
    env = launcher_free_env()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "marked ready twice" not in done.stderr
    return metrics(run_dir)


def assert_same_training(found: dict[str, Any], expected: dict[str, Any], rel: float) -> None:
    assert found["world_size"] == 2 and expected["world_size"] == 1
    assert len(found["loss_history"]) == len(expected["loss_history"]) == 12
    assert found["loss_history"] == pytest.approx(expected["loss_history"], rel=rel)
    grad_norms = [[s["grad_norm"] for s in m["step_log"]] for m in (found, expected)]
    assert grad_norms[0] == pytest.approx(grad_norms[1], rel=10 * rel)
    assert min(grad_norms[1]) > 0.5, "clipping should be active on every step"
    assert [e["loss"] for e in found["eval_losses"]] == pytest.approx(
        [e["loss"] for e in expected["eval_losses"]], rel=rel
    )
    # Same global batches: the same tokens, counted over both ranks.
    assert [s["tokens"] for s in found["step_log"]] != []
    assert [s["tokens"]["effective"] for s in found["step_log"]] == [
        s["tokens"]["effective"] for s in expected["step_log"]
    ]
    assert [s["tokens"]["supervised"] for s in found["step_log"]] == [
        s["tokens"]["supervised"] for s in expected["step_log"]
    ]


def assert_same_adapter(found_run: Path, expected_run: Path) -> None:
    """Every adapter tensor, all shards of it: a FULL_STATE_DICT save that kept only rank 0's shard would leave
    half of each lora_B at zero (fine-tuning.md §11.4)."""
    found = load_file(str(found_run / "adapter" / "adapter_model.safetensors"))
    expected = load_file(str(expected_run / "adapter" / "adapter_model.safetensors"))
    assert set(found) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(found[name], tensor, rtol=1e-3, atol=1e-5, msg=name)


def test_ddp_matches_one_process(config: Path, one_process: dict[str, Any]) -> None:
    found = torchrun(config, config.parent / "ddp", "train.parallel=ddp")
    assert found["parallel"] == "ddp"
    assert_same_training(found, one_process, rel=1e-4)
    assert_same_adapter(config.parent / "ddp", config.parent / "one")


def test_fsdp2_matches_one_process(config: Path, one_process: dict[str, Any]) -> None:
    found = torchrun(config, config.parent / "fsdp2", "train.parallel=fsdp2")
    assert found["parallel"] == "fsdp2"
    assert_same_training(found, one_process, rel=1e-4)
    assert_same_adapter(config.parent / "fsdp2", config.parent / "one")


def test_ddp_with_gradient_checkpointing_matches_one_process(config: Path, one_process: dict[str, Any]) -> None:
    found = torchrun(config, config.parent / "ddp-ckpt", "train.parallel=ddp", "model.gradient_checkpointing=true")
    assert found["config"]["model"]["gradient_checkpointing"] is True
    assert_same_training(found, one_process, rel=1e-5)


def test_modes() -> None:
    assert resolve_mode("auto", 1) == "none"
    assert resolve_mode("auto", 8) == "ddp"
    assert resolve_mode("fsdp2", 1) == "fsdp2"
    with pytest.raises(ValueError, match="expected one of"):
        resolve_mode("zero3", 2)


def test_none_mode_leaves_the_model_alone() -> None:
    model = nn.Linear(2, 2)
    rt = start_runtime(environ={})
    try:
        assert wrap(model, rt, "none") is model
    finally:
        stop_runtime(rt)
    with pytest.raises(ValueError, match="no decoder layers"):
        decoder_layers(model)


def test_two_nodes_train_like_one_process(config: Path, one_process: dict[str, Any]) -> None:
    """The multi-node launch path: two torchrun agents, one per "node" (--nnodes 2 --node-rank 0/1, the static
    rendezvous a Slurm batch script uses), one process each, sharing the run and cache directories as nodes
    share a filesystem."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = config.parent / "two-nodes"
    env = launcher_free_env()
    agents = []
    for node in (0, 1):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}"]
        argv += ["--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}"]
        argv += [
            "-m",
            "gpucert.finetune.train",
            str(config),
            "--output-dir",
            str(run_dir),
            "--set",
            "train.parallel=ddp",
        ]
        agents.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [agent.communicate(timeout=LAUNCH_TIMEOUT_S) for agent in agents]
    for agent, (_, err) in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, err[-3000:]
    found = metrics(run_dir)
    assert found["parallel"] == "ddp"
    assert_same_training(found, one_process, rel=1e-4)
    assert_same_adapter(run_dir, config.parent / "one")


def test_ddp_with_the_adapters_in_the_gemm_matches_one_process(config: Path) -> None:
    """bf16 weights with the adapters in the frozen GEMMs (model.adapters_in_gemm: the frozen weights are views of
    the extended matrices, which DDP broadcasts at wrap; B refreshed into them at every forward): 2 processes
    follow 1 within bf16 noise, and the adapters do ride in the GEMMs."""
    bf16 = ["model.dtype=bf16"]
    run_one = config.parent / "one-bf16"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
            mp.setenv(name, value)
        mp.delenv("MASTER_PORT", raising=False)
        argv = [str(config), "--output-dir", str(run_one), "--set", "train.grad_accum=4", "--set", bf16[0]]
        assert main(argv) == 0
    one = metrics(run_one)
    found = torchrun(config, config.parent / "ddp-bf16", "train.parallel=ddp", *bf16)
    for m in (one, found):
        assert "with the adapters in the frozen GEMM" in m["model"]["fused_projections"], m["model"]
    assert found["loss_history"] == pytest.approx(one["loss_history"], rel=2e-2)
    assert found["loss_history"][-1] < found["loss_history"][0] - 0.3
