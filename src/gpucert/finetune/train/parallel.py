"""How the model is spread over ranks: nothing, DDP (every rank holds the model, adapter gradients are
all-reduced) or FSDP2 (each decoder layer's parameters sharded, gathered per layer for compute).

DDP is the default for 7B LoRA: the adapter all-reduce is a few ms per step (fine-tuning.md §9); FSDP2 is for
when the base model does not fit one GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from gpucert.finetune.model.layers import decoder_layers
from gpucert.runtime.group import Runtime

MODES = ("auto", "none", "ddp", "fsdp2")


def resolve_mode(mode: str, world_size: int) -> str:
    if mode not in MODES:
        raise ValueError(f"train.parallel: expected one of {list(MODES)}, found {mode!r}")
    if mode == "auto":
        return "ddp" if world_size > 1 else "none"
    if mode == "none" and world_size > 1:
        # Nothing would sync gradients: the ranks would drift apart and rank 0 save only its own adapter.
        raise ValueError(f"train.parallel: none cannot train {world_size} processes; use ddp, fsdp2 or auto")
    return mode


def wrap(model: nn.Module, rt: Runtime, mode: str) -> nn.Module:
    """The model ready for training under `mode` ("auto": DDP when more than one process, else none)."""
    mode = resolve_mode(mode, rt.world_size)
    cuda = rt.device.type == "cuda"
    if mode == "none":
        return model
    if mode == "ddp":
        # find_unused_parameters=False: every adapter gets a gradient every step, and the unused-parameter
        # search is what trips over checkpointed LoRA layers.
        return DistributedDataParallel(
            model,
            device_ids=[rt.device.index] if cuda else None,
            find_unused_parameters=False,
        )
    mesh = init_device_mesh(rt.device.type, (rt.world_size,))
    # bf16 compute with fp32 gradient reduction on GPUs; gloo on CPUs stays in fp32, which it is built for.
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cuda else None
    kwargs = {"mesh": mesh, "mp_policy": policy} if policy else {"mesh": mesh}
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The PEFT model inside a DDP wrapper (FSDP2 shards in place, so its model is already the one)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Let the backward inside communicate gradients only when `enabled` (the last micro-step of a step)."""
    if isinstance(model, DistributedDataParallel):
        with nullcontext() if enabled else model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    else:
        yield
