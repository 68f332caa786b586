"""The tiny fine-tuning run on the node's GPUs in bf16: DDP over all of them (one process on a 1-GPU node), and
FSDP2 with activation checkpointing where there are two or more. Run on the lent GPU machine:

    python -m pytest tests/gpu/test_finetune.py -q
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import kill_process_tree
from tests.finetune.packed_rows import packed_batch

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


def packed_loss_and_grads(cfg: Any) -> tuple[float, list[torch.Tensor]]:
    """One forward/backward of the tiny model on the GPU over rows of several packed documents and padding."""
    from gpucert.finetune.config import DataConfig, LoraConfig
    from gpucert.finetune.data.tokenizer import load_tokenizer
    from gpucert.finetune.model.lora import forward_loss, load_model

    tokenizer = load_tokenizer(cfg, DataConfig())
    documents = [[70, 130, 50], [200], [30, 30]]
    batch = packed_batch(len(tokenizer), documents, seed=1, pad_id=tokenizer.pad_token_id, pad_to=256)
    batch = {k: v.cuda() for k, v in batch.items()}
    torch.manual_seed(0)
    model, _ = load_model(cfg, LoraConfig(r=8, alpha=16, dropout=0.0), tokenizer, torch.device("cuda"), 256)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    loss, n = forward_loss(model, batch, cfg.attn_implementation)
    (loss / n).backward()
    return float(loss.detach()), [p.grad.float().clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize(
    "change",
    [{"attn_implementation": "flex_attention"}, {"compile": True}, {"fused_loss": False}, {"fuse_projections": False}],
    ids=str,
)
def test_speed_options_keep_the_packed_loss(change: dict[str, Any]) -> None:
    from gpucert.finetune.config import ModelConfig

    reference_cfg = ModelConfig(name="tiny", dtype="fp32", attn_implementation="sdpa")
    reference = packed_loss_and_grads(reference_cfg)
    found = packed_loss_and_grads(replace(reference_cfg, **change))
    assert found[0] == pytest.approx(reference[0], rel=1e-4)
    for a, b in zip(found[1], reference[1], strict=True):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=1e-5)


def test_a_killed_rank_ends_both_nodes_over_nccl(tmp_path: Path) -> None:
    """Two torchrun agents as two "nodes" of one GPU each: rank 1's worker SIGKILLed mid-training leaves rank 0
    inside an NCCL collective that would wait runtime.collective_timeout_s; its watchdog names rank 1 from the
    missing heartbeats and both agents end within 60 s."""
    import re
    import signal
    import socket
    import time

    import psutil

    from gpucert.runtime.launch_env import RANK_VARIABLES

    if torch.cuda.device_count() < 2:
        pytest.skip("two nodes of one GPU each need two GPUs")
    config = tmp_path / "tiny-gpu.yaml"
    config.write_text(CONFIG.replace("CACHE", str(tmp_path / "cache")).replace("max_steps: 10", "max_steps: 100000"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agents, logs = [], []
    for node in (0, 1):
        env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES} | {"CUDA_VISIBLE_DEVICES": str(node)}
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}"]
        argv += ["--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}"]
        argv += ["-m", "gpucert.finetune.train", str(config), "--output-dir", str(tmp_path / "run")]
        argv += ["--set", "train.epochs=1000", "--set", "train.save_every=100000", "--set", "train.eval_every=100000"]
        argv += ["--set", "runtime.heartbeat_interval_s=1", "--set", "runtime.heartbeat_timeout_s=6"]
        logs.append(tmp_path / f"node{node}.log")
        with logs[-1].open("wb") as out:
            agents.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + 240
        while "[finetune] step 3/" not in logs[0].read_text(errors="replace"):
            assert all(a.poll() is None for a in agents), logs[0].read_text()[-3000:]
            assert time.monotonic() < deadline, logs[0].read_text()[-3000:]
            time.sleep(0.2)
        children = psutil.Process(agents[1].pid).children(recursive=True)
        [worker] = [p for p in children if "gpucert.finetune.train" in p.cmdline()]
        worker.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        for agent in agents:
            agent.wait(timeout=max(60 - (time.monotonic() - killed), 0.1))
    finally:
        for agent in agents:
            if agent.poll() is None:
                kill_process_tree(agent.pid)
    out0 = logs[0].read_text(errors="replace")
    assert re.search(r"stops: rank 1 \(.*\) failed during step \d+: no heartbeat", out0), out0[-3000:]
    print(f"both nodes ended {time.monotonic() - killed:.1f} s after the kill")


@pytest.mark.parametrize("triton_chunk", [True, False], ids=["triton-kernel", "compiled"])
def test_the_compiled_loss_chunk_matches_the_plain_loss_in_bf16(
    triton_chunk: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused head's chunk on CUDA, the Triton kernel (ce_kernel.py) or the compiled function, against full
    logits and autograd, in the model's bf16."""
    import torch.nn.functional as F

    from gpucert.finetune.model import loss as loss_module
    from gpucert.finetune.model.kernels import cross_entropy as ce_kernel
    from gpucert.finetune.model.loss import linear_cross_entropy

    monkeypatch.setattr(loss_module, "TRITON_CHUNK", triton_chunk)
    launched = []
    kernel = ce_kernel.chunk_loss_and_grad
    monkeypatch.setattr(ce_kernel, "chunk_loss_and_grad", lambda *a: (launched.append(1), kernel(*a))[1])

    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(2, 1537, 256, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    weight = (0.1 * torch.randn(32003, 256, device="cuda", generator=g)).to(torch.bfloat16)
    labels = torch.randint(0, 32003, (2, 1537), device="cuda", generator=g)
    labels[0, :100] = -100
    fused = linear_cross_entropy(hidden, weight, labels, chunk=1024)  # a full chunk and a shorter last one
    (grad_fused,) = torch.autograd.grad(fused, hidden)
    logits = (hidden[:, :-1] @ weight.t()).float()
    plain = F.cross_entropy(logits.reshape(-1, 32003), labels[:, 1:].reshape(-1), reduction="sum")
    (grad_plain,) = torch.autograd.grad(plain, hidden)
    torch.testing.assert_close(fused.float(), plain, rtol=1e-5, atol=0)
    torch.testing.assert_close(grad_fused.float(), grad_plain.float(), rtol=2e-2, atol=1e-3)
    assert len(launched) == (3 if triton_chunk else 0)  # 2 x 1536 supervised positions less 100: 3 chunks


@pytest.mark.parametrize("rows", [1024, 37])
def test_the_triton_loss_kernel_is_as_close_to_fp64_as_the_compiled_chunk(rows: int) -> None:
    """ce_kernel at the 7B's 152,064-entry vocabulary: its loss and gradient against fp64, no further off than
    the compiled function's it replaces, and the same bits on a second call."""
    from gpucert.finetune.model.kernels import cross_entropy as ce_kernel
    from gpucert.finetune.model.loss import _chunk_loss_and_grad, _compiled_chunk

    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (3 * torch.randn(rows, 152_064, device="cuda", generator=g)).to(torch.bfloat16)
    targets = torch.randint(0, 152_064, (rows,), device="cuda", generator=g)
    targets[0] = 152_063
    want_loss, want_grad = _chunk_loss_and_grad(logits.double(), targets, torch.float64)
    assert ce_kernel.fits(logits, torch.float32)
    found = ce_kernel.chunk_loss_and_grad(logits.clone(), targets)
    again = ce_kernel.chunk_loss_and_grad(logits.clone(), targets)
    compiled = _compiled_chunk(logits, targets, torch.float32)
    # Each entry against its own size: most of a row is ~1e-5, where an absolute bound sees nothing.
    off = {
        name: float(((grad.double() - want_grad).abs() / want_grad.abs()).max())
        for name, (_, grad) in (("triton", found), ("compiled", compiled))
    }
    for name, (loss, _) in (("triton", found), ("compiled", compiled)):
        print(f"{name}: loss off fp64 {abs(float(loss) / float(want_loss) - 1):.1e}, gradient {off[name]:.2e} of each")
    assert abs(float(found[0]) / float(want_loss) - 1) < 1e-6
    # Rounded to nearest in bf16, as the compiled function rounds: within half a step (2^-8 of an entry's size),
    # plus the fp32 softmax's own error (~1e-6).
    assert off["triton"] <= 2**-8 + 1e-5
    assert torch.equal(found[0], again[0]) and torch.equal(found[1], again[1])


def assert_as_close_to_fp32(reference: Any, baseline: Any, found: Any, what: str) -> None:
    """(loss, gradients) of a fast bf16 path against fp32: its loss and every gradient as close to the fp32
    reference as the plain bf16 path's (within 1.5 x, or 1e-3)."""
    loss_off = [abs(run[0] - reference[0]) / abs(reference[0]) for run in (baseline, found)]
    print(f"loss off fp32: plain bf16 {loss_off[0]:.2e}, {what} {loss_off[1]:.2e}")
    assert loss_off[1] <= 1.5 * loss_off[0] + 1e-3
    worst = 0.0
    for index, (b, f, r) in enumerate(zip(baseline[1], found[1], reference[1], strict=True)):
        off = [float((x - r).norm() / r.norm()) for x in (b, f)]
        worst = max(worst, off[1])
        assert off[1] <= 1.5 * off[0] + 1e-3, (index, off)
    print(f"worst gradient off fp32, {what}: {worst:.2%}")


def test_the_adapters_in_the_gemm_train_as_the_plain_path_in_bf16() -> None:
    """bf16 with the adapters in the frozen GEMMs (q/k/v and gate/up's B, o_proj and down_proj's A), compiled,
    against the same model with separate adapter products: each is compared with fp32, and the GEMM path's loss
    and every adapter gradient must be as close to it as the plain bf16 path's (within 1.5 x, or 1e-3)."""
    from gpucert.finetune.config import ModelConfig

    cfg = ModelConfig(name="tiny", dtype="bf16", attn_implementation="sdpa", compile=True)
    reference = packed_loss_and_grads(replace(cfg, dtype="fp32", compile=False))
    plain = packed_loss_and_grads(replace(cfg, adapters_in_gemm=False))
    in_gemm = packed_loss_and_grads(cfg)
    assert_as_close_to_fp32(reference, plain, in_gemm, "in the GEMM")


def test_the_fused_mlp_trains_as_the_plain_path_in_bf16() -> None:
    """bf16, compiled, the adapters in the frozen GEMMs, each MLP one function whose backward is
    swiglu_kernel's Triton kernel (model.fuse_mlp), against the same model without it and with separate adapter
    products: each compared with fp32, as close to it as the plain bf16 path (within 1.5 x, or 1e-3)."""
    from gpucert.finetune.config import ModelConfig

    cfg = ModelConfig(name="tiny", dtype="bf16", attn_implementation="sdpa", compile=True)
    reference = packed_loss_and_grads(replace(cfg, dtype="fp32", compile=False))
    plain = packed_loss_and_grads(replace(cfg, adapters_in_gemm=False))
    fused = packed_loss_and_grads(cfg)
    unfused = packed_loss_and_grads(replace(cfg, fuse_mlp=False))
    assert_as_close_to_fp32(reference, plain, fused, "fused MLP")
    assert_as_close_to_fp32(reference, plain, unfused, "in the GEMM, MLP unfused")


@pytest.mark.parametrize(("rows", "n"), [(4096 + 37, 18_944), (12_288, 18_944), (1000, 5000)])
def test_the_mlp_backward_kernel_is_as_close_to_fp64_as_torch(rows: int, n: int) -> None:
    """swiglu_kernel's Triton kernel at Qwen2-7B's 18,944 columns (and at 5,000, no multiple of the tile), r16,
    against fp64: each output as close as the same formula in torch from the same bf16 inputs (fp32 pointwise,
    products of the rounded gradients), and the same bits when run again."""
    from gpucert.finetune.model.kernels import swiglu as swiglu_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    r = 16
    gate = (2 * torch.randn(rows, n, generator=g, device="cuda")).bfloat16()
    up = torch.randn(rows, n, generator=g, device="cuda").bfloat16()
    dh = (1e-3 * torch.randn(rows, n, generator=g, device="cuda")).bfloat16()
    xa = torch.randn(rows, 2 * r, generator=g, device="cuda").bfloat16()
    dxd = (1e-3 * torch.randn(rows, r, generator=g, device="cuda")).bfloat16()
    exact = swiglu_kernel.reference(gate.double(), up.double(), dh.double(), xa.double(), dxd.double(), 2.0, 0.5)
    torch_bf16 = swiglu_kernel.reference(gate, up, dh, xa, dxd, 2.0, 0.5)
    found = swiglu_kernel.backward(gate, up, dh, xa, dxd, 2.0, 0.5)
    again = swiglu_kernel.backward(gate, up, dh, xa, dxd, 2.0, 0.5)
    names = ("dgate", "dup", "db_gate", "db_up", "da_down")
    for name, f, t, e, a in zip(names, found, torch_bf16, exact, again, strict=True):
        assert f.shape == t.shape and f.dtype == t.dtype, name
        off = [float((x.double() - e).norm() / e.norm()) for x in (t, f)]
        print(f"{name}: torch {off[0]:.2e}, kernel {off[1]:.2e} off fp64")
        assert off[1] <= 1.5 * off[0] + 1e-6, (name, off)
        assert torch.equal(f, a), name


def flash_loss_and_grads(attn: str, dtype: torch.dtype, documents: list[list[int]], compile_layers: bool) -> Any:
    """One forward/backward of a 2-layer Qwen2 with Qwen2-7B's attention shape (head dim 128, grouped-query
    heads), from seed 0, over rows of `documents` padded to 1,024 tokens; (loss, every parameter's gradient)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from gpucert.finetune.model import flash
    from gpucert.finetune.model.lora import forward_loss

    flash.register()
    batch = {k: v.cuda() for k, v in packed_batch(1000, documents, seed=2, pad_to=1024, prompt=4).items()}
    shape = dict(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2)
    shape |= dict(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    key = {"flash_attention_3": flash.KEY, "varlen": flash.VARLEN_KEY}.get(attn, attn)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**shape, attn_implementation=key)).to("cuda", dtype)
    if compile_layers:
        for layer in model.model.layers:
            layer.compile()
    loss, n = forward_loss(model, batch, attn)
    (loss / n).backward()
    return float(loss.detach()), [p.grad.float().clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("attn", ["flash_attention_3", "varlen"])
@pytest.mark.parametrize(
    ("documents", "compile_layers"),
    [([[1024], [1024]], False), ([[300, 500, 200], [1000], [600, 400]], True)],
    ids=["one-document-a-row-eager", "packed-and-padded-compiled"],
)
def test_gpucerts_own_attention_trains_as_sdpa_in_bf16(
    attn: str, documents: list[list[int]], compile_layers: bool
) -> None:
    """gpucert's own attention paths (finetune/model/flash.py, the real kernels: FlashAttention-3's, and torch's
    varlen_attn) against SDPA with its masks: each in bf16 against SDPA in fp32, the loss and every gradient as
    close to it as SDPA's bf16 (within 1.5 x, or 1e-3). Packed rows need a FlashAttention-3 built with its
    variable-length kernels."""
    if attn == "flash_attention_3":
        if torch.cuda.get_device_capability()[0] != 9:
            pytest.skip("FlashAttention-3 runs on Hopper GPUs only")
        pytest.importorskip("flash_attn_interface")
    elif importlib.util.find_spec("torch.nn.attention.varlen") is None:
        pytest.skip("this torch has no torch.nn.attention.varlen (torch >= 2.10)")
    reference = flash_loss_and_grads("sdpa", torch.float32, documents, False)
    sdpa = flash_loss_and_grads("sdpa", torch.bfloat16, documents, compile_layers)
    found = flash_loss_and_grads(attn, torch.bfloat16, documents, compile_layers)
    assert_as_close_to_fp32(reference, sdpa, found, attn)
