"""gpucert's FlashAttention-3 path (finetune/model/flash.py) on the tiny model, against SDPA with its masks.

This CPU has no FlashAttention-3: a stand-in `flash_attn_interface` module computes what its two kernels compute
(causal attention on [b, s, heads, d], grouped-query heads, documents of the rows laid end to end), so what is
tested is gpucert's glue: the model built with it, the layout, the documents of packed rows, the refusals.
tests/gpu/test_finetune.py runs the real kernels on the lent H100.
"""

from __future__ import annotations

import sys
import types
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from tests.finetune.packed_rows import packed_batch

from gpucert.finetune.config import DataConfig, LoraConfig, ModelConfig
from gpucert.finetune.data.packing import row_layout
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.model import flash
from gpucert.finetune.model import lora as model_module
from gpucert.finetune.model.lora import forward_loss, load_base_model

TINY = ModelConfig(name="tiny", dtype="fp32", attn_implementation="sdpa")
LORA = LoraConfig(r=8, alpha=16, dropout=0.0)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, causal: bool) -> torch.Tensor:
    """[s, heads, d] in and out, k and v with fewer heads."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v)), is_causal=causal, scale=scale)
    return out.transpose(0, 1)


def fake_flash_attn_func(q, k, v, softmax_scale=None, causal=False, **_):
    return torch.stack([attend(q[i], k[i], v[i], softmax_scale, causal) for i in range(q.shape[0])])


def fake_flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False, **_):
    # max_q/k bound the documents' length (the rows' length), as the real kernels take it.
    assert torch.equal(cu_q, cu_k) and max_q == max_k >= int((cu_q[1:] - cu_q[:-1]).max())
    out = torch.empty_like(q)
    for start, end in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
        out[start:end] = attend(q[start:end], k[start:end], v[start:end], softmax_scale, causal)
    return out


@pytest.fixture
def kernels(monkeypatch):
    module = types.ModuleType("flash_attn_interface")
    module.flash_attn_func = fake_flash_attn_func  # type: ignore[attr-defined]
    module.flash_attn_varlen_func = fake_flash_attn_varlen_func  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn_interface", module)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY, DataConfig())


def loss_of(attn: str, batch: dict[str, torch.Tensor], tokenizer, layout=None) -> tuple[float, torch.Tensor]:
    model = load_base_model(replace(TINY, attn_implementation=attn), len(tokenizer), torch.device("cpu"))
    embed = model.get_input_embeddings().weight
    embed.requires_grad_(True)
    loss, n = forward_loss(model, batch, attn, layout)
    (loss / n).backward()
    return float(loss.detach()), embed.grad


# One document a row, packed rows, packed rows with a padding document: what each path is checked on.
DOCUMENT_LAYOUTS = pytest.mark.parametrize(
    "documents",
    [[[16], [16]], [[7, 9], [12, 4]], [[5, 6, 5], [10]]],
    ids=["one-document-a-row", "packed", "packed-and-padded"],
)


def assert_trains_as_sdpa(attn: str, documents: list[list[int]], tokenizer) -> None:
    """The loss and the embedding's gradient of the tiny model with `attn`, against SDPA with its masks."""
    batch = packed_batch(len(tokenizer), documents, seed=3)
    found = loss_of(attn, batch, tokenizer)
    expected = loss_of("sdpa", batch, tokenizer)
    assert found[0] == pytest.approx(expected[0], rel=1e-6)
    torch.testing.assert_close(found[1], expected[1], rtol=1e-4, atol=2e-5 * float(expected[1].abs().max()))


@DOCUMENT_LAYOUTS
def test_the_flash_attention_3_path_trains_as_sdpa_with_its_masks(documents, tokenizer, kernels) -> None:
    assert_trains_as_sdpa("flash_attention_3", documents, tokenizer)


def test_the_documents_come_from_the_host_s_row_layout(tokenizer, kernels, monkeypatch) -> None:
    # The trainer's step passes each micro-batch's layout, worked out from its host copy: the forward then finds
    # no documents in the GPU's position_ids (which waits for the GPU), and gives the same loss and gradients.
    batch = packed_batch(len(tokenizer), [[5, 6, 5], [10]], seed=3)
    expected = loss_of("flash_attention_3", batch, tokenizer)
    monkeypatch.setattr(model_module, "flash_documents", lambda *_: pytest.fail("documents read from the GPU"))
    found = loss_of("flash_attention_3", batch, tokenizer, row_layout(batch))
    assert found[0] == expected[0]
    torch.testing.assert_close(found[1], expected[1], rtol=0, atol=0)


def test_the_model_is_built_with_gpucerts_attention(tokenizer) -> None:
    model = load_base_model(replace(TINY, attn_implementation="flash_attention_3"), len(tokenizer), torch.device("cpu"))
    assert model.config._attn_implementation == flash.KEY


def test_what_the_kernels_cannot_do_is_refused(kernels) -> None:
    q, kv = torch.zeros(1, 4, 8, 16), torch.zeros(1, 2, 8, 16)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match=r"no attention dropout, the model asks for 0\.1"):
        flash.flash3_attention(module, q, kv, kv, None, dropout=0.1)
    with pytest.raises(ValueError, match=r"sliding window \(4 tokens\) is shorter than a document may be \(rows of 8"):
        flash.flash3_attention(module, q, kv, kv, None, sliding_window=4)
    with pytest.raises(ValueError, match="takes unpadded rows"):
        flash.flash3_attention(module, q, kv, kv, torch.ones(1, 8))
    out, weights = flash.flash3_attention(module, q, kv, kv, None, sliding_window=8)
    assert out.shape == (1, 8, 4, 16) and weights is None


# --- torch's varlen attention (`model.attn_implementation: varlen`) ---------------------------------------------
# varlen_attn runs on CUDA only: stand-ins with each of its two signatures compute what it computes, so what is
# tested here is gpucert's glue (tests/gpu/test_finetune.py runs the real kernels).


def fake_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1), **kw):
    """torch >= 2.11's signature: window_size (-1, 0) is causal, enable_gqa for fewer k/v heads."""
    assert window_size in ((-1, 0), (-1, -1)) and (kw.get("enable_gqa") or query.shape[1] == key.shape[1])
    causal = window_size == (-1, 0)
    return fake_flash_attn_varlen_func(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, causal)


def fake_varlen_attn_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    """torch 2.10's signature: is_causal, no scale, k and v with q's heads."""
    assert query.shape[1] == key.shape[1], "torch 2.10's varlen_attn takes no grouped-query heads"
    return fake_flash_attn_varlen_func(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, None, is_causal)


@pytest.fixture(params=[fake_varlen_attn, fake_varlen_attn_2_10], ids=["signature-2.11", "signature-2.10"])
def varlen_kernel(request, monkeypatch):
    from torch.nn.attention import varlen

    monkeypatch.setattr(varlen, "varlen_attn", request.param)
    monkeypatch.setattr(flash, "VARLEN_PARAMETERS", frozenset())  # register() reads the stand-in's
    return request.param


@DOCUMENT_LAYOUTS
def test_the_varlen_path_trains_as_sdpa_with_its_masks(documents, tokenizer, varlen_kernel) -> None:
    assert_trains_as_sdpa("varlen", documents, tokenizer)


def test_the_varlen_model_is_built_with_gpucerts_attention_and_refuses_what_it_cannot_do(tokenizer) -> None:
    model = load_base_model(replace(TINY, attn_implementation="varlen"), len(tokenizer), torch.device("cpu"))
    assert model.config._attn_implementation == flash.VARLEN_KEY
    q, kv = torch.zeros(1, 4, 8, 16), torch.zeros(1, 2, 8, 16)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match=r"varlen: these kernels have no attention dropout, the model asks for 0\.1"):
        flash.varlen_attention(module, q, kv, kv, None, dropout=0.1)
    with pytest.raises(ValueError, match="varlen takes unpadded rows"):
        flash.varlen_attention(module, q, kv, kv, torch.ones(1, 8))
    with pytest.raises(ValueError, match=r"model\.attn_implementation: varlen runs on CUDA GPUs only, this is cpu"):
        model_module.check_attention("varlen", torch.device("cpu"))


def test_a_scale_torch_2_10_cannot_take_is_refused(monkeypatch) -> None:
    from torch.nn.attention import varlen

    monkeypatch.setattr(varlen, "varlen_attn", fake_varlen_attn_2_10)
    monkeypatch.setattr(flash, "VARLEN_PARAMETERS", frozenset())  # read from the stand-in
    q = torch.zeros(8, 2, 16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    refused = r"takes no scale and the model scales its scores by 0\.5, not 1/sqrt\(16\)"
    with pytest.raises(ValueError, match=refused):
        flash.torch_varlen(q, q, q, cu, cu, 8, 8, 0.5, True)
    assert flash.torch_varlen(q, q, q, cu, cu, 8, 8, 0.25, True).shape == q.shape  # 1/sqrt(16): its own


@torch.library.custom_op("gpucert_test::varlen_attn", mutates_args=())
def varlen_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_q: int, causal: bool
) -> torch.Tensor:
    """The stand-in as one operator, as torch's own varlen_attn is: torch.compile puts it in the graph whole
    instead of tracing its per-document loop."""
    return fake_flash_attn_varlen_func(q, k, v, cu, cu, max_q, max_q, None, causal)


@varlen_op.register_fake
def _(q, k, v, cu, max_q, causal):
    return torch.empty_like(q)


def compiled_varlen_attn(query, key, value, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), **_):
    """torch >= 2.11's signature, on the operator above (the tiny model's scale is its own: 1/sqrt(d))."""
    return varlen_op(query, key, value, cu_q, max_q, window_size == (-1, 0))


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches empty before and after, also when the test fails: the compiled code hangs on the
    decoder layer's forward, which the other tests on this worker run too."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_micro_batches_of_other_documents_run_the_layers_compiled_once(tokenizer, monkeypatch, fresh_dynamo) -> None:
    # Each micro-batch packs another number of documents, the longest of another length. Under torch.compile
    # neither may be a constant the layers' graph guards on: each new one compiled every layer again, forward and
    # backward (the speed recipe's first step on the H100: 22.7 s instead of 2.1). A counter as the compile
    # backend counts the forward graphs dynamo compiles (the backward's follow them).
    from torch._dynamo.testing import CompileCounter
    from torch.nn.attention import varlen

    monkeypatch.setattr(varlen, "varlen_attn", compiled_varlen_attn)
    monkeypatch.setattr(flash, "VARLEN_PARAMETERS", frozenset(["window_size", "scale", "enable_gqa"]))
    counter = CompileCounter()
    model = load_base_model(replace(TINY, attn_implementation="varlen"), len(tokenizer), torch.device("cpu"))
    for layer in model.model.layers:
        layer.compile(backend=counter)
    graphs = []
    # 4 documents, the longest 12; then 5, the longest 10; then 3 (the padding one of 4 tokens), the longest 16.
    for documents in ([[7, 9], [12, 4]], [[5, 6, 5], [10]], [[16], [12]]):
        batch = packed_batch(len(tokenizer), documents, seed=3)
        with torch.no_grad():
            forward_loss(model, batch, "varlen", row_layout(batch))
        graphs.append(counter.frame_count)
    assert graphs[0] >= 1 and graphs == [graphs[0]] * 3, f"graphs compiled after each micro-batch: {graphs}"


def test_a_sliding_window_shorter_than_the_rows_is_refused_when_the_model_loads() -> None:
    from transformers import MistralConfig, Qwen2Config

    # Mistral applies its window in every layer; Qwen2 only where use_sliding_window makes layers sliding.
    with pytest.raises(ValueError, match=r"sliding window \(2048 tokens\) is shorter than data\.max_length \(4096\)"):
        model_module.check_window(MistralConfig(sliding_window=2048), "varlen", 4096)
    model_module.check_window(MistralConfig(sliding_window=4096), "varlen", 4096)
    model_module.check_window(MistralConfig(sliding_window=2048), "flash_attention_2", 4096)  # passes it on
    model_module.check_window(Qwen2Config(sliding_window=2048, use_sliding_window=False), "varlen", 4096)
    windowed = Qwen2Config(sliding_window=2048, use_sliding_window=True, max_window_layers=0, num_hidden_layers=2)
    with pytest.raises(ValueError, match="flash_attention_3: the model's sliding window"):
        model_module.check_window(windowed, "flash_attention_3", 4096)
