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
    # The FP8 variant against the function it replaces (loss.py's, eager here, compiled on a GPU) and against fp64.
    for name, vocab, confident in (("fp8", 1000, False), ("fp8_narrow", 100, False), ("fp8_confident", 1000, True)):
        logits = (3 * torch.randn(7, vocab, generator=g)).to(torch.bfloat16)
        targets = torch.randint(0, vocab, (7,), generator=g)
        targets[0], targets[1] = 0, vocab - 1
        if confident:  # p_t within 1e-9 of 1 in some rows: 1 - p_t must come from the other entries' sum
            logits[torch.arange(7), targets] = torch.tensor([40.0, 30.0, 25.0, 12.0, 8.0, 3.0, 0.0]).to(torch.bfloat16)
        want_loss, want_q, want_scale = loss._chunk_loss_and_fp8_grad(logits, targets, torch.float32)
        found_loss, found_q, found_scale = ce_kernel.chunk_loss_and_fp8_grad(logits, targets, block=256)
        _, exact = reference(logits, targets)
        deq = found_q.double() * found_scale.double()
        # Half a step of e4m3 (3 mantissa bits) at each entry's size, or half its subnormal spacing (2^-9 scale).
        off = (deq - exact).abs() - found_scale.double() * 2**-10
        out[name] = {
            "loss_rel": abs(float(found_loss) - float(reference(logits, targets)[0])) / float(want_loss),
            "scales_equal": bool(torch.equal(found_scale, want_scale)),
            "grad_max_rel": float((off / exact.abs()).max()),
            "bits_differ": int((found_q.view(torch.uint8) != want_q.view(torch.uint8)).sum()),
            "entries": found_q.numel(),
            "dtypes": [str(found_q.dtype), str(found_scale.dtype), list(found_scale.shape)],
            "same_bits": bool(torch.equal(ce_kernel.chunk_loss_and_fp8_grad(logits, targets, block=256)[1].view(
                torch.uint8), found_q.view(torch.uint8))),
        }
    # A NaN among a row's logits: a NaN scale and gradient for that row, as the eager function gives (Triton's max
    # and clamp would drop it), the other rows untouched.
    logits = torch.randn(3, 300, generator=g).to(torch.bfloat16)
    logits[1, 7] = float("nan")
    targets = torch.tensor([0, 5, 299])
    _, want_q, want_scale = loss._chunk_loss_and_fp8_grad(logits, targets, torch.float32)
    _, found_q, found_scale = ce_kernel.chunk_loss_and_fp8_grad(logits, targets, block=128)
    bf16_loss, bf16_grad = ce_kernel.chunk_loss_and_grad(logits.clone(), targets, block=128)
    out["bf16_nan"] = {
        "loss_nan": bool(bf16_loss.isnan()),
        "grad_nan_rows": [bool(v) for v in bf16_grad.isnan().all(1)],
    }
    out["fp8_nan"] = {
        "scale_nan": [bool(v) for v in found_scale.isnan().squeeze(1)],
        "want_scale_nan": [bool(v) for v in want_scale.isnan().squeeze(1)],
        "grad_nan_rows": [bool(v) for v in found_q.float().isnan().all(1)],
        "same_bits_other_rows": bool(torch.equal(found_q[[0, 2]].view(torch.uint8), want_q[[0, 2]].view(torch.uint8))),
    }
    # Never taken on a CPU: the loss keeps its eager function there.
    out["fits_cpu"] = ce_kernel.fits(torch.zeros(2, 8, dtype=torch.bfloat16), torch.float32)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(CHILD)


@pytest.mark.slow
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


@pytest.mark.parametrize("case", ["fp8", "fp8_narrow", "fp8_confident"])
def test_the_fp8_kernel_gives_the_compiled_functions_scales_and_gradient_within_half_a_step(
    interpreted: dict, case: str
) -> None:
    found = interpreted[case]
    assert found["loss_rel"] < 1e-6
    assert found["scales_equal"]  # the same power of two a row as fp8.power_of_two_scale
    # Rounded to nearest (torch's cast): half a step of e4m3 at each entry's size, 2^-4 of it.
    assert found["grad_max_rel"] <= 2**-4
    # fp32 rounding of exp and the sums in another order may move an entry across an e4m3 rounding boundary.
    assert found["bits_differ"] <= found["entries"] // 1000
    assert found["dtypes"] == ["torch.float8_e4m3fn", "torch.float32", [7, 1]]
    assert found["same_bits"]


def test_a_nan_in_a_row_gives_that_row_a_nan_scale_gradient_and_loss_as_the_eager_function(interpreted: dict) -> None:
    found = interpreted["fp8_nan"]
    assert found["scale_nan"] == found["want_scale_nan"] == [False, True, False]
    assert found["grad_nan_rows"] == [False, True, False]
    assert found["same_bits_other_rows"]
    # The bf16 kernel too: the loss NaN, as the eager function's (it was finite, the NaN dropped by the running max).
    assert interpreted["bf16_nan"] == {"loss_nan": True, "grad_nan_rows": [False, True, False]}
