"""`gpucert.finetune.train` with two knobs for speed work on the lent GPU (issue 13), without touching the loop.

    PROFILE_STEP=8 PROFILE_OUT=$OUT/prof.txt SDPA_BACKEND=cudnn \
      torchrun --standalone --nproc-per-node=1 tools/profile_finetune.py CONFIG --set ...

PROFILE_STEP: profile that step (counted in this process) with torch.profiler and write the kernels sorted by
device time, plus their share per kind (GEMM, attention, elementwise/fused, NCCL, other), to PROFILE_OUT.
SDPA_BACKEND (flash | efficient | cudnn | math): leave only that SDPA backend enabled, to measure one
attention kernel against another on the same step. Both are read here, never by gpucert itself.
"""

from __future__ import annotations

import os
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

import gpucert.finetune.train as train_module

KINDS = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn.*(sdp|mha)|flex", re.I)),
    ("gemm", re.compile(r"gemm|sm90_xmma|cutlass|nvjet|matmul|_mm_|cublas", re.I)),
    ("nccl", re.compile(r"nccl", re.I)),
    ("triton (compiled elementwise, norms, loss)", re.compile(r"triton", re.I)),
    ("optimizer", re.compile(r"multi_tensor|adam", re.I)),
)


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def write_profile(prof: Any, path: Path) -> None:
    events = [e for e in prof.key_averages() if e.device_time_total > 0 and e.device_type.name == "CUDA"]
    total = sum(e.device_time_total for e in events) or 1.0
    by_kind: dict[str, float] = defaultdict(float)
    for e in events:
        by_kind[kind_of(e.key)] += e.device_time_total
    lines = [f"device time in kernels: {total / 1e3:.1f} ms", ""]
    for kind, t in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"{kind:45s} {t / 1e3:9.1f} ms {100 * t / total:5.1f} %")
    lines += ["", f"{'ms':>9} {'%':>5} {'calls':>6}  kernel"]
    for e in sorted(events, key=lambda e: -e.device_time_total)[:60]:
        share = 100 * e.device_time_total / total
        lines.append(f"{e.device_time_total / 1e3:9.2f} {share:5.1f} {e.count:6d}  {e.key[:160]}")
    path.write_text("\n".join(lines) + "\n")


def choose_sdpa_backend(name: str) -> None:
    flags = {
        "flash": torch.backends.cuda.enable_flash_sdp,
        "efficient": torch.backends.cuda.enable_mem_efficient_sdp,
        "cudnn": torch.backends.cuda.enable_cudnn_sdp,
        "math": torch.backends.cuda.enable_math_sdp,
    }
    if name not in flags:
        raise SystemExit(f"SDPA_BACKEND: expected one of {', '.join(flags)}, found {name!r}")
    for backend, enable in flags.items():
        enable(backend == name)


def main() -> int:
    if os.environ.get("SDPA_BACKEND"):
        choose_sdpa_backend(os.environ["SDPA_BACKEND"])
    at = int(os.environ.get("PROFILE_STEP", "0"))
    out = Path(os.environ.get("PROFILE_OUT", "profile.txt"))
    plain_step = train_module.train_step
    calls = {"n": 0}

    def step(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] != at:
            return plain_step(*args, **kwargs)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            stats = plain_step(*args, **kwargs)
            torch.cuda.synchronize()
        if int(os.environ.get("RANK", "0")) == 0:
            write_profile(prof, out)
        return stats

    train_module.train_step = step  # type: ignore[assignment]
    return train_module.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
