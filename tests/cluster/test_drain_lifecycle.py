"""The drain lifecycle on the real Slurm of the test suite: a FAIL drains node2 with the check as reason, passing
runs are counted in that reason (scontrol keeps it, and shows who set it), the third pass in a row resumes it,
and a run with an ERROR in between changes nothing."""

from __future__ import annotations

import subprocess

import pytest

from gpucert.cluster.slurm_checks import apply_drain
from gpucert.report.schema import Result
from gpucert.status import Status


def result(name: str, status: Status) -> Result:
    return Result(name=name, subject="node2 GPU 0", status=status, message=f"expected 0 errors, found {status.value}")


@pytest.mark.slow
def test_resume_only_after_three_passes_in_a_row(slurm_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)  # apply_drain's scontrol inherits this process's environment

    def node2() -> tuple[str, str]:
        out = subprocess.run(["scontrol", "show", "node", "node2", "-o"], capture_output=True, text=True,
                             timeout=30, check=True).stdout  # fmt: skip
        return out.split("State=")[1].split()[0], out.split(" Reason=")[1].strip() if " Reason=" in out else ""

    fail, ok_run = [result("gpu.ecc", Status.FAIL)], [result("gpu.ecc", Status.PASS)]
    error_run = [*ok_run, result("gpu.temperature", Status.ERROR)]
    try:
        said, ok = apply_drain("node2", fail, 30.0, resume_after=3)
        assert ok, said
        state, reason = node2()
        assert "DRAIN" in state and reason.startswith("gpucert: gpu.ecc node2 GPU 0: expected 0 errors"), reason
        for passes in (1, 2):
            said, ok = apply_drain("node2", ok_run, 30.0, resume_after=3)
            assert ok and f"{passes} of 3 runs in a row" in said, said
            state, reason = node2()
            assert "DRAIN" in state and f"[passes {passes} of 3]" in reason, (state, reason)
        said, ok = apply_drain("node2", error_run, 30.0, resume_after=3)
        assert ok and "a check could not run" in said and "[passes 2 of 3]" in node2()[1], said
        said, ok = apply_drain("node2", ok_run, 30.0, resume_after=3)
        assert ok and said.startswith("resumed node2"), said
        assert "DRAIN" not in node2()[0]
    finally:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=RESUME"], timeout=30, check=False)


@pytest.mark.slow
def test_health_drain_rechecks_a_fail_and_resumes_after_two_passes(slurm_cluster, tmp_path) -> None:
    """`gpucert health --drain --resume-after 2` as HealthCheckProgram on node2: a FAIL (one GPU expected on
    this CPU machine) is measured twice (two run directories) before node2 is drained; the first passing run
    keeps it drained and counts it, the second resumes it."""
    import sys

    def health(runs: str, *extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "gpucert", "health", "--profile", "cpu", "--drain", "--resume-after", "2"]
        argv += ["--slurm-node", "node2", "--json", "--set", f"runs_dir={tmp_path / runs}", *extra]
        argv += ["--set", "health.liveness=false"]  # the lifecycle, not the GPUs, is under test: seconds less a run
        return subprocess.run(argv, env=slurm_cluster.env, capture_output=True, text=True, timeout=120)

    def node2() -> tuple[str, str]:
        out = subprocess.run(["scontrol", "show", "node", "node2", "-o"], env=slurm_cluster.env, capture_output=True,
                             text=True, timeout=30, check=True).stdout  # fmt: skip
        return out.split("State=")[1].split()[0], out.split(" Reason=")[1].strip() if " Reason=" in out else ""

    try:
        failed = health("failed", "--set", "health.expected_gpus=1")
        assert failed.returncode == 2, failed.stderr
        assert len(list((tmp_path / "failed").glob("*/report.json"))) == 2  # the reading and its recheck
        state, reason = node2()
        assert "DRAIN" in state and reason.startswith("gpucert: gpu.count"), (state, reason)
        first = health("pass1")
        assert first.returncode == 0 and "stays drained: its checks pass, 1 of 2 runs in a row" in first.stderr
        assert len(list((tmp_path / "pass1").glob("*/report.json"))) == 1  # nothing FAILed: no recheck
        state, reason = node2()
        assert "DRAIN" in state and "[passes 1 of 2]" in reason, (state, reason)
        second = health("pass2")
        assert second.returncode == 0 and "resumed node2" in second.stderr, second.stderr
        assert "DRAIN" not in node2()[0]
    finally:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=RESUME"], env=slurm_cluster.env, timeout=30)
