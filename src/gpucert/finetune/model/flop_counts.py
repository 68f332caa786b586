"""The model's shape as the FLOP formula needs it: what lora.ModelInfo hands train/metrics.py.

No torch here, so the throughput arithmetic stays a pure module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlopCounts:
    """N, N_lora, L, H and Q of fine-tuning.md §8 (from model.ModelInfo)."""

    matmul_params: int
    lora_params: int
    layers: int
    heads: int
    head_dim: int
    # lm_head is not recomputed by activation checkpointing (it sits outside the checkpointed layers).
    lm_head_params: int = 0
