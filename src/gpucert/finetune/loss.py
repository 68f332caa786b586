"""The language-model head and its cross-entropy, fused and chunked, so full logits never exist.

A 152k-entry vocabulary makes the logits the largest activation of a 7B step: 8k tokens x 152k in fp32 is 5 GB,
and as much again for their gradient (fine-tuning.md §9). `linear_cross_entropy` computes the head one chunk of
tokens at a time, only for tokens that have a label, and works out the gradient for the hidden states in the
same pass (the loss is a scalar, so its gradient needs nothing the forward does not have). What it keeps for the
backward is that gradient, the size of the hidden states; peak extra memory is one chunk's fp32 logits.

The arithmetic is the plain path's: logits from a matmul in the model's dtype, then the softmax in fp32 (float64
stays float64, for tests). The head's weight is frozen (LoRA never trains it here), so no weight gradient is made.
"""

from __future__ import annotations

from typing import Any

import torch

IGNORE_INDEX = -100
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


def _loss_only(logits: torch.Tensor, targets: torch.Tensor, accumulate: torch.dtype) -> torch.Tensor:
    x = logits.to(accumulate)
    return (torch.logsumexp(x, dim=-1) - x.gather(1, targets[:, None]).squeeze(1)).sum()


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        want_grad = ctx.needs_input_grad[0]
        accumulate = torch.promote_types(hidden.dtype, torch.float32)
        loss = torch.zeros((), dtype=accumulate, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if want_grad else None
        chunk_fn = _compiled_chunk if hidden.is_cuda else _chunk_loss_and_grad
        for start in range(0, hidden.shape[0], chunk):
            h, t = hidden[start : start + chunk], targets[start : start + chunk]
            logits = h @ weight.t()
            if grad_hidden is None:
                loss += _loss_only(logits, t, accumulate)
                continue
            part, grad_logits = chunk_fn(logits, t, accumulate)
            loss += part
            # The gradient in the model's dtype before its matmul, as the plain path's autograd does.
            grad_hidden[start : start + chunk] = grad_logits @ weight
        ctx.save_for_backward(grad_hidden if grad_hidden is not None else hidden.new_empty(0))
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        (grad_hidden,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return grad_hidden * grad_loss.to(grad_hidden.dtype), None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int = CHUNK_TOKENS
) -> torch.Tensor:
    """Σ cross-entropy(hidden[i] @ weight.T, labels[i+1]) over positions whose next label is not IGNORE_INDEX.

    hidden [b, s, d] (the final norm's output), weight [V, d] (lm_head, frozen), labels [b, s] unshifted: the
    label of position t is predicted from position t-1, as in a causal LM's loss.
    """
    if weight.requires_grad:
        raise ValueError("linear_cross_entropy: expected a frozen lm_head weight; a trained head needs the plain loss")
    states = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    targets = labels[:, 1:].reshape(-1)
    keep = (targets != IGNORE_INDEX).nonzero().squeeze(1)
    # Unlabelled positions (prompts, tool outputs, padding) never reach the head.
    return _LinearCrossEntropy.apply(states.index_select(0, keep), weight, targets.index_select(0, keep), chunk)
