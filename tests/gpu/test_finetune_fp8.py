"""FP8 frozen base weights (`model.precision: fp8`, src/gpucert/finetune/model/fp8.py) on the GPU's kernels: the
matmuls against bf16 at the Qwen2-7B shapes, eager and compiled, and a tiny training run in fp8 held to the same
run in bf16. Needs compute capability >= 8.9 (H100, H200, L40S). Run on the lent GPU machine:

    python -m pytest tests/gpu/test_finetune_fp8.py -q -s      # -s prints the GEMM times (shown, not judged)
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
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

# A run in fp8 may differ from the run in bf16 by this share of the bf16 loss at any step, and by FINAL_REL_MAX
# at the last one. Why these: both runs start from the same weights and see the same batches, so the curves
# differ only by the quantization (about 4 % per matmul, relative Frobenius) and bf16 noise. Measured on the CPU
# (torch's _scaled_mm), 20 steps of this run at 256 tokens: fp8 within 0.6 % of bf16 at every step, 0.0 % at the
# last. Sabotaged the same way: weight scales doubled stray 6.2 % at step 4 and end 5.1 % off; no input gradient
# through the frozen layers strays 6.4 % at step 4 and ends 10.7 % off. Both fail here. (All-e5m2 operands end
# 1.0 % off and pass: the matmul test above catches those.)
STEP_REL_MAX = 0.05
FINAL_REL_MAX = 0.02
# The tiny run must learn, or agreeing curves prove nothing: the mean of the last 3 losses this far below the
# first 3 (nats). Both runs fall by more than 1 nat in 12 steps on the CPU.
LEARNED_NATS = 0.3
# See tests/finetune/test_fp8.py: e4m3 operands put a GEMM about 3.7 % off; 5 % fails a wrong scale or e5m2.
MATMUL_REL_ERROR_MAX = 0.05


def aligned_tiny_model(tmp_path: Path) -> Path:
    """A model directory holding only config.json: the tiny Qwen2 with a 176-wide MLP instead of 172, so that
    every projection can run in FP8 (dimensions multiples of 16). Built with random weights from the run's
    seed (model.random_init) and the tiny tokenizer, as the speed recipe builds Qwen2-7B."""
    from gpucert.finetune.model.lora import tiny_config

    config = tiny_config(4096)
    config.intermediate_size = 176
    model_dir = tmp_path / "tiny-aligned"
    config.save_pretrained(model_dir)
    return model_dir


def assert_fp8_follows_bf16(bf16: list[float], fp8: list[float], step_rel_max: float, final_rel_max: float) -> None:
    assert len(bf16) == len(fp8) >= 6, (bf16, fp8)
    for losses in (bf16, fp8):
        assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - LEARNED_NATS, losses
    off = [abs(f - b) / b for b, f in zip(bf16, fp8, strict=True)]
    worst = max(range(len(off)), key=off.__getitem__)
    assert off[worst] <= step_rel_max, (
        f"expected the fp8 loss within {step_rel_max:.0%} of bf16's at every step, found {off[worst]:.2%} at step "
        f"{worst + 1} ({fp8[worst]:.4f} vs {bf16[worst]:.4f}); bf16 {bf16}, fp8 {fp8}"
    )
    assert off[-1] <= final_rel_max, (
        f"expected the final fp8 loss within {final_rel_max:.0%} of bf16's, found {off[-1]:.2%} "
        f"({fp8[-1]:.4f} vs {bf16[-1]:.4f})"
    )


def rel_error(found: torch.Tensor, reference: torch.Tensor) -> float:
    return float((found.detach().float() - reference.detach().float()).norm() / reference.detach().float().norm())


def frozen_linear(out_features: int, in_features: int, bias: bool) -> torch.nn.Linear:
    layer = torch.nn.Linear(in_features, out_features, bias=bias, device="cuda", dtype=torch.bfloat16)
    layer.requires_grad_(False)
    return layer


# Qwen2-7B's projections: q (with bias), o, gate/up, down; 8,192 tokens = micro-batch 2 x 4,096.
SHAPES = [(3584, 3584, True), (3584, 3584, False), (18944, 3584, False), (3584, 18944, False), (512, 3584, True)]


@pytest.mark.parametrize(("out_features", "in_features", "bias"), SHAPES, ids=str)
def test_forward_and_input_gradient_match_bf16_on_the_gpu(out_features: int, in_features: int, bias: bool) -> None:
    """Relative Frobenius error of y and dx against the fp32 product of the bf16 operands below
    MATMUL_REL_ERROR_MAX, eager and compiled (inductor, as the decoder layers are); compiled equals eager."""
    from gpucert.finetune.model.fp8 import Fp8FrozenLinear

    torch.manual_seed(0)
    layer = frozen_linear(out_features, in_features, bias)
    fp8 = Fp8FrozenLinear.from_linear(layer)
    x = torch.randn(2, 4096, in_features, device="cuda").to(torch.bfloat16)
    dy = torch.randn(2, 4096, out_features, device="cuda").to(torch.bfloat16)
    x_ref = x.float().requires_grad_()
    y_ref = F.linear(x_ref, layer.weight.float(), layer.bias.float() if bias else None)
    y_ref.backward(dy.float())

    results = []
    for module in (fp8, torch.compile(fp8, fullgraph=True)):
        xi = x.clone().requires_grad_()
        y = module(xi)
        y.backward(dy)
        assert xi.grad is not None and y.dtype == xi.grad.dtype == torch.bfloat16
        assert rel_error(y, y_ref) < MATMUL_REL_ERROR_MAX
        assert rel_error(xi.grad, x_ref.grad) < MATMUL_REL_ERROR_MAX
        results.append((y, xi.grad))
    (y_eager, dx_eager), (y_compiled, dx_compiled) = results
    assert rel_error(y_compiled, y_eager) < 1e-2 and rel_error(dx_compiled, dx_eager) < 1e-2
    print(
        f"\n{out_features}x{in_features}: y {rel_error(y_eager, y_ref):.2%}, dx {rel_error(dx_eager, x_ref.grad):.2%}"
    )


def test_fp8_gemm_time_against_bf16() -> None:
    """Shown, not judged: the forward GEMM of Qwen2-7B's up projection at 8,192 tokens, bf16 against FP8 with
    its quantization of x, median of 20 after 5 warm-up calls (CUDA events)."""
    from gpucert.finetune.model.fp8 import Fp8FrozenLinear

    layer = frozen_linear(18944, 3584, False)
    fp8 = Fp8FrozenLinear.from_linear(layer)
    compiled = torch.compile(fp8, fullgraph=True)
    x = torch.randn(8192, 3584, device="cuda").to(torch.bfloat16)

    def median_ms(fn: Any) -> float:
        times = []
        with torch.no_grad():
            for i in range(25):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(x)
                end.record()
                torch.cuda.synchronize()
                if i >= 5:
                    times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    flop = 2 * 8192 * 3584 * 18944
    for name, fn in (("bf16", layer), ("fp8 eager", fp8), ("fp8 compiled", compiled)):
        ms = median_ms(fn)
        print(f"\n{name}: {ms:.3f} ms, {flop / ms / 1e9:.0f} TFLOP/s")


# The head's matmuls in FP8 (model.fp8_head): the loss and the hidden states' gradient against the fp32 head at
# Qwen2-7B's head (3,584 x 152,064), with targets drawn from the model's own softmax (what a model that predicts
# well sees) at two logit spreads: 0.3 (a random model, the speed runs' start) and 3 (a trained one). Measured on
# the lent H100 (2026-11-23): see docs/OPTIMIZATION.md. A GEMM of e4m3 operands is ~3.7 % off, and a logit's
# error moves the softmax that the gradient is made of, so the gradient gets HEAD_GRAD_REL_MAX; the loss averages
# thousands of tokens and keeps to HEAD_LOSS_REL_MAX. A doubled or halved scale is 100 % or 50 % off and fails.
HEAD_LOSS_REL_MAX = 0.005
HEAD_GRAD_REL_MAX = 0.06


@pytest.mark.parametrize("logit_std", [0.3, 3.0])
def test_the_fp8_head_follows_the_fp32_head(logit_std: float) -> None:
    from gpucert.finetune.model.fp8 import Fp8FrozenLinear
    from gpucert.finetune.model.loss import linear_cross_entropy

    torch.manual_seed(0)
    vocab, hidden_size, tokens = 152064, 3584, 4095  # an odd count: the last chunk is 1,023 rows
    weight = (torch.randn(vocab, hidden_size, device="cuda") * logit_std / hidden_size**0.5).to(torch.bfloat16)
    hidden = torch.randn(1, tokens + 1, hidden_size, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        probs = torch.softmax(hidden[0, :-1].float() @ weight.float().t(), dim=-1)
    labels = torch.cat([torch.zeros(1, dtype=torch.long, device="cuda"), torch.multinomial(probs, 1).squeeze(1)])
    del probs
    ref_hidden = hidden.float().requires_grad_()
    ref = linear_cross_entropy(ref_hidden, weight.float(), labels[None])
    ref.backward()
    found = {}
    for name, head in (("bf16", weight), ("fp8", Fp8FrozenLinear.from_weight(weight))):
        h = hidden.clone().requires_grad_()
        loss = linear_cross_entropy(h, head, labels[None])
        loss.backward()
        found[name] = (abs(float(loss) / float(ref) - 1), rel_error(h.grad, ref_hidden.grad))
    print(f"\nlogit std {logit_std}: loss {float(ref) / tokens:.4f} nats/token; off fp32 (loss, grad): {found}")
    loss_off, grad_off = found["fp8"]
    assert loss_off < HEAD_LOSS_REL_MAX and grad_off < HEAD_GRAD_REL_MAX, found


@pytest.mark.parametrize("logit_std", [0.3, 3.0])
def test_the_fp8_loss_kernel_gives_the_compiled_functions_scales_and_gradient(logit_std: float) -> None:
    """kernels/cross_entropy.py's FP8 chunk at the 7B's vocabulary against the compiled function it replaced
    (loss.py's `_compiled_fp8_chunk`): each row's scale, the float8 gradient, the loss; with both timed (shown).
    The rows' sums run in another order, so an entry may round to the next e4m3 value: a few per 10,000."""
    from gpucert.finetune.model.kernels import cross_entropy as ce_kernel
    from gpucert.finetune.model.loss import _compiled_fp8_chunk

    torch.manual_seed(0)
    logits = (torch.randn(1024, 152064, device="cuda") * logit_std).to(torch.bfloat16)
    targets = torch.randint(0, 152064, (1024,), device="cuda")
    logits[:8, :].zero_()  # rows with no preference: p_t = 1 / vocab
    logits[8:16][torch.arange(8), targets[8:16]] = 60.0  # rows where p_t rounds to 1 in fp32
    found = ce_kernel.chunk_loss_and_fp8_grad(logits, targets)
    want = _compiled_fp8_chunk(logits, targets, torch.float32)
    assert abs(float(found[0]) / float(want[0]) - 1) < 1e-5, (float(found[0]), float(want[0]))
    assert float((found[2] != want[2]).float().mean()) <= 1e-3, "scales differ in more than 1 row of 1,000"
    differ = float((found[1].view(torch.uint8) != want[1].view(torch.uint8)).float().mean())
    deq = found[1].float() * found[2]
    ref = want[1].float() * want[2]
    assert differ <= 1e-3 and rel_error(deq, ref) < 1e-3, (differ, rel_error(deq, ref))
    times = {}
    for name, fn in (("triton", ce_kernel.chunk_loss_and_fp8_grad), ("compiled", _compiled_fp8_chunk)):
        for _ in range(3):
            fn(logits, targets, torch.float32)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            fn(logits, targets, torch.float32)
        end.record()
        torch.cuda.synchronize()
        times[name] = round(start.elapsed_time(end) / 20, 3)
    print(f"\nFP8 loss chunk, 1,024 x 152,064, logit std {logit_std}: ms {times}; entries differing {differ:.1e}")


def test_fp8_head_time_against_bf16() -> None:
    """Shown, not judged: the fused head and loss, forward and backward, over 8,192 tokens of Qwen2-7B's head,
    bf16 against FP8, median of 10 after 3 warm-up calls."""
    from gpucert.finetune.model.fp8 import Fp8FrozenLinear
    from gpucert.finetune.model.loss import linear_cross_entropy

    weight = (torch.randn(152064, 3584, device="cuda") * 0.05).to(torch.bfloat16)
    hidden = torch.randn(1, 8193, 3584, device="cuda").to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 152064, (1, 8193), device="cuda")
    for name, head in (("bf16", weight), ("fp8", Fp8FrozenLinear.from_weight(weight))):
        times = []
        for i in range(13):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            linear_cross_entropy(hidden, head, labels).backward()
            end.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end))
        print(f"\nhead {name}: {sorted(times)[len(times) // 2]:.2f} ms")


def _mlp_inputs(m: int, n: int, r: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int, std: float = 1.0) -> torch.Tensor:
        return (std * torch.randn(*shape, generator=g, device="cuda")).to(torch.bfloat16)

    # gate, up, dhb, xa, s B_gate, s B_up, A_down, d(hA): magnitudes of a trained layer's order
    return (
        randn(m, n, std=2.0),
        randn(m, n),
        randn(m, n, std=1e-3),
        randn(m, 2 * r),
        randn(n, r, std=0.02),
        randn(n, r, std=0.02),
        randn(r, n, std=0.01),
        randn(m, r, std=1e-3),
    )


def test_the_fp8_mlp_kernels_match_their_torch_reference_at_qwen2_7b_s_shape() -> None:
    """kernels/swiglu_fp8.py at one micro-batch of 2 x 4,096 tokens of Qwen2-7B's MLP (r16), against its torch
    reference on the same GPU. Both round h, dgate and dup to bf16 and then to float8 the same way, but
    tl.sigmoid and torch.sigmoid may differ in the last bit, which moves a value to the neighbouring bf16 (and,
    rarely, float8) step: so 1 % (relative Frobenius) for the dequantized values and the rank-r products, and
    the row scales equal in all but 0.1 % of rows. A dropped adapter term or a wrong scale is off by tens of %."""
    from gpucert.finetune.model.kernels import swiglu_fp8

    gate, up, dhb, xa, bg, bu, ad, dha = _mlp_inputs(8192, 18944, 16)
    assert swiglu_fp8.fits(gate)
    found = swiglu_fp8.forward(gate, up, xa, bg, bu, ad)
    exact = swiglu_fp8.reference_forward(gate, up, xa, bg, bu, ad)
    assert found[0].dtype == torch.float8_e4m3fn
    assert rel_error(found[0].float() * found[1], exact[0].float() * exact[1]) < 0.01
    assert float((found[1] != exact[1]).float().mean()) < 1e-3
    assert rel_error(found[2], exact[2]) < 0.01
    found_b = swiglu_fp8.backward(gate, up, dhb, xa, bg, bu, ad, dha)
    exact_b = swiglu_fp8.reference_backward(gate, up, dhb, xa, bg, bu, ad, dha)
    for q, s in ((0, 1), (2, 3)):
        assert rel_error(found_b[q].float() * found_b[s], exact_b[q].float() * exact_b[s]) < 0.01, q
        assert float((found_b[s] != exact_b[s]).float().mean()) < 1e-3, s
    for i, name in ((4, "dxa"), (5, "db_gate"), (6, "db_up"), (7, "da_down")):
        assert rel_error(found_b[i], exact_b[i]) < 0.01, name
    again = swiglu_fp8.backward(gate, up, dhb, xa, bg, bu, ad, dha)
    assert all(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
               for a, b in zip(found_b, again, strict=True))  # fmt: skip


# compile_tuning off in both runs: it changes inductor's block sizes (and with them the order of some sums), not
# what is computed, and in FP8 (where auto turns it on) it benchmarks each of the tiny model's many small kernels;
# the test was cut off at 300 s on an H100 with it on (2026-11-28), where its bf16 run alone takes 75 s. FP8 with
# the tuning on (its default) is what the speed plans run (tools/plans/h100-fp8*.txt), not this test.
CONFIG = """\
model: {name: MODEL, random_init: true, dtype: bf16, attn_implementation: sdpa, compile: true, compile_tuning: false}
lora: {r: 8, alpha: 16, dropout: 0.0}
data: {max_length: 512, eval_fraction: 0.1, cache_dir: CACHE}
train: {micro_batch: 2, grad_accum: 2, lr: 1.0e-2, warmup_ratio: 0.1, max_steps: 20, eval_every: 10, save_every: 10,
        keep_checkpoints: 1}
"""


def finetune(tmp_path: Path, name: str, nproc: int, *overrides: str) -> dict[str, Any]:
    config = tmp_path / "tiny-aligned.yaml"
    model_dir = aligned_tiny_model(tmp_path)
    config.write_text(CONFIG.replace("MODEL", str(model_dir)).replace("CACHE", str(tmp_path / "cache")))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    argv += ["-m", "gpucert.finetune.train", str(config), "--output-dir", str(tmp_path / name)]
    for item in overrides:
        argv += ["--set", item]
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540, env=env, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((tmp_path / name / "metrics.json").read_text())


def test_a_tiny_run_in_fp8_follows_the_bf16_run(tmp_path: Path) -> None:
    """The quality check: the same 20 steps (same seed, weights and batches, compiled layers) in bf16 and with
    every projection of the decoder layers in FP8. Both must learn, and fp8's loss stay within STEP_REL_MAX of
    bf16's at every step and FINAL_REL_MAX at the last (why these numbers: their comment)."""
    bf16 = finetune(tmp_path, "bf16", 1)
    fp8 = finetune(tmp_path, "fp8", 1, "model.precision=fp8")
    assert bf16["status"] == fp8["status"] == "PASS", (bf16["criteria"], fp8["criteria"])
    assert fp8["config"]["model"]["precision"] == "fp8"
    print(f"\nbf16 {bf16['loss_history']}\nfp8  {fp8['loss_history']}")
    assert_fp8_follows_bf16(bf16["loss_history"], fp8["loss_history"], STEP_REL_MAX, FINAL_REL_MAX)


def test_fp8_trains_under_ddp_on_all_gpus(tmp_path: Path) -> None:
    """DDP broadcasts every parameter at wrap, the float8 ones included (NCCL moves them as bytes)."""
    nproc = torch.cuda.device_count()
    if nproc < 2:
        pytest.skip("DDP across GPUs needs two or more")
    m = finetune(tmp_path, "ddp", nproc, "model.precision=fp8")
    assert m["parallel"] == "ddp" and m["world_size"] == nproc
    losses = m["loss_history"]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - LEARNED_NATS, losses
    assert m["outputs"]["adapter"] and m["outputs"]["checkpoint"]
