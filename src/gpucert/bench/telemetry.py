"""GPU telemetry sampled while a benchmark runs: SM clock, power, temperature, clock-event reasons.

The launcher samples NVML from a thread of the parent process while the workers measure, so the numbers
in the report sit next to the clocks and temperatures they were measured at (a throttling GPU explains a
low TFLOP/s; a cold GPU explains a suspiciously high one).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from gpucert.hardware.gpus import HW_SLOWDOWN_BITS, clock_event_names
from gpucert.hardware.nvml import CLOCK_SM, TEMPERATURE_GPU
from gpucert.report.numbers import sig
from gpucert.report.schema import Result
from gpucert.status import Status

# More samples than this are thinned for the report (a 15-minute run at 5 Hz would be 4,500 per GPU).
MAX_SAMPLES = 600


class TelemetrySampler:
    """Samples every GPU every interval_s on a daemon thread between start() and stop()."""

    def __init__(self, api: Any, interval_s: float = 0.2):
        self.api, self.interval_s = api, interval_s
        self.samples: dict[str, list[Any]] = {"t_s": []}
        self.gpus: dict[str, dict[str, list[Any]]] = {}
        # The first error of each NVML query that went unanswered: why a series has gaps (or is all gaps).
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> TelemetrySampler:
        self.api.nvmlInit()
        handles = [self.api.nvmlDeviceGetHandleByIndex(i) for i in range(self.api.nvmlDeviceGetCount())]
        self.gpus = {
            str(i): {"sm_clock_mhz": [], "power_w": [], "temperature_c": [], "clock_events": []}
            for i in range(len(handles))
        }
        t0 = time.monotonic()

        def loop() -> None:
            while not self._stop.is_set():
                self.samples["t_s"].append(round(time.monotonic() - t0, 3))
                for i, handle in enumerate(handles):
                    series = self.gpus[str(i)]
                    series["sm_clock_mhz"].append(self._ask("nvmlDeviceGetClockInfo", handle, CLOCK_SM))
                    power = self._ask("nvmlDeviceGetPowerUsage", handle)
                    series["power_w"].append(None if power is None else power / 1000)
                    series["temperature_c"].append(self._ask("nvmlDeviceGetTemperature", handle, TEMPERATURE_GPU))
                    series["clock_events"].append(self._ask("nvmlDeviceGetCurrentClocksEventReasons", handle))
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, name="gpucert-telemetry", daemon=True)
        self._thread.start()
        return self

    def _ask(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.api, fn)(*args)
        except Exception as exc:  # a missed sample is a gap in the plot; a series of nothing but gaps is judged
            self.errors.setdefault(fn, f"{type(exc).__name__}: {exc}")
            return None

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.api.nvmlShutdown()
        # Slowdown reasons of every raw sample, OR-ed before thinning: a one-sample HW slowdown must not be
        # dropped along with the samples the plots do not need.
        seen = {gpu: _or_all(series["clock_events"]) for gpu, series in self.gpus.items()}
        read = {gpu: sum(m is not None for m in series["clock_events"]) for gpu, series in self.gpus.items()}
        thinned = thin({"t_s": self.samples["t_s"], "gpus": self.gpus})
        for gpu, mask in seen.items():
            thinned["gpus"][gpu]["clock_events_seen"] = mask
            thinned["gpus"][gpu]["clock_events_read"] = read[gpu]
        thinned["samples"] = len(self.samples["t_s"])
        thinned["unreadable"] = dict(self.errors)
        return thinned


def _or_all(masks: list[int | None]) -> int:
    bits = 0
    for mask in masks:
        bits |= mask or 0
    return bits


def thin(series: dict[str, Any]) -> dict[str, Any]:
    n = len(series["t_s"])
    step = max(1, -(-n // MAX_SAMPLES))
    return {
        "t_s": series["t_s"][::step],
        "gpus": {gpu: {k: v[::step] for k, v in values.items()} for gpu, values in series["gpus"].items()},
    }


def _clock_events_read(series: dict[str, Any]) -> int:
    """Samples whose clock-event reasons NVML answered (counted before thinning where the sampler says)."""
    return int(series.get("clock_events_read", sum(m is not None for m in series["clock_events"])))


def _range(values: list[float], unit: str) -> str:
    return f"{sig(min(values))}-{sig(max(values))} {unit}" if values else "unreadable"


def judge_telemetry(benchmark: str, telemetry: dict[str, Any] | None, hostname: str) -> list[Result]:
    """FAIL when any GPU hit a hardware slowdown under load (gpu-fryer's rule); ERROR when a GPU's clock-event
    reasons could not be read at all (nothing was judged: never a PASS); the series go in details."""
    if not telemetry or not telemetry.get("gpus"):
        return []
    hot = {}
    for gpu, series in telemetry["gpus"].items():
        bits = series.get("clock_events_seen", _or_all(series["clock_events"]))
        if bits & HW_SLOWDOWN_BITS:
            hot[gpu] = clock_event_names(bits & HW_SLOWDOWN_BITS)
    unread = [gpu for gpu, series in telemetry["gpus"].items() if _clock_events_read(series) == 0]
    temps = [t for s in telemetry["gpus"].values() for t in s["temperature_c"] if t is not None]
    clocks = [c for s in telemetry["gpus"].values() for c in s["sm_clock_mhz"] if c is not None]
    summary = f"max {sig(max(temps)) + ' C' if temps else 'temperature unreadable'}, SM clock {_range(clocks, 'MHz')}"
    base: dict[str, Any] = dict(
        name=f"telemetry.{benchmark}",
        subject=hostname,
        category="telemetry",
        value=max(temps) if temps else None,
        unit="C",
        expected="no HW slowdown during the benchmark",
        # The rule, not a number from the profile: any of these NVML clock-event reasons while loaded fails.
        threshold_source="gpu-fryer's rule on NVML clock-event reasons: "
        + ", ".join(clock_event_names(HW_SLOWDOWN_BITS)),
        details=telemetry,
    )
    if hot:
        listed = "; ".join(f"GPU {gpu}: {', '.join(names)}" for gpu, names in hot.items())
        return [
            Result(
                **base,
                status=Status.FAIL,
                message=f"expected no hardware slowdown under load during {benchmark}, found {listed} ({summary})",
                remediation="check cooling and power delivery; a GPU that throttles under load fails acceptance",
            )
        ]
    if unread:
        samples = telemetry.get("samples", len(telemetry.get("t_s", [])))
        why = (telemetry.get("unreadable") or {}).get("nvmlDeviceGetCurrentClocksEventReasons", "no answer")
        gpus = ", ".join(f"GPU {gpu}" for gpu in unread)
        return [
            Result(
                **base,
                status=Status.ERROR,
                message=f"could not judge hardware slowdown during {benchmark}: NVML answered none of {samples} "
                f"clock-event samples of {gpus} ({why}; {summary})",
                remediation="check the driver with `nvidia-smi -q -d PERFORMANCE`; a GPU that stops answering NVML "
                "needs a reset",
            )
        ]
    return [Result(**base, status=Status.PASS, message=f"no hardware slowdown during {benchmark} ({summary})")]
