"""Verdicts for the node in front of you: the GPU count the operator ordered (Slurm's, else the profile's, with
the FAIL saying how to declare it), one verdict for `health --drain` that is its exit code, telemetry with
nothing readable as ERROR, and messages that never print a non-zero value as 0. The scenario YAMLs
(one-gpu-vm-default-profile, slurm-*, healthy-h100) run the same paths through `gpucert health --replay`."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import NODE_BUNDLES

from gpucert.bench import burn, memory
from gpucert.bench.telemetry import TelemetrySampler, judge_telemetry
from gpucert.cluster.slurm_checks import drain_result
from gpucert.config.profiles import load_profile
from gpucert.config.run import HealthConfig
from gpucert.hardware.environment import parse_slurm_env
from gpucert.hardware.inventory import bundle_sources, collect_inventory
from gpucert.hardware.nvml import SnapshotNvml
from gpucert.health.checks import SLURM_GPUS_SOURCE, check_gpu_count, expected_gpu_count
from gpucert.report.numbers import sig
from gpucert.report.schema import Result
from gpucert.status import Status

# --- the expected GPU count ---------------------------------------------------------------------------------


def test_slurm_gives_the_count_in_a_job_step_and_in_a_prolog() -> None:
    step = parse_slurm_env({"SLURM_JOB_ID": "1", "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_GPUS": "0,1"})
    prolog = parse_slurm_env({"SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"})
    none = parse_slurm_env({"SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": ""})
    assert step and prolog and none
    assert (step.gpus_on_node, prolog.gpus_on_node, none.gpus_on_node) == (4, 8, None)


def test_the_operator_then_slurm_then_the_profile_say_how_many_gpus() -> None:
    inv = collect_inventory(bundle_sources(NODE_BUNDLES / "h100"))
    profile = load_profile("h100-sxm")
    assert expected_gpu_count(inv, profile, HealthConfig()) == (8, "profile h100-sxm: gpu.gpus_per_node")
    assert expected_gpu_count(inv, profile, HealthConfig(expected_gpus=2)) == (2, "config: health.expected_gpus")
    slurm = inv.environment.__class__(
        parse_slurm_env({"SLURM_JOB_ID": "9", "SLURM_GPUS_ON_NODE": "1"}), None, inv.environment.virtualization
    )
    in_job = inv.__class__(**{**inv.__dict__, "environment": slurm})
    assert expected_gpu_count(in_job, profile, HealthConfig()) == (1, SLURM_GPUS_SOURCE)
    assert expected_gpu_count(in_job, profile, HealthConfig(expected_gpus=8))[0] == 8  # what the operator said


def test_a_count_from_the_profile_fails_saying_how_to_declare_this_node() -> None:
    inv = collect_inventory(bundle_sources(NODE_BUNDLES / "h100"))
    (result,) = check_gpu_count(inv, load_profile("h100-sxm"), HealthConfig())
    assert result.status is Status.FAIL
    assert result.message == "expected 8 GPUs, found 1 on h100 (the count from profile h100-sxm: gpu.gpus_per_node)"
    assert result.remediation and "--set health.expected_gpus=1" in result.remediation
    assert "gpu.gpus_per_node in a site profile" in result.remediation
    # Where the operator gave the number, the fault is the node's: no hint to change the number.
    (given,) = check_gpu_count(inv, load_profile("h100-sxm"), HealthConfig(expected_gpus=2))
    assert given.status is Status.FAIL and "--set" not in (given.remediation or "")


def test_more_gpus_than_expected_is_not_read_as_a_gpu_fallen_off_the_bus() -> None:
    """The cpu profile on a 4-GPU node once read SKIP "no NVIDIA GPU found; profile cpu expects none"."""
    inv = collect_inventory(bundle_sources(NODE_BUNDLES / "h200x4"))
    (result,) = check_gpu_count(inv, load_profile("cpu"), HealthConfig())
    assert result.status is Status.FAIL
    assert result.message == "expected 0 GPUs (profile cpu: gpu.gpus_per_node), found 4 on h200x4"
    assert result.remediation and "leave --profile out" in result.remediation and "bus" not in result.remediation
    (given,) = check_gpu_count(inv, load_profile("h200"), HealthConfig(expected_gpus=2))
    assert given.status is Status.FAIL and given.remediation and "fence the job" in given.remediation


def test_nvml_named_once_in_the_count_message() -> None:
    """The inventory's reason names NVML already ("NVML: NVML Shared Library Not Found"): read `NVML: NVML:`."""
    inv = collect_inventory(bundle_sources(NODE_BUNDLES / "h100"))
    gpu = inv.gpu.__class__(**{**inv.gpu.__dict__, "gpus": [], "nvml_error": "NVML: NVML Shared Library Not Found"})
    (result,) = check_gpu_count(inv.__class__(**{**inv.__dict__, "gpu": gpu}), load_profile("cpu"), HealthConfig())
    assert "(NVML: NVML Shared Library Not Found)" in result.message, result.message
    assert "NVML: NVML:" not in result.message


# --- health --drain -----------------------------------------------------------------------------------------


def ok(name: str, status: Status = Status.PASS) -> Result:
    return Result(name=name, subject="gpu07", status=status, message="m", expected="x")


def test_the_drain_is_a_result_error_when_slurm_cannot_be_asked() -> None:
    unreachable = lambda argv, timeout_s: (None, "`scontrol show node` exited 1: Unable to contact slurm controller")  # noqa: E731
    passing = drain_result("gpu07", [ok("gpu.ecc")], 5.0, unreachable)
    assert passing.status is Status.ERROR and passing.name == "slurm.drain" and passing.subject == "gpu07"
    assert "whether gpucert drained it before is unknown" in passing.message
    failing = drain_result("gpu07", [ok("gpu.ecc", Status.FAIL)], 5.0, unreachable)
    assert failing.status is Status.ERROR and "this failing node is still in service" in failing.message
    assert failing.remediation and "scontrol update NodeName=gpu07 State=DRAIN" in failing.remediation
    # A FAIL reads the node before it drains it (an operator's drain is left alone): an idle gpu07, then drained.
    idle = "NodeName=gpu07 Arch=x86_64 State=IDLE Partitions=gpu"
    answered = drain_result(
        "gpu07", [ok("gpu.ecc", Status.FAIL)], 5.0, lambda argv, timeout_s: (idle if "show" in argv else "", None)
    )
    assert answered.status is Status.INFO and answered.message.startswith("drained gpu07: gpucert: gpu.ecc")


@pytest.mark.slow  # a live `gpucert health` in a fresh process: several seconds on a busy 2-core machine
def test_health_drain_without_a_controller_prints_one_verdict_its_exit_code(tmp_path: Path) -> None:
    """A controller that does not answer (scontrol as it fails then): before, the report said `verdict: PASS
    (... exit code 0)`, then `could not read Slurm node`, and the process exited 3."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\necho 'slurm_load_node error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"
    )
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    argv = ["health", "--profile", "cpu", "--drain", "--slurm-node", "gpu07", "--set", "health.liveness=false"]
    done = subprocess.run(
        [sys.executable, "-m", "gpucert", *argv, "-o", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    verdicts = [line for line in done.stdout.splitlines() if "verdict" in line]
    assert len(verdicts) == 1 and "ERROR" in verdicts[0] and "exit code 3" in verdicts[0], done.stdout
    assert "PASS (" not in verdicts[0]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert (report["status"], report["exit_code"]) == ("ERROR", 3)
    drain = [r for r in report["results"] if r["name"] == "slurm.drain"]
    assert len(drain) == 1 and "Unable to contact slurm controller" in drain[0]["message"]


# --- telemetry ----------------------------------------------------------------------------------------------


class Unanswering(SnapshotNvml):
    """The captured H200 node whose GPUs stop answering every sampled query (NVML_ERROR_UNKNOWN)."""

    def _refuse(self, *args: object) -> None:
        raise RuntimeError("NVMLError_Unknown: Unknown Error")

    nvmlDeviceGetClockInfo = nvmlDeviceGetPowerUsage = nvmlDeviceGetTemperature = _refuse
    nvmlDeviceGetCurrentClocksEventReasons = _refuse


def test_telemetry_with_nothing_readable_is_error_not_pass() -> None:
    nvml = Unanswering(json.loads((NODE_BUNDLES / "h200x4/nvml-snapshot.json").read_text()))
    sampler = TelemetrySampler(nvml, interval_s=0.01).start()
    sampler._stop.wait(0.05)
    (result,) = judge_telemetry("matmul", sampler.stop(), "h200x4")
    assert result.status is Status.ERROR, result.message
    assert "NVML answered none of" in result.message and "GPU 0, GPU 1, GPU 2, GPU 3" in result.message
    assert "NVMLError_Unknown" in result.message
    assert "temperature unreadable" in result.message and "SM clock unreadable" in result.message
    assert "0-0 MHz" not in result.message and "max 0 C" not in result.message
    assert result.remediation


def test_telemetry_of_one_unreadable_gpu_among_readable_ones_is_error_naming_it() -> None:
    gpu = {"sm_clock_mhz": [1980, 1980], "power_w": [690.0] * 2, "temperature_c": [71, 72], "clock_events": [0, 0]}
    dead = {"sm_clock_mhz": [None] * 2, "power_w": [None] * 2, "temperature_c": [None] * 2, "clock_events": [None] * 2}
    (result,) = judge_telemetry("burn", {"t_s": [0.0, 0.2], "gpus": {"0": gpu, "1": dead}}, "n1")
    assert result.status is Status.ERROR and "of GPU 1 (" in result.message and "GPU 0" not in result.message
    assert "max 72 C, SM clock 1980-1980 MHz" in result.message


# --- numbers in messages ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.029, "0.029"),
        (0.0263, "0.0263"),
        (0.000012, "0.000012"),
        (0.0, "0"),
        (45.67, "45.7"),
        (989.4, "989"),
        (1410.0, "1410"),
        (18084.2, "18,084"),
        (740.0, "740"),
        (-0.5, "-0.5"),
        (float("nan"), "nan"),
    ],
)
def test_sig_keeps_three_significant_figures(value: float, text: str) -> None:
    assert sig(value) == text


def test_a_cpu_burn_and_memory_row_never_print_their_value_as_0() -> None:
    """The CPU profile's burn at 0.029 TFLOP/s read `median 0 TFLOP/s`; a cv of 0.0004 read `cv 0.000`."""
    cpu = load_profile("cpu")
    identity = {"rank": 0, "local_rank": 0, "node": "vm", "host": "vm", "subject": "rank 0 (cpu)", "gpu_index": None}
    windows = [{"t_s": float(i), "s": 10.0, "steps": 1, "tflops": 0.029} for i in range(3)]
    rank = {**identity, "dtype": "fp32", "windows": windows, "telemetry": None, "sdc": None}
    (result,) = [r for r in burn.judge({"ranks": [rank]}, cpu, None) if r.name == "burn.fp32"]
    assert result.message.startswith("median 0.029 TFLOP/s over 30 s (peak 0.029)"), result.message
    row = {"tbps": 0.026, "timing": {"cv": 0.0004}}
    (copy,) = memory.judge({"ranks": [{**identity, "rows": {"copy": row}}]}, cpu, None)  # type: ignore[arg-type]
    assert ": 0.026 TB/s (cv 0.0004)" in copy.message, copy.message


def test_a_gpu_past_its_slowdown_temperature_is_said_to_be_above_it() -> None:
    from gpucert.health.checks import check_temperature

    inv = collect_inventory(bundle_sources(NODE_BUNDLES / "h200x4"))
    hot = inv.gpu.gpus[0].__class__(**{**inv.gpu.gpus[0].__dict__, "temperature_c": 91})
    (result,) = check_temperature(hot, load_profile("h200"))
    assert result.message.endswith(", 2 C above slowdown at 89 C"), result.message
