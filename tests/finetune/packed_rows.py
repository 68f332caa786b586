"""Packed rows for the loss and attention tests: random token ids, each document's second half labelled."""

from __future__ import annotations

import torch

from gpucert.finetune.packing import collate


def packed_batch(vocab: int, documents: list[list[int]], seed: int) -> dict[str, torch.Tensor]:
    """One row per list of document lengths, collated (padded to the longest row with a padding document)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for lengths in documents:
        row: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": []}
        for n in lengths:
            ids = torch.randint(3, vocab, (n,), generator=g).tolist()
            row["input_ids"] += ids
            row["labels"] += [-100] * (n // 2) + ids[n // 2 :]
            row["position_ids"] += list(range(n))
        rows.append(row)
    return collate(rows, pad_id=0)
