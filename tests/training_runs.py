"""Fine-tuning and evaluation reports for the report tests, built by the code that builds real ones.

`synthetic_metrics` is the metrics dict train.summarise returns, for a 40-step LoRA run of a Qwen2-7B-shaped
model on one H100 with the numbers of fine-tuning.md §4 (r64, 2 x 4096 rows: 5,397 tokens/s, 18.7 % MFU,
31.7 GiB); tests/finetune/test_train.py checks a real run's dict has the same keys. `training_report` turns it
into the report training writes (run_report.build_report), `evaluation_report` is an evaluation's report.
"""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from gpucert.finetune.config import LoraConfig, ModelConfig
from gpucert.finetune.plan import Device, plan_model
from gpucert.finetune.train.metrics import judge_run
from gpucert.finetune.train.report import build_report
from gpucert.finetune.train.summary import step_time_spread
from gpucert.report.schema import Report, Result, RunMeta
from gpucert.status import Status
from tests.conftest import FIXTURES

STARTED = datetime(2026, 11, 21, 9, 0, tzinfo=timezone.utc)
# The lent H100's real inventory (docs/examples): one H100 80GB HBM3.
INVENTORY: dict[str, Any] = json.loads((FIXTURES.parent.parent / "docs/examples/h100-health.json").read_text())[
    "inventory"
]
STATS: dict[str, Any] = {
    "fingerprint": "70dc0ced9075",
    "data_method_version": "2",
    "source": "glaiveai/glaive-function-calling-v2",
    "format": "glaive",
    "template": "qwen2.5-tools",
    "max_length": 4096,
    "packing": True,
    "rows": 112960,
    "parsed": 112890,
    "unparsable": 70,
    "lines": 112962,
    "bad_lines": 2,
    "bad_line_examples": ["glaive.jsonl:5001: not a JSON object"],
    "dropped": {
        "bad_arguments": {
            "count": 52,
            "examples": [{"row": 17, "at": "glaive.jsonl:18", "excerpt": "arguments are not JSON: '{\"a\": '"}],
        },
        "undeclared_function": {
            "count": 18,
            "examples": [{"row": 903, "at": "glaive.jsonl:904", "excerpt": "<b>x</b>"}],
        },
    },
    "repaired": {"arguments_key": {"count": 43, "examples": []}},
    "unparsable_examples": [[17, "arguments are not JSON"], [903, "no ASSISTANT turn"]],
    "train": {
        "conversations": 107245,
        "rows": 21034,
        "tokens": 85_950_000,
        "truncated": 12,
        "dropped": 3,
        "supervised_share": 0.31,
        "fill": 0.997,
        "repairs": {"arguments_key": 41},
    },
    "eval": {
        "conversations": 5645,
        "rows": 1101,
        "tokens": 4_512_000,
        "truncated": 0,
        "dropped": 0,
        "supervised_share": 0.30,
        "fill": 0.996,
        "repairs": {"arguments_key": 2},
    },
}


def synthetic_metrics(
    steps: int = 40,
    tokens_per_s: float = 5397.0,
    mfu: float | None = 0.187,
    peak_gib: float | None = 31.7,
    final_loss_max: float | None = 1.2,
    loss_scale: float = 1.0,
    gradient_checkpointing: bool = True,
) -> dict[str, Any]:
    """A finished run's metrics: the loss falls from 2.5 towards 0.8 (x loss_scale), the first two steps are the
    warm-up (slower), an evaluation every 20 steps. None for mfu / peak_gib: a CPU run."""
    world, rows_tokens = 1, 2 * 4096
    log = []
    for step in range(1, steps + 1):
        warm = step <= 2
        rate = tokens_per_s * (0.6 if warm else 1.0 + 0.01 * math.sin(step))
        log.append(
            {
                "step": step,
                "loss": loss_scale * (0.8 + 1.7 * math.exp(-step / 10)),
                "lr": 2e-4,
                "grad_norm": 0.4,
                "step_time_s": rows_tokens / rate,
                "data_s": 0.007 * rows_tokens / rate,  # the share measured on the lent H100 (OPTIMIZATION.md)
                "tokens": {"padded": rows_tokens, "effective": rows_tokens, "supervised": rows_tokens // 3},
                "tokens_per_s": {"padded": rate, "effective": rate, "supervised": rate / 3},
                "t_eff": 4096.0,
                "doc_sq": 2 * 4096 * 4096,
                "mfu": None if mfu is None else mfu * rate / tokens_per_s,
                "warmup": warm,
                "world_size": world,
                "memory_gib": {
                    "allocated": None if peak_gib is None else peak_gib * 0.55,
                    "peak": None if peak_gib is None else peak_gib * min(1.0, 0.9 + step / 200),
                    "rss": 6.0 + step / 100,
                },
            }
        )
    losses = [r["loss"] for r in log]
    window = losses[-5:]
    final_loss = sum(window) / len(window)
    checkpoint = Path(f"runs/qwen/checkpoints/step-{steps}")
    criteria = judge_run(final_loss_max, final_loss, len(window), True, checkpoint, None)
    evals = [{"step": s, "loss": loss_scale * (0.9 + 1.6 * math.exp(-s / 10)), "tokens": 51_000} for s in (20, 40)]
    per_gpu = {"padded": tokens_per_s, "effective": tokens_per_s, "supervised": tokens_per_s / 3}
    return {
        "schema": "gpucert.finetune.metrics/1",
        "status": max(c.status for c in criteria).value,
        "criteria": [c.to_dict() for c in criteria],
        "wall_time_s": 95.0,
        "train_time_s": sum(r["step_time_s"] for r in log),
        "data_time_share": 0.007,
        "step_time_s": step_time_spread([r for r in log if not r["warmup"]]),
        "world_size": world,
        "parallel": "none",
        "device": "NVIDIA H100 80GB HBM3" if peak_gib is not None else "cpu",
        "versions": {"torch": "2.11.0", "transformers": "5.17.0", "peft": "0.21.0"},
        "model": {"name": "Qwen/Qwen2-7B-Instruct", "dtype": "bf16"},
        "dataset": {
            "source": STATS["source"],
            "format": "glaive",
            "fingerprint": STATS["fingerprint"],
            "path": ".gpucert-cache/data/70dc0ced9075",
            "train_rows": 21034,
            "eval_rows": 1101,
            "stats": STATS,
        },
        "config": {
            "model": {"name": "Qwen/Qwen2-7B-Instruct", "gradient_checkpointing": gradient_checkpointing},
            "train": {"micro_batch": 2, "grad_accum": 1, "final_loss_max": final_loss_max},
        },
        "steps": steps,
        "resumed_from": None,
        "timed_steps": steps - 2,
        "tokens": {
            "padded": rows_tokens * steps,
            "effective": rows_tokens * steps,
            "supervised": rows_tokens * steps // 3,
        },
        "tokens_per_s": per_gpu,
        "tokens_per_s_per_gpu": per_gpu,
        "t_eff": 4096.0,
        "flops_per_token": 34_182_529_024.0,
        "flops_formula": "FLOPs/token = 4N + 6·N_lora + 12·L·H·Q·T_eff = ...",
        "peak_tflops": None if mfu is None else 989.0,
        "peak_source": None if mfu is None else "profile h100-sxm: bf16_peak_tflops",
        "mfu": mfu,
        "hfu": None if mfu is None or not gradient_checkpointing else mfu * 1.44,
        "peak_memory_gib": peak_gib,
        "peak_memory_reserved_gib": None if peak_gib is None else peak_gib + 2.1,
        "peak_rss_gib": 6.4,
        "final_loss": final_loss,
        "loss_history": losses,
        "eval_losses": evals,
        "final_eval_loss": evals[-1]["loss"],
        "step_log": log,
        "oom": None,
        "plan": synthetic_plan(peak_gib is not None, gradient_checkpointing),
        "memory_plan": {
            "micro_batch": 2,
            "checkpointing": "full" if gradient_checkpointing else "none",
            "chosen_by": "config",
            "estimate_gib": None if peak_gib is None else 33.0,
            "free_gib": None if peak_gib is None else 78.7,
            "total_gib": None if peak_gib is None else 79.2,
            "budget_gib": None if peak_gib is None else 70.4,
            "parts": {},
            "reasons": [] if peak_gib is not None else ["not a CUDA device"],
            "headroom_gib": None if peak_gib is None else 45.7,
            "peak_memory_gib": peak_gib,
        },
        "outputs": {"adapter": "runs/qwen/adapter", "merged": None, "checkpoint": str(checkpoint), "tensorboard": None},
        # A warm compile cache (docs/results/2026-11-26-first-step.md); a CPU run compiles nothing.
        "time_to_first_step_s": 30.8 if peak_gib is not None else 6.2,
        "first_step_s": log[0]["step_time_s"],
        "first_step_setup_s": {"imports": 7.8, "join": 0.4, "run_setup": 0.1, "data": 0.6, "model_load": 2.1},
        "compile": {"cache_dir": "/home/u/.cache/gpucert/compile", "warm_up_s": 12.4, "ranks": []}
        if peak_gib is not None
        else None,
    }


def synthetic_plan(gpu: bool, gradient_checkpointing: bool) -> dict[str, Any]:
    """metrics.json's "plan" of such a run (finetune/plan.py's RunPlan.to_dict), on an H100 or a CPU."""
    device = Device("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 79.2) if gpu else Device()
    model = plan_model(ModelConfig(gradient_checkpointing=gradient_checkpointing), LoraConfig(), device)
    memory = {"micro_batch": 2, "checkpointing": "full" if gradient_checkpointing else "none", "chosen_by": "config"}
    return {
        "device": dataclasses.asdict(device),
        "parallel": "none",
        "world_size": 1,
        "micro_batch": 2,
        "model": dataclasses.asdict(model),
        "memory": memory,
    }


def training_report(metrics: dict[str, Any] | None = None, host: str = "vm") -> Report:
    metrics = metrics if metrics is not None else synthetic_metrics()
    return build_report(
        metrics,
        command=["gpucert", "finetune", "--config", "configs/finetune/qwen2-7b-glaive.yaml"],
        host=host,
        node=host,
        started_at=STARTED,
        finished_at=STARTED + timedelta(seconds=metrics["wall_time_s"]),
        inventory={**INVENTORY, "hostname": host},
        profile="h100-sxm",
    )


def evaluation_report(call_accuracy: float = 91.0, threshold: float | None = 90.0) -> Report:
    """An evaluation as `gpucert evaluate` writes it (finetune/eval/report.py): eval.* scores in % (judged where
    the recipe sets a threshold, INFO where not) with example failures, eval.overall's per-tool tally and
    failures in full, eval.loss, and one eval.tool row per tool."""

    def score(name: str, value: float, floor: float | None, details: dict[str, Any]) -> Result:
        judged = floor is not None
        ok = judged and value >= floor
        return Result(
            name=name,
            subject="held-out turns",
            status=(Status.PASS if ok else Status.FAIL) if judged else Status.INFO,
            message=f"{name} {value:.1f} %" + (f" (threshold >= {floor:g})" if judged else ", no threshold"),
            value=value,
            unit="%",
            expected=f">= {floor:g} %" if judged else None,
            threshold_source="eval.thresholds.call_accuracy_min_pct in qwen2-7b-glaive.yaml" if judged else None,
            category="evaluation",
            details=details,
        )

    tools = {
        "get_weather": {"turns": 42, "called": 41, "names_ok": 40, "args_match": 35, "correct": 34},
        "convert_currency": {"turns": 35, "called": 33, "names_ok": 33, "args_match": 25, "correct": 25},
        "<b>book</b>": {"turns": 3, "called": 1, "names_ok": 1, "args_match": 0, "correct": 0},
    }
    examples = [{"turn": "row 17 turn 2", "reasons": ["expected a call to get_weather, found no call"]}]
    results = [
        score("eval.call_accuracy", call_accuracy, threshold, {"correct": 91, "total": 100, "examples": examples}),
        score("eval.args_match", 72.5, None, {"correct": 58, "total": 80, "examples": []}),
        score(
            "eval.overall",
            70.0,
            None,
            {
                "correct": 70,
                "total": 100,
                "examples": examples,
                "counts": {"turns": 100, "expected_call": 80},
                "failures": [{"turn": "row 17 turn 2", "expected": "get_weather(city='Paris')", "got": "no call"}],
                "per_tool": tools,
            },
        ),
        Result(
            name="eval.loss",
            subject="held-out turns",
            status=Status.INFO,
            message="mean cross-entropy per supervised held-out token: 0.4100 nats/token",
            value=0.41,
            unit="nats/token",
            category="evaluation",
        ),
        *(
            Result(
                name="eval.tool",
                subject=f"tool {name}",
                status=Status.INFO,
                message=f"{t['correct']} of {t['turns']} turns that expect {name} fully right",
                value=round(100 * t["correct"] / t["turns"], 2),
                unit="%",
                category="evaluation",
                details=t,
            )
            for name, t in tools.items()
        ),
    ]
    meta = RunMeta(
        tool_version="0.1.0",
        method_version="2, scoring 2",
        verb="evaluate",
        command=["gpucert", "evaluate", "--adapter", "runs/qwen/adapter"],
        host="vm",
        started_at=STARTED.isoformat(),
        finished_at=(STARTED + timedelta(seconds=60)).isoformat(),
        duration_s=60.0,
        profile="none",
        config={},
        software={},
        nodes=["vm"],
    )
    return Report(meta=meta, inventory=INVENTORY, results=results)
