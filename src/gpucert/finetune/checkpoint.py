"""Atomic, resumable training checkpoints under `<run>/checkpoints/step-N/`.

A checkpoint is written to `.tmp-step-N`, every file fsynced, renamed to `step-N`, and only then marked with
a `COMPLETE` file: a run killed at any moment leaves either a complete checkpoint or one `find_latest`
ignores. It holds what an exact continuation needs:

    adapter_model.safetensors   the trainable (LoRA) weights by module path; never the frozen base
    optimizer.pt                AdamW state by module path (the same file from 1 GPU, DDP or FSDP2)
    scheduler.pt                the LR scheduler's state
    rng.pt                      python, numpy, torch CPU and CUDA generator states, one entry per rank
    trainer_state.json          step, sampler position (epoch, rows of its order consumed), loss history, and the
                                fingerprint of the prepared data it trained on

Model and optimizer states go through torch.distributed.checkpoint.state_dict, which gathers FSDP2 shards
into full tensors (all ranks take part) and loads them back into whatever sharding the resuming run has.
Every rank reads the files on resume: the run directory must be on a filesystem all nodes see. Which checkpoint
`resume: auto` continues from is rank 0's choice, sent to every rank: NFS attribute caching can show nodes
different directory listings, and ranks resuming from different steps would train different models.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.nn.parallel import DistributedDataParallel

from gpucert.runtime.group import Runtime, gather_to_main

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
ADAPTER_FILE = "adapter_model.safetensors"
STEP_DIR = re.compile(r"step-(\d+)")
TMP_DIR = re.compile(r"\.tmp-step-(\d+)")
# Full tensors, gathered to rank 0's CPU only (other ranks get an empty dict), frozen base weights left out.
GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
# Loading: every rank reads the full tensors and keeps its shard; the frozen base is not in the file.
SCATTER = StateDictOptions(full_state_dict=True, strict=False)


@dataclass
class TrainerState:
    step: int = 0
    # The sampler position: epoch number and how many rows of that epoch's shuffled order are consumed.
    epoch: int = 0
    index: int = 0
    # Rows per optimizer step (micro_batch x grad_accum x world): a resume must keep it to continue exactly.
    global_batch: int = 0
    world_size: int = 1
    # prepare.data_fingerprint of the data trained on; None in checkpoints written before it was recorded.
    data_fingerprint: str | None = None
    loss_history: list[float] = field(default_factory=list)
    step_log: list[dict[str, Any]] = field(default_factory=list)
    eval_losses: list[dict[str, Any]] = field(default_factory=list)


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first; half-written ones are not listed."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = STEP_DIR.fullmatch(path.name)
        if match and path.is_dir() and (path / COMPLETE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def find_latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None."""
    found = complete_checkpoints(run_dir)
    return found[-1][1] if found else None


def choose_checkpoint(resume: str, run_dir: Path) -> Path | None:
    """What `resume` (none, auto or a directory) means for run_dir as this process sees it."""
    if resume == "none":
        return None
    if resume == "auto":
        return find_latest(run_dir)
    return Path(resume)


def agree_on_checkpoint(rt: Runtime, resume: str, run_dir: Path) -> Path | None:
    """The checkpoint every rank resumes from: rank 0's choice, broadcast (collective, even for "none", so a
    rank with another config cannot skip it and leave the others waiting)."""
    choice = choose_checkpoint(resume, run_dir) if rt.is_main else None
    if rt.world_size == 1:
        return choice
    chosen = [str(choice) if choice is not None else None]
    dist.broadcast_object_list(chosen, src=0)
    return Path(chosen[0]) if chosen[0] is not None else None


def read_trainer_state(path: Path) -> TrainerState:
    """The trainer state of a complete checkpoint (cheap: no tensors), or an error naming what is missing."""
    path = Path(path)
    if not (path / COMPLETE).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE} marker): pick another one")
    return TrainerState(**json.loads((path / "trainer_state.json").read_text()))


def judge_data_change(saved: str | None, current: str, path: Path, allow_change: bool) -> str | None:
    """Resuming over the prepared data `current`: None when it is the data the checkpoint trained on, a warning
    when that is unknown (an older checkpoint) or allowed to differ, else an error naming both fingerprints."""
    if saved is None:
        return (
            f"{path} does not record which data it trained on (written before gpucert kept data fingerprints): "
            f"resuming on data {current[:12]} unchecked"
        )
    if saved == current:
        return None
    if allow_change:
        return (
            f"{path} trained on data {saved[:12]}, this run prepares {current[:12]}: continuing on the new data "
            "(resume_allow_data_change: true)"
        )
    raise ValueError(
        f"{path}: expected the prepared data the checkpoint trained on (fingerprint {saved[:12]}), found "
        f"{current[:12]}: data.source, its file, the template, tokenizer or data.* settings changed. Resume with "
        "the same data, start a new output_dir, or set resume_allow_data_change: true to continue on the new data"
    )


def adapter_state_dict(model: nn.Module) -> dict[str, Any]:
    """The trainable weights as full CPU tensors by module path, on rank 0 (empty elsewhere). Collective."""
    return get_model_state_dict(model, options=GATHER)


def save_adapter(model: nn.Module, tokenizer: Any, out_dir: Path, rt: Runtime) -> Path | None:
    """The final adapter in PEFT format (adapter_config.json + adapter_model.safetensors) with the tokenizer,
    loadable by PeftModel.from_pretrained. Collective (FSDP2 shards are gathered first); rank 0 writes."""
    adapter = adapter_state_dict(model)
    if not rt.is_main:
        return None
    peft_model = model.module if isinstance(model, DistributedDataParallel) else model
    peft_model.save_pretrained(str(out_dir), state_dict=adapter)  # type: ignore[operator]
    tokenizer.save_pretrained(str(out_dir))
    return Path(out_dir)


def rng_state(device: torch.device) -> dict[str, Any]:
    legacy: Any = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (legacy[0], legacy[1].tolist(), *legacy[2:]),
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    random.setstate(state["python"])
    kind, key, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    run_dir: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: TrainerState,
    rt: Runtime,
    keep: int,
) -> Path | None:
    """Write step-<state.step> (collective: every rank calls it; rank 0 writes). The path on rank 0."""
    adapter = adapter_state_dict(model)
    optim = get_optimizer_state_dict(model, optimizer, options=GATHER)
    rngs = gather_to_main(rt, rng_state(rt.device))
    if not rt.is_main:
        return None
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"step-{state.step}", root / f".tmp-step-{state.step}"
    for stale in (tmp, final):
        if stale.exists():
            shutil.rmtree(stale)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in adapter.items()}, str(tmp / ADAPTER_FILE))
    torch.save(optim, tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(rngs, tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(asdict(state), indent=1))
    for path in tmp.iterdir():
        _fsync(path)
    _fsync(tmp)
    os.replace(tmp, final)
    (final / COMPLETE).write_text(f"{state.step}\n")
    _fsync(final / COMPLETE)
    _fsync(final)
    _fsync(root)
    prune(run_dir, keep)
    return final


def prune(run_dir: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; drop older ones, and leftovers of interrupted writes."""
    found = complete_checkpoints(run_dir)
    for _, path in found[: max(len(found) - max(keep, 1), 0)]:
        shutil.rmtree(path)
    newest = found[-1][0] if found else -1
    for path in checkpoint_root(run_dir).iterdir():
        match = TMP_DIR.fullmatch(path.name) or STEP_DIR.fullmatch(path.name)
        # A .tmp directory, or a renamed one without its marker (COMPLETE comes after the rename), that is
        # older than a complete checkpoint is left from a killed write: newer ones may still be in progress.
        if match and int(match.group(1)) <= newest and not (path / COMPLETE).exists():
            shutil.rmtree(path)


def load_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rt: Runtime,
) -> TrainerState:
    """Restore model, optimizer, scheduler and this rank's RNG from a complete checkpoint (collective)."""
    path = Path(path)
    state = read_trainer_state(path)
    adapter: dict[str, Any] = load_file(str(path / ADAPTER_FILE))
    set_model_state_dict(model, adapter, options=SCATTER)
    optim = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=optim, options=SCATTER)
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    rngs = torch.load(path / "rng.pt", weights_only=True)
    # Another world size gets the same global batches; only dropout masks would differ, from the rank reuse.
    set_rng_state(rngs[rt.rank % len(rngs)], rt.device)
    return state
