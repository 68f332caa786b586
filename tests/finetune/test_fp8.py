"""FP8 frozen base weights on CPU: torch's CPU build runs `torch._scaled_mm` (row-wise scales included), so the
module's forward and input gradient are checked numerically here, besides the pure parts (scales, layouts, the
conversion of a tiny PEFT model, config and device refusals). tests/gpu/test_finetune_fp8.py repeats the
numerics on the GPU's kernels and holds a training run in FP8 to the same run in bf16."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from torch import nn
from transformers import Qwen2ForCausalLM

import gpucert.finetune.model.lora as model_module
from gpucert.config.loader import ConfigError
from gpucert.finetune.config import (
    DataConfig,
    FinetuneConfig,
    LoraConfig,
    ModelConfig,
    TrainConfig,
    load_finetune_config,
)
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.model.fp8 import (
    FP8,
    FP8_MAX,
    Fp8FrozenLinear,
    convert_frozen_linears,
    fp8_device_problem,
    quantize_rows,
)
from gpucert.finetune.model.lora import forward_plan, load_model, tiny_config

TINY_BF16 = ModelConfig(name="tiny", dtype="bf16", precision="fp8")
LORA = LoraConfig(r=8, alpha=16, dropout=0.0)
# e4m3 keeps 3 mantissa bits: a rounding error of at most 2^-4 of a value, about 2.6 % RMS on Gaussian data, so
# a GEMM of two quantized operands is off by about 3.7 % (relative Frobenius). 5 % holds that with margin and
# fails a wrong scale or layout (errors of order 100 %) or e5m2 operands (about 7 %).
MATMUL_REL_ERROR_MAX = 0.05


def rel_error(found: torch.Tensor, reference: torch.Tensor) -> float:
    return float((found.detach().float() - reference.float()).norm() / reference.float().norm())


def linear(out_features: int, in_features: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    layer.requires_grad_(False)
    return layer


# --- Scales and layouts ------------------------------------------------------------------------------------


def test_row_scales_are_powers_of_two_that_just_cover_each_row() -> None:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 64, generator=g) * torch.tensor([1e-4, 1e-2, 1.0, 3.0, 1e2, 1e4])[:, None]
    q, scale = quantize_rows(rows.to(torch.bfloat16))
    assert q.dtype == FP8 and scale.shape == (6, 1) and scale.dtype == torch.float32
    assert torch.equal(torch.exp2(torch.log2(scale).round()), scale)
    biggest = q.float().abs().amax(dim=1)
    # amax / s lands in (224, 448]: the largest value of each row uses the top binade, none saturates.
    assert bool(((biggest > FP8_MAX / 2) & (biggest <= FP8_MAX)).all()), biggest
    assert rel_error(q.float() * scale, rows) < 0.04


def test_an_all_zero_row_quantizes_to_zeros_with_a_finite_scale() -> None:
    q, scale = quantize_rows(torch.zeros(2, 32, dtype=torch.bfloat16))
    assert bool(torch.isfinite(scale).all()) and bool((scale > 0).all())
    assert not bool(q.float().any())


def test_the_weight_is_kept_in_both_layouts_scaled_mm_takes() -> None:
    fp8 = Fp8FrozenLinear.from_linear(linear(96, 128))
    n, k = 96, 128
    assert (fp8.out_features, fp8.in_features) == (n, k)
    # Forward y = x @ W^T: W [N, K] row-major, so W^T is a column-major [K, N] view; one scale per output row.
    assert fp8.weight.dtype == FP8 and fp8.weight.shape == (n, k) and fp8.weight.is_contiguous()
    assert fp8.weight.t().stride() == (1, k)
    assert fp8.weight_scale.shape == (1, n) and fp8.weight_scale.is_contiguous()
    # Backward dx = dy @ W: W^T [K, N] row-major, so W is a column-major [N, K] view; one scale per input column.
    assert fp8.weight_t.dtype == FP8 and fp8.weight_t.shape == (k, n) and fp8.weight_t.is_contiguous()
    assert fp8.weight_t.t().stride() == (1, n)
    assert fp8.weight_t_scale.shape == (1, k) and fp8.weight_t_scale.is_contiguous()
    assert fp8.bias is not None and fp8.bias.dtype == torch.bfloat16
    assert not any(p.requires_grad for p in fp8.parameters())


def test_both_layouts_dequantize_to_the_weight() -> None:
    layer = linear(96, 128)
    fp8 = Fp8FrozenLinear.from_linear(layer)
    w = layer.weight.float()
    assert rel_error(fp8.weight.float() * fp8.weight_scale.t(), w) < 0.04
    assert rel_error((fp8.weight_t.float() * fp8.weight_t_scale.t()).t(), w) < 0.04


def test_shapes_scaled_mm_cannot_take_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"64 -> 172 features, not multiples of 16"):
        Fp8FrozenLinear.from_linear(linear(172, 64))


# --- Numerics ------------------------------------------------------------------------------------------------


def test_forward_and_input_gradient_match_bf16() -> None:
    """Tolerance: MATMUL_REL_ERROR_MAX (why: its comment). 66 rows: M need not be a multiple of 16."""
    layer = linear(96, 128)
    fp8 = Fp8FrozenLinear.from_linear(layer)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 33, 128, generator=g).to(torch.bfloat16)
    dy = torch.randn(2, 33, 96, generator=g).to(torch.bfloat16)

    x_fp8 = x.clone().requires_grad_()
    y = fp8(x_fp8)
    y.backward(dy)
    x_ref = x.float().requires_grad_()
    y_ref = F.linear(x_ref, layer.weight.float(), layer.bias.float())
    y_ref.backward(dy.float())

    assert y.shape == (2, 33, 96) and y.dtype == torch.bfloat16
    assert x_fp8.grad is not None and x_fp8.grad.dtype == torch.bfloat16
    assert rel_error(y, y_ref) < MATMUL_REL_ERROR_MAX
    assert rel_error(x_fp8.grad, x_ref.grad) < MATMUL_REL_ERROR_MAX
    assert all(p.grad is None for p in fp8.parameters())  # frozen: no weight gradient is made


def test_without_grad_the_forward_still_runs() -> None:
    fp8 = Fp8FrozenLinear.from_linear(linear(32, 64, bias=False))
    with torch.no_grad():
        y = fp8(torch.randn(5, 64).to(torch.bfloat16))
    assert y.shape == (5, 32) and not y.requires_grad


def test_it_compiles_into_one_graph_with_the_eager_results() -> None:
    """Decoder layers are compiled: the autograd.Function must trace without a graph break (fullgraph) through
    dynamo and AOT autograd. aot_eager runs the traced graphs with eager kernels, so the results are the same."""
    fp8 = Fp8FrozenLinear.from_linear(linear(48, 64))
    x = torch.randn(3, 7, 64).to(torch.bfloat16)
    dy = torch.randn(3, 7, 48).to(torch.bfloat16)

    def run(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        xi = x.clone().requires_grad_()
        y = module(xi)
        y.backward(dy)
        assert xi.grad is not None
        return y.detach(), xi.grad

    compiled = torch.compile(fp8, backend="aot_eager", fullgraph=True)
    for a, b in zip(run(compiled), run(fp8), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# --- Conversion of a PEFT model -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(ModelConfig(name="tiny"), DataConfig())


def test_the_tiny_model_converts_its_attention_and_keeps_the_rest(tokenizer) -> None:
    torch.manual_seed(0)
    # Projections one by one (test_fused.py converts the fused groups).
    unfused = ModelConfig(name="tiny", dtype="bf16", fuse_projections=False)
    model, info = load_model(unfused, LORA, tokenizer, torch.device("cpu"))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    with pytest.warns(UserWarning, match=r"mlp.gate_proj \(64 -> 172 features.*in 2 decoder layers"):
        done = convert_frozen_linears(model)

    attention = {f"{i}.self_attn.{p}_proj.base_layer" for i in (0, 1) for p in "qkvo"}
    assert {name.split("layers.")[1] for name in done.converted} == attention
    assert len(done.skipped) == 6 and all("172" in why for why in done.skipped.values())
    fp8_modules = [m for m in model.modules() if isinstance(m, Fp8FrozenLinear)]
    assert len(fp8_modules) == 8 and sum(m.bias is not None for m in fp8_modules) == 6  # q, k, v have biases
    # The adapters, head and embeddings are untouched, and nothing trainable changed.
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable
    lora = [m for name, m in model.named_modules() if name.endswith(("lora_A.default", "lora_B.default"))]
    assert len(lora) == 28 and all(type(m) is nn.Linear and m.weight.requires_grad for m in lora)
    base = model.get_base_model()
    head_weight = forward_plan(model).head_weight  # the fused loss's head
    assert head_weight is not None and head_weight.dtype == torch.bfloat16
    assert base.get_input_embeddings().weight.dtype == torch.bfloat16
    # No frozen bf16 copy of a converted weight is left: only the skipped MLP weights are frozen nn.Linear.
    frozen_linear = [
        n for n, m in base.model.layers.named_modules() if type(m) is nn.Linear and not m.weight.requires_grad
    ]
    assert sorted(frozen_linear) == sorted(
        f"{i}.mlp.{p}_proj.base_layer" for i in (0, 1) for p in ("gate", "up", "down")
    )
    assert info.lora_params == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_projections_without_adapters_are_converted_too_and_skip_is_honoured() -> None:
    config = tiny_config(256)
    config.intermediate_size = 176  # a multiple of 16: every projection can convert
    torch.manual_seed(0)
    base = Qwen2ForCausalLM(config).to(torch.bfloat16)
    peft_config = PeftLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(base, peft_config)
    done = convert_frozen_linears(model, skip=("down_proj",))
    within = {name.split("layers.")[1] for name in done.converted}
    assert "0.self_attn.q_proj.base_layer" in within  # an adapter's base layer
    assert {"0.self_attn.k_proj", "0.self_attn.o_proj", "0.mlp.gate_proj", "0.mlp.up_proj"} <= within  # no adapter
    assert set(done.skipped) == {f"base_model.model.model.layers.{i}.mlp.down_proj" for i in (0, 1)}
    assert len(done.converted) == 2 * 6
    assert type(base.lm_head) is nn.Linear


def test_a_model_with_nothing_to_convert_is_refused() -> None:
    config = tiny_config(256)
    config.hidden_size, config.intermediate_size = 72, 172  # no projection has dimensions divisible by 16
    base = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model = get_peft_model(base, PeftLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    with pytest.raises(ConfigError, match=r"found no frozen linear layer it can convert.*use model.precision=bf16"):
        convert_frozen_linears(model)


def test_fp8_trains_the_adapters_like_bf16_on_one_batch(tokenizer) -> None:
    """The converted tiny model end to end (autocast, LoRA, fused loss): loss within 1 % of bf16's (0.03 %
    measured), and the adapters' gradients within 20 % of bf16's (relative norm; 12 % measured: the
    gradient crosses several quantized matmuls forward and back, and bf16 alone is 2 % off fp32). Dropping the
    input gradient of the frozen layers puts them 69 % off. Not a quality check over steps:
    tests/gpu/test_finetune_fp8.py has that."""
    from gpucert.finetune.model.lora import forward_loss

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, len(tokenizer), (2, 96), generator=g)
    batch = {"input_ids": ids, "labels": ids}
    results = []
    for precision in ("bf16", "fp8"):
        torch.manual_seed(0)
        model, _ = load_model(ModelConfig(name="tiny", dtype="bf16"), LORA, tokenizer, torch.device("cpu"))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)  # non-zero B: gradients flow into A through the base weights
        if precision == "fp8":
            with pytest.warns(UserWarning):
                convert_frozen_linears(model)
        loss, n = forward_loss(model, batch, "sdpa")
        (loss / n).backward()
        results.append((float(loss / n), [p.grad for p in model.parameters() if p.requires_grad]))
    (bf16_loss, bf16_grads), (fp8_loss, fp8_grads) = results
    assert fp8_loss == pytest.approx(bf16_loss, rel=0.01)
    assert all(grad is not None and bool(grad.any()) for grad in fp8_grads)
    assert rel_error(torch.cat([g.flatten() for g in fp8_grads]), torch.cat([g.flatten() for g in bf16_grads])) < 0.2


# --- The head in FP8 (model.fp8_head) -------------------------------------------------------------------------


def test_the_logits_gradient_is_quantized_with_its_exact_row_maximum() -> None:
    """The fp8 chunk's scale per row comes from 1 - p_t summed as the other probabilities: it must equal the
    power-of-two scale of the row's true amax of |softmax - one_hot|, also where p_t is within 1e-9 of 1 (1 - p_t
    subtracted in fp32 would give 0 there, and drop the target's entry) and where the target is not the most
    likely token."""
    from gpucert.finetune.model.fp8 import power_of_two_scale
    from gpucert.finetune.model.loss import _chunk_loss_and_fp8_grad

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 4096, generator=g) * torch.tensor([0.1, 1.0, 3.0, 10.0, 1.0])[:, None]
    targets = torch.randint(0, 4096, (5,), generator=g)
    logits[4, targets[4]] = 30.0  # p_t = 1 - ~4e-10
    logits = logits.to(torch.bfloat16)
    loss, grad_q, scale = _chunk_loss_and_fp8_grad(logits, targets, torch.float32)
    x = logits.double()
    exact = (torch.softmax(x, dim=-1) - F.one_hot(targets, 4096).double()).float()
    assert torch.equal(scale, power_of_two_scale(exact.abs().amax(dim=1, keepdim=True)))
    assert grad_q.dtype == FP8 and bool((grad_q.float().abs().amax(dim=1) > FP8_MAX / 2).all())
    assert rel_error(grad_q.float() * scale, exact) < 0.04
    assert float(loss) == pytest.approx(float(F.cross_entropy(x, targets, reduction="sum")), rel=1e-5)


@pytest.mark.slow
def test_the_compiled_fp8_loss_functions_are_traced_once_with_eager_results() -> None:
    """The FP8 head's compiled chunk and row quantizer (dynamic shapes, CUDA only in training) compiled here on the
    CPU: dynamo once lifted their module-level float constants into symbolic inputs and restarted its analysis, so
    each was traced and handed to AOTAutograd twice, cold and warm. Each frame now makes one AOTAutograd pass, over
    two chunk lengths, and gives the eager functions' bits."""
    from torch._dynamo.utils import counters

    from gpucert.finetune.model.loss import (
        _chunk_loss_and_fp8_grad,
        _compiled_fp8_chunk,
        _compiled_quantize_rows,
    )

    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(64, 1024, generator=g)).to(torch.bfloat16)
    targets = torch.randint(0, 1024, (64,), generator=g)
    with torch.no_grad():
        for rows in (64, 40):  # a full chunk, then a batch's shorter last one: no second compile
            chunk, chunk_targets = logits[:rows].clone(), targets[:rows].clone()  # its own tensor, as in training
            got = _compiled_fp8_chunk(chunk, chunk_targets, torch.float32)
            want = _chunk_loss_and_fp8_grad(chunk, chunk_targets, torch.float32)
            assert torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8)) and torch.equal(got[2], want[2])
            assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-6)
        hq, hs = _compiled_quantize_rows(logits)
        want_q, want_s = quantize_rows(logits)
        assert torch.equal(hq.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(hs, want_s)
    assert counters["frames"]["ok"] == 2, dict(counters["frames"])
    assert counters["aot_autograd"]["total"] == 2, dict(counters["aot_autograd"])  # 4 with the restarts


@pytest.mark.parametrize("chunk", [7, 1024])
def test_the_fp8_head_gives_the_loss_and_gradient_of_the_bf16_head(chunk: int) -> None:
    """The fused loss with the head's two matmuls in FP8 against the exact (fp32) head: loss within 0.5 %,
    the hidden states' gradient within 6 % (the GPU test's tolerances; on the CPU 0.05 % and 3.8 % at a logit
    spread of 3). Only labelled positions get a gradient. A head quantized with its scales doubled fails."""
    from gpucert.finetune.model.loss import linear_cross_entropy

    g = torch.Generator().manual_seed(0)
    vocab, width = 4096, 256
    weight = (torch.randn(vocab, width, generator=g) * 3 / width**0.5).to(torch.bfloat16)
    hidden = torch.randn(2, 40, width, generator=g).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (2, 40), generator=g)
    labels[0, :10] = -100
    ref_hidden = hidden.float().requires_grad_()
    ref = linear_cross_entropy(ref_hidden, weight.float(), labels, chunk=chunk)
    ref.backward()
    head = Fp8FrozenLinear.from_weight(weight)
    for sabotage in (False, True):
        if sabotage:
            head.weight_scale.data *= 2
        h = hidden.clone().requires_grad_()
        loss = linear_cross_entropy(h, head, labels, chunk=chunk)
        loss.backward()
        assert h.grad is not None and torch.all(h.grad[0, :9] == 0) and torch.all(h.grad[:, -1] == 0)
        close = abs(float(loss) / float(ref) - 1) < 0.005 and rel_error(h.grad, ref_hidden.grad) < 0.06
        assert close != sabotage, (float(loss), float(ref), rel_error(h.grad, ref_hidden.grad))


def test_load_model_puts_the_head_in_fp8_and_frees_its_bf16_weight(
    tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the tiny model with a 4,096-entry vocabulary (the tokenizer's 2,195 is no multiple of 16: that head
    stays bf16, with a warning)."""
    from tests.gpu.test_finetune_fp8 import aligned_tiny_model

    monkeypatch.setattr(model_module, "check_fp8_device", lambda device: None)
    aligned = replace(TINY_BF16, name=str(aligned_tiny_model(tmp_path)), random_init=True)
    torch.manual_seed(0)
    model, _ = load_model(aligned, LORA, tokenizer, torch.device("cpu"))
    head = forward_plan(model).head_weight
    assert isinstance(head, Fp8FrozenLinear) and head.weight.shape == (4096, 64)
    # Nothing in the model holds the head's bf16 weight any more (the DeferredHead took its place).
    same_shape = [n for n, p in model.named_parameters() if p.shape == (4096, 64)]
    assert same_shape == ["base_model.model.model.embed_tokens.weight"]
    model, _ = load_model(replace(aligned, fp8_head=False), LORA, tokenizer, torch.device("cpu"))
    head = forward_plan(model).head_weight
    assert isinstance(head, torch.Tensor) and head.dtype == torch.bfloat16
    with pytest.warns(UserWarning, match=r"the lm_head stays bf16: 64 -> 2195 features, not multiples of 16"):
        model, _ = load_model(TINY_BF16, LORA, tokenizer, torch.device("cpu"))
    assert isinstance(forward_plan(model).head_weight, torch.Tensor)


def test_a_head_tied_to_the_embeddings_stays_bf16_with_a_warning() -> None:
    from gpucert.finetune.model.fp8 import head_to_fp8

    embeddings = torch.randn(64, 32).to(torch.bfloat16)
    with pytest.warns(UserWarning, match="model.fp8_head: the lm_head stays bf16: it is tied to the input embeddings"):
        assert head_to_fp8(embeddings, embeddings) is None
    with pytest.warns(UserWarning, match=r"the lm_head stays bf16: 32 -> 72 features, not multiples of 16"):
        assert head_to_fp8(torch.randn(72, 32).to(torch.bfloat16), embeddings) is None
    assert isinstance(head_to_fp8(torch.randn(64, 32).to(torch.bfloat16), embeddings), Fp8FrozenLinear)


# --- Refusals --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "capability", "refused"),
    [
        ("cpu", None, "this run is on cpu"),
        ("cuda", (8, 0), "NVIDIA A100 of compute capability 8.0"),
        ("cuda", (8, 9), None),
        ("cuda", (9, 0), None),
        ("cuda", (10, 0), None),
    ],
)
def test_fp8_needs_a_gpu_of_compute_capability_8_9(device: str, capability, refused: str | None) -> None:
    problem = fp8_device_problem(device, capability, "NVIDIA A100")
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and refused in problem and ">= 8.9" in problem and "model.precision=bf16" in problem


def test_fp8_is_refused_on_rocm_builds() -> None:
    problem = fp8_device_problem("cuda", (9, 4), "AMD Instinct MI300X", rocm=True)
    assert problem is not None and "ROCm build" in problem


def test_load_model_refuses_fp8_off_a_gpu_before_building_the_model(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_: object) -> None:
        raise AssertionError("the model was built before the device was checked")

    monkeypatch.setattr(model_module, "load_base_model", never)
    with pytest.raises(ConfigError, match=r"model.precision: fp8 needs a CUDA GPU of compute capability >= 8.9"):
        load_model(TINY_BF16, LORA, tokenizer, torch.device("cpu"))


def test_precision_is_validated_at_load(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model: {dtype: bf16}\n")
    assert load_finetune_config(path, ["model.precision=fp8"]).model.precision == "fp8"
    assert load_finetune_config(path).model.precision == "bf16"
    with pytest.raises(ConfigError, match=r"--set model.precision=fp4: model.precision must be one of bf16, fp8"):
        load_finetune_config(path, ["model.precision=fp4"])
    with pytest.raises(ConfigError) as two_keys:
        load_finetune_config(path, ["model.precision=fp8", "model.dtype=fp32"])
    assert str(two_keys.value) == (  # each key named with the --set that gave it
        "model.dtype must be bf16 with model.precision fp8, found 'fp32' (model.dtype from --set model.dtype=fp32, "
        "model.precision from --set model.precision=fp8)"
    )
    with pytest.raises(ConfigError, match=r"train.parallel must be auto, none or ddp with model.precision fp8"):
        load_finetune_config(path, ["model.precision=fp8", "train.parallel=fsdp2"])
    assert (
        FinetuneConfig(model=ModelConfig(dtype="bf16", precision="fp8"), train=TrainConfig(parallel="ddp")).problems()
        == []
    )


# --- A short run, in bf16 and in fp8 (slow on a CPU) ----------------------------------------------------------


@pytest.mark.slow
def test_a_tiny_run_in_fp8_follows_the_bf16_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU counterpart of tests/gpu/test_finetune_fp8.py's quality check (same tolerances, stated there),
    through the whole training entry point with the device check let through: torch's CPU kernels quantize and
    scale alike. The adapter it writes holds the fp32 adapters only."""
    from safetensors.torch import load_file
    from tests.gpu.test_finetune_fp8 import FINAL_REL_MAX, STEP_REL_MAX, aligned_tiny_model, assert_fp8_follows_bf16

    from gpucert.finetune.train.run import run_finetune

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.setattr(model_module, "check_fp8_device", lambda device: None)
    model_dir = aligned_tiny_model(tmp_path)
    losses = {}
    for precision in ("bf16", "fp8"):
        cfg = FinetuneConfig(
            model=ModelConfig(name=str(model_dir), random_init=True, dtype="bf16", precision=precision),
            lora=LORA,
            data=DataConfig(max_length=256, eval_fraction=0.1, cache_dir=str(tmp_path / "cache")),
            train=TrainConfig(
                micro_batch=2, grad_accum=2, lr=1e-2, warmup_ratio=0.1, max_steps=12, eval_every=12, save_every=12
            ),
            output_dir=str(tmp_path / precision),
        )
        losses[precision] = run_finetune(cfg)["loss_history"]
    assert_fp8_follows_bf16(losses["bf16"], losses["fp8"], STEP_REL_MAX, FINAL_REL_MAX)
    adapter = load_file(tmp_path / "fp8" / "adapter" / "adapter_model.safetensors")
    assert adapter and all("lora_" in k and v.dtype == torch.float32 for k, v in adapter.items())
    assert os.path.getsize(tmp_path / "fp8" / "adapter" / "adapter_model.safetensors") < 1 << 20
