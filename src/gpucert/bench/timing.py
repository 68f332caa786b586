"""Timing device work honestly: warm-up, many repeats, device-side events, median and spread.

Two ways. `time_repeats` brackets every call with its own pair of CUDA events (mamf-finder): right for work
that keeps the GPU busy for a millisecond or more (a matmul, a 1 GiB copy, a training step). `time_batches`
brackets a batch of back-to-back calls with ONE pair of events and divides by the count (nccl-tests: time =
elapsed / iters): a call of a few microseconds on the GPU costs tens of microseconds of Python and launch, and
only a queue of many calls lets the GPU run them back to back, as an application's would. Either way the host
synchronises once at the end. On CPU, perf_counter around the same unit is the best clock there is.
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
            "cv": self.cv,
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


def time_batches(
    fn: Callable[[int], object],
    device: torch.device,
    warmup: int,
    iters: int,
    repeats: int,
    replay: Callable[[], object] | None = None,
) -> Timing:
    """Seconds per batch: warmup calls untimed, then `repeats` batches of `iters` back-to-back calls, each
    batch timed as a whole (divide by iters for one call).

    `replay`, when given, runs one whole batch at once (a CUDA graph of iters captured calls, nccl-tests -G)
    in place of iters calls of fn.
    """
    if iters < 1 or repeats < 1:
        raise ValueError(f"need iters >= 1 and repeats >= 1, found {iters} and {repeats}")
    for i in range(warmup):
        fn(i)
    calls = warmup

    def batch() -> None:
        nonlocal calls
        if replay is not None:
            replay()
            return
        for _ in range(iters):
            fn(calls)
            calls += 1

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for start, end in zip(starts, ends, strict=True):
            start.record()
            batch()
            end.record()
        torch.cuda.synchronize(device)
        return Timing.of([s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)])
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        batch()
        samples.append(time.perf_counter() - t0)
    return Timing.of(samples)


def iters_to_fill(call_s: float, batch_s: float, max_iters: int) -> int:
    """Calls per timed batch so that a batch lasts about batch_s: many for a call of microseconds (whose
    launch overhead would otherwise be timed), one for a call longer than the batch; at most max_iters."""
    if call_s <= 0:
        return max_iters
    return max(1, min(max_iters, round(batch_s / call_s)))
