"""The fused, chunked head + cross-entropy against the plain full-logits loss: values and gradients."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from tests.finetune.packed_rows import packed_batch

from gpucert.finetune.config import DataConfig, LoraConfig, ModelConfig
from gpucert.finetune.data import packing as packing_module
from gpucert.finetune.data.packing import RowLayout, row_layout
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.model import loss as loss_module
from gpucert.finetune.model.lora import DeferredHead, forward_loss, forward_plan, load_model
from gpucert.finetune.model.loss import linear_cross_entropy

TINY = ModelConfig(name="tiny", dtype="fp32", attn_implementation="sdpa")
LORA = LoraConfig(r=8, alpha=16, dropout=0.0)


def plain_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = hidden[:, :-1] @ weight.t()
    return F.cross_entropy(logits.reshape(-1, weight.shape[0]), labels[:, 1:].reshape(-1), reduction="sum")


@pytest.mark.parametrize("chunk", [1, 5, 1024])
def test_matches_the_plain_loss_and_its_gradient(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 9, 6, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 6, dtype=torch.float64, generator=g)
    labels = torch.randint(0, 11, (2, 9), generator=g)
    labels[0, :4] = -100  # a prompt
    labels[1, 7:] = -100  # padding
    fused = linear_cross_entropy(hidden, weight, labels, chunk=chunk)
    (grad_fused,) = torch.autograd.grad(fused * 3.0, hidden)  # a scale on the loss reaches the gradient
    expected = plain_loss(hidden, weight, labels)
    (grad_plain,) = torch.autograd.grad(expected * 3.0, hidden)
    torch.testing.assert_close(fused, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad_fused, grad_plain, rtol=1e-10, atol=1e-12)
    # Unlabelled positions get no gradient at all; the last position predicts nothing.
    assert torch.all(grad_fused[0, :3] == 0) and torch.all(grad_fused[:, -1] == 0)


def test_nothing_labelled_is_zero_with_a_zero_gradient() -> None:
    hidden = torch.randn(1, 4, 3, requires_grad=True)
    loss = linear_cross_entropy(hidden, torch.randn(5, 3), torch.full((1, 4), -100))
    loss.backward()
    assert float(loss.detach()) == 0.0 and hidden.grad is not None and torch.all(hidden.grad == 0)


def test_a_trained_head_is_refused() -> None:
    with pytest.raises(ValueError, match="frozen lm_head"):
        linear_cross_entropy(torch.randn(1, 3, 2), torch.randn(4, 2, requires_grad=True), torch.zeros(1, 3).long())


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY, DataConfig())


def batch_for(vocab: int) -> dict[str, torch.Tensor]:
    return packed_batch(vocab, [[7, 12, 5], [20]], seed=1)


def loss_and_grads(
    cfg: ModelConfig, tokenizer, batch, layout: RowLayout | None = None
) -> tuple[float, list[torch.Tensor]]:
    torch.manual_seed(0)
    model, _ = load_model(cfg, LORA, tokenizer, torch.device("cpu"))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # B starts at zero, which would hide A's gradient
            torch.nn.init.normal_(p, std=0.5)
    loss, n = forward_loss(model, batch, cfg.attn_implementation, layout)
    (loss / n).backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters() if p.requires_grad]


def test_a_model_with_the_fused_loss_trains_like_the_plain_head(tokenizer) -> None:
    batch = batch_for(len(tokenizer))
    fused = loss_and_grads(TINY, tokenizer, batch)
    plain = loss_and_grads(replace(TINY, fused_loss=False), tokenizer, batch)
    assert fused[0] == pytest.approx(plain[0], rel=1e-6)
    for a, b in zip(fused[1], plain[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("documents", [[[7, 12, 5], [20]], [[24], [24]]], ids=["packed", "one a row"])
def test_the_host_s_row_layout_gives_the_same_loss_with_nothing_read_back(tokenizer, documents, monkeypatch) -> None:
    # The trainer works each micro-batch's layout out from its host copy; the forward then reads nothing back from
    # the GPU (no nonzero: the fused loss's read of its supervised positions came after the whole forward).
    batch = packed_batch(len(tokenizer), documents, seed=1)
    layout = row_layout(batch)
    read_back = loss_and_grads(TINY, tokenizer, batch)
    monkeypatch.setattr(torch.Tensor, "nonzero", lambda *_, **__: pytest.fail("the forward read the GPU back"))
    # Nor works a fact out again from the batch: SDPA's one-document check (an .all()), the supervised positions.
    for module, name in ((packing_module, "single_documents"), (loss_module, "supervised_positions")):
        monkeypatch.setattr(module, name, lambda *_, name=name: pytest.fail(f"{name} read from the GPU's batch"))
    from_host = loss_and_grads(TINY, tokenizer, batch, layout)
    assert from_host[0] == read_back[0]
    for a, b in zip(from_host[1], read_back[1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # The layout is what the loss goes by: supervised positions of other labels give another loss.
    other = replace(layout, supervised=layout.supervised[::2])
    assert loss_and_grads(TINY, tokenizer, batch, other)[0] != pytest.approx(read_back[0], rel=1e-3)


def test_the_fused_head_is_no_parameter_and_counts_stay(tokenizer) -> None:
    fused, info = load_model(TINY, LORA, tokenizer, torch.device("cpu"))
    _, plain_info = load_model(replace(TINY, fused_loss=False), LORA, tokenizer, torch.device("cpu"))
    assert isinstance(fused.get_base_model().get_output_embeddings(), DeferredHead)
    assert "lm_head.weight" not in "".join(name for name, _ in fused.named_parameters())
    assert info == plain_info  # the FLOP formula still counts the head


def test_autocast_keeps_adapters_and_gradients_fp32(tokenizer) -> None:
    cfg = replace(TINY, dtype="bf16")
    batch = batch_for(len(tokenizer))
    torch.manual_seed(0)
    model, _ = load_model(cfg, LORA, tokenizer, torch.device("cpu"))
    assert forward_plan(model).autocast_dtype == torch.bfloat16
    loss, n = forward_loss(model, batch, "sdpa")
    (loss / n).backward()
    adapters = [p for p in model.parameters() if p.requires_grad]
    assert adapters and all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in adapters)
    # Against the fp32 model, the bf16 model is as close with autocast as with PEFT's upcast: gradients within
    # bf16 noise (a broken path is off by ~100 %), loss within 1 %.
    reference = loss_and_grads(TINY, tokenizer, batch)
    for variant in (cfg, replace(cfg, autocast=False)):
        found = loss_and_grads(variant, tokenizer, batch)
        assert found[0] == pytest.approx(reference[0], rel=1e-2)
        for a, b in zip(found[1], reference[1], strict=True):
            assert float((a - b).norm() / b.norm()) < 0.2
    assert forward_plan(load_model(TINY, LORA, tokenizer, torch.device("cpu"))[0]).autocast_dtype is None


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="torch.compile on a CPU needs a C compiler")
def test_compiled_layers_give_the_eager_loss_and_gradients(tokenizer) -> None:
    batch = batch_for(len(tokenizer))
    compiled = loss_and_grads(replace(TINY, compile=True), tokenizer, batch)
    eager = loss_and_grads(TINY, tokenizer, batch)
    assert compiled[0] == pytest.approx(eager[0], rel=1e-5)
    for a, b in zip(compiled[1], eager[1], strict=True):
        # fp32 sums in another order (inductor's kernels, the fused q/k/v GEMMs): errors of about 5e-6 of a
        # gradient's largest element, measured; a wrong gradient is off by its own size.
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5 * float(b.abs().max()))


def test_flex_attention_is_refused_off_cuda(tokenizer) -> None:
    with pytest.raises(ValueError, match="flex_attention trains on CUDA GPUs only"):
        load_model(replace(TINY, attn_implementation="flex_attention"), LORA, tokenizer, torch.device("cpu"))


@pytest.mark.parametrize("attn", ["flash_attention_2", "flash_attention_3"])
def test_flash_attention_is_refused_off_cuda_before_the_model_is_built(attn: str, tokenizer) -> None:
    with pytest.raises(ValueError, match=f"model.attn_implementation: {attn} runs on CUDA GPUs only, this is cpu"):
        load_model(replace(TINY, attn_implementation=attn), LORA, tokenizer, torch.device("cpu"))


def varlen_stand_in(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Flash attention's varlen path as plain torch (this CPU has no flash attention): causal attention inside
    each document of the rows laid end to end, whose boundaries it must be given, as the real kernels must."""
    cu = kwargs["cu_seq_lens_q"]
    b, heads, s, d = query.shape
    q, k, v = (t.transpose(1, 2).reshape(b * s, t.shape[1], d) for t in (query, key, value))
    out = torch.empty_like(q)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        ks, vs = (t.repeat_interleave(heads // t.shape[0], 0) for t in (ks, vs))
        out[start:end] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scaling).transpose(0, 1)
    return out.reshape(b, s, heads, d), None


def test_packed_rows_reach_flash_attention_as_documents(tokenizer, monkeypatch) -> None:
    # Two packed rows: transformers finds documents from position_ids for one row only, so forward_loss must pass
    # their boundaries; without them the stand-in fails, and the real kernels would attend across documents.
    from transformers import AttentionInterface

    monkeypatch.setitem(AttentionInterface._global_mapping, "gpucert_varlen_stand_in", varlen_stand_in)
    batch = batch_for(len(tokenizer))
    masked = loss_and_grads(TINY, tokenizer, batch)  # SDPA with the block-causal mask
    torch.manual_seed(0)
    model, _ = load_model(TINY, LORA, tokenizer, torch.device("cpu"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    model.get_base_model().config._attn_implementation = "gpucert_varlen_stand_in"
    loss, n = forward_loss(model, batch, "flash_attention_3")
    (loss / n).backward()
    assert float(loss.detach()) == pytest.approx(masked[0], rel=1e-6)
    for a, b in zip([p.grad for p in model.parameters() if p.requires_grad], masked[1], strict=True):
        # fp32 sums in another order (each document apart): ~5e-6 of the largest element, measured.
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5 * float(b.abs().max()))
