"""Sustained load on every GPU at once (the burn phase): throughput over time, judged by its median window.

Every GPU (one process each, all at once) multiplies large matrices back to back for bench.burn.duration_s and
records TFLOP/s per window of about bench.burn.window_s, timed with CUDA events (perf_counter on CPU). A GPU is
judged by its median window: against the node's best GPU (gpu-fryer's rule, the profile's
matmul_node_deviation_pct) and the profile's burn_bf16_tflops_min. The matmul benchmark's best of many tries
hides a GPU that is slow most of the time (one sharing with another process reached 760 TFLOP/s at best and
262 most of the time); a median does not.

Beside each GPU's windows: its SM clock, power, temperature and clock-event (throttle) reasons, sampled from
NVML by the rank itself, and the silent-data-corruption check: every GPU multiplies the same seeded inputs
before and after the load (sha256 of the products); a GPU whose bits changed under load, or differ from what
most GPUs computed, FAILs by name.

Run: `gpucert bench burn --duration 10m` (a burn-in; 90s, 10m, 1h); `gpucert accept` runs it for 30 s after
the matmul benchmark. Read: `burn.<dtype>` per GPU (median, peak, the share of windows below the bar; the
windows and NVML series in details) and `burn.sdc` per GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any, Protocol

import torch

from gpucert.bench.matmul import float32_math, make_operands, matmul_fn, operand_count
from gpucert.config.profiles import Profile
from gpucert.config.run import BurnBenchConfig
from gpucert.hardware.gpus import CLOCK_EVENT_REASONS
from gpucert.hardware.nvml import CLOCK_SM, TEMPERATURE_GPU, load_pynvml
from gpucert.report.numbers import sig
from gpucert.report.schema import Result
from gpucert.runtime.group import Runtime, gather_to_main, rank_row
from gpucert.runtime.identity import row_identity
from gpucert.status import Status
from gpucert.vote import majority_vote

# NVML is asked this often; a 30 s burn gets ~150 samples per GPU.
SAMPLE_INTERVAL_S = 0.2
# Windows and samples kept in a report's details; longer burns are thinned (a 1 h burn has 3,600 windows).
MAX_SERIES = 600
# Calibration doubles the steps of a timed batch until it lasts this share of a window.
CALIBRATE_SHARE = 0.1
# Clock-event reasons that say something is wrong with a loaded GPU (HW slowdown, SW/HW thermal, power brake):
# a FAIL names them. The SW power cap is not one: a healthy H200 under this load sits at its 700 W cap in 99 % of
# samples (lent 2xH200, 2026-11-22), so it is shown beside the power reading instead.
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80
SW_POWER_CAP = 0x4
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}


class LoadClock(Protocol):
    """Where the load's time comes from: CUDA events on a GPU, perf_counter on CPU, simulated time in tests."""

    def now(self) -> float:
        """Host seconds: when to stop issuing work."""
        ...

    def mark(self) -> Any:
        """A point in the device's work after everything issued so far."""
        ...

    def seconds(self, start: Any, end: Any) -> float:
        """Device seconds between two marks; waits until end is reached."""
        ...


class CudaClock:
    def now(self) -> float:
        return time.monotonic()

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3


class CpuClock:
    """A CPU matmul has finished when the call returns, so the host clock is the device clock."""

    def now(self) -> float:
        return time.perf_counter()

    def mark(self) -> Any:
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        return float(end - start)


# Collect


def calibrate(step: Callable[[int], object], clock: LoadClock, window_s: float) -> float:
    """Seconds per step, from a batch long enough to time (the first, untimed call pays for cuBLAS's set-up)."""
    clock.seconds(clock.mark(), _issue(step, 0, 1, clock))
    n, done = 1, 1
    while True:
        start = clock.mark()
        end = _issue(step, done, n, clock)
        elapsed = clock.seconds(start, end)
        done += n
        if elapsed >= CALIBRATE_SHARE * window_s or n >= 1 << 20:
            return max(elapsed, 1e-9) / n
        n *= 2


def _issue(step: Callable[[int], object], first: int, count: int, clock: LoadClock) -> Any:
    for i in range(first, first + count):
        step(i)
    return clock.mark()


def run_windows(
    step: Callable[[int], object], clock: LoadClock, duration_s: float, window_s: float, flop_per_step: float
) -> list[dict[str, float]]:
    """Call step(i) back to back for duration_s, timed in windows of about window_s: each window's start (seconds
    from the first), length, steps and TFLOP/s. The device never waits for the host: while one window runs, the
    host reads the one before it and issues the next, resizing windows as the GPU speeds up or slows down."""
    steps = max(1, round(window_s / calibrate(step, clock, window_s)))
    marks: list[Any] = [clock.mark()]
    counts: list[int] = []
    windows: list[dict[str, float]] = []
    t, i = 0.0, 0

    def read(k: int) -> None:
        nonlocal t, steps
        elapsed = max(clock.seconds(marks[k], marks[k + 1]), 1e-9)
        tflops = flop_per_step * counts[k] / elapsed / 1e12
        windows.append({"t_s": round(t, 3), "s": elapsed, "steps": counts[k], "tflops": tflops})
        t += elapsed
        steps = max(1, round(counts[k] * window_s / elapsed))

    end = clock.now() + duration_s
    while clock.now() < end:
        marks.append(_issue(step, i, steps, clock))
        counts.append(steps)
        i += steps
        if len(counts) >= 2:
            read(len(counts) - 2)
    if counts:
        read(len(counts) - 1)
    return windows


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    """Deterministic kernels for the checksum matmuls, and one CPU thread (a CPU matmul's blocking follows the
    thread count, which ranks started by another launcher may not share); torch's settings come back afterwards."""
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


def result_digest(step: Callable[[int], Any], count: int) -> str:
    """sha256 of the products of the count seeded operand pairs: identical on every healthy GPU of one model."""
    digest = hashlib.sha256()
    with _deterministic():
        for i in range(count):
            digest.update(step(i).contiguous().view(torch.uint8).cpu().numpy())
    return digest.hexdigest()[:16]


class GpuSampler:
    """One GPU's SM clock, power, temperature and clock-event reasons every interval_s, on a daemon thread."""

    def __init__(self, api: Any, handle: Any, interval_s: float = SAMPLE_INTERVAL_S):
        self.api, self.handle, self.interval_s = api, handle, interval_s
        self.series: dict[str, list[Any]] = {
            "t_s": [],
            "sm_clock_mhz": [],
            "power_w": [],
            "temperature_c": [],
            "clock_events": [],
        }
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpucert-burn-telemetry", daemon=True)

    def start(self) -> GpuSampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            power = self._ask("nvmlDeviceGetPowerUsage")
            self.series["t_s"].append(round(time.monotonic() - self._t0, 3))
            self.series["sm_clock_mhz"].append(self._ask("nvmlDeviceGetClockInfo", CLOCK_SM))
            self.series["power_w"].append(None if power is None else power / 1000)
            self.series["temperature_c"].append(self._ask("nvmlDeviceGetTemperature", TEMPERATURE_GPU))
            self.series["clock_events"].append(self._ask("nvmlDeviceGetCurrentClocksEventReasons"))
            self._stop.wait(self.interval_s)

    def _ask(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.api, fn)(self.handle, *args)
        except Exception:  # a missed sample is a gap in the series, not a failed benchmark
            return None

    def stop(self) -> dict[str, list[Any]]:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self.api.nvmlShutdown()
        return self.series


def start_sampler(env: Runtime) -> tuple[GpuSampler | None, str | None]:
    """This rank's GPU sampler, found by UUID (CUDA and NVML may number GPUs differently), or why there is none."""
    if env.device.type != "cuda":
        return None, "no GPU telemetry on a CPU rank"
    if env.me.gpu_uuid is None:
        return None, "the GPU's UUID is unknown, so NVML cannot be matched to it"
    try:
        api = load_pynvml()
        api.nvmlInit()
        handle = api.nvmlDeviceGetHandleByUUID(env.me.gpu_uuid)
    except Exception as exc:  # no NVML in this container: the burn still runs and says why the series are missing
        return None, f"NVML could not be read: {type(exc).__name__}: {exc}"
    return GpuSampler(api, handle).start(), None


def _support(dtype: str, device: torch.device) -> str | None:
    if device.type != "cuda" and dtype != "fp32":
        return f"a {dtype} burn is a GPU measurement (CPU ranks run fp32: --set bench.burn.dtype=fp32)"
    return None


def measure(env: Runtime, cfg: dict[str, Any]) -> dict[str, Any] | None:
    config = BurnBenchConfig(**cfg)
    device, dtype, n = env.device, config.dtype, config.size
    mine: dict[str, Any] = {**rank_row(env), "dtype": dtype, "size": n}
    why = _support(dtype, device)
    if why:
        mine["skipped"] = why
    else:
        # cuBLAS is deterministic only with a fixed workspace (read when its first handle is made, in this
        # process: the burn is a worker's first matmul); use_deterministic_algorithms refuses matmuls without it.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        operands = make_operands(dtype, n, n, n, device, operand_count(dtype, n, n, n))
        step = matmul_fn(dtype, operands)
        clock: LoadClock = CudaClock() if device.type == "cuda" else CpuClock()
        with float32_math(dtype):
            cold = result_digest(step, len(operands)) if config.sdc_check else None
            sampler, mine["telemetry_note"] = start_sampler(env)
            try:
                mine["windows"] = run_windows(step, clock, config.duration_s, config.window_s, 2.0 * n**3)
            finally:
                mine["telemetry"] = sampler.stop() if sampler else None
            hot = result_digest(step, len(operands)) if config.sdc_check else None
        mine["sdc"] = {"cold": cold, "hot": hot} if config.sdc_check else None
        del operands
    ranks = gather_to_main(env, mine)
    return None if ranks is None else {"ranks": ranks, "config": asdict(config)}


# Parse


def summarize_windows(windows: list[dict[str, float]]) -> dict[str, float]:
    values = [w["tflops"] for w in windows]
    return {
        "median_tflops": statistics.median(values),
        "peak_tflops": max(values),
        "lowest_tflops": min(values),
        "windows": len(values),
        "seconds": sum(w["s"] for w in windows),
    }


def reason_shares(clock_events: list[int | None], bits: int) -> dict[str, float]:
    """Each clock-event reason of bits seen, with the % of samples it was active in (most frequent first)."""
    masks = [m for m in clock_events if m is not None]
    shares = {
        name: 100 * sum(1 for m in masks if m & bit) / len(masks)
        for bit, name in CLOCK_EVENT_REASONS.items()
        if bit & bits and any(m & bit for m in masks)
    }
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))


def summarize_telemetry(series: dict[str, list[Any]]) -> dict[str, Any]:
    def present(key: str) -> list[float]:
        return [v for v in series[key] if v is not None]

    clocks, power, temps = present("sm_clock_mhz"), present("power_w"), present("temperature_c")
    return {
        "samples": len(series["t_s"]),
        "sm_clock_mhz_median": statistics.median(clocks) if clocks else None,
        "sm_clock_mhz_min": min(clocks, default=None),
        "power_w_median": statistics.median(power) if power else None,
        "power_w_max": max(power, default=None),
        "temperature_c_max": max(temps, default=None),
        "throttle_pct": {
            name: round(pct, 1) for name, pct in reason_shares(series["clock_events"], THROTTLE_BITS).items()
        },
        "power_cap_pct": round(sum(reason_shares(series["clock_events"], SW_POWER_CAP).values()), 1),
    }


def thin(items: list[Any]) -> list[Any]:
    return items[:: max(1, -(-len(items) // MAX_SERIES))]


# Judge


def judge(data: dict[str, Any], profile: Profile, cfg: BurnBenchConfig | None) -> list[Result]:
    del cfg
    ranks = data["ranks"]
    measured = [r for r in ranks if r.get("windows")]
    medians = {r["rank"]: summarize_windows(r["windows"])["median_tflops"] for r in measured}
    by_node: dict[str | None, list[float]] = {}
    for r in measured:
        by_node.setdefault(row_identity(r)[2], []).append(medians[r["rank"]])
    # gpu-fryer holds each GPU to the node's best; a node of one GPU has no best but itself.
    node_best = {node: max(values) for node, values in by_node.items() if len(values) >= 2}
    results = [_judge_rank(r, profile, node_best.get(row_identity(r)[2])) for r in ranks]
    return results + judge_sdc(ranks)


def _telemetry_words(summary: dict[str, Any] | None) -> str:
    if not summary or not summary["samples"]:
        return ""
    parts = []
    if summary["sm_clock_mhz_median"] is not None:
        parts.append(f"SM clock median {sig(summary['sm_clock_mhz_median'])} MHz (min {summary['sm_clock_mhz_min']})")
    if summary["power_w_median"] is not None:
        cap = f" (at the power cap in {summary['power_cap_pct']:g} % of samples)" if summary["power_cap_pct"] else ""
        parts.append(f"power median {sig(summary['power_w_median'])} W{cap}")
    if summary["temperature_c_max"] is not None:
        parts.append(f"max {summary['temperature_c_max']:g} C")
    return ", ".join(parts)


def _throttle_words(summary: dict[str, Any] | None) -> str:
    if not summary or not summary["throttle_pct"]:
        return ""
    return ", ".join(f"{name} ({pct:g} % of samples)" for name, pct in summary["throttle_pct"].items())


def _judge_rank(rank: dict[str, Any], profile: Profile, best: float | None) -> Result:
    subject, gpu, node = row_identity(rank)
    dtype = rank["dtype"]
    base: dict[str, Any] = dict(
        name=f"burn.{dtype}", subject=subject, category="benchmark", gpu_index=gpu, node=node, unit="TFLOP/s"
    )
    if rank.get("skipped"):
        return Result(**base, status=Status.SKIP, message=rank["skipped"])
    if not rank.get("windows"):
        return Result(
            **base,
            status=Status.ERROR,
            message=f"no burn window finished on {subject}, so nothing was measured",
            remediation="raise bench.burn.duration_s to several bench.burn.window_s",
        )
    summary = summarize_windows(rank["windows"])
    median, peak = summary["median_tflops"], summary["peak_tflops"]
    floors = profile.benchmarks
    floor = floors.burn_bf16_tflops_min if dtype == "bf16" else None
    pct = floors.matmul_node_deviation_pct
    bars, expected, sources, problems, unjudged = [], [], [], [], []
    if floor is not None:
        bars.append(floor)
        expected.append(f"median >= {floor:g}")
        sources.append(f"profile {profile.name}: benchmarks.burn_bf16_tflops_min")
        if median < floor:
            problems.append(f"below the {floor:g} TFLOP/s floor")
    else:
        unjudged.append(f"profile {profile.name} sets no burn floor for {dtype} (benchmarks.burn_bf16_tflops_min)")
    if pct is None:
        unjudged.append(f"profile {profile.name} turns the node rule off (matmul_node_deviation_pct: null)")
    elif best is None:
        unjudged.append(f"no other GPU on {node or 'this node'} to compare with")
    else:
        allowed = best * (1 - pct / 100)
        bars.append(allowed)
        expected.append(f"median within {pct:g} % of the node's best {sig(best)} (>= {sig(allowed)})")
        sources.append(f"profile {profile.name}: benchmarks.matmul_node_deviation_pct")
        if median < allowed:
            # First: how far from its peers says more than the floor does.
            problems.insert(0, f"{sig(100 * (1 - median / best))} % below the node's best {sig(best)}")
    telemetry = summarize_telemetry(rank["telemetry"]) if rank.get("telemetry") else None
    bar = max(bars, default=None)
    below = None if bar is None else 100 * sum(w["tflops"] < bar for w in rank["windows"]) / len(rank["windows"])
    details = {
        **summary,
        "bar_tflops": bar,
        "windows_below_bar_pct": None if below is None else round(below, 1),
        "node_best_median_tflops": best,
        "telemetry_summary": telemetry,
        "telemetry_note": rank.get("telemetry_note"),
        "series": {
            "windows": thin(rank["windows"]),
            "telemetry": {k: thin(v) for k, v in rank["telemetry"].items()} if rank.get("telemetry") else None,
        },
    }
    measured = f"median {sig(median)} TFLOP/s over {sig(summary['seconds'])} s"
    spread = f"peak {sig(peak)}" + (
        "" if below is None or bar is None else f", {sig(below)} % of windows below {sig(bar)}"
    )
    throttle, readings = _throttle_words(telemetry), _telemetry_words(telemetry)
    if problems:
        message = f"{subject}: {measured}, {', '.join(problems)}; {spread}"
        message += f"; clocks held back by {throttle}" if throttle else ""
        message += f"; {readings}" if readings else ""
        return Result(
            **base,
            status=Status.FAIL,
            value=median,
            expected="; ".join(expected),
            threshold_source="; ".join(sources),
            message=message,
            remediation=f"clocks were held back ({throttle}): check cooling, power delivery and power caps"
            if throttle
            else "look for another process on this GPU (nvidia-smi), compare its clocks and power with its peers; "
            "reseat or RMA a GPU that stays slow under load",
            details=details,
        )
    message = f"{measured} ({spread})" + (f"; {readings}" if readings else "")
    if not expected:
        return Result(
            **base,
            status=Status.INFO,
            value=median,
            message=f"{message}; not judged: {'; '.join(unjudged)}",
            details=details,
        )
    return Result(
        **base,
        status=Status.PASS,
        value=median,
        expected="; ".join(expected),
        threshold_source="; ".join(sources),
        message=message + (f"; throttle reasons seen: {throttle}" if throttle else ""),
        details=details,
    )


def judge_sdc(ranks: list[dict[str, Any]]) -> list[Result]:
    """Per GPU: its bits after the load against its own before it, and against the majority of the GPUs."""
    checked = [r for r in ranks if r.get("sdc")]
    if not checked:
        return []
    subjects = {r["rank"]: row_identity(r)[0] for r in checked}
    vote = majority_vote({r["rank"]: r["sdc"]["hot"] for r in checked})
    results = []
    for rank in checked:
        subject, gpu, node = row_identity(rank)
        cold, hot = rank["sdc"]["cold"], rank["sdc"]["hot"]
        base: dict[str, Any] = dict(
            name="burn.sdc",
            subject=subject,
            category="benchmark",
            gpu_index=gpu,
            node=node,
            expected="the same result bits before and after the load, and as the other GPUs",
            details={"cold": cold, "hot": hot, "majority": vote.majority, "gpus": vote.voters},
        )
        problems = []
        if cold != hot:
            problems.append(f"{subject} computed different bits after the load ({hot}) than before it ({cold})")
        if rank["rank"] in vote.odd and vote.undecided:
            others = ", ".join(subjects[k] for k in vote.odd if k != rank["rank"])
            problems.append(
                f"{subject} and {others} computed different results for the same inputs and no result has a "
                f"majority of the {vote.voters} GPUs: cannot tell which is wrong"
            )
        elif rank["rank"] in vote.odd:
            agreeing = vote.voters - len(vote.odd)
            which = f"the other {agreeing}" if len(vote.odd) == 1 else f"{agreeing} of the {vote.voters}"
            problems.append(f"{subject} computed a different result from {which} GPUs for the same inputs")
        if problems:
            results.append(
                Result(
                    **base,
                    status=Status.FAIL,
                    message="; ".join(problems) + ": possible silent data corruption",
                    remediation="re-run; a GPU that computes wrong twice should be drained and tested with "
                    "dcgmi diag -r 3",
                )
            )
            continue
        agree = vote.voters - len(vote.odd) - 1
        peers = (
            f", as {agree} other GPU{'s' if agree != 1 else ''}"
            if vote.voters > 1
            else " (no other GPU to compare with: checked against itself only)"
        )
        results.append(Result(**base, status=Status.PASS, message=f"same result bits before and after the load{peers}"))
    return results
