"""The run's plan: which kernels, precision, fusions, micro-batch, compile mode and parallelism a fine-tuning run
uses, and why each is on or off, decided once.

`plan_model` is a pure function of the config (model.*, lora.*), the parallel mode and a small description of the
GPU (`Device`): every condition of a speed lever lives here and nowhere else. `load_model` (model/lora.py) and the
memory estimate (train/memory_plan.py) read its answers instead of working them out again. The training loop
(train/loop.py `plan_run`) adds the memory plan and the parallelism, prints the whole plan as one block on rank 0
before the model loads, and writes it to metrics.json ("plan") and report.json (the resolved config's "plan").

What the plan cannot know before the model exists is checked where the model is built, as before: an attention
implementation or FP8 on a GPU that cannot run it is refused when the model loads, a group of projections that
cannot be fused is named in the fusion summary, and a head with a bias keeps the plain loss.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpucert.finetune.config import FUSED_MLP_MAX_RANK, FinetuneConfig, LoraConfig, ModelConfig

if TYPE_CHECKING:
    import torch

# The projections the fused MLP takes together (model/fused.py SwiGLUInGemm).
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
ATTENTION = {
    "sdpa": "PyTorch SDPA, packed documents kept apart by a block-causal mask",
    "flex_attention": "flex attention over packed documents (CUDA only)",
    "eager": "transformers' eager attention with an additive document mask",
    "flash_attention_2": "FlashAttention-2's varlen kernels, packed rows as documents (flash-attn package)",
    "flash_attention_3": "FlashAttention-3's kernels called by gpucert, packed rows as documents (Hopper only)",
    "varlen": "torch's varlen attention (FlashAttention-2 kernels in torch), packed rows as documents",
}


@dataclass(frozen=True)
class Device:
    """What the plan needs to know of the GPU: its kind ("cuda" or "cpu"), and on CUDA its name, compute
    capability and memory."""

    kind: str = "cpu"
    name: str = "cpu"
    capability: tuple[int, int] | None = None
    total_gib: float | None = None

    def describe(self) -> str:
        if self.kind != "cuda":
            return self.name
        capability = f"compute capability {self.capability[0]}.{self.capability[1]}" if self.capability else ""
        memory = f", {self.total_gib:.1f} GiB" if self.total_gib is not None else ""
        return f"{self.name} ({capability}{memory})"


def describe_device(device: torch.device) -> Device:
    """The Device of a torch device (collect: asks CUDA; nothing is decided here)."""
    import torch

    if device.type != "cuda":
        return Device(kind=device.type, name=device.type)
    properties = torch.cuda.get_device_properties(device)
    return Device(
        kind="cuda",
        name=properties.name,
        capability=(properties.major, properties.minor),
        total_gib=properties.total_memory / (1 << 30),
    )


@dataclass(frozen=True)
class Choice:
    """A lever of the plan: on or off, and why (the config key and the condition that decided it)."""

    on: bool
    why: str

    def __str__(self) -> str:
        return f"{'on' if self.on else 'off'}: {self.why}"


def _first_missing(conditions: list[tuple[bool, str]], why_on: str) -> Choice:
    """On when every condition holds (said by why_on), else off with the first condition that does not."""
    for holds, why_off in conditions:
        if not holds:
            return Choice(False, why_off)
    return Choice(True, why_on)


@dataclass(frozen=True)
class ModelPlan:
    """How the model is built and run: what load_model reads."""

    attention: str
    dtype: str
    precision: str
    sharded: bool
    autocast: Choice
    fused_loss: Choice
    fp8_head: Choice
    fuse_projections: Choice
    adapters_in_gemm: Choice
    fuse_mlp: Choice
    compile: Choice
    compile_tuning: Choice
    gradient_checkpointing: Choice

    def with_checkpointing(self, on: bool, why: str) -> ModelPlan:
        return dataclasses.replace(self, gradient_checkpointing=Choice(on, why))


def plan_model(model: ModelConfig, lora: LoraConfig, device: Device, sharded: bool = False) -> ModelPlan:
    """Every model-side decision of a run, with its reason. `sharded`: FSDP2 (or ZeRO-3) shards the frozen
    weights. The conditions are those load_model applied before the plan existed, exactly."""
    half = model.dtype in ("bf16", "fp16")
    autocast = _first_missing(
        [
            (model.autocast, "model.autocast false: PEFT's path, every adapter input upcast to fp32"),
            (half, f"model.dtype {model.dtype}: the adapters already compute in it"),
        ],
        f"adapters computed in {model.dtype} under autocast, their weights and optimizer fp32 (model.autocast)",
    )
    triton = device.kind == "cuda"
    fused_loss = _first_missing(
        [(model.fused_loss, "model.fused_loss false: full-vocabulary logits")],
        "lm_head and cross-entropy chunked over labelled tokens (model.fused_loss); each chunk's softmax "
        + ("one Triton kernel" if triton else "compiled or eager (no CUDA)")
        + "; a head with a bias or adapters keeps the plain loss",
    )
    fp8 = model.precision == "fp8"
    fp8_head = _first_missing(
        [
            (fp8, f"model.precision is {model.precision}, not fp8"),
            (model.fused_loss, "model.fused_loss false: the head is not deferred to the loss"),
            (model.fp8_head, "model.fp8_head false: the head stays bf16"),
        ],
        "the frozen lm_head's two matmuls in FP8 (model.fp8_head); a head tied to the embeddings stays bf16",
    )
    fuse = _first_missing(
        [(model.fuse_projections, "model.fuse_projections false: PEFT's projections one by one")],
        "q/k/v one stacked frozen GEMM, q/k/v and gate/up one adapter down-projection each at LoRA dropout 0 "
        "(model.fuse_projections; groups that cannot are named when the model loads)",
    )
    in_gemm = _first_missing(
        [
            (fuse.on, "needs model.fuse_projections"),
            (model.adapters_in_gemm, "model.adapters_in_gemm false"),
            (model.autocast, "needs model.autocast (the adapters must compute in the frozen dtype)"),
            (half, f"model.dtype {model.dtype}: needs bf16 or fp16 frozen weights"),
            (not fp8, "model.precision fp8: 4 % slower when tried (docs/OPTIMIZATION.md)"),
            (not sharded, "train.parallel fsdp2 would shard the frozen views"),
            (lora.dropout == 0, f"lora.dropout {lora.dropout} > 0: one dropout mask per projection, no shared A"),
        ],
        "each group's B as extra columns of its frozen GEMM, o_proj's and down_proj's A as extra rows "
        "(model.adapters_in_gemm)",
    )
    missing = [m for m in MLP_PROJECTIONS if m not in lora.target_modules]
    # bf16 fuses the MLP over the adapters in its frozen GEMMs; FP8 keeps them beside its GEMMs (4 % slower inside)
    # and fuses what lies between the GEMMs instead (fp8_mlp.py), over gate/up's one A.
    if fp8:
        mlp_needs = [
            (fuse.on, "needs model.fuse_projections (gate/up's one A)"),
            (model.autocast, "needs model.autocast (the adapters must compute in the frozen dtype)"),
            (half, f"model.dtype {model.dtype}: needs bf16 or fp16 activations"),
            (not sharded, "train.parallel fsdp2: not measured with the weights sharded"),
            (lora.dropout == 0, f"lora.dropout {lora.dropout} > 0: one dropout mask per projection, no shared A"),
        ]
        mlp_how = "the SwiGLU with the adapters' rank-r products and h's FP8 quantization " + (
            "one Triton kernel, its backward two" if triton else "the kernels' torch reference (no CUDA)"
        )
    else:
        mlp_needs = [(in_gemm.on, "needs the adapters in the frozen GEMMs")]
        mlp_how = "its backward " + ("one Triton kernel" if triton else "the kernel's torch reference (no CUDA)")
    fuse_mlp = _first_missing(
        [
            (model.fuse_mlp, "model.fuse_mlp false"),
            (not missing, f"lora.target_modules without {', '.join(missing)}"),
            (
                lora.r <= FUSED_MLP_MAX_RANK,
                f"lora.r {lora.r} > {FUSED_MLP_MAX_RANK}, the rank the kernel is measured at",
            ),
            *mlp_needs,
        ],
        f"each SwiGLU MLP one function, {mlp_how}"
        + " (model.fuse_mlp; an architecture whose MLP cannot is named when the model loads)",
    )
    compile_ = _first_missing(
        [(model.compile, "model.compile false: eager decoder layers, batches padded to their longest row")],
        "every decoder layer compiled by torch.compile, batches padded to data.max_length (model.compile)",
    )
    # "auto" tunes nowhere (docs/OPTIMIZATION.md): in bf16 it bought at most about 1 % for most of a cold compile;
    # in FP8 its +1.7 % (2026-11-23, an H100) came from inductor's quantizing SwiGLU kernels, which the fused MLP's
    # own kernels replaced, and on one H200 it then bought 0.0-0.4 % for 53-98 s more compile on an empty cache.
    tuning = _first_missing(
        [
            (model.compile, "nothing is compiled"),
            (model.compile_tuning is not False, "model.compile_tuning false"),
            (
                model.compile_tuning is True,
                "model.compile_tuning auto: off, where it bought 0-1 % in bf16 and 0.0-0.4 % in fp8 for most of a "
                "cold compile (true turns it on)",
            ),
        ],
        "inductor's coordinate-descent tuning of the compiled Triton kernels (model.compile_tuning true; "
        "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING, when set, wins)",
    )
    checkpointing = Choice(
        model.gradient_checkpointing,
        "model.gradient_checkpointing" + ("" if model.gradient_checkpointing else " false"),
    )
    return ModelPlan(
        attention=model.attn_implementation,
        dtype=model.dtype,
        # What the frozen weights compute in: fp8, or the dtype (model.precision's "bf16" means "not FP8", and a
        # CPU run in fp32 was written into the report as precision bf16).
        precision=model.precision if model.precision == "fp8" else model.dtype,
        sharded=sharded,
        autocast=autocast,
        fused_loss=fused_loss,
        fp8_head=fp8_head,
        fuse_projections=fuse,
        adapters_in_gemm=in_gemm,
        fuse_mlp=fuse_mlp,
        compile=compile_,
        compile_tuning=tuning,
        gradient_checkpointing=checkpointing,
    )


class MemoryPlan(Protocol):
    """What the run uses of train/memory_plan.py's Plan (which reads this module: no import back)."""

    @property
    def micro_batch(self) -> int: ...

    @property
    def chosen_by(self) -> str: ...

    def apply(self, cfg: FinetuneConfig) -> FinetuneConfig: ...

    def message(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RunPlan:
    """The whole plan of a run: the device, the parallelism, the model's plan and the memory plan."""

    device: Device
    parallel: str
    world_size: int
    model: ModelPlan
    memory: MemoryPlan

    @property
    def micro_batch(self) -> int:
        return self.memory.micro_batch

    def message(self) -> str:
        """The plan as one block of lines, for the log."""
        m = self.model
        precision = (
            f"{m.precision}: frozen decoder projections in float8 e4m3 on the FP8 tensor cores, the rest {m.dtype}"
            if m.precision == "fp8"
            else f"{m.dtype}: frozen weights as loaded, not quantized to FP8"
        )
        lines = [
            f"device             {self.device.describe()} x {self.world_size}",
            f"parallel           {self.parallel} over {self.world_size} process{'es' if self.world_size > 1 else ''}",
            f"precision          {precision} (model.precision, model.dtype)",
            f"attention          {m.attention}: {ATTENTION.get(m.attention, m.attention)}",
            self.memory.message(),
            f"checkpointing      {m.gradient_checkpointing}",
            f"compile            {m.compile}",
            f"compile tuning     {m.compile_tuning}",
            f"autocast           {m.autocast}",
            f"fused loss         {m.fused_loss}",
            f"fp8 head           {m.fp8_head}",
            f"fused projections  {m.fuse_projections}",
            f"adapters in GEMM   {m.adapters_in_gemm}",
            f"fused MLP          {m.fuse_mlp}",
        ]
        return "run plan (decided once, from the config and the GPU):\n" + "\n".join(f"  {line}" for line in lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": dataclasses.asdict(self.device),
            "parallel": self.parallel,
            "world_size": self.world_size,
            "micro_batch": self.micro_batch,
            "model": dataclasses.asdict(self.model),
            "memory": self.memory.to_dict(),
        }
