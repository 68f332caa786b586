"""The decoder layers of a causal LM: the blocks that FSDP2 shards one by one and that the fused, FP8 and LoRA
rewrites walk over."""

from __future__ import annotations

from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks, found by the class names HF lists as never-to-be-split (Qwen2DecoderLayer...)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"fsdp2: found no decoder layers in {type(model).__name__} (looked for {sorted(names)})")
    return layers
