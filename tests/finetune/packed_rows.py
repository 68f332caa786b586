"""Packed rows for the loss and attention tests (CPU and GPU): random token ids, the end of each document labelled."""

from __future__ import annotations

import torch

from gpucert.finetune.data.packing import collate


def packed_batch(
    vocab: int, documents: list[list[int]], seed: int, pad_id: int = 0, pad_to: int | None = None, prompt: int = 2
) -> dict[str, torch.Tensor]:
    """One row per list of document lengths, collated (padded to the longest row, or `pad_to`, with a padding
    document); the first 1/`prompt` of each document unlabelled."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for lengths in documents:
        row: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": []}
        for n in lengths:
            ids = torch.randint(3, vocab, (n,), generator=g).tolist()
            row["input_ids"] += ids
            row["labels"] += [-100] * (n // prompt) + ids[n // prompt :]
            row["position_ids"] += list(range(n))
        rows.append(row)
    return collate(rows, pad_id, pad_to)
