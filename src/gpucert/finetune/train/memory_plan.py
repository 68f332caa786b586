"""`train.micro_batch: auto`: a memory plan (micro-batch, activation checkpointing) chosen from an estimate of a
step's peak device memory, printed before training and recorded beside the measured peak.

The estimate (`estimate_peak`) is arithmetic on the architecture, counted tensor by tensor, with three
constants fitted to peaks measured on a lent H100 80GB HBM3 (torch max_memory_allocated, Qwen2-7B shape, 4096-
token rows, 2026-11-22; docs/OPTIMIZATION.md, "Memory plan"):

    static       frozen weights (dtype bytes; fp8 keeps the bf16 bytes: two float8 copies, fp8.py)
               + adapters: fp32 weight, gradient and two AdamW moments (16 bytes a parameter; DDP: +4, its buckets)
               + the fused loss's chunk: CHUNK_TOKENS x vocab fp32 logits and their gradient (loss.py)
               + WORKSPACE_GIB (fitted)
    per token    no checkpointing: ACTIVATION_SCALE (fitted) x what each decoder layer keeps for its backward
                 (counted in `layer_elements`), plus the final hidden states and their gradient;
                 full checkpointing: every layer's input, plus CHECKPOINT_LAYERS (fitted) layers' worth of the
                 above for the layer being recomputed and back-propagated

`choose_plan` takes the largest micro-batch up to train.micro_batch_max whose estimate fits under the free memory
less a margin without checkpointing, else with full checkpointing (about 27 % slower, measured: never chosen
while a micro-batch without it fits), else refuses (exit 3) naming the estimate and what to change. All pure;
`plan_for_run` reads the free memory (the minimum over ranks, so every rank picks the same plan). Which fusions
the estimated model runs with (adapters in the frozen GEMMs, the fused MLP) is the run's plan's answer
(finetune/plan.py), not worked out here.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucert.config.loader import ConfigError
from gpucert.finetune.config import FinetuneConfig, TrainConfig
from gpucert.finetune.model.loss import CHUNK_TOKENS
from gpucert.finetune.plan import Device, ModelPlan, plan_model

GIB = 1 << 30
# The model types of fused.ARCHITECTURES (a test keeps them equal): those whose MLP the fused MLP may take.
SWIGLU_MODEL_TYPES = ("qwen2", "mistral", "llama")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# fp32 weight, its gradient, AdamW's two moments.
ADAPTER_BYTES_PER_PARAM = 16
# DDP's gradient buckets: a second fp32 copy of every adapter gradient.
DDP_BUCKET_BYTES_PER_PARAM = 4
# The fused loss's live fp32 tensors per chunk: the upcast logits and softmax - one_hot (loss.py).
LOSS_CHUNK_FP32_COPIES = 2

# --- Fitted on the H100 measurements (docs/OPTIMIZATION.md "Micro-batch"; r16, no dropout, compiled, sdpa) --
# Peaks 33.7 / 50.8 / 68.0 GiB at micro-batch 1 / 2 / 3: 17.15 GiB per 4096-token row, 16.55 GiB at none.
# The counted tensors of `layer_elements` (and the 2 x hidden outside the layers) give 17.03 GiB a row:
# measured / counted = 1.007.
ACTIVATION_SCALE = 1.007
# The intercept less weights (14.18 GiB), r16 adapter state (0.60) and the loss chunk (1.16): cuBLAS
# workspaces, the compiled kernels' buffers, the batch itself.
WORKSPACE_GIB = 0.60
# Micro-batch 4 with full checkpointing peaked at 23.2 GiB: 6.65 GiB over static for 16,384 tokens, of which
# the 28 layer inputs and the final hidden states are 3.28; the rest is 1.39 layers' worth of saved tensors (the
# layer recomputed, and its backward's gradients).
CHECKPOINT_LAYERS = 1.39
# The adapters in the frozen GEMMs (model.adapters_in_gemm) keep part of one [x | xA] of gate/up a layer more:
# +1.2 GiB at 2 x 4096 tokens on Qwen2-7B r16 (51.5 GiB against the compiled loss chunk's 50.3, lent H100,
# 2026-11-23, plan h100-in-gemm-b.txt), 0.78 of the counted 1.55 GiB. The whole [x | xA] overcounted: micro-batch
# 3's estimate, 70.33 GiB against 69.4 measured (h100-bf16-round6c.txt, h100-fa3.txt), missed the 80 GB card's
# budget and auto chose 2 rows, 1.9-3.0 % slower. With the share: 52.0 and 69.8 GiB against 51.5 and 69.4.
IN_GEMM_KEPT_SHARE = 0.78
# Uncompiled decoder layers keep more (RMSNorm's fp32 upcasts, SwiGLU's activation): r64 micro-batch 2 without
# compile peaked at 63.6 GiB against 52.5 compiled (docs/results/finetune.md), 7.2 x hidden more a token a layer.
EAGER_EXTRA_HIDDEN = 7.2

# --- The margin the estimate must leave under the free memory --------------------------------------------
# A share of the card: the caching allocator reserves above what it allocates (measured up to 3.1 GiB, 6 %, on
# the runs of docs/results/finetune.md), and the estimate is held to 5 % of each measured peak.
MARGIN_SHARE = 0.08
# Fixed: device memory taken after the plan and outside torch's allocator (NCCL communicators and their
# buffers, cuBLAS/cuDNN handles, the compiled kernels' modules), about 1-2 GiB on the lent GPUs.
MARGIN_FIXED_GIB = 2.0

# Where each projection of a Llama-style decoder layer (Qwen2, Llama, Mistral) reads from and writes to.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class MemoryPlanError(ConfigError):
    """No micro-batch fits, or the plan cannot be made: exit 3 before the model loads."""


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    # An MLP the fused MLP takes (fused.mlp_problem): Qwen2, Mistral or Llama (fused.ARCHITECTURES), SiLU, no bias.
    swiglu: bool = True

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def projection(self, name: str) -> tuple[int, int]:
        """(in_features, out_features) of a decoder layer's projection."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        sizes = {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }
        if name not in sizes:
            raise MemoryPlanError(
                f"lora.target_modules: the memory plan knows the projections {', '.join(PROJECTIONS)}, found "
                f"{name!r}: set train.micro_batch to a number"
            )
        return sizes[name]

    def params(self) -> int:
        """Every parameter but the small biases: embeddings, the head unless tied, the layers, the norms."""
        h = self.hidden
        layer = sum(i * o for i, o in map(self.projection, PROJECTIONS)) + 2 * h
        return self.vocab * h * (1 if self.tied_embeddings else 2) + self.layers * layer + h


def shape_from_config(config: Any, vocab_size: int) -> ModelShape:
    """The shape of a transformers model config (Qwen2Config, MistralConfig, ...); the vocabulary is the larger
    of the config's and the tokenizer's (load_base_model resizes the embeddings to fit the tokenizer)."""
    heads = config.num_attention_heads
    return ModelShape(
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        layers=config.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab=max(config.vocab_size, vocab_size),
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        swiglu=getattr(config, "model_type", None) in SWIGLU_MODEL_TYPES
        and getattr(config, "hidden_act", None) == "silu"
        and not getattr(config, "mlp_bias", False),
    )


@dataclass(frozen=True)
class Workload:
    """What besides rows and checkpointing decides a step's memory."""

    shape: ModelShape
    seq_len: int
    lora_r: int
    target_modules: tuple[str, ...] = PROJECTIONS
    lora_dropout: float = 0.0
    dtype: str = "bf16"
    # "bf16" or "fp8": the same bytes either way (fp8 keeps two float8 copies of each frozen weight).
    precision: str = "bf16"
    compiled: bool = True
    fused_loss: bool = True
    # "none", "ddp" or "fsdp2" over `world` processes.
    parallel: str = "none"
    world: int = 1
    # model.adapters_in_gemm in effect (fused.py): q/k/v and gate/up each compute from [x | xA]. o_proj's and
    # down_proj's A rows keep nothing more (peak unchanged at 51.5 GiB, lent H100, plan h100-bf16-round6c.txt).
    adapters_in_gemm: bool = False
    # model.fuse_mlp in effect (fused.py SwiGLUInGemm): the MLP keeps no silu(gate) * up; its backward recomputes it.
    fused_mlp: bool = False

    def lora_params(self) -> int:
        return self.shape.layers * sum(self.lora_r * sum(self.shape.projection(m)) for m in self.target_modules)


def workload_from_config(
    cfg: FinetuneConfig, shape: ModelShape, parallel: str, world: int, model_plan: ModelPlan | None = None
) -> Workload:
    """The workload of a run; its fusions as the run's plan decided them (finetune/plan.py; worked out from the
    config when no plan is given)."""
    if model_plan is None:
        model_plan = plan_model(cfg.model, cfg.lora, Device(), sharded=parallel == "fsdp2")
    return Workload(
        shape=shape,
        seq_len=cfg.data.max_length,
        lora_r=cfg.lora.r,
        target_modules=tuple(cfg.lora.target_modules),
        lora_dropout=cfg.lora.dropout,
        dtype=cfg.model.dtype,
        precision=cfg.model.precision,
        compiled=cfg.model.compile,
        fused_loss=cfg.model.fused_loss,
        parallel=parallel,
        world=world,
        adapters_in_gemm=model_plan.adapters_in_gemm.on,
        fused_mlp=shape.swiglu and model_plan.fuse_mlp.on,
    )


def layer_elements(w: Workload) -> float:
    """Elements one decoder layer keeps per token for its backward, without checkpointing (counted): its input and
    the attention residual (RMSNorm backward), both norms' outputs (the adapters' A matrices need their input),
    q, k, v (attention), the attention output, gate and up (SwiGLU) and their product (down_proj's adapter; not with
    the fused MLP, which recomputes it), each adapter's rank-r intermediate; with LoRA dropout a dropped copy of every
    adapter's input; uncompiled, more."""
    s = w.shape
    kept: float = 4 * s.hidden + 2 * s.q_dim + 2 * s.kv_dim + (2 if w.fused_mlp else 3) * s.intermediate
    kept += w.lora_r * len(w.target_modules)
    if w.lora_dropout > 0:
        kept += sum(s.projection(m)[0] for m in w.target_modules)
    if w.adapters_in_gemm and {"gate_proj", "up_proj"} <= set(w.target_modules):
        # One kept [x | xA] of gate/up a layer, at the share of it measured (IN_GEMM_KEPT_SHARE).
        kept += IN_GEMM_KEPT_SHARE * (s.hidden + 2 * w.lora_r)
    if not w.compiled:
        kept += EAGER_EXTRA_HIDDEN * s.hidden
    return kept


@dataclass(frozen=True)
class Estimate:
    """A step's estimated peak device memory, GiB, in parts."""

    rows: int
    checkpointing: str
    parts: dict[str, float]

    @property
    def total_gib(self) -> float:
        return sum(self.parts.values())


def estimate_peak(w: Workload, rows: int, checkpointing: str) -> Estimate:
    """The peak allocated device memory of one rank's step at `rows` rows of w.seq_len tokens, checkpointing
    "none" or "full"."""
    s, nbytes = w.shape, DTYPE_BYTES[w.dtype]
    weights: float = s.params() * nbytes
    if w.parallel == "fsdp2" and w.world > 1:
        # Sharded, plus two layers gathered at once (the one computing and the prefetched one): not yet measured.
        layer = sum(i * o for i, o in map(s.projection, PROJECTIONS)) * nbytes
        weights = weights / w.world + 2 * layer
    adapter_bytes = ADAPTER_BYTES_PER_PARAM + (DDP_BUCKET_BYTES_PER_PARAM if w.parallel == "ddp" else 0)
    adapters = w.lora_params() * adapter_bytes / (w.world if w.parallel == "fsdp2" else 1)
    tokens = rows * w.seq_len
    # Unfused (counted, not measured): every token's logits in the model dtype, their fp32 copy and its gradient.
    loss = CHUNK_TOKENS * s.vocab * 4 * LOSS_CHUNK_FP32_COPIES if w.fused_loss else tokens * s.vocab * (nbytes + 8)
    # The final hidden states and the fused loss's gradient for them.
    outside = 2 * s.hidden
    if checkpointing == "full":
        per_token = nbytes * (s.layers * s.hidden + CHECKPOINT_LAYERS * layer_elements(w) + outside)
    else:
        per_token = ACTIVATION_SCALE * nbytes * (s.layers * layer_elements(w) + outside)
    parts = {
        "weights": weights / GIB,
        "adapters": adapters / GIB,
        "loss": loss / GIB,
        "workspace": WORKSPACE_GIB,
        "activations": tokens * per_token / GIB,
    }
    return Estimate(rows=rows, checkpointing=checkpointing, parts=parts)


def estimate_peak_gib(w: Workload, rows: int, checkpointing: str = "none") -> float:
    return estimate_peak(w, rows, checkpointing).total_gib


def margin_gib(total_gib: float) -> float:
    return MARGIN_SHARE * total_gib + MARGIN_FIXED_GIB


@dataclass(frozen=True)
class Plan:
    """The micro-batch and checkpointing a run trains with, and why."""

    micro_batch: int
    checkpointing: str
    # "auto" (chosen here), "config" (train.micro_batch set), "cpu" (auto on a CPU: 1).
    chosen_by: str
    estimate_gib: float | None = None
    free_gib: float | None = None
    total_gib: float | None = None
    budget_gib: float | None = None
    parts: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    @property
    def headroom_gib(self) -> float | None:
        if self.estimate_gib is None or self.free_gib is None:
            return None
        return self.free_gib - self.estimate_gib

    def message(self) -> str:
        what = "full checkpointing" if self.checkpointing == "full" else "no checkpointing"
        head = f"memory plan: micro-batch {self.micro_batch}, {what}"
        if self.chosen_by == "cpu":
            return f"{head} (train.micro_batch auto on a CPU means 1: there is no device memory to plan for)"
        if self.estimate_gib is None:
            return f"{head} (train.micro_batch as configured; no estimate: {'; '.join(self.reasons)})"
        source = "chosen by train.micro_batch auto" if self.chosen_by == "auto" else "as configured"
        text = (
            f"{head}, {source}: estimate {self.estimate_gib:.1f} of {self.free_gib:.1f} GiB free "
            f"(headroom {self.headroom_gib:.1f}; budget {self.budget_gib:.1f} after the "
            f"{(self.free_gib or 0) - (self.budget_gib or 0):.1f} GiB margin)"
        )
        return text + "".join(f"; {r}" for r in self.reasons)

    def apply(self, cfg: FinetuneConfig) -> FinetuneConfig:
        """The config the run trains with: micro_batch a number, checkpointing as planned."""
        return dataclasses.replace(
            cfg,
            train=dataclasses.replace(cfg.train, micro_batch=self.micro_batch),
            model=dataclasses.replace(cfg.model, gradient_checkpointing=self.checkpointing == "full"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "headroom_gib": self.headroom_gib}


def choose_plan(
    free_gib: float, total_gib: float, w: Workload, micro_batch_max: int, checkpointing_required: bool = False
) -> Plan:
    """The largest micro-batch up to micro_batch_max that fits under free_gib less the margin without
    checkpointing, else with full checkpointing (only that when checkpointing_required), else MemoryPlanError."""
    budget = free_gib - margin_gib(total_gib)
    modes = ("full",) if checkpointing_required else ("none", "full")
    reasons: list[str] = []
    for mode in modes:
        for rows in range(micro_batch_max, 0, -1):
            estimate = estimate_peak(w, rows, mode)
            if estimate.total_gib <= budget:
                return Plan(
                    micro_batch=rows,
                    checkpointing=mode,
                    chosen_by="auto",
                    estimate_gib=estimate.total_gib,
                    free_gib=free_gib,
                    total_gib=total_gib,
                    budget_gib=budget,
                    parts=estimate.parts,
                    reasons=reasons,
                )
            what = " with full checkpointing" if mode == "full" else ""
            reasons.append(f"micro-batch {rows}{what} would need {estimate.total_gib:.1f}")
            if rows == micro_batch_max and rows > 1:
                reasons[-1] += f" (train.micro_batch_max {micro_batch_max})"
    used = total_gib - free_gib
    held = f"; {used:.1f} GiB of the {total_gib:.1f} are already in use" if used > margin_gib(total_gib) else ""
    raise MemoryPlanError(
        f"train.micro_batch auto: nothing fits in {free_gib:.1f} GiB free (budget {budget:.1f} after the "
        f"{margin_gib(total_gib):.1f} GiB margin){held}: {'; '.join(reasons)} GiB. Shorten data.max_length "
        "(activations grow with it), set lora.dropout 0 (dropout keeps a copy of every adapter input), or train "
        "with train.parallel fsdp2 over more GPUs (it shards the frozen weights); model.precision fp8 does not "
        "help (its frozen weights keep the bf16 bytes)"
    )


def configured_plan(cfg: FinetuneConfig, w: Workload | None, free_gib: float, total_gib: float) -> Plan:
    """The plan of a run whose micro_batch is a number: its estimate, so a report shows it beside the peak."""
    mode = "full" if cfg.model.gradient_checkpointing else "none"
    rows = fixed_micro_batch(cfg.train)
    if w is None:
        return Plan(micro_batch=rows, checkpointing=mode, chosen_by="config", reasons=["not a CUDA device"])
    estimate = estimate_peak(w, rows, mode)
    return Plan(
        micro_batch=rows,
        checkpointing=mode,
        chosen_by="config",
        estimate_gib=estimate.total_gib,
        free_gib=free_gib,
        total_gib=total_gib,
        budget_gib=free_gib - margin_gib(total_gib),
        parts=estimate.parts,
    )


def fixed_micro_batch(train: TrainConfig) -> int:
    """train.micro_batch as a number; "auto" must have been resolved by the memory plan first."""
    if not isinstance(train.micro_batch, int):
        raise ValueError(f"train.micro_batch {train.micro_batch!r} was not resolved by the memory plan")
    return train.micro_batch


# --- Collect: the architecture and the free memory --------------------------------------------------------


def model_shape(cfg: FinetuneConfig, vocab_size: int) -> ModelShape:
    """The architecture the run will load, from its config alone (config.json: nothing else is read)."""
    if cfg.model.name == "tiny":
        from gpucert.finetune.model.lora import tiny_config

        return shape_from_config(tiny_config(vocab_size), vocab_size)
    from transformers import AutoConfig

    from gpucert.finetune.data.hub import pretrained_source

    source, offline = pretrained_source(cfg.model.name)
    return shape_from_config(AutoConfig.from_pretrained(source, **offline), vocab_size)


def host_available_gib() -> float | None:
    """The host memory a new allocation can take (MemAvailable), None where /proc/meminfo does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GIB
    except (OSError, ValueError, IndexError):
        return None
    return None


def local_ranks(rt: Any) -> int:
    """The ranks on this host (each CPU rank holds its own copy of the model), from torchrun's LOCAL_WORLD_SIZE."""
    try:
        return max(int(os.environ.get("LOCAL_WORLD_SIZE", "")), 1)
    except ValueError:
        return max(int(getattr(rt, "world_size", 1)), 1)


def refuse_beyond_host_memory(cfg: FinetuneConfig, w: Workload, rows: int, checkpointing: str, ranks: int = 1) -> None:
    """A run on the CPU whose weights and activations, by the GPU estimate, exceed the host's available memory (a
    7B recipe on a GPU-less machine): refused before the model loads, where it filled the host's memory for
    minutes on its way to being killed. `ranks`: the processes of this host, each with its own copy."""
    available = host_available_gib()
    need = estimate_peak_gib(w, rows, checkpointing) * ranks
    if available is None or need <= available:
        return
    raise MemoryPlanError(
        f"{cfg.model.name} at micro-batch {rows} needs about {need:.0f} GiB (weights, adapters, optimizer state and "
        f"activations{f', {ranks} processes' if ranks > 1 else ''}) and this host has {available:.0f} GiB available, "
        "with no GPU to train on: run it on a GPU "
        "node, or try the pipeline on this one with the tiny model (gpucert finetune, no --config)"
    )


def device_memory_gib(rt: Any, agree: bool) -> tuple[float, float]:
    """(free, total) GiB of this rank's GPU; with `agree`, the minimum of each over ranks (a collective)."""
    import torch
    import torch.distributed as dist

    free, total = torch.cuda.mem_get_info(rt.device)
    memory = torch.tensor([free, total], dtype=torch.float64, device=rt.device)
    if agree and rt.world_size > 1:
        dist.all_reduce(memory, op=dist.ReduceOp.MIN)
    free_gib, total_gib = memory.tolist()
    return free_gib / GIB, total_gib / GIB


def plan_for_run(
    cfg: FinetuneConfig, rt: Any, vocab_size: int, parallel: str, model_plan: ModelPlan | None = None
) -> Plan:
    """This run's memory plan, for the model the run's plan builds (`model_plan`). Collective under micro_batch
    auto on CUDA: the free and total memory are the minimum over ranks, so every rank computes the same plan."""
    auto = cfg.train.micro_batch == "auto"
    if rt.device.type != "cuda":
        mode = "full" if cfg.model.gradient_checkpointing else "none"
        rows = 1 if auto else fixed_micro_batch(cfg.train)
        try:
            workload = workload_from_config(cfg, model_shape(cfg, vocab_size), parallel, rt.world_size)
        except (MemoryPlanError, AttributeError, KeyError, ValueError):
            workload = None  # an architecture the estimate does not know: trained as before, unestimated
        if workload is not None:
            refuse_beyond_host_memory(cfg, workload, rows, mode, local_ranks(rt))
        if auto:
            return Plan(micro_batch=1, checkpointing=mode, chosen_by="cpu")
        return configured_plan(cfg, None, 0.0, 0.0)
    free_gib, total_gib = device_memory_gib(rt, agree=auto)
    try:
        workload = workload_from_config(cfg, model_shape(cfg, vocab_size), parallel, rt.world_size, model_plan)
        if not auto:
            return configured_plan(cfg, workload, free_gib, total_gib)
        return choose_plan(free_gib, total_gib, workload, cfg.train.micro_batch_max, cfg.model.gradient_checkpointing)
    except MemoryPlanError as exc:
        if auto:
            raise
        return Plan(
            fixed_micro_batch(cfg.train),
            "full" if cfg.model.gradient_checkpointing else "none",
            "config",
            reasons=[str(exc)],
        )
