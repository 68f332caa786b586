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

A complete checkpoint can still be unreadable (a file truncated by a copy, a disk that failed later, an edit):
rank 0 opens every file of the one it would resume from (headers only, cheap) and, on `resume: auto`, falls
back to the previous complete checkpoint, naming the broken file; the broken checkpoint is renamed to
step-N.corrupt (no longer complete, kept to look at). A save that fails, a full disk included, removes what it
had written and says "no space left on <dir>" instead of torch's `[enforce fail at inline_container.cc]`.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch
import torch.distributed as dist
import yaml
from safetensors import safe_open
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.nn.parallel import DistributedDataParallel

from gpucert.config.loader import dotted, error_text
from gpucert.finetune.config import FinetuneConfig
from gpucert.finetune.disk import NoSpaceError, is_no_space, no_space_message
from gpucert.runtime.group import Runtime, gather_to_main, say

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
ADAPTER_FILE = "adapter_model.safetensors"
STATE_FILE = "trainer_state.json"
# torch.save files of a checkpoint; read back with weights_only.
TORCH_FILES = ("optimizer.pt", "scheduler.pt", "rng.pt")
STEP_DIR = re.compile(r"step-(\d+)")
TMP_DIR = re.compile(r"\.tmp-step-(\d+)")
# A checkpoint found unreadable is renamed step-N.corrupt: out of every listing, kept for a person to look at.
CORRUPT_SUFFIX = ".corrupt"
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
    # The settings a resume must keep (SAME_ON_RESUME, dotted): a checkpoint copied out of its run still says
    # what it was trained with. None in checkpoints written before they were recorded.
    settings: dict[str, Any] | None = None


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


def what_resumes(run_dir: Path, cfg: FinetuneConfig) -> str | None:
    """What a stopped or failed run of `cfg` in `run_dir` left to continue from, for the line that says it ended;
    None when run_dir is not there (it ended before its first step, and a directory made for it went again).
    Without output_dir in cfg, `--output DIR` must be added for --resume auto to find it. Not loop.resume_hint,
    which says how to resume with another number of processes."""
    found = complete_checkpoints(run_dir)
    save_every = cfg.train.save_every
    if found:
        step, path = found[-1]
        flags = "--resume auto" if cfg.output_dir else f"--output {run_dir} --resume auto"
        return f"the latest complete checkpoint is {path} (step {step}): the same command with {flags} continues"
    if not run_dir.is_dir():
        return None
    return f"no complete checkpoint in {run_dir} (one every train.save_every={save_every} steps): a rerun starts over"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the file and why."""


def check_fresh_output(cfg: FinetuneConfig) -> None:
    """Refuse a run that starts over (resume: none) in an output_dir holding an earlier run's checkpoints: its own
    would be pruned beside them by step number, and the report and a later --resume auto would take the earlier
    run's newest as this run's. Checked by rank 0 before any work."""
    if cfg.resume != "none" or not cfg.output_dir:
        return
    found = complete_checkpoints(Path(cfg.output_dir))
    if found:
        steps = ", ".join(path.name for _step, path in found[-3:])
        raise CheckpointError(
            f"output_dir {cfg.output_dir} holds checkpoints of an earlier run ({steps}): --resume auto continues "
            f"that run; to start over, give another --output or remove {checkpoint_root(Path(cfg.output_dir))}"
        )


# The settings a resumed run must share with the run that wrote its checkpoint, or it is not that run continued:
# the model and its numerics, the adapters, and the optimizer's trajectory. Everything else may change on resume
# (how fast, where, how often it logs or saves, how long it runs; the data, which judge_data_change governs; the
# global batch, which the loop checks once the memory plan has picked a micro-batch).
SAME_ON_RESUME = (
    "model.name",
    "model.random_init",
    "model.dtype",
    "model.autocast",
    "model.precision",
    "model.fp8_head",
    "lora.",
    "train.lr",
    "train.warmup_ratio",
    "train.weight_decay",
    "train.max_grad_norm",
    "train.seed",
)
RUN_CONFIG_FILE = "config.yaml"  # rundir.CONFIG_FILE: what the run that wrote the checkpoints was given


def resume_settings(cfg: FinetuneConfig) -> dict[str, Any]:
    """The settings of cfg a resume must keep (SAME_ON_RESUME), dotted: what each checkpoint records."""
    return {k: v for k, v in dotted(asdict(cfg)).items() if k.startswith(SAME_ON_RESUME)}


def check_resume_config(cfg: FinetuneConfig) -> None:
    """Refuse, before any work, a resume whose settings differ from those its checkpoints were trained with in a
    key of SAME_ON_RESUME (a new train.lr was ignored by the restored optimizer, while config.yaml recorded it; a
    new lora.alpha jumped the loss). Compared with the settings the checkpoint records (its trainer state), else
    with the run directory's config.yaml beside it; a checkpoint with neither is refused (nothing would say the
    settings match: a backup copied out of its run once took a new lr and alpha without a word)."""
    if cfg.resume == "none":
        return
    run_dir: Path | None
    if cfg.resume == "auto":
        latest = find_latest(Path(cfg.output_dir)) if cfg.output_dir else None
        if latest is None or not cfg.output_dir:
            return
        checkpoint, run_dir = latest, Path(cfg.output_dir)
    else:
        checkpoint = Path(cfg.resume).resolve()
        # <run>/checkpoints/step-N has its run's config.yaml two levels up; a copy elsewhere has none.
        run_dir = checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS else None
    recorded = _recorded_settings(checkpoint)
    if recorded is not None:
        saved, source = recorded, f"{checkpoint / STATE_FILE}"
    elif run_dir is None:
        raise CheckpointError(
            f"resume {cfg.resume}: this checkpoint records no settings (written by an older gpucert) and has no run "
            f"directory's {RUN_CONFIG_FILE} beside it (it is not under <run>/{CHECKPOINTS}/): nothing says this "
            "run's settings match those it was trained with. Put it back under its run's "
            f"{CHECKPOINTS}/ beside that run's {RUN_CONFIG_FILE}, or start a new run"
        )
    else:
        saved_file = run_dir / RUN_CONFIG_FILE
        try:
            loaded = yaml.safe_load(saved_file.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            why = "is missing" if isinstance(exc, FileNotFoundError) else f"is unreadable ({error_text(exc)})"
            raise CheckpointError(
                f"resume {cfg.resume}: {saved_file} {why}: it holds the settings the checkpoints in {run_dir} were "
                "trained with, and without it nothing says this run's match them (a new lora.alpha or train.lr "
                "would go unnoticed). Restore it from the run's copy or a backup, or start a new run in another "
                "--output"
            ) from None
        # A config.yaml that is no mapping holds none of the settings: each reads as None there.
        saved, source = dotted(loaded if isinstance(loaded, dict) else {}), str(saved_file)
    now = resume_settings(cfg)
    changed = [
        key for key in sorted(saved.keys() | now.keys())
        if key.startswith(SAME_ON_RESUME) and saved.get(key) != now.get(key)
    ]  # fmt: skip
    if changed:
        shown = "; ".join(f"{key} {saved.get(key)!r} there, {now.get(key)!r} now" for key in changed)
        raise CheckpointError(
            f"resume {cfg.resume}: {checkpoint} was trained with other settings ({shown}, from {source}): a "
            "resumed run continues the run that wrote it, with its settings. Resume without these changes, or "
            "start a new run with them in another --output"
        )


def _recorded_settings(checkpoint: Path) -> dict[str, Any] | None:
    """The settings a checkpoint's trainer state records; None where it records none or cannot be read (an
    unreadable checkpoint is named when it is loaded)."""
    try:
        saved = json.loads((checkpoint / STATE_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    settings = saved.get("settings") if isinstance(saved, dict) else None
    return settings if isinstance(settings, dict) else None


def read_trainer_state(path: Path) -> TrainerState:
    """The trainer state of a complete checkpoint (cheap: no tensors), or an error naming the file and the fault."""
    path = Path(path)
    if not (path / COMPLETE).is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {COMPLETE} marker: its write did not finish)")
    file = path / STATE_FILE
    try:
        saved = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{file}: unreadable: {exc}") from None
    known = {f.name for f in fields(TrainerState)}
    if not isinstance(saved, dict) or not isinstance(saved.get("step"), int) or set(saved) - known:
        found = sorted(set(saved) - known) if isinstance(saved, dict) else type(saved).__name__
        raise CheckpointError(
            f"{file}: expected gpucert's trainer state (an object with an integer step), found {found}"
        )
    return TrainerState(**saved)


def verify_checkpoint(path: Path) -> str | None:
    """What makes a complete checkpoint unreadable, naming the file, or None. Reads the headers and the zip
    directory of each file, not the tensors: a truncated or replaced file is caught, a flipped bit is not."""
    path = Path(path)
    try:
        read_trainer_state(path)
    except CheckpointError as exc:
        return str(exc)
    adapter = path / ADAPTER_FILE
    try:
        # The header lists every tensor's byte range; safetensors refuses a file that does not cover them all.
        with safe_open(str(adapter), framework="pt"):
            pass
    except Exception as exc:  # SafetensorError, OSError
        return f"{adapter}: unreadable: {exc}"
    for name in TORCH_FILES:
        file = path / name
        try:
            # mmap: the zip's central directory (at its end, so truncation loses it) is read, the tensors are not.
            torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # the zip reader's RuntimeError, OSError, unpickling errors
            return f"{file}: unreadable: {_first_line(exc)}"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def set_aside(path: Path) -> Path:
    """Rename an unreadable checkpoint to <name>.corrupt (or .corrupt2...), so no listing picks it again."""
    target, n = path.with_name(path.name + CORRUPT_SUFFIX), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}{CORRUPT_SUFFIX}{n}")
    os.replace(path, target)
    return target


def choose_checkpoint(resume: str, run_dir: Path, note: Callable[[str], object] = say) -> Path | None:
    """What `resume` (none, auto or a directory) means for run_dir as this process sees it. `auto` takes the
    newest complete checkpoint that reads back; each newer one that does not is set aside and `note`d. A named
    checkpoint that does not read back is a CheckpointError: it was asked for, so there is no fallback."""
    if resume == "none":
        return None
    if resume != "auto":
        problem = verify_checkpoint(Path(resume))
        if problem:
            raise CheckpointError(
                f"resume: {problem}; pick another checkpoint, or --resume auto (resume: auto in a config)"
            )
        return Path(resume)
    unreadable: list[str] = []
    for step, path in reversed(complete_checkpoints(run_dir)):
        problem = verify_checkpoint(path)
        if problem is None:
            for message in unreadable:
                note(f"{message}; resuming from the previous complete checkpoint, step {step}")
            return path
        unreadable.append(f"checkpoint step {step} cannot be resumed from: {problem} (moved to {set_aside(path).name})")
    if unreadable:
        raise CheckpointError(
            f"resume auto: no checkpoint under {checkpoint_root(run_dir)} reads back: {'; '.join(unreadable)}. "
            "Restore one from a backup, or start over with resume: none and a new output_dir"
        )
    root = checkpoint_root(run_dir)
    set_aside_before = sorted(p.name for p in root.glob(f"step-*{CORRUPT_SUFFIX}*")) if root.is_dir() else []
    if set_aside_before:
        # An earlier run found every checkpoint unreadable and stopped; run again (a requeue), it started over
        # beside them without a word, training from step 0 what they had trained.
        raise CheckpointError(
            f"resume auto: no complete checkpoint under {root}, only checkpoints an earlier run found unreadable "
            f"and set aside ({', '.join(set_aside_before)}). Restore one from a backup (as step-N), or start over: "
            "remove them, or give resume: none and a new output_dir"
        )
    return None


def agree_on_checkpoint(rt: Runtime, resume: str, run_dir: Path, note: Callable[[str], object] = say) -> Path | None:
    """The checkpoint every rank resumes from: rank 0's choice, broadcast (collective, even for "none", so a
    rank with another config cannot skip it and leave the others waiting). A refusal fails rank 0; the others
    wait in the broadcast until the job's abort ends them."""
    choice = choose_checkpoint(resume, run_dir, note) if rt.is_main else None
    if rt.world_size == 1:
        return choice
    chosen = [str(choice) if choice is not None else None]
    dist.broadcast_object_list(chosen, src=0)
    return Path(chosen[0]) if chosen[0] is not None else None


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
    raise CheckpointError(
        f"{path}: expected the prepared data the checkpoint trained on (fingerprint {saved[:12]}), found "
        f"{current[:12]}: data.source, its file, the template, tokenizer or data.* settings changed. Resume with "
        "the same data, start a new output_dir, or set resume_allow_data_change: true to continue on the new data"
    )


def adapter_state_dict(model: nn.Module) -> dict[str, Any]:
    """The trainable weights as full CPU tensors by module path, on rank 0 (empty elsewhere). Collective."""
    return get_model_state_dict(model, options=GATHER)


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


# The one call that moves checkpoint bytes to the kernel (tests replace it to fill a disk on demand).
write_chunk = os.write


class _Sink:
    """A write-only file that keeps the OSError of a failed write: torch's zip writer reports one only as
    `[enforce fail at inline_container.cc:...] unexpected pos`, and safetensors' Rust writer as text."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: OSError | None = None
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                done += write_chunk(self.fd, view[done:])
        except OSError as exc:
            exc.filename = exc.filename or str(self.path)
            self.error = self.error or exc
            raise
        return done

    def flush(self) -> None:
        pass


def _write_file(path: Path, fill: Callable[[IO[bytes]], Any]) -> None:
    """Write `path` through fill(file) and fsync it; a failed write raises its own OSError (ENOSPC...)."""
    sink = _Sink(path)
    try:
        fill(cast(IO[bytes], sink))
        os.fsync(sink.fd)  # on NFS a full disk may only show here
    except Exception as exc:
        if sink.error is not None and sink.error is not exc:
            # torch's "[enforce fail at inline_container.cc] unexpected pos" only echoes this error: not shown.
            raise sink.error from None
        raise
    finally:
        os.close(sink.fd)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_adapter(model: nn.Module, tokenizer: Any, out_dir: Path, rt: Runtime) -> Path | None:
    """The final adapter in PEFT format (adapter_config.json + adapter_model.safetensors) with the tokenizer,
    loadable by PeftModel.from_pretrained. Collective (FSDP2 shards are gathered first); rank 0 writes, into a
    temporary directory renamed into place, so a failed write leaves no half adapter."""
    adapter = adapter_state_dict(model)
    if not rt.is_main:
        return None
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".tmp-{out_dir.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    peft_model = model.module if isinstance(model, DistributedDataParallel) else model
    try:
        peft_model.save_pretrained(str(tmp), state_dict=adapter)  # type: ignore[operator]
        tokenizer.save_pretrained(str(tmp))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception) and is_no_space(exc):
            raise NoSpaceError(
                f"{no_space_message(out_dir.parent, exc, f'the final adapter {out_dir}')}: nothing of it was kept. "
                "Free space there and run again with --resume auto (it continues from the last checkpoint)"
            ) from exc
        raise
    return out_dir


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
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    tensors = {k: v.contiguous() for k, v in adapter.items()}
    renamed = complete = False
    try:
        _write_file(tmp / ADAPTER_FILE, lambda f: f.write(safetensors_bytes(tensors)))
        _write_file(tmp / "optimizer.pt", lambda f: torch.save(optim, f))
        _write_file(tmp / "scheduler.pt", lambda f: torch.save(scheduler.state_dict(), f))
        _write_file(tmp / "rng.pt", lambda f: torch.save(rngs, f))
        _write_file(tmp / STATE_FILE, lambda f: f.write(json.dumps(asdict(state), indent=1).encode()))
        _fsync(tmp)
        # A step-N left by an earlier run of this directory goes only now that its replacement is on disk.
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        renamed = True
        _write_file(final / COMPLETE, lambda f: f.write(f"{state.step}\n".encode()))
        complete = True
        _fsync(final)
        _fsync(root)
    except BaseException as exc:
        # Nothing half-written stays: the temporary directory, or the renamed one that never got its marker. One
        # with its marker is whole: a Ctrl-C during the directory syncs after it took the only checkpoint a run
        # had, and `--resume auto` started over.
        if not complete:
            shutil.rmtree(final if renamed else tmp, ignore_errors=True)
        if isinstance(exc, Exception) and is_no_space(exc):
            latest = find_latest(run_dir)
            kept = f"the newest complete one is {latest.name}" if latest else "no complete checkpoint exists yet"
            raise NoSpaceError(
                f"{no_space_message(root, exc, f'checkpoint step {state.step}')}: its partial files were removed and "
                f"{kept}. Free space there, lower train.keep_checkpoints, or move output_dir to a larger filesystem, "
                "then continue with --resume auto"
            ) from exc
        raise
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

    def restore(name: str, apply: Callable[[Path], Any]) -> None:
        try:
            apply(path / name)
        except Exception as exc:
            raise CheckpointError(f"{path / name}: cannot be restored: {_first_line(exc)}") from exc

    def restore_adapter(file: Path) -> None:
        adapter: dict[str, Any] = load_file(str(file))
        set_model_state_dict(model, adapter, options=SCATTER)

    restore(ADAPTER_FILE, restore_adapter)
    restore(
        "optimizer.pt",
        lambda f: set_optimizer_state_dict(
            model, optimizer, optim_state_dict=torch.load(f, map_location="cpu", weights_only=True), options=SCATTER
        ),
    )
    restore("scheduler.pt", lambda f: scheduler.load_state_dict(torch.load(f, weights_only=True)))
    # Another world size gets the same global batches; only dropout masks would differ, from the rank reuse.
    restore(
        "rng.pt", lambda f: set_rng_state((rngs := torch.load(f, weights_only=True))[rt.rank % len(rngs)], rt.device)
    )
    return state
