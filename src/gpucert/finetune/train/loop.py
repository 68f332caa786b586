"""The training loop of `gpucert finetune`, top to bottom: `train` prepares the data, takes the run's plan
(finetune/plan.py), loads and wraps the model, warms the compile cache, then steps (step.py), evaluates and
checkpoints, and at the end saves the adapter and writes the run's files (summary.py). run.py starts it.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from dataclasses import asdict
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from gpucert.finetune.config import FinetuneConfig
from gpucert.finetune.data.prepare import prepare_dataset
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.model.fused import clear_pending
from gpucert.finetune.model.lora import (
    forward_plan,
    load_model,
    merge_adapter,
)
from gpucert.finetune.plan import MemoryPlan, RunPlan, describe_device, plan_model
from gpucert.finetune.train import metrics as flops
from gpucert.finetune.train.checkpoint import (
    CheckpointError,
    TrainerState,
    agree_on_checkpoint,
    judge_data_change,
    load_checkpoint,
    read_trainer_state,
    resume_settings,
    save_adapter,
    save_checkpoint,
)
from gpucert.finetune.train.compile_cache import (
    WarmUp,
    resolve_cache_dir,
    signature,
    use_cache_dir,
    warm_up,
)
from gpucert.finetune.train.memory_plan import plan_for_run
from gpucert.finetune.train.parallel import resolve_mode, wrap
from gpucert.finetune.train.report import stale_evaluations, write_run_files
from gpucert.finetune.train.rundir import RunDir
from gpucert.finetune.train.step import (
    HostBatch,
    compile_step,
    epoch_order,
    evaluate_loss,
    lr_factor,
    plan_steps,
    rank_micro_batches,
    read_host_batch,
    train_step,
)
from gpucert.finetune.train.summary import (
    compile_summary,
    first_step_record,
    run_report,
    step_record,
    summarise,
)
from gpucert.report.schema import Result
from gpucert.report.terminal import result_line
from gpucert.runtime.errors import ReaderLeft
from gpucert.runtime.group import (
    Runtime,
)
from gpucert.status import Status

ADAM_BETAS = (0.9, 0.999)


TENSORBOARD_FLUSH_S = 10


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


def start_up_split(marks: dict[str, float] | None, began: float | None, started: float) -> dict[str, float]:
    """The start-up's parts, from the process's start (`began`) to train()'s (`started`): the imports, joining
    the job, and the set-up after it (run directory, model source check); empty without marks or /proc."""
    if not marks or began is None:
        return {}
    return {
        "imports": marks["imported"] - began,
        "join": marks["joined"] - marks["joining"],
        "run_setup": started - marks["joined"],
    }


def train(
    cfg: FinetuneConfig,
    rt: Runtime,
    run: RunDir,
    peak: flops.Peak | None,
    marks: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One rank's training run. marks: when the caller's imports were done ("imported") and it began and ended
    joining the job ("joining", "joined"), seconds since the epoch, to split the start-up in metrics.json's
    setup_s."""
    started = time.time()
    began = process_started_at()
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
    # Once, before the model loads (the memory plan may turn checkpointing on) and before the global batch is
    # counted; everything below reads it.
    plan = plan_run(cfg, rt, len(tokenizer))
    cfg = plan.memory.apply(cfg)
    tc = cfg.train
    mode = plan.parallel
    log(plan.message())
    global_batch = plan.micro_batch * tc.grad_accum * rt.world_size
    per_epoch, total_steps = plan_steps(len(data.train), global_batch, tc.epochs, tc.max_steps)
    warmup_steps = math.ceil(tc.warmup_ratio * total_steps)

    compile_dir: Path | None = None
    if cfg.model.compile:
        compile_dir = resolve_cache_dir(tc.compile_cache_dir)
        use_cache_dir(compile_dir)  # before anything compiles
    rt.set_phase("model load")
    # Where the time before the first step goes, beside the compile: start-up (imports, joining the job, opening
    # the run directory), data preparation, the model's load.
    setup_s = {"start_up": started - (began or started), **start_up_split(marks, began, started)}
    setup_s["data"] = time.time() - started
    loading = time.time()
    if cfg.model.name != "tiny":
        # Said before, not after: a 7B load is minutes on a CPU and tens of seconds from a cold disk, silent inside.
        slow = " (on a CPU this takes minutes for a 7B model)" if rt.device.type == "cpu" else ""
        log(f"loading {cfg.model.name} onto {rt.device}{slow}")
    peft_model, info = load_model(
        cfg.model, cfg.lora, tokenizer, rt.device, cfg.data.max_length, sharded=mode == "fsdp2", plan=plan.model
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

    state = TrainerState(
        global_batch=global_batch,
        world_size=rt.world_size,
        data_fingerprint=data.fingerprint,
        settings=resume_settings(cfg),
    )
    if resume_from is not None:
        rt.set_phase(f"resume from {resume_from}")
        state = load_checkpoint(resume_from, model, optimizer, scheduler, rt)
        if state.global_batch != global_batch:
            raise CheckpointError(
                f"{resume_from} was trained with a global batch of {state.global_batch} rows; this run's is "
                f"{global_batch} (micro_batch {plan.micro_batch} x grad_accum {tc.grad_accum} x {rt.world_size} "
                "processes): resume with the same global batch, or start a new output_dir"
                + resume_hint(state.global_batch, tc.grad_accum, rt.world_size, plan.memory)
            )
        # The schedule's factor at the restored step, applied now: the optimizer's saved lr is the old schedule's
        # (0 at its last step), which a longer train.max_steps would otherwise train one step with.
        for group, base in zip(optimizer.param_groups, scheduler.base_lrs, strict=True):
            group["lr"] = base * lr_factor(scheduler.last_epoch, total_steps, warmup_steps)
        state.world_size = rt.world_size
        state.settings = resume_settings(cfg)  # checked the same (check_resume_config); older ones recorded none
        # What the next checkpoints trained on (differs from the loaded one only under resume_allow_data_change).
        state.data_fingerprint = data.fingerprint
        log(f"resumed from {resume_from} at step {state.step}")
        if state.step >= total_steps:
            # Nothing is trained: the metrics and report below are the checkpoint's run. Expected of a requeued job
            # that had finished; a config asking for fewer steps than the checkpoint has is said, not passed over.
            past = state.step > total_steps
            log(
                f"{'warning' if past else 'note'}: the checkpoint is at step {state.step}, "
                f"{'past' if past else 'at'} this run's last step {total_steps} (train.max_steps, train.epochs): "
                "nothing is trained and the report is the checkpoint's run"
                + ("; raise train.max_steps to train on" if past else "")
            )
            kept = finished_run(run_dir)
            if kept is not None:
                # A requeued job that had finished: its report stands as written. Rewritten, it lost the run's
                # time to the first step and took the peak memory of a process that trained nothing.
                if rt.is_main:
                    write_line(f"{kept['status']}: the run had finished; its report stands: {run_dir / 'report.json'}")
                log.close()
                return kept
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
            run.mark_trained()  # from now on a failure leaves the run directory in place
            state.step += 1
            state.index += global_batch
            steps_this_process += 1
            if steps_this_process == 1:
                first_step = first_step_record(stats.time_s, began or started, setup_s)
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
    # The run's time from this process's start: from train()'s, a report's duration was shorter than its own
    # time to the first step (the imports and joining the job left out).
    result = summarise(cfg, rt, info, data, state, run_dir, began or started, peak, oom, resume_from)
    result.update(compile_summary(rt, compile_dir, warm, first_step))
    result["plan"] = plan.to_dict()
    result["memory_plan"] = {**plan.memory.to_dict(), "peak_memory_gib": result["peak_memory_gib"]}
    # After summarise's last collective: a 7B merge on slow storage must not hold the other ranks inside one.
    if oom is None and rt.is_main and tc.merge_adapter:
        rt.set_phase("merging the adapter")
        merged_dir = merge_adapter(cfg.model, tokenizer, adapter_dir, run_dir / "merged")
        result["outputs"]["merged"] = str(merged_dir) if merged_dir else None
        if merged_dir is None:
            log("not merging: a random_init base cannot be rebuilt to merge into")
    if rt.is_main:
        rt.set_phase("writing the report")
        write_run_files(run_dir, result, run_report(result, rt, peak, began or started))
        # Why a run did not pass, on stdout as every verb's results are (progress is stderr's): the verdict line
        # alone sent the user to report.json. Each WARN, FAIL or ERROR as gpucert's plain output prints it
        # (threshold source and remedy included), so `grep '^FAIL'` finds it in a job log.
        criteria = list(map(Result.from_dict, result["criteria"]))
        for criterion in criteria:
            if criterion.status >= Status.WARN:
                write_line(result_line(criterion))
        # A PASS that held the loss to nothing says so: it covers the run finishing, not what it learnt.
        unjudged = [c.name for c in criteria if c.status is Status.INFO]
        caveat = f" (not judged: {', '.join(unjudged)}, no threshold set)" if unjudged else ""
        write_line(
            f"{result['status']}{caveat}: report in {run_dir / 'report.json'} (gpucert report {run_dir} --html "
            f"draws it), metrics in {run_dir / 'metrics.json'}, adapter in {adapter_dir}"
        )
        if steps_this_process:
            for old in stale_evaluations(run_dir):
                log(f"note: {old} scored the adapter before this run trained it on: gpucert evaluate again")
    log.close()
    return result


def finished_run(run_dir: Path) -> dict[str, Any] | None:
    """The metrics of the run that finished in run_dir (its report.json and metrics.json written), or None."""
    try:
        if not (run_dir / "report.json").is_file():
            return None
        kept = json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) and "status" in kept else None


def plan_run(cfg: FinetuneConfig, rt: Runtime, vocab_size: int) -> RunPlan:
    """The run's plan (finetune/plan.py): the parallelism, the model's levers from the config and this GPU, and
    the memory plan of that model. Collective under train.micro_batch auto on CUDA (the free memory the memory
    plan fits into is the minimum over ranks, so every rank plans alike)."""
    parallel = resolve_mode(cfg.train.parallel, rt.world_size)
    device = describe_device(rt.device)
    model = plan_model(cfg.model, cfg.lora, device, sharded=parallel == "fsdp2")
    memory = plan_for_run(cfg, rt, vocab_size, parallel, model)
    full = memory.checkpointing == "full"
    if full != model.gradient_checkpointing.on:
        model = model.with_checkpointing(full, "turned on by the memory plan: no micro-batch fits without it")
    return RunPlan(device, parallel, rt.world_size, model, memory)


def resume_hint(saved_rows: int, grad_accum: int, world: int, plan: MemoryPlan) -> str:
    """What pins the checkpoint's micro-batch when train.micro_batch auto chose another one."""
    if plan.chosen_by == "config" or saved_rows % (grad_accum * world):
        return ""
    return (
        f" (train.micro_batch auto chose {plan.micro_batch} here; the checkpoint trained "
        f"{saved_rows // (grad_accum * world)}: --set train.micro_batch={saved_rows // (grad_accum * world)})"
    )


def warm_up_line(warm: WarmUp, cache_dir: Path) -> str:
    c = warm.counters
    # Inductor keys graphs by device index: on one node every GPU's first rank compiles, at once.
    others = warm.first_ranks - 1
    beside = f", as did the first rank of each of {others} other device(s)" if others else ""
    waiting = f", {warm.waiting_ranks} other rank(s) waiting to load" if warm.waiting_ranks else ""
    how = {
        "alone": "",
        "first": f" (compiled first{beside}{waiting})",
        "after": f" (after waiting {warm.waited_s:.1f} s for the ranks that compiled first)",
        "together": " (cache warm: every rank at once)",
    }[warm.order]
    return (
        f"compile warm-up {warm.seconds:.1f} s on rank {warm.rank}{how}: compiled graphs "
        f"{c['fxgraph_cache_hit']} loaded, {c['fxgraph_cache_miss']} compiled; cache {cache_dir}"
    )


def seed_everything(seed: int) -> None:
    # The same seed on every rank: FSDP2 does not broadcast weights, so adapters must start alike everywhere.
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def write_line(line: str, stream: TextIO | None = None) -> None:
    """A line on stdout (the run's result), or on `stream` (RankZeroLog's progress: stderr). A reader gone
    (`gpucert finetune 2>&1 | head`) is ReaderLeft: the run stops, every rank (run.py)."""
    try:
        print(line, file=stream or sys.stdout, flush=True)
    except BrokenPipeError:
        raise ReaderLeft("the reader of gpucert's output closed it") from None


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
            write_line(f"[finetune] {message}", sys.stderr)

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
