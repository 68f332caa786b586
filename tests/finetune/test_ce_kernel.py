"""The fused loss's Triton chunk kernel (model/kernels/cross_entropy.py), run in Triton's interpreter on CPU tensors.

The interpreter is chosen when the kernel is decorated, so it runs in a child process started with
TRITON_INTERPRET=1. On the GPU, tests/gpu/test_finetune.py holds the compiled kernel against the compiled
function it replaces, at the 7B's vocabulary.
"""

from __future__ import annotations

import textwrap

import pytest
from tests.finetune.interpreted import run_interpreted

pytest.importorskip("triton")

CHILD = textwrap.dedent(
    """
    import json, torch
    from gpucert.finetune.model.kernels import cross_entropy as ce_kernel
    from gpucert.finetune.model import loss

    def reference(logits, targets):
        return loss._chunk_loss_and_grad(logits.double(), targets, torch.float64)

    out = {}
    g = torch.Generator().manual_seed(0)
    # Vocabularies that are no multiple of the block, targets in the first and the last, partial block; one
    # narrower than the block, whose lanes past the vocabulary never see a number.
    cases = (("bf16", torch.bfloat16, 1000), ("fp16", torch.float16, 300), ("narrow", torch.bfloat16, 100))
    for name, dtype, vocab in cases:
        logits = (3 * torch.randn(7, vocab, generator=g)).to(dtype)
        targets = torch.randint(0, vocab, (7,), generator=g)
        targets[0], targets[1] = 0, vocab - 1
        want_loss, want_grad = reference(logits, targets)
        given = logits.clone()
        found_loss, found_grad = ce_kernel.chunk_loss_and_grad(given, targets, block=256)
        again_loss, _ = ce_kernel.chunk_loss_and_grad(logits.clone(), targets, block=256)
        # Each entry against its own size: most of a row is ~1e-4 or less, where an absolute bound sees nothing.
        # Below the format's smallest normal number its spacing is fixed (fp16's subnormals, 2^-24 apart).
        tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
        off = (found_grad.double() - want_grad).abs() - tiny
        out[name] = {
            "loss_rel": abs(float(found_loss) - float(want_loss)) / float(want_loss),
            "grad_max_rel": float((off / want_grad.abs()).max()),
            "in_place": found_grad.data_ptr() == given.data_ptr(),
            "dtype": str(found_grad.dtype),
            "loss_dtype": str(found_loss.dtype),
            "same_bits": bool(found_loss == again_loss),
        }
    empty_loss, empty_grad = ce_kernel.chunk_loss_and_grad(torch.empty(0, 64, dtype=torch.bfloat16),
                                                           torch.empty(0, dtype=torch.long), block=64)
    out["empty"] = [float(empty_loss), list(empty_grad.shape)]
    # Never taken on a CPU: the loss keeps its eager function there.
    out["fits_cpu"] = ce_kernel.fits(torch.zeros(2, 8, dtype=torch.bfloat16), torch.float32)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(CHILD)


@pytest.mark.parametrize("case", ["bf16", "fp16", "narrow"])
def test_the_kernel_gives_the_loss_and_its_gradient_within_one_rounding_of_fp64(interpreted: dict, case: str) -> None:
    found = interpreted[case]
    assert found["loss_rel"] < 1e-6
    # Within one step of the format at each entry's size (2^-7 of it for bf16, 2^-10 for fp16): the interpreter's
    # casts truncate, where the GPU's round to nearest (half a step, tests/gpu/test_finetune.py).
    assert found["grad_max_rel"] <= (2**-10 if case == "fp16" else 2**-7)
    assert found["dtype"] == f"torch.{'float16' if case == 'fp16' else 'bfloat16'}"
    assert found["loss_dtype"] == "torch.float32"


def test_the_gradient_is_written_over_the_logits_and_repeats_bit_for_bit(interpreted: dict) -> None:
    assert interpreted["bf16"]["in_place"] and interpreted["fp16"]["in_place"]
    assert interpreted["bf16"]["same_bits"]


def test_an_empty_chunk_launches_nothing_and_a_cpu_chunk_keeps_the_other_path(interpreted: dict) -> None:
    assert interpreted["empty"] == [0.0, [0, 64]]
    assert interpreted["fits_cpu"] is False
