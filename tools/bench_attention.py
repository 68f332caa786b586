"""Issue 13 lever, measured before it is built: FlashAttention-3 against the cuDNN kernels SDPA picks on Hopper.

The bf16 step (Qwen2-7B, 4096-token rows, micro-batch 2) spends 52 ms a step in attention: cuDNN's flash forward
at ~505 TFLOP/s, its backward at ~446, and 5.6 ms of helper kernels (docs/OPTIMIZATION.md, round six). This
times one layer's attention as the model runs it (q 28 heads, k/v 4 heads, head dim 128, causal, bf16), forward
with the inputs needing gradients, and forward + backward:
- sdpa-cudnn: torch's SDPA on (B, H, S, D) views with enable_gqa, cuDNN backend only (what transformers' sdpa
  path runs here);
- fa3: flash_attn_interface.flash_attn_func on (B, S, H, D), if importable (built by tools/device_fa3.sh).
It also checks each against an fp32 reference on a smaller size, and times one frozen GEMM shape of the step
sustained for a few seconds with the GPU's clock and power read by NVML, to see whether the card slows under
load (steps right after a pause run 4-5 % faster than the steady ones).
Writes JSON to argv[1] (default attention.json). Not part of gpucert.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D, S = 28, 4, 128, 4096


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        try:
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
        except RuntimeError:  # a cuDNN without GQA: k and v repeated, as transformers' repeat_kv does
            kt, vt = kt.repeat_interleave(HQ // HKV, 1), vt.repeat_interleave(HQ // HKV, 1)
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    return out.transpose(1, 2)


def fa3_fn() -> Any:
    try:
        from flash_attn_interface import flash_attn_func
    except ImportError as exc:
        print(f"fa3: not importable ({exc})")
        return None

    def fa3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = flash_attn_func(q, k, v, causal=True)
        return out[0] if isinstance(out, tuple) else out

    return fa3


def inputs(b: int, s: int, grad: bool = True) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, s, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, s, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    do = torch.randn(b, s, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return q.requires_grad_(grad), k.requires_grad_(grad), v.requires_grad_(grad), do


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rep = HQ // HKV
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    kf, vf = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(qf, kf, vf, is_causal=True).transpose(1, 2)


def errors(fn: Any) -> dict[str, float]:
    q, k, v, do = inputs(1, 1024)
    out = fn(q, k, v)
    out.backward(do)
    got = [out.detach().float()] + [t.grad.float() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref_out = reference(q, k, v)
    ref_out.backward(do.float())
    want = [ref_out.detach()] + [t.grad.float() for t in (q, k, v)]
    return {
        name: float((a - b).norm() / b.norm()) for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True)
    }


def timings(fn: Any, b: int) -> dict[str, float]:
    q, k, v, do = inputs(b, S)

    def fwd() -> None:
        fn(q, k, v)

    def fwd_bwd() -> None:  # autograd.grad: no accumulation into .grad timed with it
        torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    f_ms = triton.testing.do_bench(fwd, warmup=100, rep=500, return_mode="median")
    fb_ms = triton.testing.do_bench(fwd_bwd, warmup=100, rep=1000, return_mode="median")
    fwd_flop = 4 * b * S * S * HQ * D / 2  # causal: half the score matrix
    return {
        "fwd_ms": f_ms,
        "bwd_ms": fb_ms - f_ms,
        "fwd_tflops": fwd_flop / f_ms / 1e9,
        "bwd_tflops": 2.5 * fwd_flop / (fb_ms - f_ms) / 1e9,
        "step_ms_28_layers": 28 * fb_ms,
    }


def sustained_gemm(seconds: float = 6.0) -> dict[str, Any]:
    """gate/up's forward GEMM of the step, back to back: TFLOP/s, SM clock and power per half second."""
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    a = torch.randn(8192, 3616, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3616, 18944, device="cuda", dtype=torch.bfloat16)
    flop = 2 * 8192 * 3616 * 18944
    torch.cuda.synchronize()
    time.sleep(2.0)  # start from an idle card
    samples = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(200):
            torch.mm(a, b)
        e1.record()
        e1.synchronize()
        ms = e0.elapsed_time(e1) / 200
        samples.append(
            {
                "tflops": round(flop / ms / 1e9, 1),
                "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "power_w": round(pynvml.nvmlDeviceGetPowerUsage(h) / 1000, 1),
                "reasons": hex(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)),
                "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            }
        )
    return {"shape": "[8192, 3616] @ [3616, 18944]", "per_200_gemms": samples}


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "attention.json"
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    result["cudnn"] = torch.backends.cudnn.version()
    fns = {"sdpa-cudnn": sdpa}
    fa3 = fa3_fn()
    if fa3 is not None:
        fns["fa3"] = fa3
    for name, fn in fns.items():
        result[name] = {"errors_vs_fp32": errors(fn)}
        for b in (2, 3):
            result[name][f"micro_batch_{b}"] = timings(fn, b)
        print(name, json.dumps(result[name], indent=1), flush=True)
    result["sustained_gemm"] = sustained_gemm()
    print(json.dumps(result["sustained_gemm"]), flush=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
