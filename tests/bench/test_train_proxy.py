"""The training proxy on CPU: parameter and FLOP counts by hand, the judge on synthetic data, one gloo run."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from gpucert.bench import train_proxy
from gpucert.bench.suite import launch_local
from gpucert.bench.train_proxy import PRESETS, Decoder, count_params, flops_per_token, judge
from gpucert.config.profiles import load_profile
from gpucert.config.run import TrainBenchConfig
from gpucert.status import Status

TINY = PRESETS["tiny"]


def test_tiny_parameter_and_flop_counts_match_a_hand_count() -> None:
    d, ffn, vocab, layers = 128, 344, 512, 2
    per_layer_matmul = 3 * d * d + d * d + 2 * d * ffn + ffn * d  # qkv, out, gate+up, down
    matmul = layers * per_layer_matmul + d * vocab  # + lm_head; the input embedding is a lookup
    total = matmul + vocab * d + layers * 2 * d + d  # + embedding, two norms per block, final norm
    assert (per_layer_matmul, matmul, total) == (197_632, 460_800, 526_976)

    assert count_params(Decoder(TINY)) == (total, matmul)
    flops, formula = flops_per_token(TINY, matmul, seq_len=64)
    # 6N + 12·L·H·Q·T with H·Q = 4 heads x 32 = 128.
    assert flops == 6 * 460_800 + 12 * 2 * 4 * 32 * 64 == 2_961_408
    assert "6 x 460,800 + 12 x 2 x 4 x 32 x 64 = 2,961,408" in formula


def test_1b_preset_is_about_a_billion_parameters() -> None:
    p = PRESETS["1b"]
    matmul = p.n_layers * (4 * p.d_model**2 + 3 * p.d_model * p.ffn_dim) + p.d_model * p.vocab_size
    total = matmul + p.vocab_size * p.d_model + (2 * p.n_layers + 1) * p.d_model
    assert (matmul, total) == (1_093_140_480, 1_158_760_448)


def test_forward_gives_logits_per_position() -> None:
    model = Decoder(TINY)
    logits = model(torch.randint(TINY.vocab_size, (3, 16)))
    assert logits.shape == (3, 16, TINY.vocab_size)
    # Causal: changing the last token leaves earlier positions alone.
    tokens = torch.randint(TINY.vocab_size, (1, 16))
    changed = tokens.clone()
    changed[0, -1] = (changed[0, -1] + 1) % TINY.vocab_size
    assert torch.allclose(model(tokens)[0, :-1], model(changed)[0, :-1], atol=1e-6)


def _data(**overrides: Any) -> dict[str, Any]:
    falling = [6.0, 5.8, 5.6, 5.0, 4.6, 4.2, 4.0, 3.9, 3.8, 3.6, 3.5, 3.4]
    data = {
        "model": "1b",
        "params": 1_158_760_448,
        "matmul_params": 1_093_140_480,
        "seq_len": 2048,
        "micro_batch": 4,
        "world_sizes": [1, 8],
        "tokens_per_s_per_gpu": [50_000.0, 47_000.0],
        "step_time_s": [0.164, 0.174],
        "mfu": [0.3825, 0.3596],
        "peak_tflops": 989.0,
        "flops_per_token": 7_566_000_000,
        "formula": "FLOPs/token = ...",
        "loss": {"1": falling, "8": falling},
        "scaling_efficiency": 0.94,
        "peak_memory_gib": [40.0, 42.0],
        "device": "NVIDIA H100 80GB HBM3",
    }
    return {**data, **overrides}


def _by_name(data: dict[str, Any], mfu_min: float | None = 0.3) -> dict[str, Any]:
    profile = load_profile("h100-sxm")
    profile = replace(profile, benchmarks=replace(profile.benchmarks, train_mfu_min=mfu_min))
    return {r.name: r for r in judge(data, profile, TrainBenchConfig())}


def test_judge_passes_a_healthy_run_and_keeps_the_data_for_plots() -> None:
    results = _by_name(_data())
    assert {n: r.status for n, r in results.items()} == {
        "train.tokens_per_s_per_gpu": Status.INFO,  # judged through MFU
        "train.mfu": Status.PASS,
        "train.scaling_efficiency": Status.PASS,
        "train.loss_decreasing": Status.PASS,
    }
    tps = results["train.tokens_per_s_per_gpu"]
    assert tps.value == 47_000.0 and tps.unit == "tokens/s" and tps.details["loss"]["8"][0] == 6.0
    assert tps.message.startswith("shown, not judged (train.mfu is)")
    assert results["train.mfu"].value == pytest.approx(35.96) and results["train.mfu"].expected == ">= 30 %"
    assert results["train.scaling_efficiency"].value == pytest.approx(94.0)
    for r in results.values():
        if r.status is Status.PASS:
            assert r.expected and r.threshold_source, r.name


def test_values_keep_full_precision() -> None:
    results = _by_name(_data(tokens_per_s_per_gpu=[50_000.0, 47_000.123456], mfu=[0.3825, 0.359612345]))
    assert results["train.tokens_per_s_per_gpu"].value == 47_000.123456
    assert results["train.mfu"].value == pytest.approx(35.9612345, rel=1e-12)


def test_loss_that_does_not_fall_fails_and_names_the_phase() -> None:
    flat = [6.0, 6.1, 5.9, 6.0, 6.0, 5.9, 6.0, 6.1, 5.9, 5.8, 5.9, 5.8]
    data = _data(loss={"1": _data()["loss"]["1"], "8": flat})
    result = _by_name(data)["train.loss_decreasing"]
    assert result.status is Status.FAIL
    assert "world size 8 (DDP)" in result.message and "world size 1" not in result.message
    assert result.remediation


def test_non_finite_loss_fails() -> None:
    data = _data(loss={"1": [6.0, 5.0, None, 4.0, 3.0, 2.0], "8": [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]})
    result = _by_name(data)["train.loss_decreasing"]
    assert result.status is Status.FAIL and "world size 1" in result.message


def test_half_scaling_fails() -> None:
    result = _by_name(_data(scaling_efficiency=0.5, tokens_per_s_per_gpu=[50_000.0, 25_000.0]))[
        "train.scaling_efficiency"
    ]
    assert result.status is Status.FAIL
    assert result.message.startswith("expected scaling efficiency >= 80 %, found 50.0 %")
    assert result.threshold_source == "profile h100-sxm: benchmarks.train_scaling_efficiency_min[8 GPUs]"


@pytest.mark.parametrize(("world", "floor"), [(2, 0.85), (4, 0.85), (8, 0.8)])
def test_scaling_floor_follows_the_gpu_count(world: int, floor: float) -> None:
    just_below = _data(world_sizes=[1, world], scaling_efficiency=floor - 0.001)
    result = _by_name(just_below)["train.scaling_efficiency"]
    assert result.status is Status.FAIL and result.expected == f">= {100 * floor:g} %"
    assert result.threshold_source == f"profile h100-sxm: benchmarks.train_scaling_efficiency_min[{world} GPUs]"
    assert _by_name(_data(world_sizes=[1, world], scaling_efficiency=floor))["train.scaling_efficiency"].status is (
        Status.PASS
    )


def test_scaling_without_a_floor_for_the_count_is_shown_not_judged() -> None:
    three = _by_name(_data(world_sizes=[1, 3]))["train.scaling_efficiency"]
    assert three.status is Status.INFO and three.expected is None
    assert "sets no benchmarks.train_scaling_efficiency_min for 3 GPUs" in three.message
    nodes = _by_name(_data(world_sizes=[1, 16], num_nodes=2))["train.scaling_efficiency"]
    assert nodes.status is Status.INFO and "for 2 nodes x 8 GPUs" in nodes.message


def test_mfu_below_floor_fails_and_no_floor_is_shown_not_judged() -> None:
    low = _data(mfu=[0.2, 0.19])
    result = _by_name(low, mfu_min=0.3)["train.mfu"]
    assert result.status is Status.FAIL and "expected MFU >= 30 %, found 19.0 %" in result.message
    unfloored = _by_name(low, mfu_min=None)["train.mfu"]
    assert unfloored.status is Status.INFO and unfloored.expected is None
    assert unfloored.message.startswith("shown, not judged: profile h100-sxm sets no benchmarks.train_mfu_min")


def test_the_captured_4xh200_run_passes_when_judged_again() -> None:
    report = json.loads((Path(__file__).parents[2] / "docs/results/2026-11-21-h200x4-accept.json").read_text())
    [tps] = [r for r in report["results"] if r["name"] == "train.tokens_per_s_per_gpu"]
    results = {r.name: r for r in judge(tps["details"], load_profile("h200"), TrainBenchConfig())}
    assert results["train.mfu"].status is Status.PASS
    assert results["train.scaling_efficiency"].status is Status.PASS
    assert results["train.scaling_efficiency"].threshold_source.endswith("[4 GPUs]")


def test_single_process_skips_scaling_and_cpu_skips_mfu() -> None:
    data = _data(
        world_sizes=[1],
        tokens_per_s_per_gpu=[50_000.0],
        mfu=[None],
        peak_tflops=None,
        loss={"1": _data()["loss"]["1"]},
        scaling_efficiency=None,
        device="cpu",
    )
    results = _by_name(data)
    assert results["train.scaling_efficiency"].status is Status.SKIP
    assert results["train.mfu"].status is Status.SKIP
    assert results["train.loss_decreasing"].status is Status.PASS


@pytest.mark.slow
def test_two_gloo_processes_train_alone_then_with_ddp(tmp_path: Path) -> None:
    cfg = TrainBenchConfig(model="tiny", seq_len=64, micro_batch=2, steps=12, warmup_steps=2)
    spec = {"benchmark": "train", "config": {**asdict(cfg), "peak_tflops": None}}
    data = launch_local(2, spec, tmp_path, timeout_s=180)
    assert data["world_sizes"] == [1, 2] and data["num_nodes"] == 1
    assert all(t > 0 for t in data["tokens_per_s_per_gpu"])
    assert data["params"] == 526_976 and data["mfu"] == [None, None]
    for phase in ("1", "2"):
        first, last = train_proxy.loss_drop(data["loss"][phase]) or pytest.fail(f"no losses in phase {phase}")
        assert last < 0.9 * first, (phase, data["loss"][phase])
    # Rank 0's rows are the same in both phases and the weights start equal, so step 0 agrees closely.
    assert data["loss"]["1"][0] == pytest.approx(data["loss"]["2"][0], abs=0.05)


def test_too_few_steps_to_judge_the_loss_is_an_error() -> None:
    short = [6.0, 5.0, 4.0, 3.0]
    result = _by_name(_data(loss={"1": short, "8": short}))["train.loss_decreasing"]
    assert result.status is Status.ERROR and "found 4" in result.message
