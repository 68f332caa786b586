"""The adapters inside the frozen GEMMs, as autograd functions: the forward and backward arithmetic of
`model.adapters_in_gemm` and `model.fuse_mlp`. fused.py says where they plug in (PEFT's LoRA layers re-classed
in place) and why; these take plain tensors only.

- `_AdapterInGemm`: a fused group's frozen matrix W kept as [W | s B], fed [x | xA]: one GEMM gives base + adapter.
- `_AInGemm`: a single projection (o_proj, down_proj) whose A rides as extra rows, x @ [W; A]^T.
- `_SwiGLUInGemm`: a whole SwiGLU MLP over the two, its backward one Triton kernel (kernels/swiglu.py).

Every output and gradient is PEFT's formula, summed in another order (fused.py's docstring has the figures).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from gpucert.finetune.model.kernels import swiglu


class _AdapterInGemm(torch.autograd.Function):
    """y = [x | xa] @ W_ext^T + bias, where W_ext = [W | blocks of s_i B_i] (module docstring). Backward: one
    GEMM for dx and d(xa) (W_ext's extra columns hold s_i B_i, so their share of dy @ W_ext is d(xa)), and
    dB_i = s_i dy_i^T xa_i for each member's rows of y; the frozen W gets no gradient."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        xa: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        blocks: tuple[tuple[int, int, int, int, float], ...],
        *bs: torch.Tensor,
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        xa2 = xa.reshape(-1, xa.shape[-1]).to(x.dtype)
        y = F.linear(torch.cat([x2, xa2], dim=1), weight, bias)
        ctx.save_for_backward(xa2, weight)
        ctx.blocks, ctx.x_shape, ctx.xa_dtype, ctx.b_dtypes = blocks, x.shape, xa.dtype, [b.dtype for b in bs]
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        xa2, weight = ctx.saved_tensors
        dy = grad_y.reshape(-1, grad_y.shape[-1]).to(weight.dtype)
        width = ctx.x_shape[-1]
        dx = None
        if ctx.needs_input_grad[0]:
            dx_ext = dy @ weight
            dx = dx_ext[:, :width].reshape(ctx.x_shape)
            dxa = dx_ext[:, width:].to(ctx.xa_dtype)
        else:  # the first layer's q/k/v: its input (the embeddings, frozen) needs no gradient, only d(xa) does
            dxa = (dy @ weight[:, width:]).to(ctx.xa_dtype)
        dbs = []
        for (row0, row1, col0, col1, scale), dtype in zip(ctx.blocks, ctx.b_dtypes, strict=True):
            dbs.append(((dy[:, row0:row1].t() @ xa2[:, col0:col1]) * scale).to(dtype))
        return (dx, dxa.reshape(*ctx.x_shape[:-1], -1), None, None, None, *dbs)


class _AInGemm(torch.autograd.Function):
    """One projection whose adapter's A rides in its frozen GEMM as extra rows: z = x @ [W; A]^T gives the base
    output and xA at once, y = z[:, :out] + bias + s (xA) B^T. Backward: d(xA) = s dy B, then one GEMM
    [dy | d(xA)] @ [W; A] gives dx with the adapter's share in it; dA = d(xA)^T x and dB = s dy^T (xA). Against
    PEFT's path it saves the read of x by x @ A^T and, in the backward, the write and read of d(xA) @ A: both
    tensors of x's size (8,192 x 18,944 for down_proj)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        a: torch.Tensor,
        b: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).to(weight.dtype)
        out = b.shape[0]
        z = x2 @ weight.t()
        xa = z[:, out:].contiguous()  # kept for dB: as a view it kept all of z (+3.1 GiB at 2 x 4096, lent H100)
        y = z[:, :out] if bias is None else z[:, :out] + bias
        y = y + (xa @ b.to(weight.dtype).t()) * scale
        ctx.save_for_backward(x2, xa, weight, b)
        ctx.x_shape, ctx.x_dtype, ctx.a_dtype, ctx.scale = x.shape, x.dtype, a.dtype, scale
        return y.reshape(*x.shape[:-1], out)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, xa, weight, b = ctx.saved_tensors
        dy = grad_y.reshape(-1, grad_y.shape[-1]).to(weight.dtype)
        dxa = (dy @ b.to(weight.dtype)) * ctx.scale
        db = ((dy.t() @ xa) * ctx.scale).to(b.dtype)
        da = (dxa.t() @ x2).to(ctx.a_dtype)
        dx = None
        if ctx.needs_input_grad[0]:
            dx = (torch.cat([dy, dxa], dim=1) @ weight).reshape(ctx.x_shape).to(ctx.x_dtype)
        return dx, None, None, da, db, None


class _SwiGLUInGemm(torch.autograd.Function):
    """down(silu(gate(x)) * up(x)) of an MLP whose gate/up carry their adapters in their frozen GEMMs
    (`_AdapterInGemm`, one shared A) and whose down_proj carries its A in its own (`_AInGemm`), as one function, so
    that its backward can run kernels/swiglu.py: the SwiGLU backward and the three rank-r weight gradients that read
    an intermediate-sized tensor (gate's and up's dB, down_proj's dA) from one pass over gate, up and dh. h is
    not kept: the kernel recomputes it from gate and up. Every output and gradient is the three Functions'
    formula (module docstring)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        a: torch.Tensor,
        w_gate: torch.Tensor,
        w_up: torch.Tensor,
        w_down: torch.Tensor,
        scales: tuple[float, float, float],
        b_gate: torch.Tensor,
        b_up: torch.Tensor,
        a_down: torch.Tensor,
        b_down: torch.Tensor,
    ) -> torch.Tensor:
        dtype = w_gate.dtype
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)
        xa = x2 @ a.to(dtype).t()
        x_ext = torch.cat([x2, xa], dim=1)
        gate = x_ext @ w_gate.t()
        up = x_ext @ w_up.t()
        out = b_down.shape[0]
        z = (F.silu(gate) * up) @ w_down.t()  # [y_base | h A_down^T]
        xd = z[:, out:].contiguous()
        y = z[:, :out] + (xd @ b_down.to(dtype).t()) * scales[2]
        ctx.save_for_backward(x2, xa, gate, up, xd, a, w_gate, w_up, w_down, b_down)
        ctx.scales, ctx.x_shape, ctx.x_dtype = scales, x.shape, x.dtype
        ctx.dtypes = (a.dtype, b_gate.dtype, b_up.dtype, a_down.dtype, b_down.dtype)
        return y.reshape(*x.shape[:-1], out)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, xa, gate, up, xd, a, w_gate, w_up, w_down, b_down = ctx.saved_tensors
        s_gate, s_up, s_down = ctx.scales
        dtype = w_gate.dtype
        dy = grad_y.reshape(-1, grad_y.shape[-1]).to(dtype)
        dxd = (dy @ b_down.to(dtype)) * s_down
        db_down = (dy.t() @ xd) * s_down
        dh = torch.cat([dy, dxd], dim=1) @ w_down
        dgate, dup, db_gate, db_up, da_down = swiglu.swiglu_lora_backward(gate, up, dh, xa, dxd, s_gate, s_up)
        # [dx | d(xa)] of gate and of up (the extra columns hold s B), summed slice by slice in pointwise kernels as
        # the unfused path sums them: summed whole, inductor makes the second GEMM an addmm (beta 1), which ran
        # 0.2 ms slower at Qwen2-7B's shape, 4 % (tools/bench_swiglu.py, lent H100).
        from_gate, from_up = dgate @ w_gate, dup @ w_up
        width = x2.shape[1]
        dxa = from_gate[:, width:] + from_up[:, width:]
        da = dxa.t() @ x2
        dx = None
        if ctx.needs_input_grad[0]:
            dx = from_gate[:, :width] + from_up[:, :width] + dxa @ a.to(dtype)
            dx = dx.reshape(ctx.x_shape).to(ctx.x_dtype)
        grads = (da, db_gate, db_up, da_down, db_down)
        da, db_gate, db_up, da_down, db_down = (g.to(t) for g, t in zip(grads, ctx.dtypes, strict=True))
        return dx, da, None, None, None, None, db_gate, db_up, da_down, db_down
