"""Packing tokenized conversations into rows, collating rows into batches, and the document mask.

A packed row holds whole conversations ("documents") placed best-fit decreasing (TRL's default `bfd`), never cut
and wrapped across rows. `position_ids` restart at 0 at every document start, which is what separates documents:
`block_causal_mask` lets a token attend only to earlier tokens of its own document (SDPA/eager), and flash
and flex attention read the same boundaries from the position ids. The first-token rule
`labels[position_ids == 0] = -100` keeps a document from learning to predict the next one's first token.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gpucert.finetune.data.template import IGNORE_INDEX

Document = tuple[list[int], list[int]]  # (input_ids, labels)


@dataclass
class PackStats:
    documents: int = 0
    # Documents longer than max_length, cut to it (kept or dropped).
    truncated: int = 0
    # Truncated documents dropped because no supervised token was left.
    dropped: int = 0
    rows: int = 0
    tokens: int = 0
    supervised_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _fit(doc: Document, max_length: int) -> Document:
    input_ids, labels = doc[0][:max_length], list(doc[1][:max_length])
    labels[0] = IGNORE_INDEX  # the first-token rule, position 0 of every document
    return input_ids, labels


def _row(docs: list[Document]) -> dict[str, list[int]]:
    row: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": [], "seq_lengths": []}
    for input_ids, labels in docs:
        row["input_ids"] += input_ids
        row["labels"] += labels
        row["position_ids"] += range(len(input_ids))
        row["seq_lengths"].append(len(input_ids))
    return row


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins (lists of item indices) of total length <= capacity: longest item first, each into the fullest bin
    that still fits it. Deterministic: ties are broken by index."""
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (space left, bin index), sorted
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[index]
        if length > capacity:
            raise ValueError(f"item {index} has length {length} > capacity {capacity}; truncate first")
        slot = bisect.bisect_left(free, (length, -1))
        if slot < len(free):
            space, b = free.pop(slot)
        else:
            space, b = capacity, len(bins)
            bins.append([])
        bins[b].append(index)
        if space - length > 0:
            bisect.insort(free, (space - length, b))
    return bins


def pack(docs: Sequence[Document], max_length: int, packing: bool = True) -> tuple[list[dict[str, Any]], PackStats]:
    """Rows of at most max_length tokens: {"input_ids", "labels", "position_ids", "seq_lengths"} lists.
    Without packing each document is its own row. Longer documents are truncated to max_length and dropped when
    truncation leaves no supervised token."""
    stats = PackStats(documents=len(docs))
    kept: list[Document] = []
    for doc in docs:
        if not doc[0]:
            continue
        fitted = _fit(doc, max_length)
        if len(doc[0]) > max_length:
            stats.truncated += 1
            if all(label == IGNORE_INDEX for label in fitted[1]):
                stats.dropped += 1
                continue
        kept.append(fitted)
    if packing:
        bins = best_fit_decreasing([len(d[0]) for d in kept], max_length)
        rows = [_row([kept[i] for i in b]) for b in bins]
    else:
        rows = [_row([d]) for d in kept]
    stats.rows = len(rows)
    stats.tokens = sum(len(d[0]) for d in kept)
    stats.supervised_tokens = sum(sum(label != IGNORE_INDEX for label in d[1]) for d in kept)
    return rows, stats


def collate(rows: Sequence[dict[str, Any]], pad_id: int, pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Pad rows to the longest (or `pad_to`) into tensors: input_ids, labels, position_ids [b, s] (int64) and
    num_tokens [b] (tokens before padding). Padding has labels -100 and position ids 0, 1, 2, ...: a document
    of its own, so no real token attends to it and it attends to no real token."""
    width = max([len(r["input_ids"]) for r in rows] + [pad_to or 0])
    out = {
        "input_ids": torch.full((len(rows), width), pad_id, dtype=torch.long),
        "labels": torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long),
        "position_ids": torch.zeros((len(rows), width), dtype=torch.long),
        "num_tokens": torch.zeros(len(rows), dtype=torch.long),
    }
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        out["input_ids"][i, :n] = torch.as_tensor(row["input_ids"], dtype=torch.long)
        out["labels"][i, :n] = torch.as_tensor(row["labels"], dtype=torch.long)
        out["position_ids"][i, :n] = torch.as_tensor(row["position_ids"], dtype=torch.long)
        out["position_ids"][i, n:] = torch.arange(width - n)
        out["num_tokens"][i] = n
    return out


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """[b, 1, s, s] bool, True where query i may attend key j: same document (documents start where the
    position id is 0) and j <= i. SDPA takes it as is; eager attention needs `additive_mask`."""
    document = torch.cumsum(position_ids == 0, dim=1)
    same = document[:, :, None] == document[:, None, :]
    seq = position_ids.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=position_ids.device).tril()
    return (same & causal)[:, None]


def flash_documents(position_ids: torch.Tensor) -> dict[str, Any]:
    """Flash attention's document boundaries for packed rows, as the keyword arguments transformers passes to its
    varlen kernels (cu_seq_lens_q/k over all rows laid end to end; max_length_q/k a bound on a document's length,
    the rows' length); {} when each row is one document. transformers reads documents from position_ids itself
    only for a single row: with more rows and no boundaries, every document would attend to the ones before it
    in its row.

    The bound is the rows' length, not the longest document: the kernels take any bound (it sizes their grid; the
    blocks past a document's end return at once), and under torch.compile a new longest document in every
    micro-batch was a new integer to guard on: the speed recipe's first step recompiled its layers twice, 22.7 s
    against 2.1 (one H100, 2026-11-28). `compiled_documents` makes the number of documents dynamic too."""
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().squeeze(1)  # every row starts a document (collate: padding is one too)
    if starts.numel() == position_ids.shape[0]:
        return {}
    cu = torch.cat([starts, starts.new_tensor([flat.numel()])]).to(torch.int32)
    bound = position_ids.shape[1]
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": bound, "max_length_k": bound}


def compiled_documents(documents: dict[str, Any]) -> dict[str, Any]:
    """`documents` (flash_documents, on the forward's device) with the number of boundaries marked dynamic for
    torch.compile: each micro-batch packs another number of documents, and a size first seen as a constant is
    compiled again as a variable on the first micro-batch that differs (every layer's forward and backward once
    more). Marked, the first compile (the warm-up's) is the only one."""
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):  # one tensor from flash_documents; two from another caller
        if documents.get(key) is not None:
            torch._dynamo.maybe_mark_dynamic(documents[key], 0)
    return documents


def single_documents(position_ids: torch.Tensor) -> bool:
    """Whether every row is one unpadded document (positions 0, 1, 2, ... to its end): plain causal attention."""
    single = torch.arange(position_ids.shape[1], device=position_ids.device)
    return bool((position_ids == single).all())


def supervised_positions(labels: torch.Tensor) -> torch.Tensor:
    """Indices into the rows' positions laid end to end, without each row's last ([b x (s - 1)]), of those whose
    next token has a label: the hidden states the fused loss sends through the head."""
    return (labels[:, 1:].reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)


@dataclass(frozen=True)
class RowLayout:
    """What a micro-batch's forward needs to know about its rows' structure: the shape-deciding facts (is each row
    one document, where do documents start, which positions are supervised).

    Worked out from the collated rows on the host (`row_layout` of the CPU batch, in the step's read-ahead), the
    forward never reads the GPU's copy back. Each such read (a `nonzero`, an `.all()`, an `int()`) waits until the
    GPU has run everything queued before it, then leaves the GPU idle while the host launches what follows: the
    fused loss's read came after the whole forward (docs/OPTIMIZATION.md, round eight)."""

    single_documents: bool
    # flash_documents of the rows: their cu_seq_lens and the bound on a document's length; {} when each row is one
    # document.
    documents: dict[str, Any]
    supervised: torch.Tensor  # supervised_positions of the labels (int64)

    def to(self, device: torch.device, non_blocking: bool = False) -> RowLayout:
        def move(v: Any) -> Any:
            return v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v

        # cu_seq_lens_q and _k are one tensor: moved once, still one.
        moved = {id(v): move(v) for v in self.documents.values()}
        return RowLayout(
            self.single_documents,
            {k: moved[id(v)] for k, v in self.documents.items()},
            move(self.supervised),
        )

    def pin_memory(self) -> RowLayout:
        pinned = {id(v): v.pin_memory() for v in self.documents.values() if isinstance(v, torch.Tensor)}
        return RowLayout(
            self.single_documents,
            {k: pinned.get(id(v), v) for k, v in self.documents.items()},
            self.supervised.pin_memory(),
        )


def row_layout(batch: dict[str, torch.Tensor]) -> RowLayout:
    """The RowLayout of a collated batch, on the batch's device (the host's, to keep the forward free of reads
    back; a batch with no position_ids is one document a row)."""
    position_ids = batch.get("position_ids")
    if position_ids is None:
        input_ids = batch["input_ids"]
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    return RowLayout(
        single_documents(position_ids), flash_documents(position_ids), supervised_positions(batch["labels"])
    )


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as the 0 / most-negative float bias that eager attention adds to its scores."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def takes_documents(attn_implementation: str) -> bool:
    """Whether the implementation takes packed rows as document boundaries (`flash_documents`): the flash
    attention kernels, and torch's varlen attention."""
    return attn_implementation.startswith("flash_attention") or attn_implementation == "varlen"


def attention_mask_for(
    position_ids: torch.Tensor, attn_implementation: str, dtype: torch.dtype, single: bool | None = None
) -> torch.Tensor | None:
    """The `attention_mask` to pass with packed rows: the 4-D boolean mask for "sdpa", its additive form for
    "eager". None for flash and varlen attention (their kernels get the documents from `flash_documents`), flex
    attention (transformers builds a document block mask that skips empty blocks from position_ids), and SDPA when
    every row is a single unpadded document (plain causal attention, which runs SDPA's flash kernel instead of a
    masked one). `single`: that fact when the host already knows it (RowLayout), else read from position_ids."""
    if takes_documents(attn_implementation) or attn_implementation == "flex_attention":
        return None
    if attn_implementation == "sdpa" and (single_documents(position_ids) if single is None else single):
        return None
    mask = block_causal_mask(position_ids)
    if attn_implementation == "eager":
        return additive_mask(mask, dtype)
    return mask
