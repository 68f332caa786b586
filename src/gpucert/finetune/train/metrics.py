"""Throughput arithmetic of a LoRA fine-tuning run: FLOPs per token, effective context, tokens/s, MFU.

Pure functions of counts and times (fine-tuning.md §8), so every number in metrics.json can be checked by hand:
- N = matmul parameters without the input embedding (lm_head counted), N_lora = adapter parameters,
  L = layers, H·Q = heads x head dim, T_eff = Σs_i²/Σs_i over the packed documents of lengths s_i;
- LoRA FLOPs/token = 4N + 6·N_lora + 12·L·H·Q·T_eff: forward 2N, backward through frozen weights computes
  activation gradients only (2N), the adapters take all three passes (6·N_lora), attention keeps all three;
- MFU = FLOPs/token x effective tokens/s per GPU / peak; activation-checkpoint recompute is not useful work,
  so it is only in HFU (hardware FLOPs utilisation);
- tokens/s three ways: padded (rows x row length: what the GPU processed), effective (non-pad tokens: what
  MFU uses), supervised (tokens with a label: what the loss learns from).

`judge_run` turns a run's outcome into its success criteria: report results (gpucert.report.schema.Result) with
value / expected / threshold_source / status / message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpucert.finetune.model.flop_counts import FlopCounts
from gpucert.report.schema import Result
from gpucert.status import Status

# The report category of a training run's results, and the subject of those about the whole run.
CATEGORY = "training"
RUN_SUBJECT = "run"
LOSS_UNIT = "nats/token"


@dataclass(frozen=True)
class Peak:
    """The peak dense BF16 FLOP/s that MFU divides by, and where the number came from."""

    tflops: float
    source: str  # "config train.peak_tflops" or "profile h100-sxm: bf16_peak_tflops"
    profile: str | None = None  # the hardware profile this node matched, if any


def document_lengths(position_ids: Sequence[int]) -> list[int]:
    """Lengths of the packed documents of one row: a document starts wherever the position resets to 0."""
    lengths: list[int] = []
    for position in position_ids:
        if position == 0 or not lengths:
            lengths.append(1)
        else:
            lengths[-1] += 1
    return lengths


def effective_context(lengths: Iterable[int]) -> float:
    """T_eff = Σs²/Σs: the attended context length averaged over tokens (a token of an s-long document sees
    s/2 keys on average, which the 12·L·H·Q·T term already assumes for T)."""
    total = squares = 0
    for s in lengths:
        total += s
        squares += s * s
    return squares / total if total else 0.0


def lora_flops_per_token(c: FlopCounts, t_eff: float) -> float:
    """4N + 6·N_lora + 12·L·H·Q·T_eff."""
    return 4 * c.matmul_params + 6 * c.lora_params + 12 * c.layers * c.heads * c.head_dim * t_eff


def recompute_flops_per_token(c: FlopCounts, t_eff: float) -> float:
    """Extra forward work of full activation checkpointing: 2(N - N_lm_head) + 2·N_lora + 4·L·H·Q·T_eff."""
    return 2 * (c.matmul_params - c.lm_head_params) + 2 * c.lora_params + 4 * c.layers * c.heads * c.head_dim * t_eff


def flops_formula(c: FlopCounts, t_eff: float) -> str:
    """The formula with the numbers filled in, printed beside every MFU."""
    flops = lora_flops_per_token(c, t_eff)
    return (
        f"FLOPs/token = 4N + 6·N_lora + 12·L·H·Q·T_eff = 4 x {c.matmul_params:,} + 6 x {c.lora_params:,} + "
        f"12 x {c.layers} x {c.heads} x {c.head_dim} x {t_eff:,.1f} = {flops:,.0f}; "
        "MFU = FLOPs/token x effective tokens/s per GPU / peak dense BF16 FLOP/s (recompute excluded)"
    )


def utilisation(flops_per_token: float, tokens_per_s_per_gpu: float, peak_tflops: float | None) -> float | None:
    """MFU (or HFU with recompute FLOPs added) as a fraction; None without a peak (CPU runs)."""
    if not peak_tflops:
        return None
    return flops_per_token * tokens_per_s_per_gpu / (peak_tflops * 1e12)


def tokens_per_s(padded: float, effective: float, supervised: float, seconds: float) -> dict[str, float]:
    """The three token rates over one interval (all ranks together, or one rank: the caller decides)."""
    if seconds <= 0:
        return {"padded": 0.0, "effective": 0.0, "supervised": 0.0}
    return {"padded": padded / seconds, "effective": effective / seconds, "supervised": supervised / seconds}


def judge_run(
    final_loss_max: float | None,
    final_loss: float | None,
    window: int,
    adapter_saved: bool,
    latest_checkpoint: Path | None,
    oom: str | None,
    subject: str = RUN_SUBJECT,
) -> list[Result]:
    """The success criteria of a run, as report results: the final loss (mean of the last `window` steps)
    <= train.final_loss_max, the final adapter and a complete checkpoint on disk, no out-of-memory error.

    Without train.final_loss_max the final loss is INFO: measured and shown, never a PASS nothing could fail.
    """
    found = "none (no step completed)" if final_loss is None else f"{final_loss:.4f}"
    if final_loss_max is None:
        loss = Result(
            name="final_loss",
            status=Status.INFO if final_loss is not None else Status.SKIP,
            message=f"mean loss of the last {window} steps {found}; train.final_loss_max is not set, "
            "so it is shown, not judged",
            value=final_loss,
            unit=LOSS_UNIT,
            subject=subject,
            category=CATEGORY,
        )
    else:
        ok = final_loss is not None and final_loss <= final_loss_max
        loss = Result(
            name="final_loss",
            status=Status.PASS if ok else Status.FAIL,
            message=f"mean loss of the last {window} steps {found} <= {final_loss_max:g}"
            if ok
            else f"expected a mean loss of the last {window} steps <= {final_loss_max:g}, found {found}",
            value=final_loss,
            unit=LOSS_UNIT,
            expected=f"<= {final_loss_max:g}",
            threshold_source="config train.final_loss_max",
            remediation=None if ok else "train longer, raise train.lr, or check the data",
            subject=subject,
            category=CATEGORY,
        )
    saved = adapter_saved and latest_checkpoint is not None
    checkpoint = Result(
        name="checkpoint_present",
        status=Status.PASS if saved else Status.FAIL,
        message=f"final adapter and checkpoint {latest_checkpoint}"
        if saved
        else "expected the final adapter and a complete checkpoint, found "
        + ("no complete checkpoint" if adapter_saved else "no final adapter"),
        value=latest_checkpoint.name if latest_checkpoint is not None else None,
        expected="the final adapter and a complete checkpoint",
        threshold_source="gpucert finetune: a finished run leaves both in its run directory",
        remediation=None if saved else "see the run's log for the error that stopped it",
        subject=subject,
        category=CATEGORY,
    )
    no_oom = Result(
        name="no_oom",
        status=Status.PASS if oom is None else Status.FAIL,
        message="no out-of-memory error" if oom is None else f"expected no out-of-memory error, found: {oom}",
        value=0 if oom is None else 1,
        unit="errors",
        expected="0",
        threshold_source="gpucert finetune: a run that ran out of memory did not finish",
        remediation=None
        if oom is None
        else "lower train.micro_batch (raise train.grad_accum to keep the batch) or turn on "
        "model.gradient_checkpointing",
        subject=subject,
        category=CATEGORY,
    )
    return [loss, checkpoint, no_oom]
