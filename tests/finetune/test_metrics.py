"""The FLOP and throughput arithmetic against hand counts and the Qwen2-7B numbers of fine-tuning.md §8."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucert.finetune.model.flop_counts import FlopCounts
from gpucert.finetune.train.metrics import (
    document_lengths,
    effective_context,
    flops_formula,
    judge_run,
    lora_flops_per_token,
    recompute_flops_per_token,
    tokens_per_s,
    utilisation,
)
from gpucert.status import Status

# Qwen2-7B: d 3584, 28 layers, 28 heads x 128, 4 KV heads, FFN 18944, vocab 152064, untied lm_head.
D, LAYERS, HEADS, HEAD_DIM, KV, FFN, VOCAB = 3584, 28, 28, 128, 4 * 128, 18944, 152064
ALL_LINEAR = {"q": (D, D), "k": (D, KV), "v": (D, KV), "o": (D, D), "gate": (D, FFN), "up": (D, FFN), "down": (FFN, D)}


def qwen2_7b(r: int) -> FlopCounts:
    per_layer = sum(i * o for i, o in ALL_LINEAR.values())
    lora_per_layer = sum(r * (i + o) for i, o in ALL_LINEAR.values())
    return FlopCounts(
        matmul_params=LAYERS * per_layer + D * VOCAB,
        lora_params=LAYERS * lora_per_layer,
        layers=LAYERS,
        heads=HEADS,
        head_dim=HEAD_DIM,
        lm_head_params=D * VOCAB,
    )


def test_qwen2_7b_counts_match_the_reference() -> None:
    r64, r16 = qwen2_7b(64), qwen2_7b(16)
    assert r64.matmul_params == 7_070_285_824  # N = 7.070 B
    assert r64.lora_params == 161_480_704
    assert r16.lora_params == 40_370_176
    # Attention term 12·L·H·Q = 1.204 MFLOP per token of T_eff.
    assert 12 * LAYERS * HEADS * HEAD_DIM == 1_204_224


@pytest.mark.parametrize(
    ("r", "t_eff", "gflop"),
    [(64, 4096, 34.18), (64, 1024, 30.48), (64, 512, 29.87), (16, 4096, 33.46), (16, 512, 29.14)],
)
def test_qwen2_7b_lora_flops_per_token_match_the_table(r: int, t_eff: int, gflop: float) -> None:
    assert lora_flops_per_token(qwen2_7b(r), t_eff) / 1e9 == pytest.approx(gflop, abs=0.005)


def test_r64_at_4096_exactly() -> None:
    # 4 x 7,070,285,824 + 6 x 161,480,704 + 1,204,224 x 4096
    assert lora_flops_per_token(qwen2_7b(64), 4096) == 34_182_529_024


def test_nemo_throughput_converts_to_the_reference_mfu() -> None:
    # 14,110 tok/s x 33.46 GFLOP = 472 TFLOP/s = 47.7 % of 989.
    mfu = utilisation(lora_flops_per_token(qwen2_7b(16), 4096), 14_110, 989.0)
    assert mfu == pytest.approx(0.477, abs=0.001)
    assert utilisation(1e9, 1000, None) is None


def test_measured_h100_run_mfu() -> None:
    # §4: r64, 2 x 4096, 5,397 tok/s -> 18.7 %.
    assert utilisation(lora_flops_per_token(qwen2_7b(64), 4096), 5_397, 989.0) == pytest.approx(0.187, abs=0.001)


def test_recompute_flops_exclude_lm_head() -> None:
    c = FlopCounts(matmul_params=1000, lora_params=10, layers=2, heads=4, head_dim=8, lm_head_params=200)
    assert recompute_flops_per_token(c, 16) == 2 * 800 + 2 * 10 + 4 * 2 * 4 * 8 * 16


def test_document_lengths_split_at_position_resets() -> None:
    assert document_lengths([0, 1, 2, 0, 1, 0, 1, 2, 3]) == [3, 2, 4]
    assert document_lengths([0]) == [1]
    assert document_lengths([]) == []


def test_effective_context() -> None:
    # One 4096 document: T_eff = 4096; two halves: 2048; Σs²/Σs in general.
    assert effective_context([4096]) == 4096
    assert effective_context([2048, 2048]) == 2048
    assert effective_context([3, 1]) == pytest.approx(10 / 4)
    assert effective_context([]) == 0.0


def test_tokens_per_s_three_ways() -> None:
    assert tokens_per_s(8192, 8000, 2000, 2.0) == {"padded": 4096, "effective": 4000, "supervised": 1000}
    assert tokens_per_s(1, 1, 1, 0.0) == {"padded": 0.0, "effective": 0.0, "supervised": 0.0}


def test_formula_prints_its_numbers() -> None:
    text = flops_formula(qwen2_7b(64), 4096)
    assert "4 x 7,070,285,824 + 6 x 161,480,704 + 12 x 28 x 28 x 128 x 4,096.0 = 34,182,529,024" in text


def test_judge_run() -> None:
    ckpt = Path("run/checkpoints/step-40")
    passed = judge_run(6.0, 5.5, 5, True, ckpt, None)
    assert [(c.name, c.status) for c in passed] == [
        ("final_loss", Status.PASS),
        ("checkpoint_present", Status.PASS),
        ("no_oom", Status.PASS),
    ]
    # Every PASS says what it was held to and where that came from.
    assert (passed[0].expected, passed[0].threshold_source) == ("<= 6", "config train.final_loss_max")
    assert all(c.expected and c.threshold_source and c.category == "training" for c in passed)
    assert passed[1].value == "step-40"

    failed = judge_run(1.0, 1.2, 5, False, None, "CUDA out of memory. Tried to allocate 2.00 GiB")
    assert [c.status for c in failed] == [Status.FAIL, Status.FAIL, Status.FAIL]
    assert failed[0].message == "expected a mean loss of the last 5 steps <= 1, found 1.2000"
    assert failed[0].remediation == "train longer, raise train.lr, or check the data"
    assert failed[1].message == "expected the final adapter and a complete checkpoint, found no final adapter"
    assert "Tried to allocate" in failed[2].message and failed[2].value == 1
    assert "gradient_checkpointing" in (failed[2].remediation or "")
    # The adapter saved but no complete checkpoint: named as such.
    assert judge_run(1.0, 0.5, 5, True, None, None)[1].message.endswith("found no complete checkpoint")


def test_a_final_loss_without_threshold_is_shown_not_passed() -> None:
    loss = judge_run(None, 9.0, 5, True, Path("c/step-1"), None)[0]
    assert loss.status is Status.INFO and loss.value == 9.0
    assert loss.expected is None and "train.final_loss_max is not set" in loss.message
    # No step completed (out of memory at the first) and nothing to judge it by: nothing measured either.
    assert judge_run(None, None, 0, True, None, "oom")[0].status is Status.SKIP
    # With a threshold, no measured loss is a FAIL, never a pass.
    assert judge_run(6.0, None, 0, True, None, "oom")[0].status is Status.FAIL
