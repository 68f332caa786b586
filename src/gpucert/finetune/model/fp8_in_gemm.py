"""The adapters inside the frozen FP8 GEMMs: `model.adapters_in_gemm` with `model.precision: fp8`.

in_gemm.py's layouts, with fp8.py's row-wise recipe. The adapters' parts of the extended matrices are quantized
again at every refresh (after each optimizer step), the frozen parts once, at load:

- A fused group's matrix [W | s B] (`Fp8Columns`). Forward y = [x | xA] @ [W | sB]^T: row-wise `_scaled_mm` gives
  each output row n one weight scale, so sB's row n takes W's row-n scale (fixed at load) and [x | xA] one scale
  per token. e4m3 keeps 3 mantissa bits down to 2^-9 of a row's top binade: sB, 100-1,000 times smaller than W,
  is quantized as finely as W is; what lies under that (B near its zero init) flushes toward zero, where its
  share of the output is as small. A value of sB past 448 times its row's scale (an adapter grown past its frozen
  row's largest weight) saturates there. Backward [dx | d(xA)] = dy @ [W | sB]: the backward layout's scale is
  per input column, so sB's columns get their own at each refresh.
- A single projection's [W; A] (`Fp8Rows`, o_proj and down_proj). Forward z = x @ [W; A]^T: A's rows get their
  own scales at each refresh. Backward dx = [dy | d(xA)] @ [W; A], its scale per input column k shared by W's and
  A's column k: A's column saturates past 448 times W's column-k scale (A larger than the frozen column's largest
  weight; kaiming's init puts A at 1/sqrt(k) of it, under W's columns of any trained or initialised model).

Each extension is padded with zero columns (rows) to a multiple of 16, as `_scaled_mm` needs. dB and dA stay bf16
GEMMs, as in bf16. The frozen base layer of each carrier becomes an `Fp8FrozenLinear` over the frozen part of the
two layouts (views, no copy), for PEFT's own paths (adapters disabled, mixed batches).
"""

from __future__ import annotations

from typing import Any

import torch

from gpucert.finetune.model.fp8 import (
    ALIGNMENT,
    FAST_ACCUM_BACKWARD,
    FAST_ACCUM_FORWARD,
    FP8,
    FP8_MAX,
    Fp8FrozenLinear,
    power_of_two_scale,
    quantize_rows,
)


def _padded(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _saturating(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """t / scale in e4m3, saturating at +-448 (a float8 cast alone gives NaN past it)."""
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


class Fp8Columns:
    """[W | s B] of a fused group (module docstring), in both layouts `_scaled_mm` takes:
    `weight` [N, K + R'] row-major with `weight_scale` [1, N] (W's rows); `weight_t` [K + R', N] row-major with
    `weight_t_scale` [1, K + R'] (W's columns, then sB's, refreshed). R' is R padded to a multiple of 16."""

    def __init__(self, w: torch.Tensor, extra: int) -> None:
        n, k = w.shape
        self.width, self.extra = k, extra
        total = k + _padded(extra)
        w8, row_scale = quantize_rows(w)
        wt8, col_scale = quantize_rows(w.t())
        self.weight = torch.zeros(n, total, dtype=FP8, device=w.device)
        self.weight[:, :k] = w8
        self.weight_scale = row_scale.t().contiguous()
        self.weight_t = torch.zeros(total, n, dtype=FP8, device=w.device)
        self.weight_t[:k] = wt8
        self.weight_t_scale = torch.ones(1, total, dtype=torch.float32, device=w.device)
        self.weight_t_scale[:, :k] = col_scale.t()

    def frozen_linear(self, bias: torch.Tensor | None, out_dtype: torch.dtype) -> Fp8FrozenLinear:
        k = self.width
        return Fp8FrozenLinear(
            self.weight[:, :k], self.weight_scale, self.weight_t[:k], self.weight_t_scale[:, :k], bias, out_dtype
        )

    def refresh(self, sb: torch.Tensor) -> None:
        """Quantize the adapters' columns sB [N, R] (fp32 or bf16) into both layouts."""
        k, r = self.width, self.extra
        with torch.no_grad():
            self.weight[:, k : k + r] = _saturating(sb, self.weight_scale.t())
            col_scale = power_of_two_scale(sb.abs().amax(dim=0, keepdim=True))  # [1, R]
            self.weight_t_scale[:, k : k + r] = col_scale
            self.weight_t[k : k + r] = _saturating(sb.t(), col_scale.t())


class Fp8Rows:
    """[W; A] of a single projection (module docstring): `weight` [N + r', K] row-major with `weight_scale`
    [1, N + r'] (W's rows, then A's, refreshed); `weight_t` [K, N + r'] row-major with `weight_t_scale` [1, K]
    (W's columns, which A's columns share). r' is r padded to a multiple of 16."""

    def __init__(self, w: torch.Tensor, rank: int) -> None:
        n, k = w.shape
        self.rows, self.rank = n, rank
        total = n + _padded(rank)
        w8, row_scale = quantize_rows(w)
        wt8, col_scale = quantize_rows(w.t())
        self.weight = torch.zeros(total, k, dtype=FP8, device=w.device)
        self.weight[:n] = w8
        self.weight_scale = torch.ones(1, total, dtype=torch.float32, device=w.device)
        self.weight_scale[:, :n] = row_scale.t()
        self.weight_t = torch.zeros(k, total, dtype=FP8, device=w.device)
        self.weight_t[:, :n] = wt8
        self.weight_t_scale = col_scale.t().contiguous()

    def frozen_linear(self, bias: torch.Tensor | None, out_dtype: torch.dtype) -> Fp8FrozenLinear:
        n = self.rows
        return Fp8FrozenLinear(
            self.weight[:n], self.weight_scale[:, :n], self.weight_t[:, :n], self.weight_t_scale, bias, out_dtype
        )

    def refresh(self, a: torch.Tensor) -> None:
        """Quantize the adapter's A [r, K] into both layouts."""
        n, r = self.rows, self.rank
        with torch.no_grad():
            a8, row_scale = quantize_rows(a)
            self.weight[n : n + r] = a8
            self.weight_scale[:, n : n + r] = row_scale.t()
            self.weight_t[:, n : n + r] = _saturating(a.t(), self.weight_t_scale.t())


def _scaled_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, **kw: Any) -> Any:
    return torch._scaled_mm(a, b, scale_a=a_scale, scale_b=b_scale, **kw)


class _Fp8AdapterInGemm(torch.autograd.Function):
    """in_gemm._AdapterInGemm in FP8: y = q([x | xa | 0]) @ q([W | sB | 0])^T + bias; backward [dx | d(xa)] =
    q(dy) @ q([W | sB | 0]) in one FP8 GEMM, dB_i = s_i dy_i^T xa_i in bf16."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        xa: torch.Tensor,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_t: torch.Tensor,
        weight_t_scale: torch.Tensor,
        bias: torch.Tensor | None,
        blocks: tuple[tuple[int, int, int, int, float], ...],
        *bs: torch.Tensor,
    ) -> torch.Tensor:
        width = x.shape[-1]
        x2 = x.reshape(-1, width)
        xa2 = xa.reshape(-1, xa.shape[-1]).to(x.dtype)
        pad = weight.shape[1] - width - xa2.shape[1]
        parts = [x2, xa2] + ([xa2.new_zeros(xa2.shape[0], pad)] if pad else [])
        xq, x_scale = quantize_rows(torch.cat(parts, dim=1))
        y = _scaled_mm(
            xq, x_scale, weight.t(), weight_scale, bias=bias, out_dtype=x.dtype, use_fast_accum=FAST_ACCUM_FORWARD
        )
        ctx.save_for_backward(xa2, weight_t, weight_t_scale)
        ctx.blocks, ctx.x_shape, ctx.xa_dtype, ctx.b_dtypes = blocks, x.shape, xa.dtype, [b.dtype for b in bs]
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        xa2, weight_t, weight_t_scale = ctx.saved_tensors
        width, rank = ctx.x_shape[-1], xa2.shape[1]
        dy = grad_y.reshape(-1, grad_y.shape[-1]).to(xa2.dtype)
        dyq, dy_scale = quantize_rows(dy)
        dx = None
        if ctx.needs_input_grad[0]:
            dx_ext = _scaled_mm(
                dyq, dy_scale, weight_t.t(), weight_t_scale, out_dtype=dy.dtype, use_fast_accum=FAST_ACCUM_BACKWARD
            )
            dx = dx_ext[:, :width].reshape(ctx.x_shape)
            dxa = dx_ext[:, width : width + rank]
        else:  # the first layer's q/k/v: only d(xa), from the extension's rows of the backward layout
            extension = weight_t[width:]
            dxa = _scaled_mm(
                dyq,
                dy_scale,
                extension.t(),
                weight_t_scale[:, width:],
                out_dtype=dy.dtype,
                use_fast_accum=FAST_ACCUM_BACKWARD,
            )[:, :rank]
        dbs = []
        for (row0, row1, col0, col1, scale), dtype in zip(ctx.blocks, ctx.b_dtypes, strict=True):
            dbs.append(((dy[:, row0:row1].t() @ xa2[:, col0:col1]) * scale).to(dtype))
        return (dx, dxa.to(ctx.xa_dtype).reshape(*ctx.x_shape[:-1], -1), None, None, None, None, None, None, *dbs)


class _Fp8AInGemm(torch.autograd.Function):
    """in_gemm._AInGemm in FP8: z = q(x) @ q([W; A; 0])^T gives the base output and xA, y = z_W + bias +
    s (xA) B^T; backward d(xA) = s dy B, dx = q([dy | d(xA) | 0]) @ q([W; A; 0]) in one FP8 GEMM, dA = d(xA)^T x
    and dB = s dy^T (xA) in bf16."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_t: torch.Tensor,
        weight_t_scale: torch.Tensor,
        bias: torch.Tensor | None,
        a: torch.Tensor,
        b: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out, rank = b.shape
        xq, x_scale = quantize_rows(x2)
        z = _scaled_mm(xq, x_scale, weight.t(), weight_scale, out_dtype=x.dtype, use_fast_accum=FAST_ACCUM_FORWARD)
        xa = z[:, out : out + rank].contiguous()  # kept for dB; a view would keep all of z
        y = z[:, :out] if bias is None else z[:, :out] + bias
        y = y + (xa @ b.to(x.dtype).t()) * scale
        ctx.save_for_backward(x2, xa, weight_t, weight_t_scale, b)
        ctx.x_shape, ctx.a_dtype, ctx.scale = x.shape, a.dtype, scale
        return y.reshape(*x.shape[:-1], out)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, xa, weight_t, weight_t_scale, b = ctx.saved_tensors
        dy = grad_y.reshape(-1, grad_y.shape[-1]).to(x2.dtype)
        dxa = (dy @ b.to(dy.dtype)) * ctx.scale
        db = ((dy.t() @ xa) * ctx.scale).to(b.dtype)
        da = (dxa.t() @ x2).to(ctx.a_dtype)
        dx = None
        if ctx.needs_input_grad[0]:
            pad = weight_t.shape[1] - dy.shape[1] - dxa.shape[1]
            parts = [dy, dxa] + ([dxa.new_zeros(dxa.shape[0], pad)] if pad else [])
            dq, d_scale = quantize_rows(torch.cat(parts, dim=1))
            dx = _scaled_mm(
                dq, d_scale, weight_t.t(), weight_t_scale, out_dtype=dy.dtype, use_fast_accum=FAST_ACCUM_BACKWARD
            )
            dx = dx.reshape(ctx.x_shape)
        return dx, None, None, None, None, None, da, db, None


def group_output(x: torch.Tensor, xa: torch.Tensor, carrier: Fp8Columns, bias: Any, blocks: Any, bs: Any) -> Any:
    """One fused group's frozen matrix with its adapters, in FP8 (`_Fp8AdapterInGemm`)."""
    return _Fp8AdapterInGemm.apply(
        x, xa, carrier.weight, carrier.weight_scale, carrier.weight_t, carrier.weight_t_scale, bias, blocks, *bs
    )


def single_output(x: torch.Tensor, carrier: Fp8Rows, bias: Any, a: Any, b: Any, scale: float) -> Any:
    """One projection with its A in its frozen FP8 GEMM (`_Fp8AInGemm`)."""
    return _Fp8AInGemm.apply(
        x, carrier.weight, carrier.weight_scale, carrier.weight_t, carrier.weight_t_scale, bias, a, b, scale
    )

