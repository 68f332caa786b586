"""The run's plan (finetune/plan.py): every lever decided once from the config and a description of the GPU, with
its reason; load_model and the memory plan read it."""

from __future__ import annotations

import dataclasses
import itertools
import json
from types import SimpleNamespace

import pytest
import torch

from gpucert.finetune.config import FUSED_MLP_MAX_RANK, DataConfig, FinetuneConfig, LoraConfig, ModelConfig
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.model.lora import forward_plan, load_model
from gpucert.finetune.plan import Device, RunPlan, describe_device, plan_model
from gpucert.finetune.train.loop import plan_run

CPU = Device()
H100 = Device(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0), total_gib=79.1)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def in_gemm_before_the_plan(model: ModelConfig, lora: LoraConfig, sharded: bool) -> bool:
    """config.adapters_in_gemm_applies as it stood before the plan, which load_model and the memory plan asked."""
    return (
        model.fuse_projections
        and model.adapters_in_gemm
        and model.autocast
        and model.dtype in ("bf16", "fp16")
        and model.precision != "fp8"
        and not sharded
        and lora.dropout == 0
    )


def fuse_mlp_before_the_plan(model: ModelConfig, lora: LoraConfig, sharded: bool) -> bool:
    """As before the plan, and since 2026-11-29 in FP8 too (fp8_mlp.py), over gate/up's one A."""
    fp8_mlp = (
        model.precision == "fp8"
        and model.fuse_projections
        and model.autocast
        and model.dtype in ("bf16", "fp16")
        and not sharded
        and lora.dropout == 0
    )
    return (
        model.fuse_mlp
        and {"gate_proj", "up_proj", "down_proj"} <= set(lora.target_modules)
        and lora.r <= FUSED_MLP_MAX_RANK
        and (in_gemm_before_the_plan(model, lora, sharded) or fp8_mlp)
    )


def test_every_lever_is_on_exactly_where_load_model_turned_it_on_before() -> None:
    """All combinations of the keys the conditions read: the plan's on/off is the old conditions', on any GPU."""
    keys = itertools.product(
        (True, False),  # fuse_projections
        (True, False),  # adapters_in_gemm
        (True, False),  # autocast
        ("bf16", "fp16", "fp32"),
        ("bf16", "fp8"),
        (True, False),  # fuse_mlp
        (True, False),  # fused_loss
        (True, False),  # fp8_head
        (True, False),  # compile
        (True, False),  # sharded
        (0.0, 0.05),
        (16, 64),
        (ALL, ["q_proj", "v_proj"]),
    )
    checked = 0
    for fuse, in_gemm, autocast, dtype, precision, mlp, loss, head, compile_, sharded, dropout, r, targets in keys:
        model = ModelConfig(
            dtype=dtype,
            precision=precision,
            fuse_projections=fuse,
            adapters_in_gemm=in_gemm,
            autocast=autocast,
            fuse_mlp=mlp,
            fused_loss=loss,
            fp8_head=head,
            compile=compile_,
        )
        lora = LoraConfig(r=r, dropout=dropout, target_modules=list(targets))
        for device in (CPU, H100):
            plan = plan_model(model, lora, device, sharded)
            case = (model, lora, device, sharded)
            assert plan.fuse_projections.on == fuse, case
            assert plan.adapters_in_gemm.on == in_gemm_before_the_plan(model, lora, sharded), case
            assert plan.fuse_mlp.on == fuse_mlp_before_the_plan(model, lora, sharded), case
            assert plan.autocast.on == (autocast and dtype in ("bf16", "fp16")), case
            assert plan.fused_loss.on == loss, case
            assert plan.fp8_head.on == (precision == "fp8" and loss and head), case
            assert plan.compile.on == compile_, case
            assert not plan.compile_tuning.on, case  # auto: off in bf16 and fp8 alike
            # What the frozen weights compute in: fp8, else the dtype (a "bf16" precision of an fp32 run was
            # written into its report as bf16).
            assert plan.precision == (precision if precision == "fp8" else dtype), case
            assert plan.attention == model.attn_implementation, case
            checked += 1
    assert checked == 2 * 2**8 * 3 * 2**4  # devices x the boolean keys x dtypes x precision, dropout, r, targets


def test_the_defaults_on_an_h100_fuse_everything_and_say_how() -> None:
    plan = plan_model(ModelConfig(), LoraConfig(r=16, dropout=0.0), H100)
    assert plan.adapters_in_gemm.on and plan.fuse_mlp.on and plan.autocast.on
    assert "one Triton kernel" in plan.fuse_mlp.why and "one Triton kernel" in plan.fused_loss.why
    assert not plan.fp8_head.on and plan.fp8_head.why == "model.precision is bf16, not fp8"


def test_on_a_cpu_the_fused_mlp_runs_the_kernel_s_torch_reference() -> None:
    plan = plan_model(ModelConfig(), LoraConfig(r=16, dropout=0.0), CPU)
    assert plan.fuse_mlp.on and "torch reference (no CUDA)" in plan.fuse_mlp.why
    assert "compiled or eager (no CUDA)" in plan.fused_loss.why


@pytest.mark.parametrize(
    ("model", "lora", "sharded", "why"),
    [
        (ModelConfig(precision="fp8"), LoraConfig(r=16, dropout=0.0), False, "model.precision fp8"),
        (ModelConfig(), LoraConfig(r=16, dropout=0.0), True, "train.parallel fsdp2"),
        (ModelConfig(), LoraConfig(r=16, dropout=0.05), False, "lora.dropout 0.05 > 0"),
        (ModelConfig(dtype="fp32"), LoraConfig(r=16, dropout=0.0), False, "model.dtype fp32"),
        (ModelConfig(adapters_in_gemm=False), LoraConfig(r=16, dropout=0.0), False, "model.adapters_in_gemm false"),
        (ModelConfig(fuse_projections=False), LoraConfig(r=16, dropout=0.0), False, "needs model.fuse_projections"),
    ],
)
def test_adapters_in_gemm_off_names_the_first_condition_that_fails(
    model: ModelConfig, lora: LoraConfig, sharded: bool, why: str
) -> None:
    plan = plan_model(model, lora, H100, sharded)
    assert not plan.adapters_in_gemm.on and why in plan.adapters_in_gemm.why
    if model.precision == "fp8":  # FP8 fuses its MLP without them (fp8_mlp.py)
        assert plan.fuse_mlp.on and "h's FP8 quantization one Triton kernel, its backward two" in plan.fuse_mlp.why
    else:
        assert not plan.fuse_mlp.on and plan.fuse_mlp.why == "needs the adapters in the frozen GEMMs"


@pytest.mark.parametrize(
    ("model", "lora", "sharded", "why"),
    [
        (ModelConfig(fuse_projections=False), LoraConfig(r=16, dropout=0.0), False, "needs model.fuse_projections"),
        (ModelConfig(), LoraConfig(r=16, dropout=0.0), True, "train.parallel fsdp2: not measured"),
        (ModelConfig(), LoraConfig(r=16, dropout=0.05), False, "lora.dropout 0.05 > 0"),
        (ModelConfig(autocast=False), LoraConfig(r=16, dropout=0.0), False, "needs model.autocast"),
    ],
)
def test_the_fp8_fused_mlp_off_names_the_first_condition_that_fails(
    model: ModelConfig, lora: LoraConfig, sharded: bool, why: str
) -> None:
    plan = plan_model(dataclasses.replace(model, precision="fp8"), lora, H100, sharded)
    assert not plan.fuse_mlp.on and why in plan.fuse_mlp.why, plan.fuse_mlp.why
    on_cpu = plan_model(ModelConfig(precision="fp8"), LoraConfig(r=16, dropout=0.0), CPU).fuse_mlp
    assert on_cpu.on and "the kernels' torch reference (no CUDA)" in on_cpu.why


def test_the_fused_mlp_off_says_which_key_keeps_it_off() -> None:
    rank = plan_model(ModelConfig(), LoraConfig(r=64, dropout=0.0), H100).fuse_mlp
    assert not rank.on and rank.why.startswith(f"lora.r 64 > {FUSED_MLP_MAX_RANK}")
    attention_only = plan_model(ModelConfig(), LoraConfig(r=16, dropout=0.0, target_modules=["q_proj"]), H100)
    assert attention_only.fuse_mlp.why == "lora.target_modules without gate_proj, up_proj, down_proj"
    assert attention_only.adapters_in_gemm.on  # the groups present still carry theirs


def test_fp8_s_head_follows_the_fused_loss() -> None:
    fp8 = ModelConfig(precision="fp8")
    assert plan_model(fp8, LoraConfig(), H100).fp8_head.on
    unfused = plan_model(dataclasses.replace(fp8, fused_loss=False), LoraConfig(), H100).fp8_head
    assert not unfused.on and "model.fused_loss false" in unfused.why


def test_a_cpu_device_is_described_without_asking_cuda() -> None:
    assert describe_device(torch.device("cpu")) == CPU


def test_the_run_plan_is_one_block_and_one_json_object() -> None:
    """On a CPU rank: the parallelism, the memory plan (1 row of auto means 1) and every lever, said once."""
    cfg = FinetuneConfig(model=ModelConfig(dtype="fp32"), lora=LoraConfig(r=8, dropout=0.0))
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch="auto"))
    plan = plan_run(cfg, SimpleNamespace(device=torch.device("cpu"), world_size=1), 1000)
    assert isinstance(plan, RunPlan) and plan.parallel == "none" and plan.micro_batch == 1
    block = plan.message().splitlines()
    assert block[0].startswith("run plan") and all(line.startswith("  ") for line in block[1:])
    names = [line.split()[0] for line in block[1:]]
    assert names == [
        "device", "parallel", "precision", "attention", "memory", "checkpointing", "compile", "compile", "autocast",
        "fused", "fp8", "fused", "adapters", "fused",
    ]  # fmt: skip
    assert "memory plan: micro-batch 1" in plan.message()
    written = json.loads(json.dumps(plan.to_dict()))
    assert written["micro_batch"] == 1 and written["model"]["adapters_in_gemm"]["on"] is False


def test_load_model_builds_what_the_plan_says_not_what_the_config_says() -> None:
    """The config asks for fused projections and compiled layers; a plan with both off is what is built."""
    model_cfg = ModelConfig(name="tiny", dtype="fp32", compile=True)
    lora = LoraConfig(r=8, alpha=16, dropout=0.0)
    tokenizer = load_tokenizer(model_cfg, DataConfig())
    planned = plan_model(model_cfg, lora, CPU)
    off = dataclasses.replace(
        planned,
        fuse_projections=dataclasses.replace(planned.fuse_projections, on=False),
        compile=dataclasses.replace(planned.compile, on=False),
    )
    model, info = load_model(model_cfg, lora, tokenizer, torch.device("cpu"), 64, plan=off)
    assert info.fused_projections == "off" and forward_plan(model).pad_to is None
    model, info = load_model(dataclasses.replace(model_cfg, compile=False), lora, tokenizer, torch.device("cpu"), 64)
    assert info.fused_projections.startswith("4 groups fused")


def test_compile_tuning_auto_tunes_nothing_and_an_explicit_true_wins() -> None:
    def tuning(**keys: object) -> bool:
        return plan_model(ModelConfig(compile=True, **keys), LoraConfig(r=16, dropout=0.0), H100).compile_tuning.on

    for precision in ("bf16", "fp8"):
        auto = plan_model(ModelConfig(compile=True, precision=precision), LoraConfig(r=16, dropout=0.0), H100)
        assert not auto.compile_tuning.on and "auto: off" in auto.compile_tuning.why, precision
    assert tuning(compile_tuning=True) and tuning(compile_tuning=True, precision="fp8")
    assert not tuning(compile_tuning=False, precision="fp8")
    eager = plan_model(ModelConfig(compile=False, compile_tuning=True), LoraConfig(r=16, dropout=0.0), H100)
    assert not eager.compile_tuning.on and eager.compile_tuning.why == "nothing is compiled"


def test_compile_tuning_takes_true_false_or_auto_from_the_command_line() -> None:
    from gpucert.config.loader import ConfigError
    from gpucert.finetune.config import load_finetune_config

    assert load_finetune_config(None).model.compile_tuning == "auto"
    assert load_finetune_config(None, ["model.compile_tuning=false"]).model.compile_tuning is False
    with pytest.raises(ConfigError, match=r"model\.compile_tuning"):
        load_finetune_config(None, ["model.compile_tuning=sometimes"])
