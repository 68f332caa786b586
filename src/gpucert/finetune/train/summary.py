"""What a fine-tuning run measured: each step's record (tokens/s three ways, MFU, memory), the time to the first
step and the compile cache's work, and at the end metrics.json (every number and the run's criteria) and
report.json (train/report.py renders the report schema from it).
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpucert import bytecode
from gpucert.finetune.config import FinetuneConfig
from gpucert.finetune.data.prepare import Prepared
from gpucert.finetune.model.flop_counts import FlopCounts
from gpucert.finetune.model.lora import (
    ModelInfo,
)
from gpucert.finetune.train import metrics as flops
from gpucert.finetune.train.checkpoint import (
    TrainerState,
    find_latest,
)
from gpucert.finetune.train.compile_cache import (
    WarmUp,
    cache_counters,
    compile_phases_s,
)
from gpucert.finetune.train.parallel import resolve_mode
from gpucert.finetune.train.report import build_report, invocation
from gpucert.finetune.train.step import (
    StepStats,
)
from gpucert.report.schema import Report
from gpucert.runtime.group import (
    Runtime,
)
from gpucert.status import worst

SCHEMA = "gpucert.finetune.metrics/1"


# Throughput leaves out the first steps of every process (allocator growth, kernel selection, lazy init).
TIMING_WARMUP_STEPS = 2


# The final training loss of the success criterion: the mean of the last steps, as one batch is noisy.
FINAL_LOSS_WINDOW = 5


GIB = 1 << 30


def first_step_record(step_s: float, since: float, setup_s: dict[str, float]) -> dict[str, Any]:
    """This rank's first step: how long after the process started it ended, the setup before the compile
    warm-up, where Python's bytecode came from (bytecode.py), and torch's compile counters and compile time by
    phase by then (the warm-up's and the step's)."""
    return {
        "time_to_first_step_s": time.time() - since,
        "first_step_s": step_s,
        "setup_s": setup_s,
        "bytecode": dict(bytecode.decision) or None,
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
        # Rank 0's start-up split (imports, joining, data, the model's load), compiled or not.
        "first_step_setup_s": (ranks[0]["first_step"] or {}).get("setup_s"),
        "compile": {
            "cache_dir": str(cache_dir),
            "warm_up_s": max(w["seconds"] + w["waited_s"] for w in warms) if warms else None,
            "ranks": ranks,
        }
        if cache_dir is not None
        else None,
    }


def per_gpu_rates(steps: list[dict[str, Any]], world_size: int) -> dict[str, float]:
    """Tokens/s per GPU over the GPU-seconds each step used (its time x its processes; world_size for records
    that do not say). A run resumed on another number of processes divided every step by the last one's: two
    processes' steps counted as one GPU's inflated the figure, and its MFU."""
    tokens = {k: sum(r["tokens"][k] for r in steps) for k in ("padded", "effective", "supervised")}
    gpu_seconds = sum(r["step_time_s"] * r.get("world_size", world_size) for r in steps)
    return flops.tokens_per_s(tokens["padded"], tokens["effective"], tokens["supervised"], gpu_seconds)


def step_record(
    step: int, s: StepStats, counts: FlopCounts, rt: Runtime, peak: float | None, nth: int
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


def step_time_spread(records: list[dict[str, Any]]) -> dict[str, float] | None:
    """The timed steps' median time and their slowest, with its step number. The run's tokens/s is a mean over
    those steps, so one stall moves it: on one H200 (2026-11-29) a single step of 1.09 s among steps of 0.63 s took
    5.5 % off a 12-step run's figure. The report names such a step (report.SLOW_STEP_FACTOR)."""
    if not records:
        return None
    slowest = max(records, key=lambda r: r["step_time_s"])
    return {
        "median": statistics.median(r["step_time_s"] for r in records),
        "slowest": slowest["step_time_s"],
        "slowest_step": slowest["step"],
    }


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
    per_gpu = per_gpu_rates(timed, rt.world_size)
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
        "wall_time_s": time.time() - started,  # this process, from its start
        "train_time_s": sum(r["step_time_s"] for r in log_),  # every step of the run, a resume's earlier ones too
        "data_time_share": data_time_share(timed),
        "step_time_s": step_time_spread(timed),
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
