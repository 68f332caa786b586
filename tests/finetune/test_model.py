"""The LoRA model on CPU: parameter counts by hand, document-masked loss, checkpointing, merging."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from peft import PeftModel

from gpucert.finetune.config import DataConfig, LoraConfig, ModelConfig
from gpucert.finetune.data.packing import collate
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.model.lora import (
    forward_loss,
    load_base_model,
    load_model,
    merge_adapter,
    saved_adapter_on,
    supervised_count,
    tiny_config,
)

TINY = ModelConfig(name="tiny", dtype="fp32", attn_implementation="sdpa")
LORA = LoraConfig(r=8, alpha=16, dropout=0.0)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY, DataConfig())


def documents(vocab: int, lengths: list[int], seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) per document: random tokens, the second half supervised, position 0 never."""
    g = torch.Generator().manual_seed(seed)
    docs = []
    for n in lengths:
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        labels = [-100] * (n // 2) + ids[n // 2 :]
        labels[0] = -100
        docs.append((ids, labels))
    return docs


def row_of(docs: list[tuple[list[int], list[int]]]) -> dict[str, list[int]]:
    row: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": []}
    for ids, labels in docs:
        row["input_ids"] += ids
        row["labels"] += labels
        row["position_ids"] += list(range(len(ids)))
    return row


def trained_a_little(model: torch.nn.Module, batch: dict[str, torch.Tensor], attn: str = "sdpa") -> None:
    """A few AdamW steps, so lora_B is no longer zero and the adapter changes the outputs."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        loss, n = forward_loss(model, batch, attn)
        (loss / n).backward()
        opt.step()
        opt.zero_grad()


def test_the_adapters_are_drawn_on_the_models_device(
    tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PEFT builds each adapter on the default device and copies it to its base layer's afterwards: built on
    the CPU for a GPU model, r64 on a 7B model took 1.9-6.4 s of random draws and copies where 0.2-0.4 s do on
    the GPU (an H200, 2026-11-28, tools/model_load_time.py). The meta device stands in for the GPU here: every
    adapter init must be drawn on the model's device, none on the CPU and copied over."""
    r = 8  # no dimension of the tiny model: what is drawn with r in its shape is an adapter
    drawn: list[str] = []
    kaiming = torch.nn.init.kaiming_uniform_

    def spy(*args, **kwargs):
        weight = args[0] if args else kwargs["tensor"]
        if r in weight.shape:
            drawn.append(weight.device.type)
        return kaiming(*args, **kwargs)

    monkeypatch.setattr(torch.nn.init, "kaiming_uniform_", spy)
    model, _ = load_model(replace(TINY, dtype="bf16"), LoraConfig(r=r, alpha=16, dropout=0.0), tokenizer,
                          torch.device("meta"))  # fmt: skip
    lora = {p.device.type for name, p in model.named_parameters() if "lora_" in name}
    assert drawn and set(drawn) == {"meta"} and lora == {"meta"}, (sorted(set(drawn)), lora)

    # A saved adapter (gpucert evaluate, the merge) is built on its base's device before its weights load.
    model, _ = load_model(TINY, LoraConfig(r=r, alpha=16, dropout=0.0), tokenizer, torch.device("cpu"))
    model.save_pretrained(str(tmp_path / "adapter"))
    drawn.clear()
    base = load_base_model(replace(TINY, dtype="bf16"), len(tokenizer), torch.device("meta"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "copying from a non-meta parameter ... is a no-op": meant here
        loaded = saved_adapter_on(base, tmp_path / "adapter")
    lora = {p.device.type for name, p in loaded.named_parameters() if "lora_" in name}
    assert drawn and set(drawn) == {"meta"} and lora == {"meta"}, (sorted(set(drawn)), lora)


def test_a_saved_adapter_loads_without_transformers_deprecation_warning(tokenizer, tmp_path: Path) -> None:
    """peft 0.21 reads `is_gradient_checkpointing`, deprecated in transformers 5.2x: every `gpucert evaluate`
    printed the FutureWarning until the load was quieted as load_model's is."""
    model, _ = load_model(TINY, LoraConfig(r=8, alpha=16, dropout=0.0), tokenizer, torch.device("cpu"))
    model.save_pretrained(str(tmp_path / "adapter"))
    base = load_base_model(TINY, len(tokenizer), torch.device("cpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        saved_adapter_on(base, tmp_path / "adapter")
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]


def test_tiny_counts_match_a_hand_count(tokenizer) -> None:
    torch.manual_seed(0)
    model, info = load_model(TINY, LoraConfig(r=8, alpha=16, dropout=0.0), tokenizer, torch.device("cpu"))
    vocab, d, kv, ffn, layers = len(tokenizer), 64, 2 * 16, 172, 2
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * ffn  # q, k+v, o, gate+up+down
    lora_per_layer = 8 * ((d + d) + 2 * (d + kv) + (d + d) + 2 * (d + ffn) + (ffn + d))
    assert info.matmul_params == layers * per_layer + d * vocab  # lm_head in, embedding out
    assert info.lm_head_params == d * vocab
    assert info.lora_params == info.trainable_params == layers * lora_per_layer == 18_496
    biases, norms = layers * (d + 2 * kv), layers * 2 * d + d
    assert info.total_params == info.matmul_params + d * vocab + biases + norms + info.lora_params
    assert (info.layers, info.heads, info.kv_heads, info.head_dim, info.vocab_size) == (2, 4, 2, 16, vocab)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == info.trainable_params


def test_tiny_weights_do_not_depend_on_the_global_seed(tokenizer) -> None:
    torch.manual_seed(1)
    a = load_base_model(TINY, len(tokenizer), torch.device("cpu"))
    torch.manual_seed(2)
    b = load_base_model(TINY, len(tokenizer), torch.device("cpu"))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_random_init_from_a_config_only_directory(tokenizer, tmp_path: Path) -> None:
    tiny_config(len(tokenizer)).save_pretrained(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    cfg = ModelConfig(name=str(tmp_path), random_init=True, dtype="bf16")
    _, info = load_model(cfg, LORA, tokenizer, torch.device("cpu"))
    _, tiny_info = load_model(replace(TINY, dtype="bf16"), LORA, tokenizer, torch.device("cpu"))
    assert info == tiny_info
    assert json.loads((tmp_path / "config.json").read_text())["hidden_size"] == 64


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@torch.no_grad()
def test_packed_loss_equals_documents_run_one_by_one(tokenizer, attn: str) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(name="tiny", dtype="fp32", attn_implementation=attn)
    model, _ = load_model(cfg, LORA, tokenizer, torch.device("cpu"))
    model.eval()
    docs = documents(len(tokenizer), [7, 12, 5])
    packed_loss, packed_n = forward_loss(model, collate([row_of(docs)], tokenizer.pad_token_id), attn)
    alone = [forward_loss(model, collate([row_of([d])], tokenizer.pad_token_id), attn) for d in docs]
    assert int(packed_n) == sum(int(n) for _, n in alone) == sum(sum(x != -100 for x in lab[1:]) for _, lab in docs)
    assert float(packed_loss) == pytest.approx(sum(float(s) for s, _ in alone), rel=1e-5)
    # Padding a batch adds no loss and no supervised token.
    padded = collate([row_of(docs), row_of(docs[:1])], tokenizer.pad_token_id)
    padded_loss, padded_n = forward_loss(model, padded, attn)
    assert int(padded_n) == int(packed_n) + int(alone[0][1])
    assert float(padded_loss) == pytest.approx(float(packed_loss) + float(alone[0][0]), rel=1e-5)


def test_loss_is_summed_in_fp32_for_a_bf16_model(tokenizer) -> None:
    model, _ = load_model(ModelConfig(name="tiny", dtype="bf16"), LORA, tokenizer, torch.device("cpu"))
    loss, n = forward_loss(model, collate([row_of(documents(len(tokenizer), [9]))], 0), "sdpa")
    assert loss.dtype == torch.float32
    assert n.dtype == torch.int64


def test_supervised_count_skips_the_first_column() -> None:
    labels = torch.tensor([[5, -100, 7, 8], [-100, 1, -100, -100]])
    assert int(supervised_count(labels)) == 3


def test_gradient_checkpointing_changes_neither_loss_nor_gradients(tokenizer) -> None:
    batch = collate([row_of(documents(len(tokenizer), [10, 14]))], tokenizer.pad_token_id)
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        cfg = ModelConfig(name="tiny", dtype="fp32", gradient_checkpointing=checkpointing)
        model, _ = load_model(cfg, LORA, tokenizer, torch.device("cpu"))
        model.train()
        trained_a_little(model, batch)
        loss, n = forward_loss(model, batch, "sdpa")
        (loss / n).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        results.append((float(loss.detach()), grads))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-5)
    for off, on in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(on, off, rtol=1e-5, atol=1e-7)


def test_merged_model_gives_the_adapter_outputs(tokenizer, tmp_path: Path) -> None:
    torch.manual_seed(0)
    # The plain head, so the training model's outputs are logits to compare.
    model, _ = load_model(replace(TINY, fused_loss=False), LORA, tokenizer, torch.device("cpu"))
    batch = collate([row_of(documents(len(tokenizer), [16]))], tokenizer.pad_token_id)
    trained_a_little(model, batch)
    model.save_pretrained(str(tmp_path / "adapter"))
    merged_dir = merge_adapter(TINY, tokenizer, tmp_path / "adapter", tmp_path / "merged")
    assert merged_dir is not None and (merged_dir / "config.json").is_file()
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir))
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=batch["input_ids"]).logits
        found = merged(input_ids=batch["input_ids"]).logits
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-5)
    reloaded = PeftModel.from_pretrained(
        load_base_model(TINY, len(tokenizer), torch.device("cpu")), tmp_path / "adapter"
    )
    with torch.no_grad():
        # Not bit for bit: the training model runs q/k/v and gate/up as stacked GEMMs (fused.py), whose sums
        # round in another order than the reloaded model's one-by-one GEMMs; a wrong adapter is off by far more.
        torch.testing.assert_close(reloaded(input_ids=batch["input_ids"]).logits, expected, rtol=1e-4, atol=1e-5)
