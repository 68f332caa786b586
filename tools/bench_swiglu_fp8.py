"""Issue 31 part 5: the FP8 MLP's kernels (finetune/model/kernels/swiglu_fp8.py) at Qwen2-7B's micro-batch 2 (8,192
tokens, 18,944 intermediate, r16), at several tilings, and one whole MLP forward and backward fused (fp8_mlp.py)
against PEFT's projections one by one, both compiled, with each variant's kernels from torch.profiler.

Prints JSON on its last line: each tiling's time in ms and the bandwidth of its compulsory traffic (forward: gate
and up read, h written in bf16, then read and written in FP8; backward: gate, up, dh read, dgate and dup written
in bf16, then read and written in FP8), the MLP's times, and the top kernels of each MLP variant. Run on the GPU:
python tools/bench_swiglu_fp8.py. On a CPU, tests/finetune/test_swiglu_fp8_kernel.py runs the kernels in
Triton's interpreter.
"""

from __future__ import annotations

import copy
import json
import sys

import torch
from bench_loss_chunk import time_ms  # tools/ is on the path when run as a script

from gpucert.finetune.model.kernels import swiglu_fp8

M, N, R = 8192, 18_944, 16
# Each kernel's tilings, as kernels/swiglu_fp8.py's FWD_TILING, HQ_TILING, BWD_TILING and QUANT_TILING read them.
# Tiles of 64 x 64 with 4 warps put a warp on 16 whole rows (2026-11-29: 0.52 ms against 0.70 for 32 x 128).
FWD = [
    (64, 64, 1024, 4, 3),
    (64, 64, 512, 4, 3),
    (64, 64, 2048, 4, 3),
    (64, 64, 1024, 4, 2),
    (64, 128, 1024, 4, 3),
    (32, 128, 1024, 4, 3),
]
HQ = [(32, 256, 4), (64, 256, 8), (16, 512, 4), (32, 128, 4)]
BWD = [
    (1024, 64, 64, 4, 3),
    (512, 64, 64, 4, 3),
    (2048, 64, 64, 4, 3),
    (1024, 64, 64, 4, 2),
    (512, 32, 128, 4, 3),
]
QUANT = [(64, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 4), (32, 128, 4, 3), (128, 128, 8, 3)]


def inputs() -> tuple[torch.Tensor, ...]:
    def randn(*shape: int, std: float = 1.0) -> torch.Tensor:
        return (std * torch.randn(*shape, device="cuda")).to(torch.bfloat16)

    return (
        randn(M, N, std=2.0),
        randn(M, N),
        randn(M, N, std=1e-3),
        randn(M, 2 * R),
        randn(N, R, std=0.02),
        randn(N, R, std=0.02),
        randn(R, N, std=0.01),
        randn(M, R, std=1e-3),
    )


def kernels(calls: int, warmup: int) -> dict[str, object]:
    gate, up, dhb, xa, bg, bu, ad, dha = inputs()
    mb = M * N / 1e6
    out: dict[str, object] = {}
    for t in FWD:
        ms = time_ms(lambda t=t: swiglu_fp8.forward(gate, up, xa, bg, bu, ad, tiling=t), calls, warmup)
        out[f"forward {t}"] = {"ms": round(ms, 3), "GB/s": round((4 * 2 + 1) * mb / ms, 1)}
    for q in HQ:
        ms = time_ms(lambda q=q: swiglu_fp8.forward(gate, up, xa, bg, bu, ad, quant_tiling=q), calls, warmup)
        out[f"quantize-h {swiglu_fp8.FWD_TILING} {q}"] = {"ms": round(ms, 3)}
    for t in BWD:
        ms = time_ms(lambda t=t: swiglu_fp8.backward(gate, up, dhb, xa, bg, bu, ad, dha, tiling=t), calls, warmup)
        out[f"backward {t} quant {swiglu_fp8.QUANT_TILING}"] = {
            "ms": round(ms, 3),
            "GB/s": round((5 * 2 + 2 * 2 + 2) * mb / ms, 1),
        }
    for q in QUANT:
        ms = time_ms(lambda q=q: swiglu_fp8.backward(gate, up, dhb, xa, bg, bu, ad, dha, quant_tiling=q), calls, warmup)
        out[f"backward {swiglu_fp8.BWD_TILING} quant {q}"] = {"ms": round(ms, 3)}
    return out


def mlp(calls: int, warmup: int) -> dict[str, object]:
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from gpucert.finetune.model.fp8 import convert_frozen_linears
    from gpucert.finetune.model.fp8_mlp import fuse_fp8_mlps
    from gpucert.finetune.model.fused import fuse_projections

    shape = dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4)
    base = Qwen2ForCausalLM(Qwen2Config(**shape, num_hidden_layers=1, vocab_size=1024)).to("cuda", torch.bfloat16)
    targets = ["gate_proj", "up_proj", "down_proj"]
    peft = get_peft_model(base, PeftLoraConfig(r=R, lora_alpha=2 * R, target_modules=targets))
    fusion = fuse_projections(peft)
    convert_frozen_linears(peft)
    plain = copy.deepcopy(peft)
    fuse_fp8_mlps(peft, fusion)
    x = torch.randn(M, 3584, device="cuda").to(torch.bfloat16).requires_grad_()
    out: dict[str, object] = {}
    for name, model in (("unfused", plain), ("fused", peft)):
        layer = torch.compile(model.base_model.model.model.layers[0].mlp)

        def step(layer=layer) -> None:
            with torch.autocast("cuda", torch.bfloat16):
                layer(x).float().sum().backward()

        out[f"mlp {name} ms"] = round(time_ms(step, calls, warmup), 3)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        rows = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:14]
        out[f"mlp {name} kernels"] = [[e.key[:90], e.count, round(e.device_time_total / 1e3, 3)] for e in rows]
    return out


if __name__ == "__main__":
    calls, warmup = 20, 5
    which = sys.argv[1:] or ["kernels", "mlp"]
    found: dict[str, object] = {}
    if "kernels" in which:
        found.update(kernels(calls, warmup))
    if "mlp" in which:
        found.update(mlp(calls, warmup))
    for key, value in found.items():
        print(key, value)
    print(json.dumps(found))
