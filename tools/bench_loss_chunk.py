"""Issue 13, round nine: the fused loss's per-chunk softmax kernel, measured before it was built into the loss.

Each 1,024-token chunk of the fused loss (finetune/model/loss.py) runs the head's GEMM, then one compiled kernel that
reads the chunk's bf16 logits (1,024 x 152,064, 311 MB) and writes their gradient softmax - one_hot (311 MB), then
the input-gradient GEMM. Profiled at micro-batch 3 (round eight), that kernel took 0.64 ms a chunk, 7.6 ms a
step: 1.5 TB/s if it reads the logits twice, far from the 3.35 TB/s the H100 has. kernels/cross_entropy.py's Triton
kernel of two passes over each row (the max and the sum of exponentials together, online; then the gradient)
moves the same 933 MB; the loss now runs it on CUDA.

Times, over 50 calls after 10, at 1,024 and 2,048 rows:
- compiled: finetune/model/loss.py's `_compiled_chunk` as the trainer runs it (dynamic shapes, coordinate-descent
  tuning on);
- triton: ce_kernel's kernel, its gradient in a new tensor;
- triton-in-place: the same, its gradient written over the logits (which nothing reads after it), as the loss
  runs it.
Prints JSON: each one's milliseconds, the bandwidth of 2 reads and 1 write, and its loss and gradient against an
fp64 reference (loss.py's own function in float64). Run on the GPU: python tools/bench_loss_chunk.py. On a CPU,
tests/finetune/test_ce_kernel.py runs the kernel in Triton's interpreter.
"""

from __future__ import annotations

import json

import torch

from gpucert.finetune.model.kernels.cross_entropy import BLOCK, WARPS, _softmax_ce_rows
from gpucert.finetune.model.loss import _chunk_loss_and_grad, _compiled_chunk

VOCAB = 152_064


def triton_chunk(
    logits: torch.Tensor, targets: torch.Tensor, in_place: bool = False, block: int = BLOCK, warps: int = WARPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ lse - logit_t in fp32, softmax - one_hot(t) in the logits' dtype), as `_chunk_loss_and_grad`."""
    rows, vocab = logits.shape
    grad = logits if in_place else torch.empty_like(logits)
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _softmax_ce_rows[(rows,)](
        logits, targets, grad, loss, vocab, logits.stride(0), grad.stride(0), BLOCK=block, num_warps=warps
    )
    return loss.sum(), grad


def reference(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _chunk_loss_and_grad(logits.double(), targets, torch.float64)


def errors(found: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    loss, grad = found
    return {
        "loss_rel": abs(float(loss) - float(ref[0])) / abs(float(ref[0])),
        "grad_max_abs": float((grad.double() - ref[1]).abs().max()),
    }


def inputs(rows: int, vocab: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    # Logits of a trained head's scale (a few units), targets anywhere in the vocabulary.
    logits = (3 * torch.randn(rows, vocab, generator=g, device=device)).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), generator=g, device=device)
    return logits, targets


def time_ms(fn, calls: int = 50, warmup: int = 10) -> float:
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def bench_rows(rows: int) -> dict[str, dict[str, float]]:
    logits, targets = inputs(rows, VOCAB, "cuda")
    ref = reference(logits, targets)
    moved = 3 * logits.numel() * logits.element_size()  # read twice, written once
    # The in-place kernel is timed over one buffer it keeps overwriting: the values change (gradients, not
    # logits), the work does not. Its result is checked on a fresh copy.
    scratch = logits.clone()
    variants = {
        "compiled": (lambda: _compiled_chunk(logits, targets, torch.float32), None),
        "triton": (lambda: triton_chunk(logits, targets), None),
        "triton-in-place": (
            lambda: triton_chunk(scratch, targets, in_place=True),
            lambda: triton_chunk(logits.clone(), targets, in_place=True),
        ),
    }
    result = {}
    for name, (fn, checked) in variants.items():
        found = (checked or fn)()
        ms = time_ms(fn)
        result[name] = {"ms": ms, "tb_per_s": moved / ms / 1e9, **errors(found, ref)}
    for block, warps in ((2048, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16)):
        ms = time_ms(lambda block=block, warps=warps: triton_chunk(logits, targets, block=block, warps=warps))
        result[f"triton block {block} warps {warps}"] = {"ms": ms, "tb_per_s": moved / ms / 1e9}
    return result


def main() -> None:
    import torch._inductor.config as inductor_config

    inductor_config.coordinate_descent_tuning = True  # as the trainer sets it (model.compile_tuning)
    out: dict[str, object] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for rows in (1024, 2048):
        out[f"rows_{rows}"] = bench_rows(rows)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
