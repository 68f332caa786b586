"""Timing device work honestly: warm-up, many repeats, device-side events, median and spread.

On CUDA every repeat is bracketed by CUDA events and the host synchronises once at the end, so launch
overhead and host jitter stay out of the numbers (nccl-tests, mamf-finder do the same). On CPU, perf_counter
around each call is the best clock there is.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    samples_s: list[float]
    median_s: float
    min_s: float
    max_s: float
    mean_s: float
    # Coefficient of variation (stdev / mean); nccl-tests' analyzer warns above 0.05.
    cv: float

    @classmethod
    def of(cls, samples_s: list[float]) -> Timing:
        if not samples_s:
            raise ValueError("no timing samples")
        mean = statistics.fmean(samples_s)
        stdev = statistics.pstdev(samples_s) if len(samples_s) > 1 else 0.0
        return cls(
            samples_s=samples_s,
            median_s=statistics.median(samples_s),
            min_s=min(samples_s),
            max_s=max(samples_s),
            mean_s=mean,
            cv=stdev / mean if mean > 0 else 0.0,
        )

    def summary(self) -> dict[str, float]:
        """The spread without the raw samples, for report details."""
        return {
            "median_s": self.median_s,
            "min_s": self.min_s,
            "max_s": self.max_s,
            "mean_s": self.mean_s,
            "cv": round(self.cv, 4),
            "repeats": len(self.samples_s),
        }


def time_repeats(fn: Callable[[int], object], device: torch.device, warmup: int, repeats: int) -> Timing:
    """Call fn(i) warmup times untimed, then repeats times timed; i lets fn rotate its buffers."""
    for i in range(warmup):
        fn(i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for i in range(repeats):
            starts[i].record()
            fn(warmup + i)
            ends[i].record()
        torch.cuda.synchronize(device)
        return Timing.of([s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)])
    samples = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(warmup + i)
        samples.append(time.perf_counter() - t0)
    return Timing.of(samples)
