"""The language-model head and its cross-entropy, fused and chunked, so full logits never exist.

A 152k-entry vocabulary makes the logits the largest activation of a 7B step: 8k tokens x 152k in fp32 is 5 GB,
and as much again for their gradient (fine-tuning.md §9). `linear_cross_entropy` computes the head one chunk of
tokens at a time, only for tokens that have a label, and works out the gradient for the hidden states in the
same pass (the loss is a scalar, so its gradient needs nothing the forward does not have). What it keeps for the
backward is that gradient, the size of the hidden states; peak extra memory is one chunk's fp32 logits.

The arithmetic is the plain path's: logits from a matmul in the model's dtype, then the softmax in fp32 (float64
stays float64, for tests). The head's weight is frozen (LoRA never trains it here), so no weight gradient is made.
On a GPU the softmax and its gradient are one Triton kernel (kernels/cross_entropy.py), else a compiled or eager
function.

With `model.precision: fp8` and `model.fp8_head` the head's two matmuls run on the FP8 tensor cores
(fp8.Fp8FrozenLinear's layouts and row-wise recipe): the hidden states quantized per token, and the logits'
gradient per row straight out of the softmax kernel (kernels/cross_entropy.py's FP8 variant on a GPU), whose row
maximum |softmax - one_hot| = 1 - p_t is known without a pass of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gpucert.finetune.data.packing import supervised_positions
from gpucert.finetune.model.fp8 import (
    FAST_ACCUM_FORWARD,
    FAST_ACCUM_HEAD_BACKWARD,
    FP8,
    FP8_MAX,
    Fp8FrozenLinear,
    power_of_two_scale,
    quantize_rows,
)
from gpucert.finetune.model.kernels import cross_entropy as ce_kernel

# Tokens per chunk: 1024 x 152k fp32 logits is 0.6 GB, and a 1024-row matmul still runs at full speed.
CHUNK_TOKENS = 1024


def _chunk_loss_and_grad(
    logits: torch.Tensor, targets: torch.Tensor, accumulate: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ lse - logit_t, softmax - one_hot(t) in the logits' dtype) of one chunk, the softmax in `accumulate`.

    d(Σ lse - logit_t)/d logits = softmax - one_hot(t). Written as whole-tensor expressions so that, compiled, it
    reads the chunk's logits twice and writes the gradient once instead of the eager path's seven passes over an
    fp32 copy (5 GB of traffic per 1,024 tokens of a 152k vocabulary; 5 % of a 7B step on an H100, profiled).
    """
    x = logits.to(accumulate)
    lse = torch.logsumexp(x, dim=-1)
    loss = (lse - x.gather(1, targets[:, None]).squeeze(1)).sum()
    vocab = torch.arange(x.shape[-1], device=x.device)
    grad = torch.exp(x - lse[:, None]) - (vocab[None, :] == targets[:, None]).to(accumulate)
    return loss, grad.to(logits.dtype)


# CUDA only: on CPU (tests, the tiny model) compiling costs more than it saves, and the eager function is the
# same arithmetic. `dynamic` because the last chunk of a batch has its own length.
_compiled_chunk = torch.compile(_chunk_loss_and_grad, dynamic=True)


def _chunk_loss_and_fp8_grad(
    logits: torch.Tensor, targets: torch.Tensor, accumulate: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Σ lse - logit_t, softmax - one_hot(t) quantized per row to e4m3, the rows' scales [rows, 1] fp32).

    A row's largest |softmax - one_hot| is the target's, 1 - p_t, and 1 - p_t = Σ_{i≠t} p_i bounds every other
    entry: summed in the same pass as the softmax's denominator (not 1 - p_t subtracted, which loses everything
    when p_t nears 1), it gives the row's scale without an amax pass over the 152k-wide row.
    """
    x = logits.to(accumulate)
    top = x.amax(dim=-1, keepdim=True)
    e = torch.exp(x - top)
    vocab = torch.arange(x.shape[-1], device=x.device)
    hit = vocab[None, :] == targets[:, None]
    total = e.sum(dim=-1, keepdim=True)
    others = torch.where(hit, 0.0, e).sum(dim=-1, keepdim=True)
    loss = (top + torch.log(total) - x.gather(1, targets[:, None])).sum()
    rest = others / total
    scale = power_of_two_scale(rest)
    # The target's entry is -(1 - p_t) from the same sum: p_t - 1 would round to 0 in fp32 once p_t > 1 - 6e-8.
    grad = torch.where(hit, -rest, e / total) / scale
    return loss, grad.clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


# Float constants specialized: with dynamic=True, dynamo lifts the module-level floats these read (FP8_MAX,
# fp8.py's AMAX_FLOOR) into symbolic inputs, then specializes them and restarts its analysis, so each function was
# traced twice, cold and warm, the first pass missing AOTAutograd's cache (the 2 misses of every warm FP8 start;
# on the CPU 2.24 s against 1.64 s for both functions warm, the same outputs). Scoped to these two compiles.
_specialize_floats = torch._dynamo.config.patch(specialize_float=True)
_compiled_fp8_chunk = _specialize_floats(torch.compile(_chunk_loss_and_fp8_grad, dynamic=True))
_compiled_quantize_rows = _specialize_floats(torch.compile(quantize_rows, dynamic=True))


# The Triton kernel where it fits (kernels/cross_entropy.py: 0.34 against the compiled 0.59 ms a 1,024-token chunk
# on the lent H100). A switch for measuring one against the other (tools/profile_finetune.py LOSS_KERNEL=compiled).
TRITON_CHUNK = True


def _chunk_function(
    logits: torch.Tensor, targets: torch.Tensor, accumulate: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    if TRITON_CHUNK and ce_kernel.fits(logits, accumulate):
        return ce_kernel.chunk_loss_and_grad(logits, targets, accumulate)
    return (_compiled_chunk if logits.is_cuda else _chunk_loss_and_grad)(logits, targets, accumulate)


def _fp8_chunk_function(
    logits: torch.Tensor, targets: torch.Tensor, accumulate: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # The Triton kernel where it fits (0.83 ms a 1,024-token chunk compiled on one H200: inductor split each row's
    # reduction); TRITON_CHUNK off measures one against the other.
    if TRITON_CHUNK and ce_kernel.fits(logits, accumulate):
        return ce_kernel.chunk_loss_and_fp8_grad(logits, targets, accumulate)
    return (_compiled_fp8_chunk if logits.is_cuda else _chunk_loss_and_fp8_grad)(logits, targets, accumulate)


def _loss_only(logits: torch.Tensor, targets: torch.Tensor, accumulate: torch.dtype) -> torch.Tensor:
    x = logits.to(accumulate)
    return (torch.logsumexp(x, dim=-1) - x.gather(1, targets[:, None]).squeeze(1)).sum()


def _head_matmuls(
    hidden: torch.Tensor, head: torch.Tensor | Fp8FrozenLinear
) -> tuple[Callable[[slice], torch.Tensor], Callable[..., tuple[torch.Tensor, ...]], Callable[..., torch.Tensor]]:
    """(the logits of a slice of hidden's rows; the chunk function, returning the loss and the logits' gradient;
    the hidden states' gradient from that gradient) for the head in the model's dtype or in FP8."""
    if not isinstance(head, Fp8FrozenLinear):

        def logits(rows: slice) -> torch.Tensor:
            return hidden[rows] @ head.t()

        def grad_input(grad_logits: torch.Tensor) -> torch.Tensor:
            # The gradient in the model's dtype before its matmul, as the plain path's autograd does.
            return grad_logits @ head

        return logits, _chunk_function, grad_input

    hq, h_scale = (_compiled_quantize_rows if hidden.is_cuda else quantize_rows)(hidden)

    def fp8_logits(rows: slice) -> torch.Tensor:
        return torch._scaled_mm(
            hq[rows],
            head.weight.t(),
            scale_a=h_scale[rows],
            scale_b=head.weight_scale,
            out_dtype=head.out_dtype,
            use_fast_accum=FAST_ACCUM_FORWARD,
        )

    def fp8_grad_input(grad_q: torch.Tensor, grad_scale: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(
            grad_q,
            head.weight_t.t(),
            scale_a=grad_scale,
            scale_b=head.weight_t_scale,
            out_dtype=head.out_dtype,
            use_fast_accum=FAST_ACCUM_HEAD_BACKWARD,
        )

    return fp8_logits, _fp8_chunk_function, fp8_grad_input


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, head: torch.Tensor | Fp8FrozenLinear, targets: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        want_grad = ctx.needs_input_grad[0]
        accumulate = torch.promote_types(hidden.dtype, torch.float32)
        loss = torch.zeros((), dtype=accumulate, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if want_grad else None
        logits_of, chunk_fn, grad_input = _head_matmuls(hidden, head)
        for start in range(0, hidden.shape[0], chunk):
            rows, t = slice(start, start + chunk), targets[start : start + chunk]
            logits = logits_of(rows)
            if grad_hidden is None:
                loss += _loss_only(logits, t, accumulate)
                continue
            part, *grad_logits = chunk_fn(logits, t, accumulate)
            loss += part
            grad_hidden[rows] = grad_input(*grad_logits)
        ctx.save_for_backward(grad_hidden if grad_hidden is not None else hidden.new_empty(0))
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        (grad_hidden,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return grad_hidden * grad_loss.to(grad_hidden.dtype), None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor | Fp8FrozenLinear,
    labels: torch.Tensor,
    chunk: int = CHUNK_TOKENS,
    supervised: torch.Tensor | None = None,
) -> torch.Tensor:
    """Σ cross-entropy(hidden[i] @ weight.T, labels[i+1]) over positions whose next label is not IGNORE_INDEX.

    hidden [b, s, d] (the final norm's output), weight [V, d] (lm_head, frozen; or the head in FP8, its
    Fp8FrozenLinear), labels [b, s] unshifted: the label of position t is predicted from position t-1, as in a
    causal LM's loss. `supervised`: those positions (`packing.supervised_positions` of the labels) when the host
    worked them out already; else found here, which waits for the GPU to finish the forward.
    """
    if isinstance(weight, torch.Tensor) and weight.requires_grad:
        raise ValueError("linear_cross_entropy: expected a frozen lm_head weight; a trained head needs the plain loss")
    states = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    targets = labels[:, 1:].reshape(-1)
    keep = supervised_positions(labels) if supervised is None else supervised
    # Unlabelled positions (prompts, tool outputs, padding) never reach the head.
    return _LinearCrossEntropy.apply(states.index_select(0, keep), weight, targets.index_select(0, keep), chunk)
