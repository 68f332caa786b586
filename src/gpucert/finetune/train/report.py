"""A fine-tuning run as a gpucert report: `report.json` (and `report.md`) in the run directory.

`gpucert report RUN [--html]` renders it like any other run (loss and eval-loss curves, tokens/s and MFU per
step, memory, the data-preparation report) and `gpucert report RUN_A RUN_B` compares two runs.

Pure functions of the run's metrics dict (train.summarise, also written as metrics.json), so every result can
be checked without training:
- the success criteria (metrics.judge_run) are the only judged results: final loss against
  train.final_loss_max, the adapter and a checkpoint on disk, no out-of-memory error;
- every other number (eval loss, tokens/s per GPU, MFU, memory, the data counts) has no threshold in the
  recipe or the profile: INFO, shown and compared between runs, never a PASS that could not have failed; SKIP
  where it does not apply (MFU without a peak, device memory on a CPU). The report's verdict is therefore the
  criteria's, the same as metrics.json's "status".
- result `steps` carries the per-step series in its details (what the plots draw): step, loss, lr, grad_norm,
  step_time_s, tokens_per_s_per_gpu (effective), supervised_tokens_per_s_per_gpu, mfu_pct, memory_peak_gib
  and memory_allocated_gib (rank 0's device), rss_gib (rank 0's host), warmup (left out of the throughput
  figures), and eval_step / eval_loss. A null is a value not measured at that step (MFU on a CPU, memory in a
  step logged before it was recorded).
- result `train.memory_plan` (runs from the memory plan on): the micro-batch and checkpointing trained with, how
  they were chosen, the estimate of the peak and the measured peak beside it (details: the plan with the
  estimate's parts, free memory, budget and the larger micro-batches that would not fit).
- result `data.preparation` carries the data-preparation report (prepare.py's stats) in its details.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import gpucert
from gpucert.finetune.train.metrics import CATEGORY, LOSS_UNIT, RUN_SUBJECT
from gpucert.report.schema import Report, Result, RunMeta
from gpucert.report.store import write_atomic, write_report
from gpucert.status import Status

VERB = "finetune"
DATA_CATEGORY = "data"
DATA_SUBJECT = "prepared data"
STEPS_RESULT = "steps"
DATA_RESULT = "data.preparation"
MEMORY_PLAN_RESULT = "train.memory_plan"
# A timed step this many times the median is named beside the tokens/s: one stall (a garbage collection, another
# process on the GPU or the host) lowers the mean a benchmark quotes, where the median does not move.
SLOW_STEP_FACTOR = 1.25


def invocation(argv: list[str]) -> list[str]:
    """The command line as a user would retype it: `gpucert finetune ...` or `python -m gpucert.finetune.train ...`
    (torchrun starts the module by its file path)."""
    if not argv:
        return []
    program = Path(argv[0])
    if program.name == "gpucert" or program.parts[-2:] == ("gpucert", "__main__.py"):
        return ["gpucert", *argv[1:]]
    if program.parts[-4:] == ("gpucert", "finetune", "train", "__main__.py"):
        return ["python", "-m", "gpucert.finetune.train", *argv[1:]]
    return list(argv)


def step_series(metrics: dict[str, Any]) -> dict[str, list[Any]]:
    """The per-step series of the run (see the module docstring), one list per quantity, aligned on `step`."""
    log = metrics.get("step_log") or []
    world = metrics.get("world_size") or 1

    def per_gpu(record: dict[str, Any], kind: str) -> float | None:
        rate = (record.get("tokens_per_s") or {}).get(kind)
        return None if rate is None else rate / (record.get("world_size") or world)

    def memory(record: dict[str, Any], key: str) -> float | None:
        return (record.get("memory_gib") or {}).get(key)

    evals = metrics.get("eval_losses") or []
    return {
        "step": [r["step"] for r in log],
        "loss": [r.get("loss") for r in log],
        "lr": [r.get("lr") for r in log],
        "grad_norm": [r.get("grad_norm") for r in log],
        "step_time_s": [r.get("step_time_s") for r in log],
        "tokens_per_s_per_gpu": [per_gpu(r, "effective") for r in log],
        "supervised_tokens_per_s_per_gpu": [per_gpu(r, "supervised") for r in log],
        "mfu_pct": [None if r.get("mfu") is None else 100 * r["mfu"] for r in log],
        "memory_peak_gib": [memory(r, "peak") for r in log],
        "memory_allocated_gib": [memory(r, "allocated") for r in log],
        "rss_gib": [memory(r, "rss") for r in log],
        "warmup": [bool(r.get("warmup")) for r in log],
        "eval_step": [e["step"] for e in evals],
        "eval_loss": [e["loss"] for e in evals],
    }


def _info(name: str, value: Any, unit: str | None, message: str, **fields: Any) -> Result:
    fields.setdefault("subject", RUN_SUBJECT)
    fields.setdefault("category", CATEGORY)
    return Result(name=name, status=Status.INFO, message=message, value=value, unit=unit, **fields)


def _skip(name: str, message: str, unit: str | None = None) -> Result:
    return Result(name=name, subject=RUN_SUBJECT, status=Status.SKIP, message=message, unit=unit, category=CATEGORY)


def _steps(metrics: dict[str, Any]) -> Result:
    train = metrics["config"]["train"]
    global_batch = train["micro_batch"] * train["grad_accum"] * metrics["world_size"]
    resumed = f"; resumed from {metrics['resumed_from']}" if metrics.get("resumed_from") else ""
    return _info(
        STEPS_RESULT,
        metrics["steps"],
        "steps",
        f"{metrics['steps']} optimizer steps of {global_batch} rows (micro_batch {train['micro_batch']} x "
        f"grad_accum {train['grad_accum']} x {metrics['world_size']} processes){resumed}",
        details=step_series(metrics),
    )


def _eval_loss(metrics: dict[str, Any]) -> Result:
    evals = metrics.get("eval_losses") or []
    if not evals:
        return _skip("eval_loss", "no evaluation ran (no eval rows, or no step reached train.eval_every)", LOSS_UNIT)
    last, first = evals[-1], evals[0]
    since = f" (first, at step {first['step']}: {first['loss']:.4f})" if len(evals) > 1 else ""
    return _info(
        "eval_loss",
        last["loss"],
        LOSS_UNIT,
        f"held-out loss at step {last['step']} over {last['tokens']:,} supervised tokens: {last['loss']:.4f}{since}; "
        "no eval-loss threshold in the recipe",
    )


def _step_spread(spread: dict[str, float] | None) -> str:
    """The timed steps' median, and the slowest step when it stands out enough to move the mean tokens/s."""
    if not spread:
        return ""  # runs before it was measured, or none timed
    median, slowest = spread["median"], spread["slowest"]
    text = f"; step time median {median:.3f} s"
    if median > 0 and slowest > SLOW_STEP_FACTOR * median:
        text += (
            f", step {spread['slowest_step']} {slowest:.3f} s ({slowest / median:.1f}x the median: a stall, which "
            "lowers this mean; a run of more steps, or the median, tells the speed)"
        )
    return text


def _throughput(metrics: dict[str, Any]) -> Result:
    per_gpu, total = metrics["tokens_per_s_per_gpu"], metrics["tokens_per_s"]
    world, device = metrics["world_size"], metrics["device"]
    share = metrics.get("data_time_share")  # absent from runs before it was measured
    # The host's share says whether a faster input pipeline could pay: under 1 % on the lent H100.
    data = f"; the data's host work {100 * share:.2f} % of the step time" if share is not None else ""
    spread = metrics.get("step_time_s")
    return _info(
        "tokens_per_s_per_gpu",
        per_gpu["effective"],
        "tokens/s",
        f"{per_gpu['effective']:,.0f} effective (non-pad) tokens/s per GPU over {metrics['timed_steps']} timed steps "
        f"on {world} x {device} (parallel {metrics['parallel']}); padded {per_gpu['padded']:,.0f}, supervised "
        f"{per_gpu['supervised']:,.0f}; all ranks {total['effective']:,.0f}{data}{_step_spread(spread)}",
        details={
            "per_gpu": per_gpu,
            "all_ranks": total,
            "world_size": world,
            "device": device,
            "parallel": metrics["parallel"],
            "timed_steps": metrics["timed_steps"],
            "data_time_share": share,
            "step_time_s": spread,
        },
    )


def _utilisation(metrics: dict[str, Any], name: str, value: float | None, what: str) -> Result:
    if value is None:
        return _skip(
            name,
            f"no peak FLOP/s for {metrics['device']}: {what} needs train.peak_tflops or a GPU a hardware profile "
            "matches",
            "%",
        )
    return _info(
        name,
        100 * value,
        "%",
        f"{what} {value:.1%} of {metrics['peak_tflops']:g} TFLOP/s ({metrics.get('peak_source') or 'peak'}); "
        f"{metrics['flops_per_token']:,.0f} FLOPs/token at T_eff {metrics['t_eff']:,.1f}",
        details={
            "flops_formula": metrics["flops_formula"],
            "flops_per_token": metrics["flops_per_token"],
            "t_eff": metrics["t_eff"],
            "peak_tflops": metrics["peak_tflops"],
            "peak_source": metrics.get("peak_source"),
        },
    )


def _memory(metrics: dict[str, Any]) -> list[Result]:
    rss = _info(
        "peak_rss_gib",
        metrics["peak_rss_gib"],
        "GiB",
        f"largest host resident set over ranks: {metrics['peak_rss_gib']:.2f} GiB",
    )
    device = metrics.get("peak_memory_gib")
    if device is None:
        return [
            _skip("peak_memory_gib", f"no GPU memory on {metrics['device']}: host memory is peak_rss_gib", "GiB"),
            rss,
        ]
    reserved = metrics.get("peak_memory_reserved_gib")
    return [
        _info(
            "peak_memory_gib",
            device,
            "GiB",
            f"largest peak of allocated device memory over ranks: {device:.2f} GiB"
            + (f" ({reserved:.2f} GiB reserved by the caching allocator)" if reserved is not None else ""),
            details={"reserved_gib": reserved},
        ),
        rss,
    ]


def _memory_plan(plan: dict[str, Any]) -> Result:
    """The plan the run trained with (train/memory_plan.py) and its estimate beside the measured peak: INFO,
    so the estimate's error shows in every run; the plan's own check is that the run did not run out of memory."""
    what = "full checkpointing" if plan["checkpointing"] == "full" else "no checkpointing"
    chosen = {"auto": "chosen by train.micro_batch auto", "cpu": "train.micro_batch auto on a CPU: 1"}.get(
        plan["chosen_by"], "as configured"
    )
    text = f"micro-batch {plan['micro_batch']}, {what} ({chosen})"
    estimate, peak = plan.get("estimate_gib"), plan.get("peak_memory_gib")
    if estimate is not None:
        text += f"; estimate {estimate:.1f} GiB of {plan['free_gib']:.1f} GiB free"
        if peak:
            text += f", measured peak {peak:.1f} GiB (estimate {100 * (estimate - peak) / peak:+.1f} %)"
    elif plan.get("reasons"):
        text += f"; no estimate: {'; '.join(plan['reasons'])}"
    return _info(MEMORY_PLAN_RESULT, estimate, "GiB", text, details=plan)


def _split_text(name: str, split: dict[str, Any]) -> str:
    share = split.get("supervised_share")
    return (
        f"{name}: {split.get('conversations', '?')} conversations -> {split.get('rows', '?')} rows, "
        f"{split.get('tokens', 0):,} tokens"
        + (f" ({share:.1%} supervised)" if isinstance(share, float) else "")
        + f", {split.get('truncated', 0)} truncated, {split.get('dropped', 0)} dropped"
    )


def _cases_text(kind: str, cases: Any) -> str | None:
    """ "dropped 10 rows (bad_arguments 5, duplicate_assistant_turns 5)" from a case tally; None if none."""
    if not isinstance(cases, dict) or not cases:
        return None
    counts = {case: tally.get("count", 0) for case, tally in cases.items() if isinstance(tally, dict)}
    listed = ", ".join(f"{case} {n}" for case, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    return f"{kind} {sum(counts.values())} rows ({listed})"


def data_result(dataset: dict[str, Any]) -> Result:
    """The data-preparation report (prepare.py's stats, whatever counts it holds) as one INFO result: the
    refusals (data.max_bad_row_share, empty splits) already stopped any run whose data was not usable."""
    stats = dataset.get("stats") or {}
    parts = [f"{stats.get('parsed', '?')} parsed, {stats.get('unparsable', 0)} unparsable"]
    if stats.get("bad_lines"):
        parts.append(f"{stats['bad_lines']} of {stats.get('lines', '?')} lines skipped (not JSON objects)")
    parts += [text for kind in ("dropped", "repaired") if (text := _cases_text(kind, stats.get(kind)))]
    splits = [_split_text(s, stats[s]) for s in ("train", "eval") if isinstance(stats.get(s), dict)]
    return Result(
        name=DATA_RESULT,
        subject=DATA_SUBJECT,
        status=Status.INFO,
        message=f"{stats.get('rows', '?')} rows from {dataset.get('source')}: " + "; ".join(parts + splits),
        value=stats.get("parsed"),
        unit="rows",
        category=DATA_CATEGORY,
        details={**stats, "path": dataset.get("path")},
    )


def _first_step(metrics: dict[str, Any]) -> Result:
    """Time from the process's start to the end of its first step, and the compile inside it (summary.py's
    compile_summary; compile_cache.py)."""
    total, compile_ = metrics["time_to_first_step_s"], metrics.get("compile") or {}
    warm = compile_.get("warm_up_s")
    ranks = compile_.get("ranks") or []
    compiled = sum(((r.get("warm_up") or {}).get("counters") or {}).get("fxgraph_cache_miss", 0) for r in ranks)
    loaded = sum(((r.get("warm_up") or {}).get("counters") or {}).get("fxgraph_cache_hit", 0) for r in ranks)
    how = (
        f"; compile warm-up {warm:.1f} s ({compiled} graphs compiled, {loaded} loaded from {compile_['cache_dir']})"
        if warm is not None
        else ""
    )
    # Rank 0's set-up before the warm-up (loop.py setup_s): where the rest of the time went, compiled or not.
    first = ((ranks[0] or {}).get("first_step") or {}) if ranks else {}
    setup = metrics.get("first_step_setup_s") or first.get("setup_s") or {}
    steps = ("imports", "join", "run_setup", "data", "model_load")
    parts = [(k.replace("_", " "), setup[k]) for k in steps if k in setup]
    if parts:
        how += "; before it " + ", ".join(f"{name} {s:.1f} s" for name, s in parts)
    code = first.get("bytecode") or {}
    if code.get("cache"):  # the imports read (or, on a first start, wrote) Python's bytecode there (bytecode.py)
        state = f", {code['state']}" if code.get("state") else ""
        how += f" (Python's bytecode from {code['cache']}{state}: {code['reason']})"
    return _info(
        "time_to_first_step",
        total,
        "s",
        f"first step done {total:.1f} s after the process started (the step itself {metrics['first_step_s']:.1f} s)"
        f"{how}; no threshold in the recipe",
        details={"first_step_s": metrics["first_step_s"], "compile": compile_},
    )


def run_results(metrics: dict[str, Any]) -> list[Result]:
    """Every result of a run: the judged criteria first, then the measurements (INFO or SKIP), then the data."""
    criteria = [Result.from_dict(c) for c in metrics["criteria"]]
    measured = [_steps(metrics), _eval_loss(metrics), _throughput(metrics)]
    measured.append(_utilisation(metrics, "mfu", metrics.get("mfu"), "LoRA-aware MFU"))
    if metrics["config"]["model"]["gradient_checkpointing"]:
        measured.append(_utilisation(metrics, "hfu", metrics.get("hfu"), "HFU (with checkpoint recompute)"))
    if metrics.get("time_to_first_step_s") is not None:  # absent from runs before it was measured
        measured.append(_first_step(metrics))
    plan = [_memory_plan(metrics["memory_plan"])] if metrics.get("memory_plan") else []
    return [*criteria, *measured, *_memory(metrics), *plan, data_result(metrics["dataset"])]


def build_report(
    metrics: dict[str, Any],
    *,
    command: list[str],
    host: str,
    node: str,
    started_at: datetime,
    finished_at: datetime,
    inventory: dict[str, Any],
    profile: str,
) -> Report:
    """The run's report: its results, rank 0's node inventory and the resolved config."""
    meta = RunMeta(
        tool_version=gpucert.__version__,
        method_version=gpucert.METHOD_VERSION,
        verb=VERB,
        command=command,
        host=host,
        started_at=started_at.isoformat(),
        finished_at=finished_at.isoformat(),
        duration_s=round(max((finished_at - started_at).total_seconds(), 0.0), 3),
        profile=profile,
        config=metrics["config"],
        # The inventory's versions where both name a package (it reads them the way every report does).
        software={**(metrics.get("versions") or {}), **(inventory.get("software") or {})},
        nodes=[node],
    )
    return Report(meta=meta, inventory=inventory, results=run_results(metrics))


def write_run_files(run_dir: Path, metrics: dict[str, Any], report: Report) -> None:
    """report.json and report.md, then metrics.json last (its presence says the run finished, for the tools
    that read it); each file is written whole or not at all."""
    # A report.html drawn from an earlier report of this directory (a run resumed to more steps) would show the
    # old curves beside the new report: `gpucert report DIR --html` draws it again.
    (run_dir / "report.html").unlink(missing_ok=True)
    write_report(report, run_dir)
    write_atomic(run_dir / "metrics.json", json.dumps(metrics, indent=1))


def stale_evaluations(run_dir: Path) -> list[Path]:
    """The evaluations under run_dir (`gpucert evaluate`'s default outputs beside the adapter) that scored the
    adapter as it was before this run wrote it again."""
    return [d for d in (run_dir / "evaluation", run_dir / "evaluation-bfcl") if (d / "report.json").is_file()]
