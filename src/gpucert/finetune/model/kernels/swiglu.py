"""The SwiGLU backward of a LoRA MLP whose adapters ride in the frozen GEMMs, as one Triton kernel (CUDA only).

With the adapters in the frozen GEMMs (fused.py), a Qwen2-7B MLP's backward at micro-batch 3 ran, on top of its
three frozen GEMMs: inductor's SwiGLU backward (reads gate, up and dh, writes dgate and dup, 0.76 ms a layer),
then gate's and up's dB = s dgate^T (xA) and down_proj's dA = d(hA)^T h, skinny GEMMs that read dgate, dup and
h again (0.16 ms each). This kernel computes all five from one read of gate, up and dh: it writes dgate and dup
as before and, with each tile still in registers, adds the tile's share of the three skinny products (rank r, so
each is a small `tl.dot`). h = silu(gate) * up is recomputed from the tile, so the forward need not keep it.
Measured on the lent H100 at r16 (docs/OPTIMIZATION.md round ten): 0.87 ms against the 1.27 ms of what it
replaces, and 11.8 GiB less memory at micro-batch 3. The step was 0.2-0.3 % faster in the form measured, which
summed gate's and up's input gradients whole. Ranks above 16 keep the unfused MLP (config.FUSED_MLP_MAX_RANK).

Each program owns BLOCK_N columns and ROWS rows, looping over its rows BLOCK_M at a time; its partial products
are written, per split of the rows, in each gradient's own layout and summed afterwards in a fixed order, so the
same inputs give the same bits. Without Triton (a CPU build of torch) or off CUDA, `reference` computes the same
in torch; `TRITON_INTERPRET=1` runs the kernel on CPU tensors, for tests.
"""

from __future__ import annotations

import os
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU build of torch: the MLP's backward runs `reference`
    triton = None

# Tiles of 32 rows x 128 columns, 4 warps: 0.87 ms at Qwen2-7B's micro-batch 3 (2.7 TB/s), against 1.27 ms for
# 64 x 128 with 8 warps and for what it replaces (lent H100, tools/bench_swiglu.py, docs/OPTIMIZATION.md).
BLOCK_M = 32
BLOCK_N = 128
ROWS = 1024  # rows a program: 12 row splits at micro-batch 3, 148 x 12 programs on Qwen2-7B's 18,944 columns
WARPS = 4

if triton is not None:

    @triton.jit
    def swiglu_grads(g, u, d, out_ptr):
        """(dgate, dup, h) of h = silu(g) * u from fp32 g, u and dh = d, rounded to out_ptr's dtype (the FP8 MLP's
        backward kernel in swiglu_fp8.py computes the same)."""
        sig = tl.sigmoid(g)
        silu = g * sig
        out = out_ptr.dtype.element_ty
        return (d * u * sig * (1.0 + g * (1.0 - sig))).to(out), (d * silu).to(out), (silu * u).to(out)

    @triton.jit
    def _swiglu_lora_backward(
        gate_ptr,
        up_ptr,
        dh_ptr,
        dgate_ptr,
        dup_ptr,
        xa_ptr,  # [M, 2r]: gate's xA in columns [0, r), up's in [r, 2r)
        dxd_ptr,  # [M, rd]: d(hA) of down_proj, already scaled
        part_b_ptr,  # [2, splits, N, RB] fp32: dB_gate, dB_up (unscaled), partial over each split's rows
        part_a_ptr,  # [splits, RB, N] fp32: dA_down, likewise
        M,
        N,
        R: tl.constexpr,
        RD: tl.constexpr,
        stride_xa,
        stride_dxd,
        ROWS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        RB: tl.constexpr,  # max(r, rd) rounded up to a power of two >= 16: tl.dot's smallest side
        WIDE_DOT: tl.constexpr,  # products in fp32: Triton's interpreter (3.6) multiplies bf16 as raw integers
    ):
        pid_n = tl.program_id(0)
        split = tl.program_id(1)
        splits = tl.num_programs(1)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        ranks = tl.arange(0, RB)
        acc_g = tl.zeros([RB, BLOCK_N], tl.float32)
        acc_u = tl.zeros([RB, BLOCK_N], tl.float32)
        acc_d = tl.zeros([RB, BLOCK_N], tl.float32)
        first = split * ROWS
        for step in range(0, ROWS, BLOCK_M):
            rows = first + step + tl.arange(0, BLOCK_M)
            row_ok = rows < M
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            mask = row_ok[:, None] & col_ok[None, :]
            g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            d = tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            dg, du, h = swiglu_grads(g, u, d, dgate_ptr)
            tl.store(dgate_ptr + offs, dg, mask=mask)
            tl.store(dup_ptr + offs, du, mask=mask)
            # The rank-side operands, loaded transposed ([RB, BLOCK_M]), zero past r and past M.
            xa_rows = xa_ptr + rows.to(tl.int64)[None, :] * stride_xa
            xg = tl.load(xa_rows + ranks[:, None], mask=row_ok[None, :] & (ranks < R)[:, None], other=0.0)
            xu = tl.load(xa_rows + R + ranks[:, None], mask=row_ok[None, :] & (ranks < R)[:, None], other=0.0)
            dd_rows = dxd_ptr + rows.to(tl.int64)[None, :] * stride_dxd
            dd = tl.load(dd_rows + ranks[:, None], mask=row_ok[None, :] & (ranks < RD)[:, None], other=0.0)
            if WIDE_DOT:
                acc_g += tl.dot(xg.to(tl.float32), dg.to(tl.float32), input_precision="ieee")
                acc_u += tl.dot(xu.to(tl.float32), du.to(tl.float32), input_precision="ieee")
                acc_d += tl.dot(dd.to(tl.float32), h.to(tl.float32), input_precision="ieee")
            else:
                acc_g += tl.dot(xg.to(dg.dtype), dg)
                acc_u += tl.dot(xu.to(du.dtype), du)
                acc_d += tl.dot(dd.to(h.dtype), h)
        # Each stored in its gradient's own layout, dB [columns, ranks] and dA [ranks, columns], so that no
        # transposing copy follows (a profile of the first form showed 56 copy kernels more a step, 6.7 ms).
        b_out = cols[:, None] * RB + ranks[None, :]
        b_keep = col_ok[:, None] & (ranks[None, :] < RB)
        b_base = part_b_ptr + split * RB * N
        tl.store(b_base + b_out, tl.trans(acc_g), mask=b_keep)
        tl.store(b_base + splits * RB * N + b_out, tl.trans(acc_u), mask=b_keep)
        a_out = ranks[:, None] * N + cols[None, :]
        tl.store(part_a_ptr + split * RB * N + a_out, acc_d, mask=(ranks[:, None] < RB) & col_ok[None, :])


# Triton reads TRITON_INTERPRET when a kernel is decorated, at import: so is it read here, once.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def fits(gate: torch.Tensor) -> bool:
    """Whether the kernel runs for these activations: half precision with Triton present, on CUDA (or on the CPU
    under TRITON_INTERPRET=1, for tests). swiglu_fp8.py's kernels ask the same."""
    on_device = gate.is_cuda or INTERPRETED
    return triton is not None and on_device and gate.dtype in (torch.bfloat16, torch.float16)


def rank_block(r: int, rd: int) -> int:
    """The kernels' rank side: max(r, rd) rounded up to a power of two >= 16, tl.dot's smallest (swiglu_fp8.py too)."""
    return max(16, 1 << (max(r, rd) - 1).bit_length())


def backward(
    gate: torch.Tensor,
    up: torch.Tensor,
    dh: torch.Tensor,
    xa: torch.Tensor,
    dxd: torch.Tensor,
    scale_gate: float,
    scale_up: float,
    rows: int = ROWS,
    block_m: int = BLOCK_M,
    block_n: int = BLOCK_N,
    warps: int = WARPS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dgate, dup, dB_gate, dB_up, dA_down) of h = silu(gate) * up, given dh = dL/dh and:
    xa [M, 2r] (gate's xA, then up's), dxd = d(hA_down) [M, rd]. dB_gate = s_g dgate^T xa_g [N, r] and dB_up
    likewise, dA_down = dxd^T h [rd, N], all fp32; dgate and dup in gate's dtype. The kernel where `fits`,
    else `reference`; rows (a multiple of block_m), block_m, block_n and warps are the kernel's tiling
    (tools/bench_swiglu.py times them)."""
    if rows % block_m:
        # Each program's rows would run into the next split's, counted twice in dB and dA.
        raise ValueError(f"swiglu_kernel: rows {rows} must be a multiple of block_m {block_m}")
    if not fits(gate):
        return reference(gate, up, dh, xa, dxd, scale_gate, scale_up)
    assert triton is not None
    m, n = gate.shape
    r, rd = xa.shape[1] // 2, dxd.shape[1]
    rb = rank_block(r, rd)
    gate, up, dh = gate.contiguous(), up.contiguous(), dh.contiguous()
    xa, dxd = xa.contiguous(), dxd.contiguous()
    dgate, dup = torch.empty_like(gate), torch.empty_like(gate)
    splits = triton.cdiv(m, rows)
    parts_b = torch.empty(2, splits, n, rb, dtype=torch.float32, device=gate.device)
    parts_a = torch.empty(splits, rb, n, dtype=torch.float32, device=gate.device)
    grid = (triton.cdiv(n, block_n), splits)
    _swiglu_lora_backward[grid](
        gate, up, dh, dgate, dup, xa, dxd, parts_b, parts_a, m, n, r, rd, xa.stride(0), dxd.stride(0),
        ROWS=rows, BLOCK_M=block_m, BLOCK_N=block_n, RB=rb, WIDE_DOT=not gate.is_cuda, num_warps=warps,
    )  # fmt: skip
    db = parts_b.sum(1)  # over the row splits, in one fixed order
    da_down = parts_a.sum(0)
    db_gate, db_up = (db[0, :, :r] * scale_gate).contiguous(), (db[1, :, :r] * scale_up).contiguous()
    return dgate, dup, db_gate, db_up, da_down[:rd].contiguous()


def reference_grads(
    g: torch.Tensor, u: torch.Tensor, d: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`swiglu_grads` in torch: (dgate, dup, h) from wide g, u and dh = d, rounded to dtype (swiglu_fp8.py's
    reference too)."""
    sig = torch.sigmoid(g)
    silu = g * sig
    return (d * u * sig * (1 + g * (1 - sig))).to(dtype), (d * silu).to(dtype), (silu * u).to(dtype)


def reference(
    gate: torch.Tensor,
    up: torch.Tensor,
    dh: torch.Tensor,
    xa: torch.Tensor,
    dxd: torch.Tensor,
    scale_gate: float,
    scale_up: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`backward` in torch: the pointwise part in fp32 (fp64 for fp64 inputs), rounded to gate's dtype as the
    kernel rounds it, and the three products from the rounded values."""
    wide = torch.float64 if gate.dtype == torch.float64 else torch.float32
    dgate, dup, h = reference_grads(gate.to(wide), up.to(wide), dh.to(wide), gate.dtype)
    r = xa.shape[1] // 2
    xa_w, dxd_w = xa.to(wide), dxd.to(wide)
    db_gate = (dgate.to(wide).t() @ xa_w[:, :r]) * scale_gate
    db_up = (dup.to(wide).t() @ xa_w[:, r:]) * scale_up
    da_down = dxd_w.t() @ h.to(wide)
    return dgate, dup, db_gate, db_up, da_down  # the products in fp32 (fp64), as the kernel's sums


@torch.library.custom_op("gpucert::swiglu_lora_backward", mutates_args=())
def swiglu_lora_backward(
    gate: torch.Tensor,
    up: torch.Tensor,
    dh: torch.Tensor,
    xa: torch.Tensor,
    dxd: torch.Tensor,
    scale_gate: float,
    scale_up: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`backward` as an operator the compiled layers call as it is (inductor cannot trace into a Triton launch)."""
    return backward(gate, up, dh, xa, dxd, scale_gate, scale_up)


@swiglu_lora_backward.register_fake
def _(gate: torch.Tensor, up: torch.Tensor, dh: torch.Tensor, xa: torch.Tensor, dxd: torch.Tensor, *_: float) -> Any:
    m, n = gate.shape
    r, rd = xa.shape[1] // 2, dxd.shape[1]
    out = torch.float64 if gate.dtype == torch.float64 else torch.float32
    return (
        gate.new_empty(m, n),
        gate.new_empty(m, n),
        gate.new_empty(n, r, dtype=out),
        gate.new_empty(n, r, dtype=out),
        gate.new_empty(rd, n, dtype=out),
    )
