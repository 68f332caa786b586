"""FP8 frozen base weights for LoRA training (`model.precision: fp8`).

LoRA never trains the base weights, so they can be quantized once: each frozen nn.Linear of the decoder layers
becomes an `Fp8FrozenLinear` whose weight is float8_e4m3fn, and its matmuls run on the FP8 tensor cores through
`torch._scaled_mm` (about twice the bf16 rate on an H100; the frozen weights' GEMMs are 70 % of a 7B step,
docs/OPTIMIZATION.md). The adapters, norms, attention and embeddings stay in bf16/fp32; the head, see below.

What is quantized how (the row-wise recipe of torchao's float8 training, `Float8LinearRecipeName.ROWWISE`):

- the weight W [N, K], once at conversion, in the two layouts `_scaled_mm` needs (its first operand row-major,
  its second column-major): for y = x @ W^T, W row-major with a scale per output row n (W^T then is a
  column-major view); for dx = dy @ W, W^T stored row-major with a scale per input column k (W then is a
  column-major view). The scale of a GEMM's second operand must lie along its output dimension, so each layout
  gets its own scales. Two float8 copies take the bytes of one bf16 weight; the bf16 weight is freed.
- the activation x per row (token) and the output gradient dy per row, dynamically at every call.
- every scale is a power of two covering the row's amax (amax / 448 rounded up): dividing by it is exact, and
  compiled and eager code quantize alike (torchao rounds row-wise scales to powers of two for the same reason).
- all three in e4m3 (3 mantissa bits): per-row scales give dy the range e5m2 would, and `_scaled_mm`'s
  row-wise kernels take e4m3 operands only.

No weight gradient is ever computed. The matmuls accumulate in fp32 inside cuBLAS/CUTLASS, with fast
accumulation both ways (measured below). Both in- and out-features must be multiples of 16 (`_scaled_mm`);
other layers keep their bf16 nn.Linear and are named in a warning.

The frozen lm_head can run in FP8 too (`model.fp8_head`, `head_to_fp8`): the fused loss (loss.py) then takes
its two layouts instead of the bf16 weight.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gpucert.config.loader import ConfigError
from gpucert.finetune.model.layers import decoder_layers

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
# An all-zero row gets this amax instead of 0, so its scale stays finite (torchao's EPS).
AMAX_FLOOR = 1e-12
# torch._scaled_mm refuses inner and output dimensions that are not multiples of 16.
ALIGNMENT = 16
# float8 tensor cores: Ada (8.9) and Hopper (9.0) onwards.
MIN_CAPABILITY = (8, 9)
# Fast (lower-precision) accumulation for the output (torchao's default) and for dx too: on the lent H100 it took
# the 7B step from 20,723 to 21,154 tokens/s and the tiny bf16-vs-fp8 run stayed within its tolerance (final
# loss 7.0894 vs 7.1071 bf16), docs/OPTIMIZATION.md.
FAST_ACCUM_FORWARD = True
FAST_ACCUM_BACKWARD = True
# The head's input gradient sums over the whole vocabulary (152,064 products a value on Qwen2-7B, 8 times the
# decoder layers' longest inner dimension): there the tensor cores' partial sums are promoted to fp32 as they go
# (no fast accumulation), as DeepSeek-V3 does for long inner dimensions.
FAST_ACCUM_HEAD_BACKWARD = False


def power_of_two_scale(amax: torch.Tensor) -> torch.Tensor:
    """The smallest power of two s with amax / s <= 448, in fp32: the dequantization factor of a row."""
    ideal = amax.float().clamp(min=AMAX_FLOOR) / FP8_MAX
    return torch.exp2(torch.ceil(torch.log2(ideal)))


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(t / s in float8_e4m3fn, s [rows, 1] fp32) for a 2-D t, one power-of-two scale s per row.

    The clamp saturates what log2's rounding might push a hair past 448: a float8_e4m3fn cast does not saturate
    (it gives NaN).
    """
    scale = power_of_two_scale(t.abs().amax(dim=1, keepdim=True))
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


class _Fp8FrozenMatmul(torch.autograd.Function):
    """y = x @ W^T + b with x quantized per row; backward: dx = dy @ W with dy quantized per row. One FP8 GEMM
    each way, nothing saved but the weight's backward layout (frozen parameters, not activations)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_t: torch.Tensor,
        weight_t_scale: torch.Tensor,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        xq, x_scale = quantize_rows(x2)
        # weight [N, K] row-major: weight.t() is the column-major [K, N] operand; weight_scale is [1, N].
        y = torch._scaled_mm(
            xq,
            weight.t(),
            scale_a=x_scale,
            scale_b=weight_scale,
            bias=bias,
            out_dtype=out_dtype,
            use_fast_accum=FAST_ACCUM_FORWARD,
        )
        ctx.save_for_backward(weight_t, weight_t_scale)
        ctx.x_shape = x.shape
        ctx.x_dtype = x.dtype
        ctx.out_dtype = out_dtype
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None, None
        weight_t, weight_t_scale = ctx.saved_tensors
        dyq, dy_scale = quantize_rows(grad_y.reshape(-1, grad_y.shape[-1]))
        # weight_t [K, N] row-major: weight_t.t() is W as the column-major [N, K] operand; its scale is [1, K].
        dx = torch._scaled_mm(
            dyq,
            weight_t.t(),
            scale_a=dy_scale,
            scale_b=weight_t_scale,
            out_dtype=ctx.out_dtype,
            use_fast_accum=FAST_ACCUM_BACKWARD,
        )
        return dx.reshape(ctx.x_shape).to(ctx.x_dtype), None, None, None, None, None, None


def _frozen(t: torch.Tensor) -> nn.Parameter:
    # Parameters, not buffers: DDP broadcasts buffers at every forward (parameters once, at wrap), and
    # train/checkpoint.py's state dicts leave frozen parameters out, so neither copy nor checkpoint grows.
    return nn.Parameter(t, requires_grad=False)


class Fp8FrozenLinear(nn.Module):
    """A frozen nn.Linear whose matmuls run in FP8 (module docstring). Built by `from_linear`."""

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_t: torch.Tensor,
        weight_t_scale: torch.Tensor,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = _frozen(weight)  # [N, K] e4m3, row-major
        self.weight_scale = _frozen(weight_scale)  # [1, N] fp32
        self.weight_t = _frozen(weight_t)  # [K, N] e4m3, row-major
        self.weight_t_scale = _frozen(weight_t_scale)  # [1, K] fp32
        self.bias = _frozen(bias) if bias is not None else None
        self.out_dtype = out_dtype

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8FrozenLinear:
        problem = shape_problem(linear.weight)
        if problem:
            raise ValueError(problem)
        bias = linear.bias.detach() if linear.bias is not None else None
        return cls.from_weight(linear.weight.detach(), bias)

    @classmethod
    def from_weight(cls, w: torch.Tensor, bias: torch.Tensor | None = None) -> Fp8FrozenLinear:
        weight, row_scale = quantize_rows(w)
        # Per input column k: quantize W^T by rows, which is W by columns.
        weight_t, col_scale = quantize_rows(w.t())
        return cls(weight, row_scale.t().contiguous(), weight_t.contiguous(), col_scale.t().contiguous(), bias, w.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Fp8FrozenMatmul.apply(
            x, self.weight, self.weight_scale, self.weight_t, self.weight_t_scale, self.bias, self.out_dtype
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, fp8"


def shape_problem(weight: torch.Tensor) -> str | None:
    """Why `_scaled_mm` cannot take this weight [out_features, in_features], or None."""
    out_features, in_features = weight.shape
    if in_features % ALIGNMENT or out_features % ALIGNMENT:
        return f"{in_features} -> {out_features} features, not multiples of {ALIGNMENT} as torch._scaled_mm needs"
    return None


@dataclass
class Conversion:
    """What convert_frozen_linears did: qualified module names, and why each skipped one was left in bf16."""

    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """The skipped layers grouped by their name within a decoder layer ("mlp.down_proj (172 -> 64 ...)")."""
        groups: dict[str, int] = {}
        for name, reason in self.skipped.items():
            key = f"{_within_layer(name)} ({reason})"
            groups[key] = groups.get(key, 0) + 1
        return "; ".join(f"{key} in {n} decoder layer{'s' if n > 1 else ''}" for key, n in groups.items())


def _within_layer(name: str) -> str:
    """'base_model.model.model.layers.3.mlp.down_proj.base_layer' -> 'mlp.down_proj'."""
    parts = [p for p in name.split(".") if p != "base_layer"]
    digits = [i for i, p in enumerate(parts) if p.isdigit()]
    return ".".join(parts[digits[-1] + 1 :] if digits else parts)


def convert_frozen_linears(model: nn.Module, skip: Collection[str] = ()) -> Conversion:
    """Replace every frozen nn.Linear inside the decoder layers by an Fp8FrozenLinear, in place: the
    `base_layer` of each PEFT LoRA layer and any projection without an adapter. The LoRA matrices (trained), the
    head (the fused loss takes it, `head_to_fp8`) and the embeddings (a lookup) are never touched; a module whose
    name has a part in `skip` (e.g. "down_proj") stays bf16. Layers whose shape `_scaled_mm` cannot take stay
    bf16 and are named in a warning; a model where nothing converts is refused (ConfigError)."""
    kept = {id(p) for p in _head_and_embedding_weights(model)}
    names = {id(m): name for name, m in model.named_modules()}
    done = Conversion()
    for layer in decoder_layers(model):
        for parent in list(layer.modules()):
            for child_name, child in list(parent.named_children()):
                if type(child) is not nn.Linear or child.weight.requires_grad or id(child.weight) in kept:
                    continue
                name = f"{names[id(parent)]}.{child_name}"
                if set(name.split(".")) & set(skip):
                    done.skipped[name] = "asked to skip"
                    continue
                problem = shape_problem(child.weight)
                if problem:
                    done.skipped[name] = problem
                    continue
                setattr(parent, child_name, Fp8FrozenLinear.from_linear(child))
                done.converted.append(name)
    if not done.converted:
        raise ConfigError(
            f"model.precision: fp8 found no frozen linear layer it can convert in {type(model).__name__}"
            + (f" ({done.summary()})" if done.skipped else "")
            + "; use model.precision=bf16"
        )
    if done.skipped:
        warnings.warn(f"model.precision fp8: left in bf16: {done.summary()}", stacklevel=2)
    return done


def head_to_fp8(weight: torch.Tensor, embeddings: torch.Tensor | None) -> Fp8FrozenLinear | None:
    """The fused loss's frozen head weight [vocab, hidden] in FP8 (both layouts), or None where it stays bf16,
    with a warning saying why: a head tied to the input embeddings (their lookup reads the same bf16 weight, so
    the float8 copies would add its bytes instead of replacing them) or a shape `_scaled_mm` cannot take."""
    if embeddings is not None and weight.data_ptr() == embeddings.data_ptr():
        why = "it is tied to the input embeddings"
    else:
        why = shape_problem(weight) or ""
    if why:
        warnings.warn(f"model.fp8_head: the lm_head stays bf16: {why}", stacklevel=2)
        return None
    return Fp8FrozenLinear.from_weight(weight)


def _head_and_embedding_weights(model: nn.Module) -> list[torch.Tensor]:
    found = []
    for getter in ("get_output_embeddings", "get_input_embeddings"):
        module = getattr(model, getter, lambda: None)()
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor):
            found.append(weight)
    return found


def fp8_device_problem(
    device_type: str, capability: tuple[int, int] | None, name: str = "", rocm: bool = False
) -> str | None:
    """Why FP8 matmuls cannot run on this device, or None. `capability` is CUDA's (major, minor); `rocm`: a
    ROCm build of torch, whose MI300 GPUs take the fnuz float8 formats, not the e4m3fn written here."""
    need = ".".join(map(str, MIN_CAPABILITY))
    if rocm:
        return "model.precision: fp8 is written for NVIDIA GPUs (float8_e4m3fn), this torch is a ROCm build; use bf16"
    if device_type != "cuda" or capability is None:
        return (
            f"model.precision: fp8 needs a CUDA GPU of compute capability >= {need} (Ada, Hopper or newer), "
            f"this run is on {device_type}; use model.precision=bf16"
        )
    if tuple(capability) < MIN_CAPABILITY:
        found = ".".join(map(str, capability))
        return (
            f"model.precision: fp8 needs a CUDA GPU of compute capability >= {need} (Ada, Hopper or newer), "
            f"found {name or 'a GPU'} of compute capability {found}; use model.precision=bf16"
        )
    return None


def check_fp8_device(device: torch.device) -> None:
    """Refuse (ConfigError, exit 3) a device without float8 tensor cores, before any model is built."""
    capability, name = None, ""
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
    problem = fp8_device_problem(device.type, capability, name, rocm=torch.version.hip is not None)
    if problem:
        raise ConfigError(problem)
