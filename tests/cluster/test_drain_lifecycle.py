"""The drain lifecycle on the real Slurm of the test suite: a FAIL drains node2 with the check as reason, passing
runs are counted in that reason (scontrol keeps it, and shows who set it), the third pass in a row resumes it,
and a run with an ERROR in between changes nothing. A FAIL leaves an operator's drain as it is (so no pass resumes
it), and drains nothing where the node's name is not one Slurm has."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpucert.cluster.slurm_checks import apply_drain
from gpucert.report.schema import Result
from gpucert.status import Status


def result(name: str, status: Status) -> Result:
    return Result(
        name=name,
        subject="node2 GPU 0",
        status=status,
        message=f"expected 0 errors, found {status.value}",
        expected="0",
    )


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


def _health(
    slurm_cluster, out: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "gpucert", "health", "--profile", "cpu", "--drain", "--json", "-o", str(out)]
    argv += ["--set", "health.liveness=false", *extra]
    return subprocess.run(argv, env=env or slurm_cluster.env, capture_output=True, text=True, timeout=120)


def _node(slurm_cluster, name: str) -> tuple[str, str]:
    out = subprocess.run(["scontrol", "show", "node", name, "-o"], env=slurm_cluster.env, capture_output=True,
                         text=True, timeout=30, check=True).stdout  # fmt: skip
    return out.split("State=")[1].split()[0], out.split(" Reason=")[1].strip() if " Reason=" in out else ""


@pytest.mark.slow
def test_a_fail_leaves_an_operators_drain_and_a_later_pass_does_not_resume_it(slurm_cluster, tmp_path) -> None:
    """The tester's case: gpucert's FAIL reason replaced `cable swap`, and the next passing run resumed the node
    as if gpucert had drained it."""
    env = slurm_cluster.env
    try:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=cable swap"], env=env,
                       check=True, timeout=30)  # fmt: skip
        failed = _health(slurm_cluster, tmp_path / "failed", "--slurm-node", "node2", "--set", "health.expected_gpus=1")
        assert failed.returncode == 2, failed.stderr
        assert "node2 is already drained by someone else (Reason=cable swap, set by " in failed.stderr, failed.stderr
        assert "left as it is; gpucert's FAIL: gpu.count" in failed.stderr, failed.stderr
        state, reason = _node(slurm_cluster, "node2")
        assert "DRAIN" in state and reason.startswith("cable swap"), (state, reason)
        # Both readings' reports are kept (fleet.md): the re-run in the same --output replaced the first one.
        first = json.loads((tmp_path / "failed" / "first-reading" / "report.json").read_text())
        second = json.loads((tmp_path / "failed" / "report.json").read_text())
        assert first["meta"]["started_at"] < second["meta"]["started_at"]
        passed = _health(slurm_cluster, tmp_path / "passed", "--slurm-node", "node2")
        assert passed.returncode == 0 and "drained by someone else: cable swap" in passed.stderr, passed.stderr
        state, reason = _node(slurm_cluster, "node2")
        assert "DRAIN" in state and reason.startswith("cable swap"), (state, reason)
    finally:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=RESUME"], env=env, timeout=30)


@pytest.mark.slow
def test_a_fail_on_a_node_slurm_does_not_have_drains_nothing_and_names_the_flag(slurm_cluster, tmp_path) -> None:
    """No --slurm-node, no SLURMD_NODENAME: the node is the host name, which is no NodeName of the cluster but is
    both nodes' NodeHostname, so `scontrol update NodeName=<host>` drained one of them."""
    host = socket.gethostname().split(".")[0]
    if host in slurm_cluster.nodes:
        pytest.skip(f"this host is named {host}, a node of the test cluster")
    env = {k: v for k, v in slurm_cluster.env.items() if k != "SLURMD_NODENAME"}
    try:
        failed = _health(slurm_cluster, tmp_path / "failed", "--set", "health.expected_gpus=1", env=env)
        assert failed.returncode == 3, failed.stderr
        assert f"Slurm knows no node {host} (" in failed.stderr and f"Node {host} not found" in failed.stderr
        assert "this failing node is still in service" in failed.stderr
        report = json.loads(failed.stdout)
        (drain,) = [r for r in report["results"] if r["name"] == "slurm.drain"]
        assert drain["status"] == "ERROR" and "--slurm-node NAME" in drain["remediation"], drain
        assert "SLURMD_NODENAME" in drain["remediation"]
        for name in slurm_cluster.nodes:
            state, reason = _node(slurm_cluster, name)
            assert "DRAIN" not in state, (name, state, reason)
    finally:
        for name in slurm_cluster.nodes:
            subprocess.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], env=env, timeout=30)
