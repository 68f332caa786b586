"""Each attention kernel a stock torch offers, at the 7B's shape: which one the packed-row recipes should want.

One layer of Qwen2-7B's attention (q 28 heads, k/v 4 heads, head dim 128, causal, bf16, micro-batch 4 of
4,096-token rows), forward, then forward + backward, per SDPA backend (cuDNN, FlashAttention-2 "flash",
memory-efficient), with grouped-query heads native (enable_gqa) and repeated, and torch's varlen_attn
(FlashAttention-2's variable-length kernels, what `model.attn_implementation: varlen` runs) on the same rows as
one document each. Prints ms and TFLOP/s (causal: half the square counted). Not part of gpucert.
Usage: python tools/bench_attention_backends.py   (on a GPU machine)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpucert.finetune.model.flash import torch_varlen

B, HQ, HKV, S, D = 4, 28, 4, 4096, 128
FORWARD_FLOP = 4 * B * HQ * S * S * D / 2  # two matmuls, causal
BACKWARD_FLOP = 2.5 * FORWARD_FLOP


def timed_ms(fn: Callable[[], object], repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def line(name: str, forward: Callable[[], torch.Tensor], grad: torch.Tensor) -> str:
    fwd = timed_ms(forward)
    both = timed_ms(lambda: forward().backward(grad))
    return (
        f"{name:22s} forward {fwd:6.3f} ms ({FORWARD_FLOP / fwd / 1e9:4.0f} TFLOP/s)  backward {both - fwd:6.3f} ms "
        f"({BACKWARD_FLOP / (both - fwd) / 1e9:4.0f} TFLOP/s)  both {both:6.3f} ms, x28 layers {28 * both:5.1f} ms"
    )


def main() -> None:
    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    q, k, v = leaf(B, HQ, S, D), leaf(B, HKV, S, D), leaf(B, HKV, S, D)
    kr, vr = (t.detach().repeat_interleave(HQ // HKV, 1).requires_grad_() for t in (k, v))
    grad = torch.randn(B, HQ, S, D, device="cuda", dtype=torch.bfloat16)
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
    backends.append(("efficient", SDPBackend.EFFICIENT_ATTENTION))
    for name, backend in backends:
        for gqa in (True, False):
            label = f"sdpa {name}{' gqa' if gqa else ' repeated'}"

            def forward(backend: SDPBackend = backend, gqa: bool = gqa) -> torch.Tensor:
                with sdpa_kernel([backend]):
                    if gqa:
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    return F.scaled_dot_product_attention(q, kr, vr, is_causal=True)

            try:
                print(line(label, forward, grad))
            except RuntimeError as exc:  # a backend without this case (efficient has no GQA)
                print(f"{label:22s} not available: {str(exc).splitlines()[0][:120]}")
    # varlen_attn on [tokens, heads, dim]: every row one document.
    qv = q.detach().transpose(1, 2).reshape(B * S, HQ, D).requires_grad_()
    kv, vv = (t.detach().transpose(1, 2).reshape(B * S, HKV, D).requires_grad_() for t in (k, v))
    bounds = torch.arange(0, B * S + 1, S, device="cuda", dtype=torch.int32)
    print(
        line(
            "varlen_attn (FA2)",
            lambda: torch_varlen(qv, kv, vv, bounds, bounds, S, S, None, True),
            grad.transpose(1, 2).reshape(B * S, HQ, D),
        )
    )


if __name__ == "__main__":
    main()
