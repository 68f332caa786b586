"""Issue 13 lever, measured before it was built (now `model.adapters_in_gemm`): the adapters in the frozen GEMM.

One Qwen2-7B MLP input side at 8,192 tokens (gate and up: 3,584 -> 18,944, LoRA r16 with one shared A, as
`model.fuse_projections` runs them), silu(gate) * up, forward and backward, compiled, two ways:

- plain (today): g = x @ Wg^T + s (xa_g @ Bg^T), u likewise: four 8,192 x 18,944 products written and read back
  before the SwiGLU, and in the backward d(xa) = dg @ Bg reads dg once more;
- ext: the frozen weights kept as [Wg | s Bg | 0] and [Wu | 0 | s Bu] (K = 3,584 + 2r) and the input as
  [x | xa]: one GEMM a projection gives base + adapter, and its input-gradient GEMM gives dx and d(xa) at once;
  only dB = s dg^T xa is left (a custom autograd function: no gradient for the frozen columns).

Prints the median time of each over 20 calls after 5, and how far ext's output and gradients are from plain's.
Run on the GPU: python tools/bench_lora_ext.py. Not part of gpucert.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

T, H, INTER, R, SCALE = 8192, 3584, 18944, 16, 2.0


class _ExtGateUp(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, xa: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, bg: Any, bu: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x_ext = torch.cat([x, xa.to(x.dtype)], dim=1)
        ctx.save_for_backward(xa, wg, wu)
        return x_ext @ wg.t(), x_ext @ wu.t()

    @staticmethod
    def backward(ctx: Any, dg: torch.Tensor, du: torch.Tensor) -> tuple[Any, ...]:
        xa, wg, wu = ctx.saved_tensors
        dx_ext = torch.addmm(dg @ wg, du, wu)
        xa16 = xa.to(dg.dtype)
        dbg = (dg.t() @ xa16[:, :R]).float() * SCALE
        dbu = (du.t() @ xa16[:, R:]).float() * SCALE
        return dx_ext[:, :H], dx_ext[:, H:].to(xa.dtype), None, None, dbg, dbu


def main() -> None:
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    wg = (torch.randn(INTER, H, device=dev) * 0.02).to(bf)
    wu = (torch.randn(INTER, H, device=dev) * 0.02).to(bf)
    a = (torch.randn(2 * R, H, device=dev) * 0.02).requires_grad_()
    bg = (torch.randn(INTER, R, device=dev) * 0.02).requires_grad_()
    bu = (torch.randn(INTER, R, device=dev) * 0.02).requires_grad_()
    wg_ext = torch.zeros(INTER, H + 2 * R, device=dev, dtype=bf)
    wu_ext = torch.zeros(INTER, H + 2 * R, device=dev, dtype=bf)
    wg_ext[:, :H], wu_ext[:, :H] = wg, wu
    x0 = torch.randn(T, H, device=dev).to(bf)
    dh = torch.randn(T, INTER, device=dev).to(bf)

    def plain(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=bf):
            xa = x @ a.t()
            g = x @ wg.t() + (xa[:, :R] @ bg.t()) * SCALE
            u = x @ wu.t() + (xa[:, R:] @ bu.t()) * SCALE
            return F.silu(g) * u

    def ext(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=bf):
            xa = x @ a.t()
        g, u = _ExtGateUp.apply(x, xa, wg_ext, wu_ext, bg, bu)
        return F.silu(g) * u

    def refresh() -> None:
        with torch.no_grad():  # the adapters' B into the frozen matrices' extra columns, once per step
            wg_ext[:, H : H + R] = (bg * SCALE).to(bf)
            wu_ext[:, H + R :] = (bu * SCALE).to(bf)

    results: dict[str, Any] = {}
    for name, fn in (("plain", torch.compile(plain)), ("ext", torch.compile(ext))):
        times = []
        for i in range(25):
            for p in (a, bg, bu):
                p.grad = None
            x = x0.clone().requires_grad_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if name == "ext":
                refresh()
            out = fn(x)
            out.backward(dh)
            end.record()
            torch.cuda.synchronize()
            if i >= 5:
                times.append(start.elapsed_time(end))
        results[name] = (out.detach(), x.grad, a.grad.clone(), bg.grad.clone(), bu.grad.clone())
        print(f"{name}: {sorted(times)[len(times) // 2]:.3f} ms forward + backward, one layer", flush=True)
    labels = ("out", "dx", "dA", "dBg", "dBu")
    for label, p, e in zip(labels, results["plain"], results["ext"], strict=True):
        off = float((e.float() - p.float()).norm() / p.float().norm())
        print(f"  ext vs plain {label}: {off:.2e} relative", flush=True)


if __name__ == "__main__":
    main()
