"""The fused loss's softmax cross-entropy of one chunk of logits, as one Triton kernel (CUDA only).

Each chunk of the fused loss (loss.py) runs the head's GEMM, then a kernel that reads the chunk's bf16 logits
(1,024 x 152,064: 311 MB) and writes their gradient softmax - one_hot, then the input-gradient GEMM. Compiled by
inductor from whole-tensor expressions (loss.py's `_chunk_loss_and_grad`) that kernel ran at 1.6 TB/s. This one
makes two passes over each row, one program a row: the row's maximum and sum of exponentials together (online,
rescaled as the maximum grows), then the gradient, written over the logits, which nothing reads after it. It
moves the same bytes at 2.7-2.8 TB/s: 0.34 against 0.59 ms a 1,024-token chunk on the lent H100
(tools/bench_loss_chunk.py, docs/OPTIMIZATION.md round nine), with the same error against fp64.

Triton comes with torch's CUDA builds; without it (or on a CPU) the loss keeps the compiled or eager function.
`TRITON_INTERPRET=1` runs the kernel on CPU tensors, for tests.
"""

from __future__ import annotations

import torch

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
        # Pass 1: the running maximum and the sum of exponentials below it, rescaled as the maximum grows.
        top = tl.full([BLOCK], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK], tl.float32)
        for start in range(0, vocab, BLOCK):
            x = tl.load(x_row + start + cols, mask=start + cols < vocab, other=float("-inf")).to(tl.float32)
            new_top = tl.maximum(top, x)
            total = total * tl.exp(top - new_top) + tl.exp(x - new_top)
            # A lane that has seen only the mask's -inf would hold exp(-inf - -inf) = nan.
            total = tl.where(new_top == float("-inf"), 0.0, total)
            top = new_top
        row_top = tl.max(top, 0)
        lse = row_top + tl.log(tl.sum(total * tl.exp(top - row_top), 0))
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


def fits(logits: torch.Tensor, accumulate: torch.dtype) -> bool:
    """Whether the kernel computes what `loss._chunk_loss_and_grad(logits, targets, accumulate)` would: a CUDA
    chunk of half-precision logits, rows contiguous, softmax in fp32 (float64 tests keep the other path)."""
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
