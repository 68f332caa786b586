"""The SwiGLU of an FP8 LoRA MLP with its adapters' rank-r products, as Triton kernels (CUDA only).

In FP8 (`model.precision: fp8`) the adapters run beside the frozen GEMMs (their products inside them were 4 %
slower, docs/OPTIMIZATION.md), so a Qwen2-7B MLP wrote, per layer and micro-batch of 8,192 tokens: gate's and
up's frozen outputs, each adapter's up-projection s (xA) B^T of the same size (8,192 x 18,944), their sums, h =
silu(gate) * up in bf16, h again in FP8 for down_proj, and read h once more for down_proj's x A^T; the backward
likewise wrote and read the adapters' share of dh, dgate and dup in bf16 and FP8, and read dgate and dup again
for the four rank-r products. A profile of the H200's FP8 step put the SwiGLU forward at 21.8 ms a step against
11.1 where the adapters rode inside the GEMMs (reading their outputs was the difference). Here the rank-r
products are small `tl.dot`s on tiles already in registers, so none of those intermediate-sized adapter tensors
exists:

- `forward`: from gate, up (the frozen GEMMs' bf16 outputs), xA [M, 2r], s B_gate, s B_up and A_down: h's FP8
  rows and their power-of-two scales (fp8.py's recipe) and h A_down^T [M, r]. A first kernel over row blocks x
  column chunks writes h in the activations' dtype with each chunk's amax and share of h A_down^T per row; a
  second, plain one quantizes h with its row's scale. Its bytes are those of recomputing h in a second launch of
  the first kernel (gate and up read again instead of h written and read), but the first kernel's dots, layout
  changes and sigmoid are not paid twice: at Qwen2-7B's micro-batch 2 on one H200, 0.52 ms against 0.65 for the
  same tiles recomputed, and 0.83 for the 32 x 128 tiles shipped first. (Programs owning whole rows, one launch
  reading gate and up twice, took 0.91 ms: too few programs in flight.)
- `backward`: from gate, up, the frozen dh and d(h A_down^T): dgate and dup in FP8 with their row scales, d(xA)
  [M, 2r], and the three rank-r weight gradients gate's and up's dB and down_proj's dA. A first kernel owns
  columns (like kernels/swiglu.py, whose sums over rows it shares), writes dgate and dup in bf16 with each
  row's amax over its columns; a second owns rows, quantizes them and sums d(xA) = dgate (s B_gate).

On one H200 (2026-11-29, docs/OPTIMIZATION.md) the 7B FP8 step ran 3.0-3.7 % faster with 8 GiB less memory at
micro-batch 2 with the first tilings; the forward moved its bytes at 1.7 TB/s, the backward's two kernels at 2.1
TB/s, where a plain torch.add moves 4.3. The tiles of 64 x 64 put a warp on 16 whole rows, so the rank-r dots
(h A_down^T above all) stay inside a warp: 168 registers a thread in the forward, not 254; the forward now moves
2.7 TB/s (docs/results/2026-11-29-h200-fp8-mlp-forward.md).

Without Triton or off CUDA, `reference_forward` and `reference_backward` compute the same in torch (the CPU runs
of tests and of FP8 on torch's CPU kernels). `TRITON_INTERPRET=1` runs the kernels on CPU tensors, for tests;
there the FP8 casts are torch's (Triton 3.9's interpreter rounds some values to the wrong binade).
"""

from __future__ import annotations

from typing import Any

import torch

from gpucert.finetune.model.fp8 import FP8, FP8_MAX, power_of_two_scale, quantize_rows

# The same conditions and rank side as the bf16 fused MLP's kernel (INTERPRETED and fits re-exported for tests).
from gpucert.finetune.model.kernels.swiglu import INTERPRETED as INTERPRETED
from gpucert.finetune.model.kernels.swiglu import fits, rank_block, reference_grads

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU build of torch: the references run
    triton = None

# Each kernel's tiling, with Triton's warps and pipeline stages last: the forward's (rows a program, columns a tile,
# columns a program), its quantizer's (rows, columns a program; warps), the backward's column-owning kernel's (rows
# a program, rows a tile, columns a program), its row-owning kernel's (rows a program, columns a tile). Picked by
# tools/bench_swiglu_fp8.py on one H200 (2026-11-29): 0.52 ms for the forward at Qwen2-7B's micro-batch 2 (the
# quantizer's tilings 16-64 x 256-512 within 0.01 ms), 1.14 for the backward.
FWD_TILING = (64, 64, 1024, 4, 3)
HQ_TILING = (32, 256, 4)
BWD_TILING = (1024, 64, 64, 4, 3)
QUANT_TILING = (64, 128, 8, 4)

if triton is not None:
    from gpucert.finetune.model.kernels.swiglu import swiglu_grads

    @triton.jit
    def _dot(a, b, WIDE_DOT: tl.constexpr):
        # Triton's interpreter (3.6 on) multiplies bf16 as raw integers: products in fp32 there.
        if WIDE_DOT:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _b_tiles(bg_ptr, bu_ptr, cols, col_ok, ranks, R: tl.constexpr):
        """(s B_gate)^T and (s B_up)^T over these columns, [RB, BLOCK_N], zero past r and past N."""
        keep = (ranks < R)[:, None] & col_ok[None, :]
        offs = cols[None, :] * R + ranks[:, None]
        return tl.load(bg_ptr + offs, mask=keep, other=0.0), tl.load(bu_ptr + offs, mask=keep, other=0.0)

    @triton.jit
    def _gated(gate_ptr, up_ptr, offs, mask, xg, xu, bgt, but, WIDE_DOT: tl.constexpr):
        """(gate + xA_g (s B_g)^T, up + xA_u (s B_u)^T) of one tile, in fp32."""
        g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        return g + _dot(xg, bgt, WIDE_DOT), u + _dot(xu, but, WIDE_DOT)

    @triton.jit
    def _fp8_swiglu_forward(
        gate_ptr,
        up_ptr,
        xa_ptr,  # [M, 2r]: gate's xA in columns [0, r), up's in [r, 2r)
        bg_ptr,  # [N, r]: s_gate B_gate
        bu_ptr,  # [N, r]: s_up B_up
        ad_ptr,  # [rd, N]: A_down
        h_ptr,  # [M, N] out: h, in the activations' dtype
        amax_ptr,  # [chunks, M] fp32 out: each row's amax of h over the chunk's columns
        ha_ptr,  # [chunks, M, RB] fp32 out: h A_down^T over the chunk's columns
        M,
        N,
        R: tl.constexpr,
        RD: tl.constexpr,
        stride_xa,
        COLS: tl.constexpr,  # columns a program: its chunk
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        RB: tl.constexpr,  # max(r, rd) rounded up to a power of two >= 16: tl.dot's smallest side
        WIDE_DOT: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        chunk = tl.program_id(1)
        row_ok = rows < M
        ranks = tl.arange(0, RB)
        xa_rows = xa_ptr + rows.to(tl.int64)[:, None] * stride_xa + ranks[None, :]
        x_keep = row_ok[:, None] & (ranks < R)[None, :]
        xg = tl.load(xa_rows, mask=x_keep, other=0.0)
        xu = tl.load(xa_rows + R, mask=x_keep, other=0.0)
        amax = tl.zeros([BLOCK_M], tl.float32)
        ha = tl.zeros([BLOCK_M, RB], tl.float32)
        for n0 in range(chunk * COLS, chunk * COLS + COLS, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            col_ok = cols < N
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            mask = row_ok[:, None] & col_ok[None, :]
            bgt, but = _b_tiles(bg_ptr, bu_ptr, cols, col_ok, ranks, R)
            g, u = _gated(gate_ptr, up_ptr, offs, mask, xg, xu, bgt, but, WIDE_DOT)
            h = (g * tl.sigmoid(g) * u).to(h_ptr.dtype.element_ty)  # h in the activations' dtype, as unfused
            tl.store(h_ptr + offs, h, mask=mask)
            amax = tl.maximum(amax, tl.max(tl.abs(h.to(tl.float32)), axis=1))
            adt = tl.load(
                ad_ptr + ranks[None, :] * N + cols[:, None],
                mask=col_ok[:, None] & (ranks < RD)[None, :],
                other=0.0,
            )
            ha += _dot(h, adt, WIDE_DOT)
        tl.store(amax_ptr + chunk * M + rows, amax, mask=row_ok)
        out = ha_ptr + (chunk * M + rows.to(tl.int64))[:, None] * RB + ranks[None, :]
        tl.store(out, ha, mask=row_ok[:, None])

    @triton.jit
    def _fp8_quantize_rows(
        h_ptr,
        hs_ptr,  # [M] the row scales
        hq_ptr,  # [M, N] out: h / its row's scale, float8 (fp32 where interpreted)
        M,
        N,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < M
        mask = row_ok[:, None] & (cols < N)[None, :]
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
        scale = tl.load(hs_ptr + rows, mask=row_ok, other=1.0)
        h = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        q = tl.clamp(h / scale[:, None], -FP8_MAX_C, FP8_MAX_C)
        tl.store(hq_ptr + offs, q.to(hq_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _fp8_swiglu_backward(
        gate_ptr,
        up_ptr,
        dhb_ptr,  # [M, N]: the frozen down_proj's share of dh
        xa_ptr,
        bg_ptr,
        bu_ptr,
        ad_ptr,
        dha_ptr,  # [M, rd]: d(h A_down^T), already scaled by s_down
        dg_ptr,  # [M, N] out: dgate, in the activations' dtype
        du_ptr,  # [M, N] out: dup
        amax_ptr,  # [2, column blocks, M] fp32 out: each row's amax of dgate (dup) over the block's columns
        part_b_ptr,  # [2, splits, N, RB] fp32 out: dgate^T xA_g, dup^T xA_u, over each split's rows
        part_a_ptr,  # [splits, RB, N] fp32 out: d(hA)^T h, likewise
        M,
        N,
        R: tl.constexpr,
        RD: tl.constexpr,
        stride_xa,
        stride_dha,
        ROWS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        RB: tl.constexpr,
        WIDE_DOT: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        split = tl.program_id(1)
        blocks = tl.num_programs(0)
        splits = tl.num_programs(1)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        ranks = tl.arange(0, RB)
        bgt, but = _b_tiles(bg_ptr, bu_ptr, cols, col_ok, ranks, R)
        ad = tl.load(
            ad_ptr + ranks[:, None] * N + cols[None, :], mask=(ranks < RD)[:, None] & col_ok[None, :], other=0.0
        )
        acc_g = tl.zeros([RB, BLOCK_N], tl.float32)
        acc_u = tl.zeros([RB, BLOCK_N], tl.float32)
        acc_d = tl.zeros([RB, BLOCK_N], tl.float32)
        for step in range(0, ROWS, BLOCK_M):
            rows = split * ROWS + step + tl.arange(0, BLOCK_M)
            row_ok = rows < M
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            mask = row_ok[:, None] & col_ok[None, :]
            xa_rows = xa_ptr + rows.to(tl.int64)[:, None] * stride_xa + ranks[None, :]
            x_keep = row_ok[:, None] & (ranks < R)[None, :]
            xg = tl.load(xa_rows, mask=x_keep, other=0.0)
            xu = tl.load(xa_rows + R, mask=x_keep, other=0.0)
            dha = tl.load(
                dha_ptr + rows.to(tl.int64)[:, None] * stride_dha + ranks[None, :],
                mask=row_ok[:, None] & (ranks < RD)[None, :],
                other=0.0,
            )
            g, u = _gated(gate_ptr, up_ptr, offs, mask, xg, xu, bgt, but, WIDE_DOT)
            d = tl.load(dhb_ptr + offs, mask=mask, other=0.0).to(tl.float32) + _dot(dha, ad, WIDE_DOT)
            dg, du, h = swiglu_grads(g, u, d, dg_ptr)
            tl.store(dg_ptr + offs, dg, mask=mask)
            tl.store(du_ptr + offs, du, mask=mask)
            tl.store(amax_ptr + pid_n * M + rows, tl.max(tl.abs(dg.to(tl.float32)), axis=1), mask=row_ok)
            tl.store(amax_ptr + (blocks + pid_n) * M + rows, tl.max(tl.abs(du.to(tl.float32)), axis=1), mask=row_ok)
            acc_g += _dot(tl.trans(xg), dg, WIDE_DOT)
            acc_u += _dot(tl.trans(xu), du, WIDE_DOT)
            acc_d += _dot(tl.trans(dha), h, WIDE_DOT)
        # In each gradient's own layout, dB [columns, ranks] and dA [ranks, columns] (kernels/swiglu.py says why).
        b_out = cols[:, None] * RB + ranks[None, :]
        b_mask = col_ok[:, None] & (ranks[None, :] < RB)
        b_base = part_b_ptr + split * RB * N
        tl.store(b_base + b_out, tl.trans(acc_g), mask=b_mask)
        tl.store(b_base + splits * RB * N + b_out, tl.trans(acc_u), mask=b_mask)
        a_out = ranks[:, None] * N + cols[None, :]
        tl.store(part_a_ptr + split * RB * N + a_out, acc_d, mask=(ranks[:, None] < RB) & col_ok[None, :])

    @triton.jit
    def _fp8_quantize_pair(
        dg_ptr,
        du_ptr,
        sg_ptr,  # [M] the row scales of dgate
        su_ptr,
        bg_ptr,
        bu_ptr,
        dgq_ptr,  # [M, N] out: dgate / its row scale, float8 (fp32 where interpreted)
        duq_ptr,
        dxa_ptr,  # [M, 2 RB] fp32 out: dgate (s B_g), then dup (s B_u)
        M,
        N,
        R: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        RB: tl.constexpr,
        WIDE_DOT: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        ranks = tl.arange(0, RB)
        sg = tl.load(sg_ptr + rows, mask=row_ok, other=1.0)
        su = tl.load(su_ptr + rows, mask=row_ok, other=1.0)
        acc_g = tl.zeros([BLOCK_M, RB], tl.float32)
        acc_u = tl.zeros([BLOCK_M, RB], tl.float32)
        for n0 in range(0, N, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            col_ok = cols < N
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            mask = row_ok[:, None] & col_ok[None, :]
            dg = tl.load(dg_ptr + offs, mask=mask, other=0.0)
            du = tl.load(du_ptr + offs, mask=mask, other=0.0)
            qg = tl.clamp(dg.to(tl.float32) / sg[:, None], -FP8_MAX_C, FP8_MAX_C)
            qu = tl.clamp(du.to(tl.float32) / su[:, None], -FP8_MAX_C, FP8_MAX_C)
            tl.store(dgq_ptr + offs, qg.to(dgq_ptr.dtype.element_ty), mask=mask)
            tl.store(duq_ptr + offs, qu.to(duq_ptr.dtype.element_ty), mask=mask)
            b_keep = col_ok[:, None] & (ranks < R)[None, :]
            bg = tl.load(bg_ptr + cols[:, None] * R + ranks[None, :], mask=b_keep, other=0.0)
            bu = tl.load(bu_ptr + cols[:, None] * R + ranks[None, :], mask=b_keep, other=0.0)
            acc_g += _dot(dg, bg, WIDE_DOT)
            acc_u += _dot(du, bu, WIDE_DOT)
        out = dxa_ptr + rows.to(tl.int64)[:, None] * (2 * RB) + ranks[None, :]
        tl.store(out, acc_g, mask=row_ok[:, None])
        tl.store(out + RB, acc_u, mask=row_ok[:, None])

    # Module-level constants reach a jitted function only as tl.constexpr globals.
    FP8_MAX_C = tl.constexpr(FP8_MAX)


def _fp8_out(like: torch.Tensor) -> torch.Tensor:
    # The interpreter's float8 casts are wrong for some values: it writes fp32, cast by torch afterwards.
    return torch.empty(like.shape, dtype=FP8 if like.is_cuda else torch.float32, device=like.device)


def _as_fp8(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == FP8 else t.to(FP8)


def forward(
    gate: torch.Tensor,
    up: torch.Tensor,
    xa: torch.Tensor,
    bg: torch.Tensor,
    bu: torch.Tensor,
    ad: torch.Tensor,
    tiling: tuple[int, int, int, int, int] | None = None,
    quant_tiling: tuple[int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hq, h_scale, ha) of h = silu(gate + xa_g bg^T) * (up + xa_u bu^T), rounded to gate's dtype: hq = h / its
    row's power-of-two scale in float8_e4m3fn [M, N], h_scale [M, 1] fp32, ha = h ad^T [M, rd] fp32. xa [M, 2r]
    (gate's, then up's), bg and bu [N, r] already scaled by the adapters' s, ad [rd, N]. The kernels where `fits`,
    else `reference_forward`; tiling and quant_tiling as FWD_TILING's and HQ_TILING's, which are used unless given
    (tools/bench_swiglu_fp8.py)."""
    block_m, block_n, cols, warps, stages = tiling or FWD_TILING
    if cols % block_n:
        # A chunk's last tile would run into the next chunk's columns, counted twice in h A_down^T.
        raise ValueError(f"swiglu_fp8: columns a program {cols} must be a multiple of block_n {block_n}")
    if not fits(gate):
        return reference_forward(gate, up, xa, bg, bu, ad)
    assert triton is not None
    m, n = gate.shape
    r, rd = xa.shape[1] // 2, ad.shape[0]
    rb = rank_block(r, rd)
    gate, up = gate.contiguous(), up.contiguous()
    # h is rounded to its buffer's dtype (gate's), as the reference rounds; the dots' operands in gate's dtype too.
    xa, bg, bu, ad = (t.to(gate.dtype).contiguous() for t in (xa, bg, bu, ad))
    h = torch.empty_like(gate)  # for the quantizer only: 310 MB at micro-batch 2, gone when the forward returns
    chunks = triton.cdiv(n, cols)
    amax = torch.empty(chunks, m, dtype=torch.float32, device=gate.device)
    ha_parts = torch.empty(chunks, m, rb, dtype=torch.float32, device=gate.device)
    _fp8_swiglu_forward[(triton.cdiv(m, block_m), chunks)](
        gate, up, xa, bg, bu, ad, h, amax, ha_parts, m, n, r, rd, xa.stride(0), COLS=cols, BLOCK_M=block_m,
        BLOCK_N=block_n, RB=rb, WIDE_DOT=not gate.is_cuda, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    hs = power_of_two_scale(amax.amax(0))
    hq = _fp8_out(gate)
    q_block_m, q_block_n, q_warps = quant_tiling or HQ_TILING
    _fp8_quantize_rows[(triton.cdiv(m, q_block_m), triton.cdiv(n, q_block_n))](
        h, hs, hq, m, n, BLOCK_M=q_block_m, BLOCK_N=q_block_n, num_warps=q_warps
    )
    ha = ha_parts.sum(0)  # over the chunks, in one fixed order
    return _as_fp8(hq), hs[:, None], ha[:, :rd].contiguous()


def backward(
    gate: torch.Tensor,
    up: torch.Tensor,
    dhb: torch.Tensor,
    xa: torch.Tensor,
    bg: torch.Tensor,
    bu: torch.Tensor,
    ad: torch.Tensor,
    dha: torch.Tensor,
    tiling: tuple[int, int, int, int, int] | None = None,
    quant_tiling: tuple[int, int, int, int] | None = None,
) -> tuple[torch.Tensor, ...]:
    """(dgq, dg_scale, duq, du_scale, dxa, db_gate, db_up, da_down) of `forward`'s h, given the frozen down_proj's
    dhb = dL/dh [M, N] and dha = d(h A_down^T) [M, rd] (scaled by s_down): dh = dhb + dha ad. dgate and dup as
    float8 rows with their scales [M, 1]; dxa = [dgate bg | dup bu] [M, 2r] fp32 (bg, bu hold s B); db_gate =
    dgate^T xa_g and db_up [N, r], unscaled, and da_down = dha^T h [rd, N], all fp32. The kernels where `fits`,
    else `reference_backward`; tiling and quant_tiling as BWD_TILING's and QUANT_TILING's, which are used unless
    given (BWD_TILING's rows a program a multiple of its rows a tile)."""
    rows, block_m, block_n, warps, stages = tiling or BWD_TILING
    if rows % block_m:
        # Each program's rows would run into the next split's, counted twice in dB and dA.
        raise ValueError(f"swiglu_fp8: rows {rows} must be a multiple of block_m {block_m}")
    if not fits(gate):
        return reference_backward(gate, up, dhb, xa, bg, bu, ad, dha)
    assert triton is not None
    m, n = gate.shape
    r, rd = xa.shape[1] // 2, ad.shape[0]
    rb = rank_block(r, rd)
    gate, up, dhb, xa, dha = (t.contiguous() for t in (gate, up, dhb, xa, dha))
    bg, bu, ad = bg.to(gate.dtype).contiguous(), bu.to(gate.dtype).contiguous(), ad.to(gate.dtype).contiguous()
    dg, du = torch.empty_like(gate), torch.empty_like(gate)
    blocks, splits = triton.cdiv(n, block_n), triton.cdiv(m, rows)
    amax = torch.empty(2, blocks, m, dtype=torch.float32, device=gate.device)
    parts_b = torch.empty(2, splits, n, rb, dtype=torch.float32, device=gate.device)
    parts_a = torch.empty(splits, rb, n, dtype=torch.float32, device=gate.device)
    _fp8_swiglu_backward[(blocks, splits)](
        gate, up, dhb, xa, bg, bu, ad, dha, dg, du, amax, parts_b, parts_a, m, n, r, rd, xa.stride(0),
        dha.stride(0), ROWS=rows, BLOCK_M=block_m, BLOCK_N=block_n, RB=rb, WIDE_DOT=not gate.is_cuda,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    # Each its own tensor: an operator's outputs may not alias one another (torch.library).
    sg, su = power_of_two_scale(amax[0].amax(0)), power_of_two_scale(amax[1].amax(0))
    dgq, duq = _fp8_out(gate), _fp8_out(gate)
    dxa = torch.empty(m, 2 * rb, dtype=torch.float32, device=gate.device)
    q_block_m, q_block_n, q_warps, q_stages = quant_tiling or QUANT_TILING
    _fp8_quantize_pair[(triton.cdiv(m, q_block_m),)](
        dg, du, sg, su, bg, bu, dgq, duq, dxa, m, n, r,
        BLOCK_M=q_block_m, BLOCK_N=q_block_n, RB=rb, WIDE_DOT=not gate.is_cuda, num_warps=q_warps,
        num_stages=q_stages,
    )  # fmt: skip
    # Summed over the row splits in one fixed order; gate's and up's separately, so that they alias nothing.
    db_gate, db_up = parts_b[0].sum(0), parts_b[1].sum(0)
    return (
        _as_fp8(dgq),
        sg[:, None],
        _as_fp8(duq),
        su[:, None],
        torch.cat([dxa[:, :r], dxa[:, rb : rb + r]], dim=1),
        db_gate[:, :r].contiguous(),
        db_up[:, :r].contiguous(),
        parts_a.sum(0)[:rd].contiguous(),
    )


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.dtype == torch.float64 else t.float()


def _gated_reference(
    gate: torch.Tensor, up: torch.Tensor, xa: torch.Tensor, bg: torch.Tensor, bu: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r = xa.shape[1] // 2
    xa_w = _wide(xa)
    return _wide(gate) + xa_w[:, :r] @ _wide(bg).t(), _wide(up) + xa_w[:, r:] @ _wide(bu).t()


def reference_forward(
    gate: torch.Tensor, up: torch.Tensor, xa: torch.Tensor, bg: torch.Tensor, bu: torch.Tensor, ad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`forward` in torch: the products and the pointwise part in fp32 (fp64 for fp64 inputs), h rounded to
    gate's dtype, quantized by fp8.quantize_rows."""
    g, u = _gated_reference(gate, up, xa, bg, bu)
    h = (g * torch.sigmoid(g) * u).to(gate.dtype)
    hq, hs = quantize_rows(h)
    return hq, hs, (_wide(h) @ _wide(ad).t()).float()


def reference_backward(
    gate: torch.Tensor,
    up: torch.Tensor,
    dhb: torch.Tensor,
    xa: torch.Tensor,
    bg: torch.Tensor,
    bu: torch.Tensor,
    ad: torch.Tensor,
    dha: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """`backward` in torch, rounded where the kernels round: dgate, dup and h to gate's dtype."""
    g, u = _gated_reference(gate, up, xa, bg, bu)
    dg, du, h = reference_grads(g, u, _wide(dhb) + _wide(dha) @ _wide(ad), gate.dtype)
    r = xa.shape[1] // 2
    xa_w = _wide(xa)
    dgq, sg = quantize_rows(dg)
    duq, su = quantize_rows(du)
    dxa = torch.cat([_wide(dg) @ _wide(bg), _wide(du) @ _wide(bu)], dim=1)
    db_gate = _wide(dg).t() @ xa_w[:, :r]
    db_up = _wide(du).t() @ xa_w[:, r:]
    da_down = _wide(dha).t() @ _wide(h)
    return dgq, sg, duq, su, dxa.float(), db_gate.float(), db_up.float(), da_down.float()


@torch.library.custom_op("gpucert::fp8_swiglu_forward", mutates_args=())
def fp8_swiglu_forward(
    gate: torch.Tensor, up: torch.Tensor, xa: torch.Tensor, bg: torch.Tensor, bu: torch.Tensor, ad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`forward` as an operator the compiled layers call as it is (inductor cannot trace into a Triton launch)."""
    return forward(gate, up, xa, bg, bu, ad)


@fp8_swiglu_forward.register_fake
def _(
    gate: torch.Tensor, up: torch.Tensor, xa: torch.Tensor, bg: torch.Tensor, bu: torch.Tensor, ad: torch.Tensor
) -> Any:
    m, n = gate.shape
    return (
        gate.new_empty(m, n, dtype=FP8),
        gate.new_empty(m, 1, dtype=torch.float32),
        gate.new_empty(m, ad.shape[0], dtype=torch.float32),
    )


@torch.library.custom_op("gpucert::fp8_swiglu_backward", mutates_args=())
def fp8_swiglu_backward(
    gate: torch.Tensor,
    up: torch.Tensor,
    dhb: torch.Tensor,
    xa: torch.Tensor,
    bg: torch.Tensor,
    bu: torch.Tensor,
    ad: torch.Tensor,
    dha: torch.Tensor,
) -> tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor
]:
    """`backward` as an operator the compiled layers call as it is."""
    return tuple(backward(gate, up, dhb, xa, bg, bu, ad, dha))  # type: ignore[return-value]


@fp8_swiglu_backward.register_fake
def _(
    gate: torch.Tensor,
    up: torch.Tensor,
    dhb: torch.Tensor,
    xa: torch.Tensor,
    bg: torch.Tensor,
    bu: torch.Tensor,
    ad: torch.Tensor,
    dha: torch.Tensor,
) -> Any:
    m, n = gate.shape
    r, rd = xa.shape[1] // 2, ad.shape[0]
    f32 = torch.float32
    return (
        gate.new_empty(m, n, dtype=FP8),
        gate.new_empty(m, 1, dtype=f32),
        gate.new_empty(m, n, dtype=FP8),
        gate.new_empty(m, 1, dtype=f32),
        gate.new_empty(m, 2 * r, dtype=f32),
        gate.new_empty(n, r, dtype=f32),
        gate.new_empty(n, r, dtype=f32),
        gate.new_empty(rd, n, dtype=f32),
    )
