"""Packing, collation and document masking: a packed batch trains exactly like its documents one by one."""

from __future__ import annotations

import random

import pytest
import torch
from tools.sample_data import generate_rows

from gpucert.finetune.config import DataConfig, ModelConfig
from gpucert.finetune.data.glaive import parse_rows
from gpucert.finetune.data.packing import (
    additive_mask,
    attention_mask_for,
    best_fit_decreasing,
    block_causal_mask,
    collate,
    flash_documents,
    pack,
    row_layout,
)
from gpucert.finetune.data.template import IGNORE_INDEX, check_supervised, render
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.model.lora import tiny_config


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(ModelConfig(name="tiny"), DataConfig())


@pytest.fixture(scope="module")
def sample(tokenizer):
    conversations, _ = parse_rows(generate_rows(80, 5))
    return conversations, [render(tokenizer, c) for c in conversations]


def doc(n: int, supervised_from: int = 1) -> tuple[list[int], list[int]]:
    ids = list(range(10, 10 + n))
    return ids, [IGNORE_INDEX if i < supervised_from else t for i, t in enumerate(ids)]


def test_best_fit_decreasing_fills_the_fullest_bin_that_fits() -> None:
    assert best_fit_decreasing([5, 4, 3, 3, 2, 2, 1], 8) == [[0, 2], [1, 3, 6], [4, 5]]
    rng = random.Random(0)
    lengths = [rng.randint(1, 100) for _ in range(500)]
    bins = best_fit_decreasing(lengths, 128)
    assert sorted(i for b in bins for i in b) == list(range(500))
    assert all(sum(lengths[i] for i in b) <= 128 for b in bins)
    assert sum(lengths) / (len(bins) * 128) > 0.9
    with pytest.raises(ValueError, match="capacity"):
        best_fit_decreasing([9], 8)


def test_pack_resets_positions_and_applies_the_first_token_rule() -> None:
    rows, stats = pack([doc(5, 0), doc(3, 0), doc(4, 0)], max_length=8)
    assert [r["seq_lengths"] for r in rows] == [[5, 3], [4]]
    assert rows[0]["position_ids"] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert [r["labels"][p] for r in rows for p, pos in enumerate(r["position_ids"]) if pos == 0] == [IGNORE_INDEX] * 3
    assert (stats.documents, stats.rows, stats.tokens, stats.supervised_tokens) == (3, 2, 12, 9)


def test_pack_truncates_and_drops_what_has_no_supervision_left() -> None:
    docs = [doc(12, supervised_from=3), doc(12, supervised_from=10), doc(4)]
    rows, stats = pack(docs, max_length=8)
    assert (stats.truncated, stats.dropped, stats.documents) == (2, 1, 3)
    assert sorted(r["seq_lengths"] for r in rows) == [[4], [8]]
    assert all(len(r["input_ids"]) <= 8 for r in rows)


def test_without_packing_each_document_is_its_own_row() -> None:
    rows, stats = pack([doc(5), doc(3), doc(4)], max_length=8, packing=False)
    assert [r["seq_lengths"] for r in rows] == [[5], [3], [4]] and stats.rows == 3


def test_collate_pads_as_a_separate_document() -> None:
    rows, _ = pack([doc(5), doc(2), doc(4)], max_length=8)
    batch = collate(rows, pad_id=0)
    assert batch["input_ids"].shape == (2, 7) and batch["input_ids"].dtype == torch.long
    assert batch["num_tokens"].tolist() == [7, 4]
    assert batch["position_ids"][1].tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert batch["labels"][1, 4:].tolist() == [IGNORE_INDEX] * 3
    assert batch["input_ids"][1, 4:].tolist() == [0, 0, 0]
    assert collate(rows, pad_id=0, pad_to=16)["input_ids"].shape == (2, 16)


def test_block_causal_mask() -> None:
    mask = block_causal_mask(torch.tensor([[0, 1, 2, 0, 1]]))
    assert mask.shape == (1, 1, 5, 5) and mask.dtype == torch.bool
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool
    )
    assert torch.equal(mask[0, 0], expected)
    bias = additive_mask(mask, torch.float32)
    assert bias[0, 0, 3, 0] == torch.finfo(torch.float32).min and bias[0, 0, 4, 3] == 0
    assert attention_mask_for(torch.tensor([[0, 1]]), "flash_attention_2", torch.bfloat16) is None
    assert attention_mask_for(torch.tensor([[0, 1, 0]]), "flash_attention_3", torch.bfloat16) is None


def test_flash_attention_gets_each_document_of_the_rows_laid_end_to_end() -> None:
    # Row 0 packs documents of 3 and 2 tokens, row 1 one of 4 and its padding (a document of its own).
    documents = flash_documents(torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]))
    assert documents["cu_seq_lens_q"].tolist() == [0, 3, 5, 9, 10] and documents["cu_seq_lens_q"].dtype == torch.int32
    assert documents["cu_seq_lens_k"] is documents["cu_seq_lens_q"]
    # A bound on a document's length: the rows' length, the same for every micro-batch (torch.compile guards on it).
    assert documents["max_length_q"] == documents["max_length_k"] == 5
    assert flash_documents(torch.arange(6).expand(2, 6)) == {}  # one document a row: plain causal kernels
    assert attention_mask_for(torch.tensor([[0, 1, 0]]), "flex_attention", torch.bfloat16) is None


def test_a_row_layout_holds_what_the_forward_would_read_back_and_moves_as_one() -> None:
    batch = collate(
        [
            {"input_ids": [5, 6, 7, 8, 9], "labels": [-100, 6, -100, 8, 9], "position_ids": [0, 1, 2, 0, 1]},
            {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "position_ids": [0, 1, 2]},
        ],
        pad_id=0,
    )
    layout = row_layout(batch)
    assert not layout.single_documents
    assert layout.documents["cu_seq_lens_q"].tolist() == [0, 3, 5, 8, 10]  # row 1: 3 tokens, then 2 of padding
    assert layout.documents["max_length_q"] == 5  # the rows' length
    # Positions of rows without their last, laid end to end (4 a row), whose next label counts.
    assert layout.supervised.tolist() == [0, 2, 3, 4, 5]
    # To another device (meta: no data, but new tensors), cu_seq_lens_q and _k stay one tensor.
    moved = layout.to(torch.device("meta"), non_blocking=True)
    assert moved.documents["cu_seq_lens_k"].is_meta and moved.supervised.is_meta
    assert moved.documents["cu_seq_lens_k"] is moved.documents["cu_seq_lens_q"]
    assert moved.supervised.shape == layout.supervised.shape and moved.documents["max_length_q"] == 5
    single = row_layout({"input_ids": torch.ones(2, 4, dtype=torch.long), "labels": torch.ones(2, 4, dtype=torch.long)})
    assert single.single_documents and single.documents == {} and single.supervised.tolist() == list(range(6))


def test_sdpa_gets_no_mask_only_when_every_row_is_one_whole_document() -> None:
    # No mask lets SDPA run plain causal attention (its flash kernel); any second document or padding needs one.
    assert attention_mask_for(torch.tensor([[0, 1, 2], [0, 1, 2]]), "sdpa", torch.float32) is None
    assert attention_mask_for(torch.tensor([[0, 1, 2], [0, 1, 0]]), "sdpa", torch.float32) is not None
    assert attention_mask_for(torch.tensor([[0, 1, 2]]), "eager", torch.float32) is not None


def _tiny_qwen2(vocab_size: int, attn: str):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(tiny_config(vocab_size, attn)).eval()


def _loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    # Causal LM loss: position t predicts label t + 1; summed so documents weigh by their supervised tokens.
    targets = labels[:, 1:].reshape(-1)
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).double(), targets, ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return loss, int((targets != IGNORE_INDEX).sum())


@pytest.fixture(scope="module")
def short_docs(sample):
    return [d for d in sample[1] if len(d[0]) < 300][:10]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_batch_loss_equals_the_documents_one_by_one(tokenizer, short_docs, attn: str) -> None:
    model = _tiny_qwen2(len(tokenizer), attn)
    rows, _ = pack(short_docs, max_length=512)
    assert any(len(r["seq_lengths"]) > 1 for r in rows)  # documents really share rows
    batch = collate(rows, pad_id=tokenizer.pad_token_id)
    mask = attention_mask_for(batch["position_ids"], attn, torch.float32)
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=mask,
            labels=batch["labels"],
        )
        packed_sum, packed_count = _loss_sum(out.logits, batch["labels"])
        solo_sum, solo_count = torch.zeros((), dtype=torch.float64), 0
        for input_ids, labels in short_docs:
            logits = model(input_ids=torch.tensor([input_ids])).logits
            loss, count = _loss_sum(logits, torch.tensor([labels]))
            solo_sum, solo_count = solo_sum + loss, solo_count + count
    assert packed_count == solo_count > 0
    solo = solo_sum.item() / solo_count
    assert abs(packed_sum.item() / packed_count - solo) < 1e-5
    # The model's own loss (mean over the batch's supervised tokens) agrees.
    assert abs(out.loss.item() - solo) < 1e-5


def test_without_the_document_mask_the_loss_differs(tokenizer, short_docs) -> None:
    # Guards the test above: a plain causal mask over packed rows lets documents see each other.
    model = _tiny_qwen2(len(tokenizer), "sdpa")
    rows, _ = pack(short_docs, max_length=512)
    batch = collate(rows, pad_id=tokenizer.pad_token_id)
    causal = torch.ones(batch["input_ids"].shape[1], batch["input_ids"].shape[1], dtype=torch.bool).tril()
    with torch.no_grad():
        documents = model(
            **{k: batch[k] for k in ("input_ids", "position_ids", "labels")},
            attention_mask=block_causal_mask(batch["position_ids"]),
        ).loss
        leaky = model(
            **{k: batch[k] for k in ("input_ids", "position_ids", "labels")},
            attention_mask=causal.expand(len(rows), 1, -1, -1),
        ).loss
    assert abs(documents.item() - leaky.item()) > 1e-3


def test_masks_survive_tokenize_truncate_pack_and_collate(tokenizer, sample) -> None:
    conversations, docs = sample
    max_length = 300
    rows, stats = pack(docs, max_length=max_length)
    assert stats.truncated > 0  # the path through truncation is exercised
    batch = collate(rows, pad_id=tokenizer.pad_token_id)
    by_prefix = {
        tuple(ids[:max_length]): (conv, ids, labels) for conv, (ids, labels) in zip(conversations, docs, strict=True)
    }
    seen = 0
    for b in range(len(rows)):
        starts = (batch["position_ids"][b] == 0).nonzero().flatten().tolist()
        n = int(batch["num_tokens"][b])
        for start, end in zip(starts, [*starts[1:], n], strict=True):
            if start >= n:
                break  # padding
            ids = batch["input_ids"][b, start:end].tolist()
            labels = batch["labels"][b, start:end].tolist()
            conv, full_ids, full_labels = by_prefix[tuple(ids)]
            assert labels == [IGNORE_INDEX, *full_labels[1 : len(ids)]]
            check_supervised(tokenizer, ids, labels, conv, complete=len(full_ids) <= max_length)
            seen += 1
    assert seen == stats.documents - stats.dropped
