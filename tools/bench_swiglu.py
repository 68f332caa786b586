"""Issue 13, round ten: the fused MLP's backward kernel (finetune/model/kernels/swiglu.py) against what it replaces.

At micro-batch 3 of Qwen2-7B (12,288 tokens, 18,944 intermediate, r16) each MLP's backward ran inductor's SwiGLU
backward (reads gate, up, dh; writes dgate, dup) and three skinny GEMMs that read an intermediate-sized tensor
again: gate's and up's dB = s dgate^T xA, down_proj's dA = d(hA)^T h. The kernel does all five in one pass.

Times, over 20 calls after 5, in milliseconds:
- before: a compiled SwiGLU backward plus the three GEMMs, as the layers ran them (h kept from the forward);
- kernel: swiglu_kernel.backward at its shipped tiling, and at a few others (rows, block_m, block_n, warps).
Prints JSON: the times, the bandwidth of the kernel's 3 reads and 2 writes, and each output's largest error
relative to the largest entry of an fp64 reference, for both. Run on the GPU: python tools/bench_swiglu.py. On a
CPU, tests/finetune/test_swiglu_kernel.py runs the kernel in Triton's interpreter.
"""

from __future__ import annotations

import functools
import json

import torch
import torch.nn.functional as F
from bench_loss_chunk import time_ms  # tools/ is on the path when run as a script

from gpucert.finetune.model.kernels import swiglu as swiglu_kernel

M, N, R = 12_288, 18_944, 16
SCALE = 2.0
TILINGS = [
    (1024, 32, 128, 4),
    (1024, 64, 128, 8),
    (1024, 16, 128, 4),
    (1024, 32, 256, 8),
    (1024, 32, 64, 4),
    (1024, 32, 128, 8),
    (512, 32, 128, 4),
    (2048, 32, 128, 4),
    # A warp on 16 whole rows, so the rank-r dots stay inside it: the FP8 MLP's forward took 0.65 ms at 64 x 64
    # against 0.83 at 32 x 128 (kernels/swiglu_fp8.py, 2026-11-29).
    (1024, 64, 64, 4),
    (512, 64, 64, 4),
    (2048, 64, 64, 4),
    (1024, 64, 128, 4),
]
WIDTH = 3584 + 2 * R  # [x | xA] of Qwen2-7B's gate/up
TIMING = {"calls": 20, "warmup": 5}


@torch.compile
def _swiglu_grads(gate: torch.Tensor, up: torch.Tensor, dh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g = gate.float()
    sig = torch.sigmoid(g)
    return (dh.float() * up.float() * sig * (1 + g * (1 - sig))).to(gate.dtype), (dh.float() * F.silu(g)).to(gate.dtype)


def before(gate, up, dh, h, xa, dxd):
    dgate, dup = _swiglu_grads(gate, up, dh)
    db_gate = (dgate.t() @ xa[:, :R]) * SCALE
    db_up = (dup.t() @ xa[:, R:]) * SCALE
    da_down = dxd.t() @ h
    return dgate, dup, db_gate, db_up, da_down


def errors(found, ref) -> dict[str, float]:
    names = ("dgate", "dup", "db_gate", "db_up", "da_down")
    return {n: float((f.double() - r).abs().max() / r.abs().max()) for n, f, r in zip(names, found, ref, strict=True)}


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    gate = (2 * torch.randn(M, N, generator=g, device="cuda")).bfloat16()
    up = torch.randn(M, N, generator=g, device="cuda").bfloat16()
    dh = (1e-3 * torch.randn(M, N, generator=g, device="cuda")).bfloat16()
    xa = torch.randn(M, 2 * R, generator=g, device="cuda").bfloat16()
    dxd = (1e-3 * torch.randn(M, R, generator=g, device="cuda")).bfloat16()
    h = (F.silu(gate.float()) * up.float()).bfloat16()
    ref = swiglu_kernel.reference(gate.double(), up.double(), dh.double(), xa.double(), dxd.double(), SCALE, SCALE)
    out: dict[str, object] = {"shape": [M, N, R]}
    out["before_ms"] = time_ms(lambda: before(gate, up, dh, h, xa, dxd), **TIMING)
    out["before_error"] = errors(before(gate, up, dh, h, xa, dxd), ref)
    moved = 5 * M * N * 2
    for rows, bm, bn, warps in TILINGS:
        fn = functools.partial(swiglu_kernel.backward, gate, up, dh, xa, dxd, SCALE, SCALE, rows, bm, bn, warps)
        ms = time_ms(fn, **TIMING)
        out[f"kernel rows={rows} bm={bm} bn={bn} warps={warps}"] = {
            "ms": ms,
            "TB/s": moved / ms / 1e9,
            "error": errors(fn(), ref),
        }
    # The input gradient of gate/up's [x | xA] from dgate and dup: two GEMMs and an add, the second as addmm, or
    # one GEMM over the stacked pair (K = 2 x 18,944).
    w_gate = torch.randn(N, WIDTH, generator=g, device="cuda").bfloat16()
    w_up = torch.randn(N, WIDTH, generator=g, device="cuda").bfloat16()
    w_pair = torch.cat([w_gate, w_up])
    dgate, dup = _swiglu_grads(gate, up, dh)
    d_pair = torch.cat([dgate, dup], dim=1)
    out["dx_two_mm_add_ms"] = time_ms(lambda: (dgate @ w_gate) + (dup @ w_up), **TIMING)
    out["dx_mm_addmm_ms"] = time_ms(lambda: torch.addmm(dgate @ w_gate, dup, w_up), **TIMING)
    out["dx_stacked_mm_ms"] = time_ms(lambda: d_pair @ w_pair, **TIMING)
    x_ext = torch.randn(M, WIDTH, generator=g, device="cuda").bfloat16()
    out["fwd_two_mm_ms"] = time_ms(lambda: (x_ext @ w_gate.t(), x_ext @ w_up.t()), **TIMING)
    out["fwd_stacked_mm_ms"] = time_ms(lambda: x_ext @ w_pair.t(), **TIMING)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
