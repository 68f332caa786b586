"""Row-wise FP8 quantization of long rows as one Triton kernel that compiled code cannot fuse into its producer.

Why it exists: under torch.compile, inductor fuses `fp8.quantize_rows` (a row amax, then a scaled cast) into
the kernel that produces the row. For the MLP's 18,944-wide rows (the down projection's input, and the input
gradients of gate and up) that producer is the SwiGLU, forward and backward, and a row that long does not fit
one pass: inductor's looped reduction reads the SwiGLU's four or five 310 MB inputs twice, once for the amax
and once for the cast, 60 ms of a 7B FP8 step on an H100 (docs/OPTIMIZATION.md). As an opaque op here, the
SwiGLU becomes a plain elementwise kernel reading its inputs once and writing its bf16 result (which the
adapters need anyway), and this kernel reads that result once more: one row per program, held in registers
between its amax and its cast.

It quantizes exactly as `fp8.quantize_rows` does (the same power-of-two scale, the same clamp and
round-to-nearest-even cast), so eager and compiled runs, with or without it, agree bit for bit
(tests/gpu/test_finetune_fp8.py). Needs triton (CUDA torch builds ship it); without triton the caller keeps
`fp8.quantize_rows`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpucert.finetune.fp8 import AMAX_FLOOR, FP8_MAX

# Rows up to this long stay in registers between the amax and the cast (one read of the row); longer rows are
# read twice, in chunks of LOOP_BLOCK. 32,768 fp32 values over 16 warps is 64 registers a thread.
ONE_PASS_MAX = 32768
LOOP_BLOCK = 4096


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    n_cols,
    x_row_stride,
    q_row_stride,
    AMAX_FLOOR: tl.constexpr,
    FP8_MAX: tl.constexpr,
    BLOCK: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    q_row = q_ptr + row * q_row_stride
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:
        mask = cols < n_cols
        v = tl.load(x_row + cols, mask=mask, other=0.0)
        amax = tl.max(tl.abs(v), axis=0).to(tl.float32)
    else:
        amax = tl.full([], 0.0, tl.float32)
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            chunk = tl.load(x_row + start + cols, mask=mask, other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(chunk), axis=0).to(tl.float32))
    # fp8.power_of_two_scale, 2 ** ceil(log2(max(amax, floor) / 448)), taken from the float's bits: its exponent,
    # one up unless the mantissa is zero. torch's log2 gives the same ceiling for any 16-bit amax (amax / 448
    # is then at least 0.4 % away from a power of two unless it is one), which is why only bf16/fp16 come here.
    ideal = tl.math.div_rn(tl.maximum(amax, AMAX_FLOOR), FP8_MAX)
    bits = ideal.to(tl.int32, bitcast=True)
    exponent = bits & 0x7F800000
    exponent = tl.where((bits & 0x007FFFFF) != 0, exponent + 0x00800000, exponent)
    scale = exponent.to(tl.float32, bitcast=True)
    tl.store(scale_ptr + row, scale)
    # Dividing by a power of two is exact: multiplying by its reciprocal is the same number.
    inverse = tl.math.div_rn(1.0, scale)
    if ONE_PASS:
        q = tl.clamp(v.to(tl.float32) * inverse, -FP8_MAX, FP8_MAX)
        tl.store(q_row + cols, q.to(tl.float8e4nv), mask=mask)
    else:
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            chunk = tl.load(x_row + start + cols, mask=mask, other=0.0)
            q = tl.clamp(chunk.to(tl.float32) * inverse, -FP8_MAX, FP8_MAX)
            tl.store(q_row + start + cols, q.to(tl.float8e4nv), mask=mask)


# An opaque custom op, not a triton_op: compiled code must not see into it (that is the point), and an opaque op
# with a fake implementation traces the same under static and dynamic shapes.
@torch.library.custom_op("gpucert::quantize_rows_fp8", mutates_args=())
def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / s in float8_e4m3fn, s [rows, 1] fp32) for a 2-D bf16 or fp16 CUDA tensor x of contiguous rows."""
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    one_pass = cols <= ONE_PASS_MAX
    block = triton.next_power_of_2(cols) if one_pass else LOOP_BLOCK
    with torch.cuda.device(x.device):
        _quantize_rows_kernel[(rows,)](
            x,
            q,
            scale,
            cols,
            x.stride(0),
            q.stride(0),
            AMAX_FLOOR=AMAX_FLOOR,
            FP8_MAX=FP8_MAX,
            BLOCK=block,
            ONE_PASS=one_pass,
            num_warps=16 if block >= 16384 else 8 if block >= 4096 else 4,
        )
    return q, scale


@quantize_rows_fp8.register_fake
def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    return x.new_empty((rows, cols), dtype=torch.float8_e4m3fn), x.new_empty((rows, 1), dtype=torch.float32)
