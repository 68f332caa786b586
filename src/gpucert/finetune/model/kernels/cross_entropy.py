"""The fused loss's softmax cross-entropy of one chunk of logits, as one Triton kernel (CUDA only).

Each chunk of the fused loss (loss.py) runs the head's GEMM, then a kernel that reads the chunk's bf16 logits
(1,024 x 152,064: 311 MB) and writes their gradient softmax - one_hot, then the input-gradient GEMM. Compiled by
inductor from whole-tensor expressions (loss.py's `_chunk_loss_and_grad`) that kernel ran at 1.6 TB/s. This one
makes two passes over each row, one program a row: the row's maximum and sum of exponentials together (online,
rescaled as the maximum grows), then the gradient, written over the logits, which nothing reads after it. It
moves the same bytes at 2.7-2.8 TB/s: 0.34 against 0.59 ms a 1,024-token chunk on the lent H100
(tools/bench_loss_chunk.py, docs/OPTIMIZATION.md round nine), with the same error against fp64.

With the head in FP8 (`model.fp8_head`) the gradient goes to the input-gradient GEMM in float8, one power-of-two
scale a row (fp8.py's recipe). `_softmax_ce_rows_fp8` does that in the same two passes: the first also sums the
row's exponentials without the target's, whose share of the total (1 - p_t, the row's largest |softmax - one_hot|)
gives the row's scale; the second writes the quantized gradient. Inductor's kernel for the same expressions
(loss.py's `_chunk_loss_and_fp8_grad`, compiled) split each row's reduction and took 0.83 ms a 1,024-token chunk,
13.3 ms of the FP8 step at micro-batch 4 on one H200, where the bf16 kernel took 0.32 ms a chunk.

Triton comes with torch's CUDA builds; without it (or on a CPU) the loss keeps the compiled or eager function.
`TRITON_INTERPRET=1` runs the kernels on CPU tensors, for tests; there the FP8 kernel writes fp32, cast by torch
afterwards (Triton's interpreter rounds some values to the wrong binade).
"""

from __future__ import annotations

import torch

from gpucert.finetune.model.fp8 import AMAX_FLOOR, FP8, FP8_MAX

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU build of torch: the loss keeps its other paths
    triton = None

# One program a row, 4,096 columns a block with 8 warps: 0.340 ms a 1,024-token chunk, within 1.5 % of the best of
# blocks 2,048-16,384 and 4-16 warps on the lent H100.
BLOCK = 4096
WARPS = 8

if triton is not None:

    @triton.jit
    def _row_exp_sums(x_row, target, vocab: tl.constexpr, BLOCK: tl.constexpr, OTHERS: tl.constexpr):
        """Pass 1 over a row of logits, both kernels': (its maximum m, Σ exp(x - m), and with OTHERS the same sum
        without the target's entry, else 0), from each lane's running maximum and its sum of exponentials below it,
        rescaled as the maximum grows."""
        cols = tl.arange(0, BLOCK)
        top = tl.full([BLOCK], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK], tl.float32)
        others = tl.zeros([BLOCK], tl.float32)
        for start in range(0, vocab, BLOCK):
            x = tl.load(x_row + start + cols, mask=start + cols < vocab, other=float("-inf")).to(tl.float32)
            # A NaN logit kept (Triton's max drops a NaN operand by default): the row's loss is NaN, as torch's.
            new_top = tl.maximum(top, x, propagate_nan=tl.PropagateNan.ALL)
            shrink = tl.exp(top - new_top)
            e = tl.exp(x - new_top)
            # A lane that has seen only the mask's -inf would hold exp(-inf - -inf) = nan.
            seen = new_top != float("-inf")
            total = tl.where(seen, total * shrink + e, 0.0)
            if OTHERS:
                others = tl.where(seen, others * shrink + tl.where(start + cols == target, 0.0, e), 0.0)
            top = new_top
        row_top = tl.max(top, 0)
        lane = tl.exp(top - row_top)
        return row_top, tl.sum(total * lane, 0), tl.sum(others * lane, 0)

    @triton.jit
    def _softmax_ce_rows(
        logits_ptr,
        targets_ptr,
        grad_ptr,
        loss_ptr,
        vocab: tl.constexpr,  # one compile a vocabulary: the loops know their trip count
        stride_logits,
        stride_grad,
        BLOCK: tl.constexpr,
    ):
        """One row a program: loss[row] = lse - x[t] (fp32), grad[row] = softmax(x) - one_hot(t) in grad's dtype."""
        row = tl.program_id(0).to(tl.int64)
        x_row = logits_ptr + row * stride_logits
        target = tl.load(targets_ptr + row)
        cols = tl.arange(0, BLOCK)
        row_top, row_total, _ = _row_exp_sums(x_row, target, vocab, BLOCK, False)
        lse = row_top + tl.log(row_total)
        x_t = tl.load(x_row + target).to(tl.float32)
        tl.store(loss_ptr + row, lse - x_t)
        # Pass 2: the gradient (the row is read again, mostly from L2), over the logits when grad is logits: each
        # block is read before it is written, by the same program.
        g_row = grad_ptr + row * stride_grad
        for start in range(0, vocab, BLOCK):
            mask = start + cols < vocab
            x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.exp(x - lse) - tl.where(start + cols == target, 1.0, 0.0)
            tl.store(g_row + start + cols, g.to(grad_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _softmax_ce_rows_fp8(
        logits_ptr,
        targets_ptr,
        grad_ptr,  # [rows, vocab] out: (softmax - one_hot) / the row's scale, float8 (fp32 where interpreted)
        scale_ptr,  # [rows] fp32 out: the row's power-of-two scale
        loss_ptr,
        vocab: tl.constexpr,
        stride_logits,
        BLOCK: tl.constexpr,
    ):
        """One row a program: loss[row] = lse - x[t] (fp32), and the gradient quantized with the row's scale, as
        loss.py's `_chunk_loss_and_fp8_grad`."""
        row = tl.program_id(0).to(tl.int64)
        x_row = logits_ptr + row * stride_logits
        target = tl.load(targets_ptr + row)
        cols = tl.arange(0, BLOCK)
        # With the sum of the other entries' exponentials beside the total's: 1 - p_t from that sum, not from p_t,
        # which would round to 0 once p_t nears 1.
        row_top, row_total, row_others = _row_exp_sums(x_row, target, vocab, BLOCK, True)
        rest = tl.div_rn(row_others, row_total)
        x_t = tl.load(x_row + target).to(tl.float32)
        tl.store(loss_ptr + row, row_top + tl.log(row_total) - x_t)
        # fp8.power_of_two_scale: 2^ceil(log2(ideal)), from the bits of ideal (a normal fp32 number: at least
        # AMAX_FLOOR / 448). Exact, where torch's log2 may round a value a few ulps above a power of two down to it
        # (a scale half as large, whose largest entry the clamp below saturates); the same in the interpreter.
        # NaN propagated as torch propagates it (Triton's max and clamp drop a NaN operand by default): logits with a
        # NaN give a NaN scale and gradient, not a finite one.
        ideal = tl.div_rn(tl.maximum(rest, AMAX_FLOOR_C, propagate_nan=tl.PropagateNan.ALL), FP8_MAX_C)
        bits = ideal.to(tl.int32, bitcast=True)
        up = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # the biased exponent of the scale
        scale = tl.where(ideal == ideal, (up << 23).to(tl.float32, bitcast=True), ideal)
        tl.store(scale_ptr + row, scale)
        # 1 / scale, exact (a power of two, from its exponent's bits), so no division's rounding enters.
        inverse = tl.where(ideal == ideal, ((254 - up) << 23).to(tl.float32, bitcast=True), ideal)
        # Pass 2: the gradient over the scale, saturated as fp8.quantize_rows saturates.
        g_row = grad_ptr + row * vocab
        for start in range(0, vocab, BLOCK):
            mask = start + cols < vocab
            x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            p = tl.div_rn(tl.exp(x - row_top), row_total)
            g = tl.where(start + cols == target, -rest, p) * inverse
            g = tl.clamp(g, -FP8_MAX_C, FP8_MAX_C, propagate_nan=tl.PropagateNan.ALL)
            tl.store(g_row + start + cols, g.to(grad_ptr.dtype.element_ty), mask=mask)

    # Module-level constants reach a jitted function only as tl.constexpr globals.
    FP8_MAX_C = tl.constexpr(FP8_MAX)
    AMAX_FLOOR_C = tl.constexpr(AMAX_FLOOR)


def fits(logits: torch.Tensor, accumulate: torch.dtype) -> bool:
    """Whether the kernels compute what `loss._chunk_loss_and_grad(logits, targets, accumulate)` (and its FP8
    variant `_chunk_loss_and_fp8_grad`) would: a CUDA chunk of half-precision logits, rows contiguous, softmax in
    fp32 (float64 tests keep the other path)."""
    return (
        triton is not None
        and logits.is_cuda
        and logits.dim() == 2
        and logits.dtype in (torch.bfloat16, torch.float16)
        and logits.stride(1) == 1
        and accumulate == torch.float32
    )


def chunk_loss_and_grad(
    logits: torch.Tensor, targets: torch.Tensor, accumulate: torch.dtype = torch.float32, block: int = BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ lse - logit_t in fp32, softmax - one_hot(t) in the logits' dtype), as loss.py's `_chunk_loss_and_grad`;
    the gradient is written over `logits`. Each row's loss is summed afterwards, in a fixed order: the same chunk
    gives the same bits. Targets must lie in [0, vocab): the fused loss passes supervised positions only."""
    if triton is None:
        raise RuntimeError("ce_kernel: Triton is not installed (it comes with torch's CUDA builds)")
    rows, vocab = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        _softmax_ce_rows[(rows,)](
            logits, targets, logits, loss, vocab, logits.stride(0), logits.stride(0), BLOCK=block, num_warps=WARPS
        )
    return loss.sum(), logits


def chunk_loss_and_fp8_grad(
    logits: torch.Tensor, targets: torch.Tensor, accumulate: torch.dtype = torch.float32, block: int = BLOCK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Σ lse - logit_t in fp32, (softmax - one_hot(t)) / s in float8_e4m3fn, s [rows, 1] fp32), as loss.py's
    `_chunk_loss_and_fp8_grad`: s is each row's power-of-two scale of its largest entry, 1 - p_t. The gradient is
    a new tensor (float8 cannot be written over bf16 logits that other rows still read)."""
    if triton is None:
        raise RuntimeError("ce_kernel: Triton is not installed (it comes with torch's CUDA builds)")
    rows, vocab = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    scale = torch.empty(rows, dtype=torch.float32, device=logits.device)
    # The interpreter's float8 casts are wrong for some values: it writes fp32, cast by torch afterwards.
    grad = torch.empty(rows, vocab, dtype=FP8 if logits.is_cuda else torch.float32, device=logits.device)
    if rows:
        _softmax_ce_rows_fp8[(rows,)](
            logits, targets, grad, scale, loss, vocab, logits.stride(0), BLOCK=block, num_warps=WARPS
        )
    return loss.sum(), grad if grad.dtype == FP8 else grad.to(FP8), scale[:, None]
