"""GPU liveness: prove every GPU computes correctly, in a child process that can be killed if a GPU hangs.

Each GPU multiplies the same seeded random fp32 matrices (TF32 off) and is compared with a float64 CPU
reference; the results of all GPUs must also be bit-identical, since identical inputs on identical hardware
and libraries give identical bits (Imbue's cross-GPU check, a cheap silent-data-corruption screen). A GPU whose
bits differ from the majority's FAILs by name and the rest PASS; with no majority (two GPUs that disagree) every
one that disagrees FAILs, since nobody can tell which is wrong (gpucert.vote).

Run directly for debugging: `python -m gpucert.health.liveness` prints one JSON list, a row per CUDA GPU.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Protocol

MATRIX_SIZE = 1024
# fp32 accumulation of 1024 products of N(0,1) numbers: relative error stays near 1e-6; 1e-3 is a broken GPU.
MAX_RELATIVE_ERROR = 1e-3


@dataclass(frozen=True)
class LivenessResult:
    # CUDA's device index in the child and the GPU's UUID ("GPU-..."), which is how NVML's GPUs are matched:
    # CUDA and NVML may number GPUs differently (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES).
    index: int
    uuid: str
    ok: bool
    max_relative_error: float | None
    digest: str | None
    duration_ms: float | None
    error: str | None = None


class LivenessProbe(Protocol):
    def run(self, timeout_s: float) -> list[LivenessResult]: ...


def check_devices() -> list[LivenessResult]:
    """In-process check (the child side). Imports torch here so the CLI starts fast without it."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    generator = torch.Generator().manual_seed(1234)
    a = torch.randn(MATRIX_SIZE, MATRIX_SIZE, generator=generator)
    b = torch.randn(MATRIX_SIZE, MATRIX_SIZE, generator=generator)
    reference = (a.double() @ b.double()).float()
    scale = reference.abs().max().item()
    results = []
    for index in range(torch.cuda.device_count()):
        uuid = f"GPU-{torch.cuda.get_device_properties(index).uuid}"
        try:
            device = torch.device("cuda", index)
            start = time.perf_counter()
            out = (a.to(device) @ b.to(device)).cpu()
            duration_ms = (time.perf_counter() - start) * 1e3
            error = ((out - reference).abs().max().item()) / scale
            results.append(
                LivenessResult(
                    index=index,
                    uuid=uuid,
                    ok=bool(error < MAX_RELATIVE_ERROR) and bool(torch.isfinite(out).all()),
                    max_relative_error=error,
                    digest=hashlib.sha256(bytes(out.contiguous().untyped_storage())).hexdigest()[:16],
                    duration_ms=round(duration_ms, 2),
                )
            )
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            results.append(LivenessResult(index, uuid, False, None, None, None, error=why))
    return results


class SubprocessLivenessProbe:
    """The real probe: a child python per run, so a hung GPU costs a timeout, not the whole health run."""

    def run(self, timeout_s: float) -> list[LivenessResult]:
        argv = [sys.executable, "-m", "gpucert.health.liveness"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise LivenessError(f"no answer within {timeout_s:.0f} s: a GPU may be hung", hung=True) from None
        try:
            rows = json.loads(done.stdout.strip().splitlines()[-1])
            return [LivenessResult(**row) for row in rows]
        except (IndexError, ValueError, TypeError):
            raise LivenessError(f"liveness child exited {done.returncode}: {done.stderr.strip()[-300:]}") from None


class LivenessError(RuntimeError):
    """The probe gave no per-GPU answer: it hung (a hardware symptom) or crashed (no torch, broken CUDA)."""

    def __init__(self, message: str, hung: bool = False):
        super().__init__(message)
        self.hung = hung


def main(argv: list[str]) -> int:
    del argv
    results = check_devices()
    print(json.dumps([r.__dict__ for r in results]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
