"""The model side of fine-tuning: a causal LM with LoRA adapters, and its loss on a packed batch.

`load_model` gives a PEFT model and the counts the FLOP formula needs (train/metrics.py); `forward_loss` gives the
summed token loss and the number of supervised tokens, so the training loop can normalise by the global count of a
whole optimizer step (fine-tuning.md §7).

Model names: "tiny" (a 2-layer Qwen2 built from a fixed seed, nothing downloaded), a hub id or local model
directory (pretrained weights), or with `random_init` a hub id or a directory holding only config.json
(the architecture with random weights, for speed runs). hub.py tells a path from a hub id and loads from the
local cache when the hub cannot be reached.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from gpucert.config.loader import ConfigError
from gpucert.finetune.config import LoraConfig, ModelConfig
from gpucert.finetune.data.hub import pretrained_source
from gpucert.finetune.data.packing import (
    RowLayout,
    attention_mask_for,
    compiled_documents,
    flash_documents,
    takes_documents,
)
from gpucert.finetune.model import flash
from gpucert.finetune.model.flop_counts import FlopCounts
from gpucert.finetune.model.fp8 import Fp8FrozenLinear, check_fp8_device, convert_frozen_linears, head_to_fp8
from gpucert.finetune.model.fp8_mlp import fuse_fp8_mlps
from gpucert.finetune.model.fused import Fusion, fuse_projections, refresh_adapters_in_gemm
from gpucert.finetune.model.layers import decoder_layers
from gpucert.finetune.model.loss import linear_cross_entropy
from gpucert.finetune.plan import ModelPlan, describe_device, plan_model

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ATTN_IMPLEMENTATIONS = ("sdpa", "flex_attention", "eager", "flash_attention_2", "flash_attention_3", "varlen")
# What each flash implementation imports (transformers' module names), what provides it, and the GPU
# generations it runs on (compute capability majors: 8 Ampere, 9 Hopper; FlashAttention-3 runs on Hopper alone).
FLASH_PACKAGES = {
    "flash_attention_2": ("flash_attn", "the flash-attn package (FlashAttention-2)", range(8, 100)),
    "flash_attention_3": (
        "flash_attn_interface",
        "the flash_attn_3 package (FlashAttention-3, built from flash-attention's hopper/; tools/device_fa3.sh "
        "shows how)",
        range(9, 10),
    ),
    "varlen": ("torch.nn.attention.varlen", "torch >= 2.10 (torch.nn.attention.varlen)", range(8, 100)),
}
# The implementations gpucert calls itself (finetune/model/flash.py says why), and the key transformers knows each by.
OWN_ATTENTION = {"flash_attention_3": flash.KEY, "varlen": flash.VARLEN_KEY}
# The tiny model's weights come from this seed whatever the training seed, so every run and rank starts alike.
TINY_SEED = 1234
IGNORE_INDEX = -100


@dataclass(frozen=True)
class ModelInfo:
    total_params: int
    trainable_params: int
    # N of the FLOP formula: nn.Linear weights, so lm_head in and the input embedding (a lookup) out.
    matmul_params: int
    lm_head_params: int
    lora_params: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    # model.fuse_projections: what was fused, and why any group was not (finetune/model/fused.py).
    fused_projections: str = "off"

    def flop_counts(self) -> FlopCounts:
        return FlopCounts(
            matmul_params=self.matmul_params,
            lora_params=self.lora_params,
            layers=self.layers,
            heads=self.heads,
            head_dim=self.head_dim,
            lm_head_params=self.lm_head_params,
        )


@dataclass(frozen=True)
class ForwardPlan:
    """How forward_loss runs a model, fixed when the model is built (a model attribute, so DDP and FSDP2
    wrappers carry it along)."""

    # The dtype adapters compute in under autocast; None: as PEFT does (inputs cast to the adapter dtype).
    autocast_dtype: torch.dtype | None = None
    # Pad every batch to this length (compiled layers keep static shapes); None: to the longest row.
    pad_to: int | None = None
    # lm_head's frozen weight when the loss is fused (the model then returns hidden states), or its FP8 layouts
    # (model.fp8_head); None: plain head. Plain tensors, not parameters: neither DDP nor FSDP2 sees them, so
    # FSDP2 does not shard them.
    head_weight: torch.Tensor | Fp8FrozenLinear | None = None
    # Copies the adapters into the frozen GEMMs' extra columns and rows, settled (fused.refresh_adapters_in_gemm
    # on the module whose pre-hook copies them), for the trainer to call right after every optimizer step; None:
    # no adapter rides in a frozen GEMM.
    refresh_adapters: Callable[[], None] | None = None


class DeferredHead(nn.Module):
    """Stands in for lm_head when the loss is fused: the hidden states pass through, and forward_loss applies
    the head's weight (ForwardPlan.head_weight) chunk by chunk (loss.py)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


PLAN_ATTRIBUTE = "gpucert_forward_plan"


def forward_plan(model: nn.Module) -> ForwardPlan:
    inner = getattr(model, "module", model)  # DDP keeps the model in .module
    plan = getattr(inner, PLAN_ATTRIBUTE, None)
    return plan if isinstance(plan, ForwardPlan) else ForwardPlan()


@contextmanager
def quiet_peft() -> Iterator[None]:
    # peft 0.21 reads `is_gradient_checkpointing`, which transformers 5.2x deprecates: not ours to fix.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"model.dtype: expected one of {sorted(DTYPES)}, found {name!r}")
    return DTYPES[name]


def tiny_config(vocab_size: int, attn_implementation: str = "sdpa") -> Qwen2Config:
    """A 2-layer, 64-wide Qwen2 (GQA 4 query / 2 KV heads): the whole training stack in a CPU second."""
    shape: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        # HF's default 0.02 leaves a frozen random lm_head able to reach logits of only about ±1.3 on 64
        # dimensions, so LoRA alone could barely move the loss off ln(vocab); 0.1 lets the tiny run learn.
        initializer_range=0.1,
        attn_implementation=attn_implementation,
    )
    return Qwen2Config(**shape)


def load_base_model(model_cfg: ModelConfig, vocab_size: int, device: torch.device) -> PreTrainedModel:
    """The causal LM without adapters, on `device` in model_cfg.dtype, with model_cfg.attn_implementation."""
    dtype = torch_dtype(model_cfg.dtype)
    attn = model_cfg.attn_implementation
    if attn not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"model.attn_implementation: expected one of {list(ATTN_IMPLEMENTATIONS)}, found {attn!r}")
    if attn in OWN_ATTENTION:  # gpucert's own call of the kernels (finetune/model/flash.py says why)
        flash.register()
        attn = OWN_ATTENTION[attn]
    model: PreTrainedModel
    auto: Any = AutoModelForCausalLM
    if model_cfg.name == "tiny":
        # Built on the CPU from a fixed seed, so the CPU and GPU tests start from the same weights.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TINY_SEED)
            tiny: Any = Qwen2ForCausalLM(tiny_config(vocab_size, attn))
        model = tiny.to(device=device, dtype=dtype)
    elif model_cfg.random_init:
        source, offline = pretrained_source(model_cfg.name)
        config = AutoConfig.from_pretrained(source, **offline)
        # Initialised on the device itself: 7 B random weights on a CPU take minutes.
        with torch.device(device):
            model = auto.from_config(config, dtype=dtype, attn_implementation=attn)
    else:
        source, offline = pretrained_source(model_cfg.name)
        # AutoModel also looks for a PEFT adapter config under the name, and only adapter_kwargs keep that
        # lookup off the network (transformers 5.x auto_factory).
        model = auto.from_pretrained(
            source,
            dtype=dtype,
            attn_implementation=attn,
            device_map={"": device},
            **offline,
            **({"adapter_kwargs": dict(offline)} if offline else {}),
        )
    embeddings: Any = model.get_input_embeddings()
    if embeddings.weight.shape[0] < vocab_size:
        model.resize_token_embeddings(vocab_size)
    return model


def count_shape(base: PreTrainedModel, vocab_size: int) -> dict[str, int]:
    """Matmul parameters and the attention shape of a base model (before adapters are added)."""
    config: Any = base.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    lm_head: Any = base.get_output_embeddings()
    return {
        "matmul_params": sum(m.weight.numel() for m in base.modules() if isinstance(m, nn.Linear)),
        "lm_head_params": lm_head.weight.numel() if lm_head is not None else 0,
        "layers": config.num_hidden_layers,
        "heads": heads,
        "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
        "head_dim": head_dim,
        "hidden_size": config.hidden_size,
        "vocab_size": vocab_size,
    }


def defer_head(base: PreTrainedModel) -> torch.Tensor | None:
    """Replace lm_head by a DeferredHead, so the model returns hidden states and forward_loss fuses the head
    into the loss; its weight, or None where the fused loss does not apply (a head with a bias or adapters)."""
    head: Any = base.get_output_embeddings()
    if type(head) is nn.Linear and head.bias is None and not head.weight.requires_grad:
        base.set_output_embeddings(DeferredHead())
        return head.weight.detach()
    return None


def check_attention(attn: str, device: torch.device) -> None:
    """Refuse an attention implementation that cannot train here before a 7B model is built, not at load or at
    the first step: flex attention has no backward off CUDA, and flash attention needs its package and GPU. A
    ConfigError: its message says what to set, so the run prints it in one line, without a traceback."""
    if attn == "flex_attention" and device.type != "cuda":
        raise ConfigError(f"model.attn_implementation: flex_attention trains on CUDA GPUs only, this is {device.type}")
    if attn not in FLASH_PACKAGES:
        return
    module, package, majors = FLASH_PACKAGES[attn]
    if device.type != "cuda":
        raise ConfigError(f"model.attn_implementation: {attn} runs on CUDA GPUs only, this is {device.type}: use sdpa")
    capability = torch.cuda.get_device_capability(device)
    if capability[0] not in majors:
        raise ConfigError(
            f"model.attn_implementation: {attn} does not run on {torch.cuda.get_device_name(device)} (compute "
            f"capability {capability[0]}.{capability[1]}): use sdpa"
        )
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"model.attn_implementation: {attn} needs {package}, which is not installed here: install it, or use "
            f"flex_attention (packed rows) or sdpa"
        )


def check_window(config: Any, attn: str, max_length: int | None) -> None:
    """Refuse, once the model's config is known and before any step, a sliding window shorter than a row where
    gpucert calls the attention kernels itself (OWN_ATTENTION: they run each document causally, with no window;
    transformers' own flash_attention_2 passes the window on). The attention call refuses it too, but only for
    the rows it sees, and without compiled layers rows are padded to each micro-batch's longest: the first long
    row could come late in a run."""
    if attn not in OWN_ATTENTION or max_length is None:
        return
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        window = None  # e.g. Qwen2 with use_sliding_window false: every layer attends in full
    if window is not None and window < max_length:
        raise ValueError(
            f"model.attn_implementation {attn}: the model's sliding window ({window} tokens) is shorter than "
            f"data.max_length ({max_length}), and these kernels attend over whole documents: use sdpa or "
            f"flex_attention, or data.max_length <= {window}"
        )


def load_model(
    model_cfg: ModelConfig,
    lora_cfg: LoraConfig,
    tokenizer: Any,
    device: torch.device,
    max_length: int | None = None,
    sharded: bool = False,
    plan: ModelPlan | None = None,
) -> tuple[PeftModel, ModelInfo]:
    """The base model with LoRA adapters on lora_cfg.target_modules, and its counts. `max_length` is the row
    length batches are padded to when the layers are compiled. `plan`: the run's ModelPlan (finetune/plan.py),
    which decides every lever read here; None works it out from the config, this device and `sharded` (FSDP2 or
    ZeRO-3 will shard the frozen weights: no adapters in the frozen GEMM then).

    Call after seeding: the adapters' A matrices take their random init from the global generator, and FSDP2
    relies on every rank building the same ones.
    """
    if plan is None:
        plan = plan_model(model_cfg, lora_cfg, describe_device(device), sharded)
    check_attention(plan.attention, device)
    if plan.precision == "fp8":
        check_fp8_device(device)  # a GPU without float8 tensor cores is refused before the model is built
    vocab_size = len(tokenizer)
    base = load_base_model(model_cfg, vocab_size, device)
    check_window(base.config, plan.attention, max_length)
    shape = count_shape(base, vocab_size)
    base.config.use_cache = False
    if plan.gradient_checkpointing.on:
        # Non-reentrant checkpointing is what DDP and FSDP2 need with frozen weights: the reentrant one marks
        # adapter gradients ready twice under DDP (fine-tuning.md §11.2). The input hook gives the embedding
        # output requires_grad, for code paths that still check it.
        enable = getattr(base, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        base.enable_input_require_grads()
    peft_config = PeftLoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=list(lora_cfg.target_modules),
        task_type="CAUSAL_LM",
        bias="none",
    )
    # Under the model's device: PEFT builds each adapter on the default device, draws its random init there twice
    # (nn.Linear's own, then LoRA's) and copies it to its base layer's device; on the CPU, for r64 on a 7B model
    # (161 M values), that took most of the model's load (tools/model_load_time.py).
    with quiet_peft(), torch.device(device):
        model = get_peft_model(base, peft_config)
    params = list(model.named_parameters())
    counts = dict(
        total_params=sum(p.numel() for _, p in params),
        trainable_params=sum(p.numel() for _, p in params if p.requires_grad),
        lora_params=sum(p.numel() for name, p in params if "lora_" in name),
    )
    del params  # it would keep each fused member's own weight alive beside the stacked copy until load_model returns
    fusion: Fusion | None = None
    refresh: Callable[[], None] | None = None
    if plan.fuse_projections.on:
        # After PEFT (it joins PEFT's layers), before FP8 (which converts each group's stacked matrix) and compiling.
        fusion = fuse_projections(base, adapters_in_gemm=plan.adapters_in_gemm.on, mlp=plan.fuse_mlp.on)
        if fusion.in_gemm or fusion.a_in_gemm:
            refresh = partial(refresh_adapters_in_gemm, base, settled=True)
    autocast_dtype = None
    if plan.autocast.on:
        # PEFT keeps adapters in fp32 and casts each adapter's input to fp32: an fp32 copy of every projection
        # input, and fp32 matmuls. Under autocast the input stays bf16 and the matmul casts the small adapter
        # weights instead; the weights, their gradients and the optimizer stay fp32.
        for module in model.modules():
            if hasattr(module, "cast_input_dtype_enabled"):
                setattr(module, "cast_input_dtype_enabled", False)  # noqa: B010 (a plain attribute, not a submodule)
        autocast_dtype = base.dtype
    if plan.precision == "fp8":
        convert_frozen_linears(base)  # after counting (an Fp8FrozenLinear is no nn.Linear), before compiling
        if plan.fuse_mlp.on and fusion is not None:
            fuse_fp8_mlps(base, fusion)  # over the converted projections
    info = ModelInfo(**counts, fused_projections=fusion.summary() if fusion else "off", **shape)
    # After counting: a deferred head's weight is no longer a parameter.
    head_weight: torch.Tensor | Fp8FrozenLinear | None = defer_head(base) if plan.fused_loss.on else None
    if isinstance(head_weight, torch.Tensor) and plan.fp8_head.on:
        embeddings: Any = base.get_input_embeddings()
        # The bf16 weight is freed once converted: the DeferredHead took the head's place in the model.
        head_weight = head_to_fp8(head_weight, embeddings.weight) or head_weight
    if plan.compile.on:
        # A process-wide inductor setting, read when the layers are first compiled (at the first step): it tunes
        # the fused loss's compiled chunk too, as it did when measured. Triton kernels only: CPU code is not
        # tuned. TORCHINDUCTOR_COORDINATE_DESCENT_TUNING, when set, wins.
        if "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING" not in os.environ:
            inductor_config.coordinate_descent_tuning = plan.compile_tuning.on
        for layer in decoder_layers(base):
            layer.compile()
    forward = ForwardPlan(autocast_dtype, max_length if plan.compile.on else None, head_weight, refresh)
    setattr(model, PLAN_ATTRIBUTE, forward)
    return model, info


def saved_adapter_on(base: PreTrainedModel, adapter_dir: Path) -> PeftModel:
    """A saved adapter (PEFT's format) on `base`, its layers built on base's device: PEFT would build them on the
    CPU, draw an init there and copy each to the GPU before loading the saved weights (load_model says what that
    costs). Quiet as load_model is: without it every `gpucert evaluate` printed transformers' FutureWarning."""
    with quiet_peft(), torch.device(base.device):
        return PeftModel.from_pretrained(base, str(adapter_dir))


def adapter_for_generation(
    model_cfg: ModelConfig, tokenizer: Any, adapter_dir: Path, device: torch.device
) -> tuple[PeftModel, str]:
    """(the base model with a saved adapter on `device`, in eval mode; its attention implementation), for `gpucert
    evaluate` (held-out and BFCL). Generation pads its rows, which gpucert's own attention paths (unpadded training
    rows) refuse: SDPA then."""
    attn = "sdpa" if model_cfg.attn_implementation in OWN_ATTENTION else model_cfg.attn_implementation
    base = load_base_model(replace(model_cfg, attn_implementation=attn), len(tokenizer), device)
    return saved_adapter_on(base, adapter_dir).eval(), attn


def merge_adapter(model_cfg: ModelConfig, tokenizer: Any, adapter_dir: Path, out_dir: Path) -> Path | None:
    """The adapter folded into the base weights, saved as a plain model directory; None where the base cannot be
    rebuilt (random_init: its random weights are gone)."""
    if model_cfg.random_init and model_cfg.name != "tiny":
        return None
    base = load_base_model(model_cfg, len(tokenizer), torch.device("cpu"))
    with quiet_peft():
        merged = saved_adapter_on(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def supervised_count(labels: torch.Tensor) -> torch.Tensor:
    """Tokens the loss learns from: label t is predicted from position t-1, so the first column never counts."""
    return (labels[:, 1:] != IGNORE_INDEX).sum()


def forward_loss(
    model: nn.Module, batch: dict[str, torch.Tensor], attn_impl: str, layout: RowLayout | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the token cross-entropies over supervised tokens, their count), the sum computed in fp32.
    `layout`: the rows' RowLayout on the batch's device, when the host worked it out from its copy (the trainer's
    step); else each fact is read from the batch where it is needed, which waits for the GPU each time."""
    plan = forward_plan(model)
    position_ids = batch.get("position_ids")
    if position_ids is None:
        # An unpacked batch is one document per row: positions count from 0.
        position_ids = torch.arange(batch["input_ids"].shape[1], device=batch["input_ids"].device).expand_as(
            batch["input_ids"]
        )
    # Packed rows stay document-masked: SDPA gets the boolean block-causal mask, eager its additive form (fp32:
    # bf16 scores are promoted to it), flex attention none (transformers reads document starts from position_ids),
    # flash attention the documents' boundaries for its varlen kernels.
    single = layout.single_documents if layout is not None else None
    mask = attention_mask_for(position_ids, attn_impl, torch.float32, single)
    documents: dict[str, Any] = {}
    if takes_documents(attn_impl):
        documents = compiled_documents(layout.documents if layout is not None else flash_documents(position_ids))
    device = batch["input_ids"].device
    autocast = torch.autocast(device.type, dtype=plan.autocast_dtype) if plan.autocast_dtype else nullcontext()
    with autocast:
        out = model(
            input_ids=batch["input_ids"], position_ids=position_ids, attention_mask=mask, use_cache=False, **documents
        )
        if plan.head_weight is not None:
            supervised = layout.supervised if layout is not None else None
            loss_sum = linear_cross_entropy(out.logits, plan.head_weight, batch["labels"], supervised=supervised)
            return loss_sum, supervised_count(batch["labels"])
    logits = out.logits[:, :-1]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # the sum in fp32; float64 (tests) stays as it is
    targets = batch["labels"][:, 1:]
    loss_sum = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return loss_sum, supervised_count(batch["labels"])
