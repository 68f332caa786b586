"""`gpucert finetune`: LoRA supervised fine-tuning, one process per GPU (one gloo process per rank on a CPU).

Run it:
    python -m gpucert.finetune.train configs/finetune/tiny.yaml                       # CPU, a minute
    torchrun --nproc-per-node 8 -m gpucert.finetune.train configs/finetune/qwen2-7b-glaive.yaml \
        --set output_dir=runs/qwen-glaive --resume auto                                # 8 GPUs, DDP
Precedence is config defaults < YAML file < --set key.path=value; `--resume auto` continues from the newest
complete checkpoint of output_dir as rank 0 sees it (exactly: same batches, same RNG, same loss curve), refused
when the prepared data changed since (resume_allow_data_change: true continues on the new data).

A failure on any rank ends the job on every rank, never a hang: the failing rank records the cause in the job's
store and exits 3 after one line and its traceback,
    gpucert: rank 1 (node-b rank 0 (cpu)) failed during step 12: RuntimeError: ...
and every other rank's watchdog reads it within runtime.heartbeat_interval_s and exits 3 naming that rank. A rank
that dies or freezes without a word is named after runtime.heartbeat_timeout_s. Ctrl-C exits 130.

Reading the output (output_dir):
    report.json       the run in the report schema (and report.md): the success criteria judged, every other
                      number INFO, the per-step curves; `gpucert report DIR [--html]` renders it, `gpucert
                      report DIR_A DIR_B` compares two runs
    metrics.json      every number, for scripts: losses per step, eval losses, tokens/s (padded, effective,
                      supervised; total and per GPU), LoRA-aware MFU with its formula, peak memory, versions,
                      the resolved config, and the criteria (report results) with "status" the worst of them
    adapter/          the final LoRA adapter in PEFT format (PeftModel.from_pretrained) with the tokenizer
    merged/           the adapter merged into the base weights, when train.merge_adapter is set
    checkpoints/      step-N checkpoints for --resume; tensorboard/: loss, lr, grad norm, tokens/s, MFU

The loop: every optimizer step takes one global batch (micro_batch x grad_accum x world rows) from a shuffle
of the epoch that depends only on seed and epoch, and each rank its own slice of it. The loss is the sum of
token losses divided by the supervised-token count of the whole global batch, counted before the backward,
so 1 process and N processes compute the same gradients for the same global batch (fine-tuning.md §7).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from datasets import Dataset
from torch import nn

from gpucert.config.loader import ConfigError
from gpucert.finetune import metrics as flops
from gpucert.finetune.checkpoint import (
    NoSpaceError,
    TrainerState,
    agree_on_checkpoint,
    find_latest,
    judge_data_change,
    load_checkpoint,
    read_trainer_state,
    save_adapter,
    save_checkpoint,
)
from gpucert.finetune.compile_cache import (
    WarmUp,
    cache_counters,
    compile_phases_s,
    resolve_cache_dir,
    signature,
    use_cache_dir,
    warm_up,
)
from gpucert.finetune.config import FinetuneConfig, load_finetune_config
from gpucert.finetune.data.hub import check_model_source
from gpucert.finetune.data.packing import RowLayout, collate, row_layout
from gpucert.finetune.data.prepare import Prepared, prepare_dataset
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.memory_plan import Plan, fixed_micro_batch, plan_for_run
from gpucert.finetune.model.fused import clear_pending
from gpucert.finetune.model.lora import (
    IGNORE_INDEX,
    ModelInfo,
    forward_loss,
    forward_plan,
    load_model,
    merge_adapter,
    supervised_count,
)
from gpucert.finetune.parallel import gradient_sync, resolve_mode, wrap
from gpucert.finetune.run_report import build_report, invocation, write_run_files
from gpucert.finetune.rundir import RunDir, open_run_dir
from gpucert.report.schema import Report
from gpucert.runtime.group import (
    ABORTED_EXIT,
    AbortRecord,
    RendezvousError,
    Runtime,
    fail,
    leave_failed,
    say,
    start_runtime,
    stop_runtime,
)
from gpucert.runtime.sigterm import TermWatch, stopped_by_launcher
from gpucert.status import Status, worst

SCHEMA = "gpucert.finetune.metrics/1"
# Throughput leaves out the first steps of every process (allocator growth, kernel selection, lazy init).
TIMING_WARMUP_STEPS = 2
# The final training loss of the success criterion: the mean of the last steps, as one batch is noisy.
FINAL_LOSS_WINDOW = 5
ADAM_BETAS = (0.9, 0.999)
GIB = 1 << 30
# The shell's convention for a run ended by Ctrl-C (128 + SIGINT).
INTERRUPTED_EXIT = 130
TENSORBOARD_FLUSH_S = 10


# --- The order of the data --------------------------------------------------------------------------------


def plan_steps(train_rows: int, global_batch: int, epochs: float, max_steps: int | None) -> tuple[int, int]:
    """(optimizer steps per epoch, total steps); a partial global batch at an epoch's end is dropped."""
    per_epoch = train_rows // global_batch
    if per_epoch == 0:
        raise ValueError(
            f"the train split has {train_rows} rows, fewer than one global batch of {global_batch} "
            "(micro_batch x grad_accum x processes): lower train.micro_batch or train.grad_accum, or add data"
        )
    total = math.ceil(epochs * per_epoch)
    return per_epoch, min(total, max_steps) if max_steps is not None else total


def epoch_order(rows: int, seed: int, epoch: int) -> list[int]:
    """The epoch's shuffle: a function of seed and epoch only, the same on every rank and after a resume."""
    return torch.randperm(rows, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def rank_micro_batches(global_rows: list[int], rank: int, micro_batch: int, grad_accum: int) -> list[list[int]]:
    """This rank's grad_accum micro-batches of one global batch: rank r takes the r-th contiguous slice."""
    mine = global_rows[rank * micro_batch * grad_accum : (rank + 1) * micro_batch * grad_accum]
    return [mine[i * micro_batch : (i + 1) * micro_batch] for i in range(grad_accum)]


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up over `warmup` steps to the peak, then a cosine to zero at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


# --- One optimizer step -----------------------------------------------------------------------------------


@dataclass
class StepStats:
    loss: float
    grad_norm: float
    lr: float
    time_s: float
    # Tokens of the global batch: rows x row length, non-pad, with a label.
    padded: int
    effective: int
    supervised: int
    # Σs² and Σs over its packed documents, for T_eff.
    doc_sq: int
    doc_len: int
    # This rank's host time for the data inside time_s that the GPU waited for: the copy of rows read ahead, or
    # the whole read when nothing was (the first step of a process). What dataloader workers could hide at most.
    data_s: float = 0.0


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    if dist.get_world_size() == 1:
        return [float(v) for v in values]  # nothing to add: no copy to the device and back, no wait for it
    # float64 keeps token counts exact far beyond any run's size.
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def batch_to(
    rows: list[dict[str, Any]], pad_id: int, device: torch.device, pad_to: int | None = None
) -> dict[str, torch.Tensor]:
    return to_device(collate(rows, pad_id, pad_to), device)


@dataclass
class HostBatch:
    """One step's rows for this rank, read from the prepared set and collated on the host (pinned for CUDA), with
    the counts the step reports, taken from the host copy so that none waits for the GPU."""

    micro_ids: list[list[int]]
    micro: list[dict[str, torch.Tensor]]
    # Each micro-batch's RowLayout, from the host copy: the forward reads nothing back from the GPU.
    layouts: list[RowLayout]
    supervised: int
    padded: int
    effective: int
    doc_sq: int
    doc_len: int


def read_host_batch(
    micro_ids: list[list[int]], dataset: Dataset, pad_id: int, pad_to: int | None, pin: bool
) -> HostBatch:
    micro_rows = [[dataset[i] for i in ids] for ids in micro_ids]
    micro = [collate(rows, pad_id, pad_to) for rows in micro_rows]
    layouts = [row_layout(b) for b in micro]
    if pin:
        # Page-locked, so the step's copy to the GPU is asynchronous (torch's caching host allocator reuses the
        # pages, and holds them until the copy that reads them has run).
        micro = [{k: v.pin_memory() for k, v in b.items()} for b in micro]
        layouts = [layout.pin_memory() for layout in layouts]
    docs = [flops.document_lengths(row["position_ids"]) for rows in micro_rows for row in rows]
    return HostBatch(
        micro_ids=micro_ids,
        micro=micro,
        layouts=layouts,
        supervised=sum(int(supervised_count(b["labels"])) for b in micro),
        padded=sum(b["input_ids"].numel() for b in micro),
        effective=sum(len(row["input_ids"]) for rows in micro_rows for row in rows),
        doc_sq=sum(s * s for d in docs for s in d),
        doc_len=sum(s for d in docs for s in d),
    )


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    host: HostBatch | None,
    micro_ids: list[list[int]],
    dataset: Dataset,
    cfg: FinetuneConfig,
    rt: Runtime,
    pad_id: int,
    read_ahead: list[list[int]] | None = None,
) -> tuple[StepStats, HostBatch | None]:
    """One optimizer step over this rank's micro-batches (row indices into `dataset`), timed from the data to the
    last statistic. `host` is this step's rows when the previous step read them ahead (else they are read here);
    `read_ahead` names the next step's, which are read and collated once this step's work is queued on the GPU
    (host work the GPU does not wait for) and returned with the statistics."""
    started = time.perf_counter()
    pad_to = forward_plan(model).pad_to
    pin = rt.device.type == "cuda"
    if host is None:
        host = read_host_batch(micro_ids, dataset, pad_id, pad_to, pin)
    if host.micro_ids != micro_ids:  # the loop read ahead the wrong rows: exact resume would be lost
        raise RuntimeError(f"rank {rt.rank}: rows read ahead {host.micro_ids} are not this step's {micro_ids}")
    batches = [to_device(b, rt.device) for b in host.micro]
    layouts = [layout.to(rt.device, non_blocking=True) for layout in host.layouts]
    data_s = time.perf_counter() - started
    # The divisor of every micro-step's loss: all supervised tokens of the global batch, known before any backward.
    global_supervised = max(all_reduce_sum([host.supervised], rt.device)[0], 1.0)
    loss_sum = torch.zeros((), device=rt.device)
    for i, (batch, layout) in enumerate(zip(batches, layouts, strict=True)):
        with gradient_sync(model, enabled=i == len(batches) - 1):
            token_loss_sum, _ = forward_loss(model, batch, cfg.model.attn_implementation, layout)
            # DDP and FSDP2 average gradients over ranks; x world turns that average back into the global sum.
            (token_loss_sum * rt.world_size / global_supervised).backward()
        loss_sum += token_loss_sum.detach()
    params = [p for p in model.parameters() if p.requires_grad]
    max_norm = cfg.train.max_grad_norm if cfg.train.max_grad_norm > 0 else math.inf
    # DTensor-aware under FSDP2: the norm is over the full gradients, not this rank's shards.
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    grad_norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    lr = float(scheduler.get_last_lr()[0])
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    refresh = forward_plan(model).refresh_adapters
    if refresh is not None:
        # The updated adapters copied into the frozen GEMMs now, while the GPU still runs this step: the walk over
        # the model costs the GPU nothing here, and the next forward's pre-hook finds nothing changed.
        refresh()
    # Everything above is queued on the GPU and nothing below waits for it until the loss is read: the next
    # step's rows are read now, behind the backward, instead of at the next step's start with the GPU idle
    # (4-5 ms a step of a 7B model: +1.4 % FP8, +0.9 % bf16 on the lent H100, docs/OPTIMIZATION.md).
    upcoming = read_host_batch(read_ahead, dataset, pad_id, pad_to, pin) if read_ahead is not None else None
    totals = all_reduce_sum(
        [float(loss_sum), host.padded, host.effective, host.doc_sq, host.doc_len],
        rt.device,
    )
    stats = StepStats(
        loss=totals[0] / global_supervised,
        grad_norm=float(grad_norm),
        lr=lr,
        time_s=time.perf_counter() - started,
        padded=int(totals[1]),
        effective=int(totals[2]),
        supervised=int(global_supervised),
        doc_sq=int(totals[3]),
        doc_len=int(totals[4]),
        data_s=data_s,
    )
    return stats, upcoming


def compile_step(model: nn.Module, host: HostBatch, cfg: FinetuneConfig, rt: Runtime) -> None:
    """A forward and backward of the step's first micro-batch that leaves no trace: what the first step compiles
    is compiled (or loaded from the cache) here, the gradients are dropped and the random state is put back, so
    the run trains exactly as without it (resume included)."""
    batch = to_device(host.micro[0], rt.device)
    layout = host.layouts[0].to(rt.device, non_blocking=True)
    devices = []
    if rt.device.type == "cuda":
        devices = [rt.device.index if rt.device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        loss_sum, _ = forward_loss(model, batch, cfg.model.attn_implementation, layout)
        loss_sum.backward()
    model.zero_grad(set_to_none=True)


def compile_signature(cfg: FinetuneConfig, rt: Runtime, micro_batch: int, mode: str) -> str:
    """What decides the compiled graphs, for the cache's warm marker: a change in any of these may compile anew."""
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    return signature(
        {
            "model": asdict(cfg.model),
            "lora": asdict(cfg.lora),
            "max_length": cfg.data.max_length,
            "packing": cfg.data.packing,
            "micro_batch": micro_batch,
            "parallel": mode,
            "torch": torch.__version__,
            "triton": triton,
            "device": torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else "cpu",
        }
    )


def process_started_at() -> float | None:
    """When this process started (seconds since the epoch), from /proc; None where there is no /proc."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    # Field 22 of stat (starttime, clock ticks after boot); fields[0] is field 3.
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


@torch.no_grad()
def evaluate_loss(model: nn.Module, rows: Dataset, cfg: FinetuneConfig, rt: Runtime, pad_id: int) -> dict[str, Any]:
    """Token-weighted loss over the whole eval split, rows dealt round-robin to ranks."""
    model.eval()
    mine = list(range(rt.rank, len(rows), rt.world_size))
    micro = fixed_micro_batch(cfg.train)
    # Every rank runs the same number of forwards (FSDP2 gathers parameters collectively in each one);
    # a rank out of rows repeats its first row with no labels, which adds nothing to the sums.
    batches = math.ceil(math.ceil(len(rows) / rt.world_size) / micro)
    loss_sum, count = 0.0, 0
    for b in range(batches):
        chunk = [rows[i] for i in mine[b * micro : (b + 1) * micro]]
        if not chunk:
            first = rows[mine[0] if mine else 0]
            chunk = [{**first, "labels": [IGNORE_INDEX] * len(first["labels"])}]
        batch = batch_to(chunk, pad_id, rt.device, forward_plan(model).pad_to)
        s, n = forward_loss(model, batch, cfg.model.attn_implementation)
        loss_sum += float(s)
        count += int(n)
    model.train()
    total_loss, total_count = all_reduce_sum([loss_sum, count], rt.device)
    return {"loss": total_loss / max(total_count, 1.0), "tokens": int(total_count)}


# --- The run ----------------------------------------------------------------------------------------------


class FinetuneFailed(RuntimeError):
    """A rank of the run failed; the cause is recorded for the job and was printed."""

    def __init__(self, record: AbortRecord) -> None:
        super().__init__(record.message())
        self.record = record


def run_finetune(cfg: FinetuneConfig, profile_peak: flops.Peak | None = None) -> dict[str, Any]:
    """Train as configured in this process (one rank of a torchrun/srun job, or alone); the metrics dict,
    also written to output_dir/metrics.json by rank 0.

    A failure is recorded for the whole job (every other rank exits within a heartbeat interval, naming this
    one) and printed. A lone process then raises FinetuneFailed (KeyboardInterrupt for Ctrl-C); a rank of a
    larger job exits at once with 3 (130 for Ctrl-C), as its peers' watchdogs do: with a peer gone, tearing
    down the process group could hang. A config with a bad value (built in code, not loaded by
    load_finetune_config) is a ConfigError before anything is created.
    """
    problems = cfg.problems()
    if problems:
        raise ConfigError("; ".join(problems))
    rt: Runtime | None = None
    run: RunDir | None = None

    def where_this_rank_was(_: AbortRecord) -> None:
        if rt is not None:
            say(f"{rt.me.describe()} was in {rt.phase}")
        if run is not None:
            run.close(failed=True)  # a peer failed: this process ends next, with no except clause run

    def terminated() -> None:
        """SIGTERM (a launcher stopping every rank because one ended, a cancelled job): say who and where, and
        leave the run directory as a failure leaves it, even while the main thread is blocked in a collective."""
        if rt is not None:
            say(f"{rt.me.describe()} stops (SIGTERM) in {rt.phase}: {stopped_by_launcher(rt).message()}")
        if run is not None:
            run.close(failed=True)

    try:
        rt = start_runtime(cfg.runtime, on_abort=where_this_rank_was)
    except KeyboardInterrupt:
        say("interrupted while joining the job")
        raise
    watch = TermWatch(terminated, ABORTED_EXIT).start()
    try:  # the watch goes whatever ends this (a test's in-process run included)
        try:
            rt.set_phase("setup")
            # Before anything is created: a wrong model path or an unreachable hub is refused in seconds.
            check_model_source(cfg.model)
            run = open_run_dir(cfg, rt)
            result = train(cfg, rt, run, resolve_peak(cfg, profile_peak))
        except (Exception, KeyboardInterrupt) as exc:
            record, code = report_failure(rt, exc)
            if run is not None:
                run.close(failed=True)
            if rt.world_size > 1:
                leave_failed(rt, code)
            stop_runtime(rt)
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise FinetuneFailed(record) from exc
        run.close(failed=False)
        stop_runtime(rt)
    finally:
        watch.stop()
    return result


def report_failure(rt: Runtime, exc: BaseException) -> tuple[AbortRecord, int]:
    """Record this rank's failure for the job and say it: one line naming the rank and phase, then the
    traceback (none for bad input or a full disk, whose messages say what to change). An error that only
    followed a peer's failure (a broken collective) names that peer instead."""
    record = fail(rt, exc)
    if isinstance(exc, KeyboardInterrupt):
        say(f"{rt.me.describe()} interrupted during {rt.phase}")
        return record, INTERRUPTED_EXIT
    if record.rank in (None, rt.rank):
        say(record.message())
        if not isinstance(exc, (ConfigError, NoSpaceError)):
            traceback.print_exception(exc)
    else:
        say(f"{rt.me.describe()} stops: {record.message()}")
        here = (str(exc).strip().splitlines() or [""])[0][:200]
        say(f"{rt.me.describe()} saw, during {rt.phase}: {type(exc).__name__}: {here}")
    return record, Status.ERROR.exit_code


def train(cfg: FinetuneConfig, rt: Runtime, run: RunDir, peak: flops.Peak | None) -> dict[str, Any]:
    started = time.time()
    peak_tflops = peak.tflops if peak else None
    tc = cfg.train
    run_dir = run.path
    log = RankZeroLog(rt, run_dir)
    # An unreadable newest checkpoint is named and skipped (resume auto), in the log.
    resume_from = agree_on_checkpoint(rt, cfg.resume, run_dir, log)
    seed_everything(tc.seed)

    rt.set_phase("data preparation")
    tokenizer = load_tokenizer(cfg.model, cfg.data)
    # Preparation is guarded by a file lock, not a collective: no rank waits on a barrier through it.
    data = prepare_dataset(cfg, tokenizer)
    if resume_from is not None:
        # Checked before the model loads: a refused resume costs seconds, not a 7B load.
        saved = read_trainer_state(resume_from)
        warning = judge_data_change(saved.data_fingerprint, data.fingerprint, resume_from, cfg.resume_allow_data_change)
        if warning:
            log(f"warning: {warning}")
    pad_id = tokenizer.pad_token_id
    mode = resolve_mode(tc.parallel, rt.world_size)
    # Before the model loads (the plan may turn checkpointing on) and before the global batch is counted.
    plan = plan_for_run(cfg, rt, len(tokenizer), mode)
    cfg = plan.apply(cfg)
    tc = cfg.train
    log(plan.message())
    global_batch = plan.micro_batch * tc.grad_accum * rt.world_size
    per_epoch, total_steps = plan_steps(len(data.train), global_batch, tc.epochs, tc.max_steps)
    warmup_steps = math.ceil(tc.warmup_ratio * total_steps)

    compile_dir: Path | None = None
    if cfg.model.compile:
        compile_dir = resolve_cache_dir(tc.compile_cache_dir)
        use_cache_dir(compile_dir)  # before anything compiles
    rt.set_phase("model load")
    # Where the time before the first step goes, beside the compile: start-up (imports, joining the job), data
    # preparation, the model's load.
    setup_s = {"start_up": started - (process_started_at() or started), "data": time.time() - started}
    loading = time.time()
    peft_model, info = load_model(
        cfg.model, cfg.lora, tokenizer, rt.device, cfg.data.max_length, sharded=mode == "fsdp2"
    )
    setup_s["model_load"] = time.time() - loading
    warm: WarmUp | None = None
    if compile_dir is not None and mode != "fsdp2":
        # Before DDP wraps it (a backward through a wrapped model is a gradient all-reduce): one rank per device
        # compiles while the others wait, unless the cache is warm. FSDP2's hooks are part of its compiled layers,
        # so under FSDP2 every rank compiles (or loads) in its first step.
        rt.set_phase("compile warm-up")
        first_rows = epoch_order(len(data.train), tc.seed, 0)[:global_batch]
        ids = rank_micro_batches(first_rows, rt.rank, plan.micro_batch, tc.grad_accum)[:1]
        warm_host = read_host_batch(ids, data.train, pad_id, forward_plan(peft_model).pad_to, rt.device.type == "cuda")
        peft_model.train()
        warm = warm_up(
            partial(compile_step, peft_model, warm_host, cfg, rt),
            rt.rank,
            rt.world_size,
            rt.device,
            compile_dir,
            compile_signature(cfg, rt, plan.micro_batch, mode),
        )
        log(warm_up_line(warm, compile_dir))
    model = wrap(peft_model, rt, mode)
    model.train()
    counts = info.flop_counts()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=tc.lr, betas=ADAM_BETAS, weight_decay=tc.weight_decay, fused=rt.device.type == "cuda" or None
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps, warmup_steps))

    state = TrainerState(global_batch=global_batch, world_size=rt.world_size, data_fingerprint=data.fingerprint)
    if resume_from is not None:
        rt.set_phase(f"resume from {resume_from}")
        state = load_checkpoint(resume_from, model, optimizer, scheduler, rt)
        if state.global_batch != global_batch:
            raise ValueError(
                f"{resume_from}: expected a global batch of {global_batch} rows, found {state.global_batch}: "
                "resume with the same micro_batch x grad_accum x processes, or start a new output_dir"
                + resume_hint(state.global_batch, tc.grad_accum, rt.world_size, plan)
            )
        state.world_size = rt.world_size
        # What the next checkpoints trained on (differs from the loaded one only under resume_allow_data_change).
        state.data_fingerprint = data.fingerprint
        log(f"resumed from {resume_from} at step {state.step}")
    elif cfg.resume == "auto":
        log(f"resume auto: no complete checkpoint under {run_dir}, starting at step 0")
    log(
        f"{info.total_params:,} parameters, {info.trainable_params:,} trainable (LoRA r{cfg.lora.r}); "
        f"{len(data.train):,} train / {len(data.eval):,} eval rows; {total_steps} steps of {global_batch} rows "
        f"({per_epoch} per epoch) on {rt.world_size} x {rt.device.type}, parallel {mode}"
    )
    log(f"fused projections (model.fuse_projections): {info.fused_projections}")

    oom: str | None = None
    steps_this_process = 0
    first_step: dict[str, Any] | None = None
    try:
        orders: dict[int, list[int]] = {}

        def micro_ids_at(epoch: int, index: int) -> list[list[int]]:
            if epoch not in orders:
                orders.clear()  # one epoch's order at a time (a read-ahead across an epoch's end keeps the new one)
                orders[epoch] = epoch_order(len(data.train), tc.seed, epoch)
            global_rows = orders[epoch][index : index + global_batch]
            return rank_micro_batches(global_rows, rt.rank, plan.micro_batch, tc.grad_accum)

        def position(epoch: int, index: int) -> tuple[int, int]:
            # A partial global batch at an epoch's end is dropped: the next epoch starts.
            return (epoch + 1, 0) if index + global_batch > per_epoch * global_batch else (epoch, index)

        host: HostBatch | None = None
        while state.step < total_steps:
            rt.set_phase(f"step {state.step + 1}")
            state.epoch, state.index = position(state.epoch, state.index)
            micro_ids = micro_ids_at(state.epoch, state.index)
            # The next step's rows are read behind this step's GPU work (train_step), the last step reads none.
            read_ahead = None
            if state.step + 1 < total_steps:
                read_ahead = micro_ids_at(*position(state.epoch, state.index + global_batch))
            stats, host = train_step(
                model, optimizer, scheduler, host, micro_ids, data.train, cfg, rt, pad_id, read_ahead
            )
            run.trained = True  # from now on a failure leaves the run directory in place
            state.step += 1
            state.index += global_batch
            steps_this_process += 1
            if steps_this_process == 1:
                first_step = first_step_record(stats.time_s, process_started_at() or started, setup_s)
                log(
                    f"first step after {first_step['time_to_first_step_s']:.1f} s "
                    f"(the step itself {stats.time_s:.1f} s)"
                )
            record = step_record(state.step, stats, counts, rt, peak_tflops, steps_this_process)
            state.loss_history.append(stats.loss)
            state.step_log.append(record)
            if state.step % tc.log_every == 0 or state.step == total_steps:
                log.step(record, total_steps)

            last = state.step == total_steps
            if len(data.eval) and (state.step % tc.eval_every == 0 or last):
                rt.set_phase(f"evaluation at step {state.step}")
                result = {"step": state.step, **evaluate_loss(model, data.eval, cfg, rt, pad_id)}
                state.eval_losses.append(result)
                log.scalar("eval/loss", result["loss"], state.step)
                log(f"step {state.step}: eval loss {result['loss']:.4f} over {result['tokens']:,} tokens")
            if state.step % tc.save_every == 0 or last:
                rt.set_phase(f"checkpoint step {state.step}")
                save_checkpoint(run_dir, model, optimizer, scheduler, state, rt, tc.keep_checkpoints)
    except torch.cuda.OutOfMemoryError as exc:
        if rt.world_size > 1:
            raise  # the other ranks are inside a collective: the job ends, naming this rank
        oom = str(exc).splitlines()[0]
        log(f"out of memory at step {state.step + 1}: {oom}")
        clear_pending(model)  # the failed forward's activations, before the adapter is saved and the run summarised

    adapter_dir = run_dir / "adapter"
    if oom is None:
        rt.set_phase("saving the adapter")
        save_adapter(model, tokenizer, adapter_dir, rt)
    rt.set_phase("summary")
    result = summarise(cfg, rt, info, data, state, run_dir, started, peak, oom, resume_from)
    result.update(compile_summary(rt, compile_dir, warm, first_step))
    result["memory_plan"] = {**plan.to_dict(), "peak_memory_gib": result["peak_memory_gib"]}
    # After summarise's last collective: a 7B merge on slow storage must not hold the other ranks inside one.
    if oom is None and rt.is_main and tc.merge_adapter:
        rt.set_phase("merging the adapter")
        merged_dir = merge_adapter(cfg.model, tokenizer, adapter_dir, run_dir / "merged")
        result["outputs"]["merged"] = str(merged_dir) if merged_dir else None
        if merged_dir is None:
            log("not merging: a random_init base cannot be rebuilt to merge into")
    if rt.is_main:
        rt.set_phase("writing the report")
        write_run_files(run_dir, result, run_report(result, rt, peak, started))
        log(
            f"{result['status']}: report in {run_dir / 'report.json'} (gpucert report {run_dir} --html draws it), "
            f"metrics in {run_dir / 'metrics.json'}, adapter in {adapter_dir}"
        )
    log.close()
    return result


def resume_hint(saved_rows: int, grad_accum: int, world: int, plan: Plan) -> str:
    """What pins the checkpoint's micro-batch when train.micro_batch auto chose another one."""
    if plan.chosen_by == "config" or saved_rows % (grad_accum * world):
        return ""
    return (
        f" (train.micro_batch auto chose {plan.micro_batch} here; the checkpoint trained "
        f"{saved_rows // (grad_accum * world)}: --set train.micro_batch={saved_rows // (grad_accum * world)})"
    )


def warm_up_line(warm: WarmUp, cache_dir: Path) -> str:
    c = warm.counters
    how = {
        "alone": "",
        "first": " (compiled first, the other ranks waiting)",
        "after": f" (after waiting {warm.waited_s:.1f} s for the ranks that compiled first)",
        "together": " (cache warm: every rank at once)",
    }[warm.order]
    return (
        f"compile warm-up {warm.seconds:.1f} s on rank {warm.rank}{how}: compiled graphs "
        f"{c['fxgraph_cache_hit']} loaded, {c['fxgraph_cache_miss']} compiled; cache {cache_dir}"
    )


def first_step_record(step_s: float, since: float, setup_s: dict[str, float]) -> dict[str, Any]:
    """This rank's first step: how long after the process started it ended, the setup before the compile
    warm-up, and torch's compile counters and compile time by phase by then (the warm-up's and the step's)."""
    return {
        "time_to_first_step_s": time.time() - since,
        "first_step_s": step_s,
        "setup_s": setup_s,
        "counters": cache_counters(),
        "phases_s": compile_phases_s(),
    }


def compile_summary(
    rt: Runtime, cache_dir: Path | None, warm: WarmUp | None, first: dict[str, Any] | None
) -> dict[str, Any]:
    """metrics.json's time to the first step (the slowest rank's) and the compile block: the cache directory, the
    warm-up's time, and per rank its warm-up and torch's cache hits and misses. Collective."""
    mine: dict[str, Any] = {
        "rank": rt.rank,
        "warm_up": warm.to_dict() if warm else None,
        "first_step": first,
    }
    ranks: list[Any] = [mine]
    if rt.world_size > 1:
        ranks = [None] * rt.world_size
        dist.all_gather_object(ranks, mine)
    firsts = [r["first_step"] for r in ranks if r["first_step"]]
    warms = [r["warm_up"] for r in ranks if r["warm_up"]]
    return {
        "time_to_first_step_s": max(f["time_to_first_step_s"] for f in firsts) if firsts else None,
        "first_step_s": max(f["first_step_s"] for f in firsts) if firsts else None,
        "compile": {
            "cache_dir": str(cache_dir),
            "warm_up_s": max(w["seconds"] + w["waited_s"] for w in warms) if warms else None,
            "ranks": ranks,
        }
        if cache_dir is not None
        else None,
    }


def seed_everything(seed: int) -> None:
    # The same seed on every rank: FSDP2 does not broadcast weights, so adapters must start alike everywhere.
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --- Measurements -----------------------------------------------------------------------------------------


def step_record(
    step: int, s: StepStats, counts: flops.FlopCounts, rt: Runtime, peak: float | None, nth: int
) -> dict[str, Any]:
    t_eff = s.doc_sq / s.doc_len if s.doc_len else 0.0
    per_token = flops.lora_flops_per_token(counts, t_eff)
    rates = flops.tokens_per_s(s.padded, s.effective, s.supervised, s.time_s)
    return {
        "step": step,
        "loss": s.loss,
        "lr": s.lr,
        "grad_norm": s.grad_norm,
        "step_time_s": s.time_s,
        "data_s": s.data_s,
        "tokens": {"padded": s.padded, "effective": s.effective, "supervised": s.supervised},
        "tokens_per_s": rates,
        "t_eff": t_eff,
        "doc_sq": s.doc_sq,
        "mfu": flops.utilisation(per_token, rates["effective"] / rt.world_size, peak),
        "warmup": nth <= TIMING_WARMUP_STEPS,
        "world_size": rt.world_size,
        "memory_gib": step_memory(rt.device),
    }


def step_memory(device: torch.device) -> dict[str, float | None]:
    """This rank's memory after a step, for the report's memory curve: device memory allocated now and its peak
    so far, host peak RSS so far. Local, no collective: a per-step all-reduce would cost every step; the run's
    summary takes the maximum over ranks once."""
    cuda = device.type == "cuda"
    return {
        "allocated": torch.cuda.memory_allocated(device) / GIB if cuda else None,
        "peak": torch.cuda.max_memory_allocated(device) / GIB if cuda else None,
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,  # ru_maxrss is KiB on Linux
    }


def peak_memory(rt: Runtime) -> dict[str, float | None]:
    """The largest peak over ranks: device memory (CUDA) and host RSS."""
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # ru_maxrss is KiB on Linux
    cuda = rt.device.type == "cuda"
    values = torch.tensor(
        [
            torch.cuda.max_memory_allocated(rt.device) / GIB if cuda else 0.0,
            torch.cuda.max_memory_reserved(rt.device) / GIB if cuda else 0.0,
            rss_gib,
        ],
        dtype=torch.float64,
        device=rt.device,
    )
    if rt.world_size > 1:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    allocated, reserved, rss = values.tolist()
    return {
        "peak_memory_gib": allocated if cuda else None,
        "peak_memory_reserved_gib": reserved if cuda else None,
        "peak_rss_gib": rss,
    }


def versions(rt: Runtime) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for package in ("gpucert", "torch", "transformers", "peft", "datasets"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    found["python"] = sys.version.split()[0]
    found["cuda"] = torch.version.cuda
    found["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if rt.device.type == "cuda" else None
    return found


def run_report(metrics: dict[str, Any], rt: Runtime, peak: flops.Peak | None, started: float) -> Report:
    """report.json of the run, on rank 0: its results with the inventory of rank 0's node (the node that writes;
    a multi-node run's other nodes are in the world size and the subject of its throughput)."""
    from gpucert.hardware.inventory import collect_inventory, live_sources

    return build_report(
        metrics,
        command=invocation(sys.argv),
        host=rt.me.host,
        node=rt.me.node,
        started_at=datetime.fromtimestamp(started, timezone.utc),
        finished_at=datetime.now(timezone.utc),
        inventory=collect_inventory(live_sources()).to_dict(),
        profile=peak.profile if peak and peak.profile else "none",
    )


def data_time_share(records: list[dict[str, Any]]) -> float | None:
    """This rank's host time for the data over the steps that timed it, as a share of their time: what
    dataloader workers could hide at most. Steps logged before data_s existed (a resumed run) are left out."""
    timed = [r for r in records if "data_s" in r]
    seconds = sum(r["step_time_s"] for r in timed)
    return sum(r["data_s"] for r in timed) / seconds if seconds else None


def summarise(
    cfg: FinetuneConfig,
    rt: Runtime,
    info: ModelInfo,
    data: Prepared,
    state: TrainerState,
    run_dir: Path,
    started: float,
    peak: flops.Peak | None,
    oom: str | None,
    resume_from: Path | None,
) -> dict[str, Any]:
    """metrics.json: the run's numbers and its verdict (the worst of its criteria, which report.json's results
    carry too). Collective (peak memory is the max over ranks)."""
    memory = peak_memory(rt)
    counts = info.flop_counts()
    log_ = state.step_log
    timed = [r for r in log_ if not r["warmup"]] or log_
    seconds = sum(r["step_time_s"] for r in timed)
    tokens = {k: sum(r["tokens"][k] for r in log_) for k in ("padded", "effective", "supervised")}
    timed_tokens = {k: sum(r["tokens"][k] for r in timed) for k in ("padded", "effective", "supervised")}
    rates = flops.tokens_per_s(timed_tokens["padded"], timed_tokens["effective"], timed_tokens["supervised"], seconds)
    t_eff = sum(r["doc_sq"] for r in timed) / max(timed_tokens["effective"], 1)
    per_token = flops.lora_flops_per_token(counts, t_eff)
    per_gpu = {k: v / rt.world_size for k, v in rates.items()}
    peak_tflops = peak.tflops if peak else None
    hfu = None
    if cfg.model.gradient_checkpointing:
        recompute = flops.recompute_flops_per_token(counts, t_eff)
        hfu = flops.utilisation(per_token + recompute, per_gpu["effective"], peak_tflops)

    window = state.loss_history[-FINAL_LOSS_WINDOW:]
    final_loss = sum(window) / len(window) if window else None
    adapter_dir = run_dir / "adapter"
    adapter_ok = (adapter_dir / "adapter_model.safetensors").is_file() and (
        adapter_dir / "adapter_config.json"
    ).is_file()
    latest = find_latest(run_dir)
    criteria = flops.judge_run(cfg.train.final_loss_max, final_loss, len(window), adapter_ok, latest, oom)
    return {
        "schema": SCHEMA,
        "status": worst(c.status for c in criteria).value,
        "criteria": [c.to_dict() for c in criteria],
        "wall_time_s": time.time() - started,
        "train_time_s": sum(r["step_time_s"] for r in log_),
        "data_time_share": data_time_share(timed),
        "world_size": rt.world_size,
        "parallel": resolve_mode(cfg.train.parallel, rt.world_size),
        "device": torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else "cpu",
        "versions": versions(rt),
        "model": {"name": cfg.model.name, "dtype": cfg.model.dtype, **asdict(info)},
        "dataset": {
            "source": cfg.data.source,
            "format": cfg.data.format,
            "fingerprint": data.fingerprint,
            "path": str(data.path),
            "train_rows": len(data.train),
            "eval_rows": len(data.eval),
            "stats": data.stats,
        },
        "config": asdict(cfg),
        "steps": len(state.loss_history),
        "resumed_from": str(resume_from) if resume_from else None,
        "timed_steps": len(timed),
        "tokens": tokens,
        "tokens_per_s": rates,
        "tokens_per_s_per_gpu": per_gpu,
        "t_eff": t_eff,
        "flops_per_token": per_token,
        "flops_formula": flops.flops_formula(counts, t_eff),
        "peak_tflops": peak_tflops,
        "peak_source": peak.source if peak else None,
        "mfu": flops.utilisation(per_token, per_gpu["effective"], peak_tflops),
        "hfu": hfu,
        **memory,
        "final_loss": final_loss,
        "loss_history": state.loss_history,
        "eval_losses": state.eval_losses,
        "final_eval_loss": state.eval_losses[-1]["loss"] if state.eval_losses else None,
        "step_log": log_,
        "oom": oom,
        "outputs": {
            "adapter": str(adapter_dir) if adapter_ok else None,
            "merged": None,  # rank 0 fills it in after merging
            "checkpoint": str(latest) if latest else None,
            "tensorboard": str(run_dir / "tensorboard") if (run_dir / "tensorboard").is_dir() else None,
        },
    }


class RankZeroLog:
    """Progress lines on stderr and TensorBoard scalars, from rank 0 only; silent elsewhere."""

    def __init__(self, rt: Runtime, run_dir: Path) -> None:
        self.enabled = rt.is_main
        self.writer: Any = None
        if self.enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self("tensorboard is not installed: no TensorBoard logs (metrics.json has every number)")
            else:
                # A peer's failure ends this process at once (os._exit): lose at most this many seconds of curves.
                self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), flush_secs=TENSORBOARD_FLUSH_S)

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[finetune] {message}", file=sys.stderr, flush=True)

    def scalar(self, name: str, value: float | None, step: int) -> None:
        if self.writer is not None and value is not None:
            self.writer.add_scalar(name, value, step)

    def step(self, r: dict[str, Any], total: int) -> None:
        mfu = f" | MFU {r['mfu']:.1%}" if r["mfu"] is not None else ""
        self(
            f"step {r['step']}/{total} | loss {r['loss']:.4f} | lr {r['lr']:.2e} | grad {r['grad_norm']:.3f} | "
            f"{r['step_time_s']:.2f} s | {r['tokens_per_s']['effective']:,.0f} tok/s effective{mfu}"
        )
        for name, value in (("loss", r["loss"]), ("lr", r["lr"]), ("grad_norm", r["grad_norm"]), ("mfu", r["mfu"])):
            self.scalar(f"train/{name}", value, r["step"])
        for kind, rate in r["tokens_per_s"].items():
            self.scalar(f"tokens_per_s/{kind}", rate, r["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# --- Command line -----------------------------------------------------------------------------------------


def profile_peak() -> flops.Peak | None:
    """The hardware profile's dense BF16 peak for this node's GPU; None on CPUs or an unknown GPU."""
    if not torch.cuda.is_available():
        return None
    from gpucert.config.profiles import select_profile

    try:
        profile = select_profile([torch.cuda.get_device_name(0)])
    except (ConfigError, ImportError):  # an unknown GPU; a checkout run without installing has no gpucert.configs
        return None
    if not profile.bf16_peak_tflops:
        return None
    return flops.Peak(profile.bf16_peak_tflops, f"profile {profile.name}: bf16_peak_tflops", profile.name)


def resolve_peak(cfg: FinetuneConfig, from_profile: flops.Peak | None) -> flops.Peak | None:
    """train.peak_tflops when the config sets it, else the hardware profile's."""
    if cfg.train.peak_tflops:
        profile = from_profile.profile if from_profile else None
        return flops.Peak(cfg.train.peak_tflops, "config train.peak_tflops", profile)
    return from_profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpucert.finetune.train", description=__doc__.split("\n")[0])
    parser.add_argument("config", type=Path, nargs="?", help="finetune YAML (configs/finetune/*.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument("--resume", help="none, auto, or a checkpoint directory (same as --set resume=...)")
    parser.add_argument("--output-dir", help="run directory (same as --set output_dir=...)")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.resume:
        overrides.append(f"resume={json.dumps(args.resume)}")
    if args.output_dir:
        overrides.append(f"output_dir={json.dumps(args.output_dir)}")
    try:
        cfg = load_finetune_config(args.config, overrides, training=True)
    except ConfigError as exc:
        print(f"gpucert finetune: error: {exc}", file=sys.stderr)
        return Status.ERROR.exit_code
    return finetune_exit_code(cfg)


def finetune_exit_code(cfg: FinetuneConfig) -> int:
    """Train, and say how it went as the exit code: the run's verdict, 3 when it failed, 130 on Ctrl-C."""
    try:
        result = run_finetune(cfg, profile_peak())
    except (ConfigError, RendezvousError) as exc:
        print(f"gpucert finetune: error: {exc}", file=sys.stderr)
        return Status.ERROR.exit_code
    except FinetuneFailed:
        return Status.ERROR.exit_code  # run_finetune said which rank failed, where, and why
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT
    return Status(result["status"]).exit_code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
