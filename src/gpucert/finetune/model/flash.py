"""FlashAttention-3 as the decoder layers' attention (`model.attn_implementation: flash_attention_3`).

transformers has its own flash_attention_3 path, but up to at least 5.17 it reads each layer's `layer_idx`, an
integer attribute torch.compile guards on: every compiled decoder layer recompiled, the recompile limit (8) was hit
and the remaining layers ran eagerly (lent H100, 2026-11-23: 14,319 tokens/s against SDPA's 16,645, +6.9 GiB).
This calls FlashAttention-3's kernels directly, on the (batch, sequence, heads, dim) views they take, with
grouped-query attention native (no repeated k/v); packed rows come as documents (`packing.flash_documents`).
"""

from __future__ import annotations

from typing import Any

import torch

# The attention key the model is built with (registered with transformers by `register`): no "flash" in it, or
# transformers would take it for one of its own flash attention kernels and look for it.
KEY = "gpucert_fa3"


def flash3_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: query [b, heads, s, d], key and value [b, kv_heads, s, d] in, the
    output [b, s, heads, d] out. Documents of packed rows come as cu_seq_lens_q/k and max_length_q/k."""
    from flash_attn_interface import flash_attn_func, flash_attn_varlen_func

    if dropout:
        raise ValueError(
            f"model.attn_implementation flash_attention_3: FlashAttention-3 has no attention dropout, the model "
            f"asks for {dropout} (its config's attention_dropout): set it to 0 or use sdpa"
        )
    if attention_mask is not None:
        raise ValueError(
            "model.attn_implementation flash_attention_3 takes unpadded rows (packed documents come as boundaries), "
            "these come with a padding mask: use sdpa for padded batches"
        )
    if softcap:
        raise ValueError("model.attn_implementation flash_attention_3: this model soft-caps its scores: use sdpa")
    b, _, s, _ = query.shape
    longest = kwargs.get("max_length_q") or s
    if sliding_window is not None and sliding_window < longest:
        raise ValueError(
            f"model.attn_implementation flash_attention_3: the model's sliding window ({sliding_window} tokens) is "
            f"shorter than its documents ({longest}): use sdpa"
        )
    causal = bool(getattr(module, "is_causal", True))
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        out = flash_attn_func(q, k, v, softmax_scale=scaling, causal=causal)
    else:  # the rows laid end to end, each document attending within itself
        q, k, v = (t.reshape(b * s, *t.shape[2:]) for t in (q, k, v))
        out = flash_attn_varlen_func(
            q, k, v, cu, kwargs["cu_seq_lens_k"], longest, kwargs["max_length_k"], softmax_scale=scaling, causal=causal
        )
    out = out[0] if isinstance(out, tuple) else out
    return out.reshape(b, s, *out.shape[-2:]), None


def register() -> None:
    """Make KEY an attention implementation transformers builds models with; its masks are flash attention's
    (none for unpadded rows: no [b, 1, s, s] mask is built)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(KEY, flash3_attention)
    AttentionMaskInterface.register(KEY, flash_attention_mask)
