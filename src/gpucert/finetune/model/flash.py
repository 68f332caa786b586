"""Attention kernels gpucert calls itself, for packed rows: FlashAttention-3 (`model.attn_implementation:
flash_attention_3`) and torch's own variable-length attention (`varlen`).

transformers has its own flash_attention_3 path, but up to at least 5.17 it reads each layer's `layer_idx`, an
integer attribute torch.compile guards on: every compiled decoder layer recompiled, the recompile limit (8) was hit
and the remaining layers ran eagerly (lent H100, 2026-11-23: 14,319 tokens/s against SDPA's 16,645, +6.9 GiB).
This calls FlashAttention-3's kernels directly, on the (batch, sequence, heads, dim) views they take, with
grouped-query attention native (no repeated k/v); packed rows come as documents (`packing.flash_documents`).

`varlen` is the same call on `torch.nn.attention.varlen.varlen_attn` (torch >= 2.10): FlashAttention-2's
variable-length kernels as torch ships them, so packed rows get document-masked attention with no package to
install and nothing for inductor to compile (flex attention's kernels are compiled on every cold compile cache).
Rows of one document each go to SDPA's causal kernels (cuDNN's on an H100), which need no boundaries.
"""

from __future__ import annotations

import inspect
import math
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

# The attention key the model is built with (registered with transformers by `register`): no "flash" in it, or
# transformers would take it for one of its own flash attention kernels and look for it.
KEY = "gpucert_fa3"
VARLEN_KEY = "gpucert_varlen"
# Each implementation as its config value names it, for messages.
NAMES = {KEY: "flash_attention_3", VARLEN_KEY: "varlen"}


def documents_attention(
    which: str,
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
    """transformers' attention interface for the implementation `which` (KEY or VARLEN_KEY, KERNELS): query
    [b, heads, s, d], key and value [b, kv_heads, s, d] in, the output [b, s, heads, d] out. Documents of packed
    rows come as cu_seq_lens_q/k and max_length_q/k: then the rows are laid end to end, [b * s, heads, d], and each
    document attends within itself."""
    b, _, s, _ = query.shape
    bound = refuse_what_cannot_run(which, query, attention_mask, dropout, sliding_window, softcap, kwargs)
    causal = bool(getattr(module, "is_causal", True))
    rows, packed = KERNELS[which]
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        return rows(query, key, value, scaling, causal), None
    q, k, v = (t.transpose(1, 2).reshape(b * s, t.shape[1], t.shape[3]) for t in (query, key, value))
    out = packed(q, k, v, cu, kwargs["cu_seq_lens_k"], bound, kwargs["max_length_k"], scaling, causal)
    return out.reshape(b, s, *out.shape[-2:]), None


def fa3_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None, causal: bool) -> Any:
    """FlashAttention-3 on rows of one document each, on the [b, s, heads, d] views its kernel takes."""
    from flash_attn_interface import flash_attn_func

    out = flash_attn_func(*(t.transpose(1, 2) for t in (query, key, value)), softmax_scale=scale, causal=causal)
    return out[0] if isinstance(out, tuple) else out


def fa3_packed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None,
    causal: bool,
) -> torch.Tensor:
    """FlashAttention-3's variable-length kernel on [tokens, heads, dim]."""
    from flash_attn_interface import flash_attn_varlen_func

    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=causal)
    return out[0] if isinstance(out, tuple) else out


def sdpa_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None, causal: bool) -> Any:
    """varlen's rows of one document each: SDPA's causal kernels, which need no boundaries."""
    gqa = query.shape[1] != key.shape[1]
    out = F.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2)


def refuse_what_cannot_run(
    key: str,
    query: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float,
    sliding_window: int | None,
    softcap: float | None,
    kwargs: dict[str, Any],
) -> int:
    """Refuse what these kernels cannot compute for this model (attention dropout, a padding mask, soft-capped
    scores, a sliding window shorter than a document may be), naming the setting; returns the bound on a
    document's length."""
    name = f"model.attn_implementation {NAMES[key]}"
    if dropout:
        raise ValueError(
            f"{name}: these kernels have no attention dropout, the model asks for {dropout} (its config's "
            f"attention_dropout): set it to 0 or use sdpa"
        )
    if attention_mask is not None:
        raise ValueError(
            f"{name} takes unpadded rows (packed documents come as boundaries), these come with a padding mask: use "
            f"sdpa for padded batches"
        )
    if softcap:
        raise ValueError(f"{name}: this model soft-caps its scores: use sdpa")
    # The bound on a document's length (packing.flash_documents: the rows' length, one value for the whole run,
    # so torch.compile guards on nothing that changes between micro-batches).
    bound: int = kwargs.get("max_length_q") or query.shape[2]
    if sliding_window is not None and sliding_window < bound:
        raise ValueError(
            f"{name}: the model's sliding window ({sliding_window} tokens) is shorter than a document may be (rows of "
            f"{bound}): use sdpa, or rows no longer than the window (data.max_length)"
        )
    return bound


def varlen_parameters() -> frozenset[str]:
    """The parameters of this torch's varlen_attn (empty without one)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return frozenset()
    return frozenset(inspect.signature(varlen_attn).parameters)


# Read once by register(), outside any compiled code: torch.compile reads this constant where a call to
# inspect.signature inside the decoder layer would break its graph.
VARLEN_PARAMETERS = frozenset[str]()


def torch_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None,
    causal: bool,
) -> torch.Tensor:
    """varlen_attn on [tokens, heads, dim], whichever of its two signatures this torch has: torch 2.10's
    (is_causal; no scale; k and v with q's heads) or the later one (window_size, scale, enable_gqa)."""
    from torch.nn.attention import varlen

    params = VARLEN_PARAMETERS or varlen_parameters()
    options: dict[str, Any] = {}
    if "window_size" in params:
        options["window_size"] = (-1, 0) if causal else (-1, -1)
    else:
        options["is_causal"] = causal
    if "scale" in params:
        options["scale"] = scale
    elif scale is not None and not math.isclose(scale, q.shape[-1] ** -0.5, rel_tol=1e-6):
        raise ValueError(
            f"model.attn_implementation varlen: this torch's varlen_attn takes no scale and the model scales its "
            f"scores by {scale}, not 1/sqrt({q.shape[-1]}): use sdpa, or a torch whose varlen_attn takes scale"
        )
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            options["enable_gqa"] = True
        else:  # grouped-query heads repeated, as SDPA's math path would
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    out = varlen.varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **options)
    return out[0] if isinstance(out, tuple) else out


# Each implementation's kernels: for rows of one document each, and for packed rows.
KERNELS = {KEY: (fa3_rows, fa3_packed), VARLEN_KEY: (sdpa_rows, torch_varlen)}
# transformers' attention functions, one per key.
flash3_attention = partial(documents_attention, KEY)
varlen_attention = partial(documents_attention, VARLEN_KEY)


def register() -> None:
    """Make KEY and VARLEN_KEY attention implementations transformers builds models with; their masks are flash
    attention's (none for unpadded rows: no [b, 1, s, s] mask is built)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    global VARLEN_PARAMETERS
    VARLEN_PARAMETERS = varlen_parameters()
    AttentionInterface.register(KEY, flash3_attention)
    AttentionInterface.register(VARLEN_KEY, varlen_attention)
    for key in (KEY, VARLEN_KEY):
        AttentionMaskInterface.register(key, flash_attention_mask)
