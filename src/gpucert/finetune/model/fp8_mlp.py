"""An FP8 LoRA MLP as one function (`model.fuse_mlp` with `model.precision: fp8`).

After FP8 conversion (fp8.py) each of a SwiGLU MLP's three projections is PEFT's LoRA layer over an
`Fp8FrozenLinear`: the frozen GEMM in FP8, the adapter beside it in bf16 (gate/up sharing one A, fused.py). Run
one by one, the adapters' up-projections of gate and up and their sums, h = silu(gate) * up in bf16 and in FP8,
and in the backward the adapters' share of dh and dgate/dup in bf16 and FP8, are each a tensor of 8,192 x 18,944
written and read again per layer (Qwen2-7B, micro-batch 2). `_Fp8SwiGLU` keeps the three frozen FP8 GEMMs each way
and hands everything between them to kernels/swiglu_fp8.py, which computes the adapters' rank-r products on the
tiles it already holds. The forward keeps gate, up and x (h is recomputed in the backward, as the bf16 fused MLP
does), so the layer keeps one intermediate-sized tensor less. On one H200, the r16 FP8 step at micro-batch 2 ran
3.0-3.7 % faster and peaked at 42.0 GiB against 50.0 (2026-11-29, docs/OPTIMIZATION.md).

The arithmetic is the unfused path's (fp8.py's row-wise recipe for x, h, dy, dgate and dup; the adapters in bf16
with fp32 sums), summed in another order and without rounding the adapters' outputs to bf16 before they are
added: a quantized value can differ by one float8 step where the unfused path's rounding lands on the other side.
`Fp8SwiGLU` is mixed into the MLP's class in place; while any projection has its adapter disabled or merged, or a
hook, the class's own forward (PEFT's path) runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gpucert.finetune.config import FUSED_MLP_MAX_RANK
from gpucert.finetune.model.fp8 import FAST_ACCUM_BACKWARD, FAST_ACCUM_FORWARD, Fp8FrozenLinear, quantize_rows
from gpucert.finetune.model.fused import (
    ADAPTER,
    FusedProjections,
    Fusion,
    activation_problem,
    fusable_problem,
    has_dropout,
    needs_pefts_path,
    reclass_mlp,
)
from gpucert.finetune.model.kernels import swiglu_fp8
from gpucert.finetune.model.layers import decoder_layers


def _frozen_fp8(m: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    base = m.base_layer
    return base.weight, base.weight_scale, base.weight_t, base.weight_t_scale


def _gemm(
    a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, dtype: torch.dtype, fast: bool
) -> torch.Tensor:
    """a @ b^T for row-major float8 a [M, K] and b [N, K] with their row scales (fp8.py's layouts)."""
    return torch._scaled_mm(a, b.t(), scale_a=a_scale, scale_b=b_scale, out_dtype=dtype, use_fast_accum=fast)


class _Fp8SwiGLU(torch.autograd.Function):
    """y = down(silu(gate(x)) * up(x)) with each projection a frozen FP8 GEMM plus its LoRA adapter (module
    docstring). `weights`: the three Fp8FrozenLinear's (weight, weight_scale, weight_t, weight_t_scale), gate's,
    up's, down's; `scales`: the adapters' s, gate's, up's, down's; `a`: gate's and up's A stacked."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        a: torch.Tensor,
        b_gate: torch.Tensor,
        b_up: torch.Tensor,
        a_down: torch.Tensor,
        b_down: torch.Tensor,
        scales: tuple[float, float, float],
        *weights: torch.Tensor,
    ) -> torch.Tensor:
        dtype = x.dtype
        s_gate, s_up, s_down = scales
        (wg, wg_s, _, _), (wu, wu_s, _, _), (wd, wd_s, _, _) = weights[0:4], weights[4:8], weights[8:12]
        x2 = x.reshape(-1, x.shape[-1])
        xq, x_scale = quantize_rows(x2)  # once for gate and up
        gate = _gemm(xq, x_scale, wg, wg_s, dtype, FAST_ACCUM_FORWARD)
        up = _gemm(xq, x_scale, wu, wu_s, dtype, FAST_ACCUM_FORWARD)
        xa = x2 @ a.to(dtype).t()
        bg, bu = (b_gate * s_gate).to(dtype), (b_up * s_up).to(dtype)
        hq, h_scale, ha = swiglu_fp8.fp8_swiglu_forward(gate, up, xa, bg, bu, a_down.to(dtype))
        ha = ha.to(dtype)
        y = _gemm(hq, h_scale, wd, wd_s, dtype, FAST_ACCUM_FORWARD) + (ha @ b_down.to(dtype).t()) * s_down
        ctx.save_for_backward(x2, xa, gate, up, ha, a, b_gate, b_up, a_down, b_down, *weights)
        ctx.scales, ctx.x_shape = scales, x.shape
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, xa, gate, up, ha, a, b_gate, b_up, a_down, b_down, *weights = ctx.saved_tensors
        (_, _, wg_t, wg_ts), (_, _, wu_t, wu_ts), (_, _, wd_t, wd_ts) = weights[0:4], weights[4:8], weights[8:12]
        s_gate, s_up, s_down = ctx.scales
        dtype = gate.dtype
        dy = grad_y.reshape(-1, grad_y.shape[-1]).to(dtype)
        dyq, dy_scale = quantize_rows(dy)
        dhb = _gemm(dyq, dy_scale, wd_t, wd_ts, dtype, FAST_ACCUM_BACKWARD)
        dha = (dy @ b_down.to(dtype)) * s_down
        db_down = (dy.t() @ ha) * s_down
        bg, bu = (b_gate * s_gate).to(dtype), (b_up * s_up).to(dtype)
        dgq, dg_scale, duq, du_scale, dxa, db_gate, db_up, da_down = swiglu_fp8.fp8_swiglu_backward(
            gate, up, dhb, xa, bg, bu, a_down.to(dtype), dha
        )
        dxa = dxa.to(dtype)
        da = dxa.t() @ x2
        dx = None
        if ctx.needs_input_grad[0]:
            dx = _gemm(dgq, dg_scale, wg_t, wg_ts, dtype, FAST_ACCUM_BACKWARD)
            dx = dx + _gemm(duq, du_scale, wu_t, wu_ts, dtype, FAST_ACCUM_BACKWARD) + dxa @ a.to(dtype)
            dx = dx.reshape(ctx.x_shape)
        return (
            dx,
            da.to(a.dtype),
            (db_gate * s_gate).to(b_gate.dtype),
            (db_up * s_up).to(b_up.dtype),
            da_down.to(a_down.dtype),
            db_down.to(b_down.dtype),
            None,
            *(None for _ in weights),
        )


class Fp8SwiGLU(nn.Module):
    """Mixed into an MLP's class in place (`fuse_fp8_mlp`): its forward runs `_Fp8SwiGLU`, or the class's own
    forward (PEFT's paths) while any projection has its adapter disabled or merged, or a hook. Like fused.py's
    SwiGLUInGemm, a model with it cannot be pickled whole; its adapters save as PEFT's."""

    gate_proj: Any
    up_proj: Any
    down_proj: Any

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = self.gate_proj, self.up_proj, self.down_proj
        if needs_pefts_path(gate, up, down):
            return super().forward(x)
        weights = _frozen_fp8(gate) + _frozen_fp8(up) + _frozen_fp8(down)
        scales = (float(gate.scaling[ADAPTER]), float(up.scaling[ADAPTER]), float(down.scaling[ADAPTER]))
        lora = [m.lora_B[ADAPTER].weight for m in (gate, up)] + [
            down.lora_A[ADAPTER].weight,
            down.lora_B[ADAPTER].weight,
        ]
        a = gate.gpucert_group.shared_a_weight()
        return _Fp8SwiGLU.apply(x, a, *lora, scales, *weights)


def fp8_mlp_problem(mlp: nn.Module) -> str | None:
    """Why an MLP cannot run as `Fp8SwiGLU`, or None: gate/up one fused group with one A (fused.py) of equal ranks
    (the kernels split xA in halves), down_proj a plain LoRA layer as fused.py's groups require one, all three over
    an Fp8FrozenLinear without bias, ranks up to FUSED_MLP_MAX_RANK, SiLU."""
    gate: Any = getattr(mlp, "gate_proj", None)
    up: Any = getattr(mlp, "up_proj", None)
    down: Any = getattr(mlp, "down_proj", None)
    group = getattr(gate, "gpucert_group", None)
    if not isinstance(group, FusedProjections) or group.stacked or not group.shared_a:
        return "gate/up not one group with one A (model.fuse_projections)"
    ranks = group.ranks
    if getattr(up, "gpucert_group", None) is not group or len(set(ranks)) != 1:
        return "gate/up of different groups or ranks"
    if any(not isinstance(getattr(m, "base_layer", None), Fp8FrozenLinear) for m in (gate, up, down)):
        return "a projection not converted to FP8"
    why = fusable_problem(down, base=Fp8FrozenLinear)
    if why is not None or has_dropout(down):
        return f"down_proj: {why or 'LoRA dropout'}"
    if any(m.base_layer.bias is not None for m in (gate, up, down)):
        return "a projection with a bias"
    rank = max(*ranks, down.r[ADAPTER])
    if rank > FUSED_MLP_MAX_RANK:
        return f"LoRA rank {rank}, over the {FUSED_MLP_MAX_RANK} the kernels are measured at"
    return activation_problem(mlp)


def fuse_fp8_mlp(mlp: nn.Module) -> None:
    """Re-class `mlp` in place as a subclass of its own class and Fp8SwiGLU (checked by fp8_mlp_problem first)."""
    reclass_mlp(mlp, Fp8SwiGLU, "Fp8")


def fuse_fp8_mlps(model: nn.Module, fusion: Fusion) -> None:
    """Run every decoder layer's MLP of `model` (fused by fuse_projections, then converted to FP8) as Fp8SwiGLU where
    fp8_mlp_problem allows, counted in `fusion.mlp`; each other one is named, with the reason, in `fusion.left`."""
    names = {id(m): name for name, m in model.named_modules()}
    for layer in decoder_layers(model):
        block = getattr(layer, "mlp", None)
        if block is None:
            continue
        why = fp8_mlp_problem(block)
        if why is None:
            fuse_fp8_mlp(block)
            fusion.mlp += 1
        else:
            fusion.left[names[id(block)]] = f"MLP: {why}"
