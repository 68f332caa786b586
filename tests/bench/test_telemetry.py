"""Telemetry sampling (against a replayed H200 node) and its judge."""

from __future__ import annotations

import json
import time

from tests.conftest import NODE_BUNDLES

from gpucert.bench.telemetry import MAX_SAMPLES, TelemetrySampler, judge_telemetry, thin
from gpucert.hardware.nvml import SnapshotNvml
from gpucert.status import Status


def test_sampler_reads_every_gpu_from_nvml() -> None:
    nvml = SnapshotNvml(json.loads((NODE_BUNDLES / "h200x4/nvml-snapshot.json").read_text()))
    sampler = TelemetrySampler(nvml, interval_s=0.01).start()
    time.sleep(0.1)
    series = sampler.stop()
    assert set(series["gpus"]) == {"0", "1", "2", "3"}
    assert len(series["t_s"]) >= 2
    gpu0 = series["gpus"]["0"]
    # The captured idle node: SM clock 345 MHz, 79.3 W, 40 C, clock events = Idle (0x1).
    assert set(gpu0["sm_clock_mhz"]) == {345}
    assert set(gpu0["power_w"]) == {79.323}
    assert set(gpu0["temperature_c"]) == {40}
    assert set(gpu0["clock_events"]) == {1}


def series(clock_events: list[int]) -> dict:
    n = len(clock_events)
    gpu = {"sm_clock_mhz": [1980] * n, "power_w": [690.0] * n, "temperature_c": [71] * n, "clock_events": clock_events}
    return {"t_s": [0.2 * i for i in range(n)], "gpus": {"0": gpu, "1": {**gpu, "clock_events": [0] * n}}}


def test_hardware_slowdown_under_load_fails_naming_the_gpu() -> None:
    (result,) = judge_telemetry("matmul", series([0, 0x40, 0x4, 0]), "node1")
    assert result.status is Status.FAIL
    assert "found GPU 0: HW Thermal Slowdown" in result.message
    assert result.category == "telemetry" and result.value == 71


def test_power_cap_alone_is_not_a_hardware_slowdown() -> None:
    (result,) = judge_telemetry("matmul", series([0x4, 0x4]), "node1")
    assert result.status is Status.PASS
    assert "SM clock 1980-1980 MHz" in result.message


def test_no_gpus_no_result_and_long_series_are_thinned() -> None:
    assert judge_telemetry("matmul", None, "node1") == []
    long = series([0] * (3 * MAX_SAMPLES + 7))
    thinned = thin(long)
    assert len(thinned["t_s"]) <= MAX_SAMPLES
    assert len(thinned["gpus"]["1"]["power_w"]) == len(thinned["t_s"])
