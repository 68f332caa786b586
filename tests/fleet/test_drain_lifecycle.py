"""The Slurm drain lifecycle, on scontrol's answers: resume only after N passing runs in a row (counted in the
drain reason), a run with an ERROR is no pass, and a FAIL must be seen twice (confirm_failures) before it drains.
The same calls on the real Slurm of the test suite are in tests/cluster/test_drain_lifecycle.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpucert.acceptance import RunOutcome
from gpucert.cli import main
from gpucert.cluster.slurm_checks import apply_drain, drain_reason, passes_so_far
from gpucert.fleet.recheck import confirm_failures, recheck
from gpucert.report.schema import Result
from gpucert.report.store import load_report
from gpucert.status import Status
from tests.conftest import FIXTURES, NODE_BUNDLES
from tests.health.test_scenarios import apply_scenario


def result(name: str, status: Status, value: float | None = None, subject: str = "gpu07 GPU 3") -> Result:
    return Result(
        name=name, subject=subject, status=status, message=f"{name} {status.value}", value=value, expected="x"
    )


class Slurmctld:
    """One node's state and reason as scontrol shows them (a set reason comes back with who set it and when)."""

    def __init__(self, state: str = "IDLE", reason: str | None = None) -> None:
        self.state, self.reason, self.asked = state, reason, []

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[str | None, str | None]:
        self.asked.append(argv)
        if argv[1] == "show":
            reason = f" Reason={self.reason} [root@2026-11-26T14:40:01]" if self.reason else ""
            return f"NodeName=gpu07 Arch=x86_64 State={self.state} Partitions=gpu{reason}", None
        fields = dict(a.split("=", 1) for a in argv[2:])
        if fields["State"] == "DRAIN":
            self.state, self.reason = "IDLE+DRAIN", fields["Reason"]
        else:
            self.state, self.reason = "IDLE", None
        return "", None


def test_passes_are_read_from_the_reason_scontrol_shows() -> None:
    set_by = " [root@2026-11-26T14:40:01]"
    assert passes_so_far(f"gpucert: gpu.ecc gpu07 GPU 3: m{set_by}") == ("gpucert: gpu.ecc gpu07 GPU 3: m", 0)
    assert passes_so_far(f"gpucert: gpu.ecc: m [passes 2 of 3]{set_by}") == ("gpucert: gpu.ecc: m", 2)
    assert passes_so_far("gpucert: x [passes 1 of 3]") == ("gpucert: x", 1)


def test_resume_after_three_passes_in_a_row_a_fail_starts_again_an_error_counts_nothing() -> None:
    slurm = Slurmctld()
    fail, ok_run, error_run = (
        [result("gpu.ecc", Status.FAIL)],
        [result("gpu.ecc", Status.PASS)],
        [
            result("gpu.ecc", Status.PASS),
            result("gpu.temperature", Status.ERROR),
        ],
    )
    said, ok = apply_drain("gpu07", fail, 5.0, slurm, resume_after=3)
    assert ok and said == "drained gpu07: gpucert: gpu.ecc gpu07 GPU 3: gpu.ecc FAIL"
    said, ok = apply_drain("gpu07", ok_run, 5.0, slurm, resume_after=3)
    assert ok and said == (
        "gpu07 stays drained: its checks pass, 1 of 3 runs in a row (gpucert: gpu.ecc gpu07 GPU 3: gpu.ecc FAIL)"
    )
    assert slurm.reason == "gpucert: gpu.ecc gpu07 GPU 3: gpu.ecc FAIL [passes 1 of 3]"
    # A check that could not run is no pass: nothing is counted or changed.
    asked = len(slurm.asked)
    said, ok = apply_drain("gpu07", error_run, 5.0, slurm, resume_after=3)
    assert ok and "stays drained: a check could not run, which is no pass" in said
    assert len(slurm.asked) == asked + 1 and slurm.reason.endswith("[passes 1 of 3]")
    apply_drain("gpu07", ok_run, 5.0, slurm, resume_after=3)
    assert slurm.reason.endswith("[passes 2 of 3]") and "DRAIN" in slurm.state
    # A FAIL now drains it again with a fresh count.
    apply_drain("gpu07", fail, 5.0, slurm, resume_after=3)
    assert slurm.reason == "gpucert: gpu.ecc gpu07 GPU 3: gpu.ecc FAIL"
    for n in (1, 2):
        apply_drain("gpu07", ok_run, 5.0, slurm, resume_after=3)
        assert slurm.reason.endswith(f"[passes {n} of 3]")
    said, ok = apply_drain("gpu07", ok_run, 5.0, slurm, resume_after=3)
    assert ok and said.startswith("resumed gpu07") and slurm.state == "IDLE"


def test_one_pass_resumes_by_default_and_a_drain_by_someone_else_stays() -> None:
    slurm = Slurmctld("IDLE+DRAIN", "gpucert: gpu.ecc gpu07 GPU 3: m")
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.PASS)], 5.0, slurm)
    assert ok and said.startswith("resumed gpu07")
    slurm = Slurmctld("IDLE+DRAIN", "cable swap")
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.PASS)], 5.0, slurm, resume_after=2)
    assert ok and "drained by someone else: cable swap" in said and slurm.reason == "cable swap"


def test_a_fail_must_be_seen_twice() -> None:
    first = [
        result("gpu.temperature", Status.FAIL, 91.0),  # a hot moment
        result("gpu.ecc_uncorrectable", Status.FAIL, 3),  # a counter: reads the same twice
        result("gpu.clock_events", Status.PASS),
    ]
    second = [
        result("gpu.temperature", Status.PASS, 62.0),
        result("gpu.ecc_uncorrectable", Status.FAIL, 3),
        result("gpu.clock_events", Status.FAIL),  # FAILs on the re-measurement only
    ]
    confirmed = {r.name: r for r in confirm_failures(first, second)}
    assert confirmed["gpu.ecc_uncorrectable"] == second[1]
    hot = confirmed["gpu.temperature"]
    assert hot.status is Status.WARN and hot.value == 62.0
    assert hot.message == "gpu.temperature PASS (FAILed once, then not when re-measured: 91.0: gpu.temperature FAIL)"
    clocks = confirmed["gpu.clock_events"]
    assert clocks.status is Status.WARN and "FAILed on the re-measurement only" in clocks.message
    # Only the FAIL seen twice drains; the flickers are on record.
    drained = Slurmctld()
    apply_drain("gpu07", list(confirmed.values()), 5.0, drained)
    assert drained.reason is not None and drained.reason.startswith("gpucert: gpu.ecc_uncorrectable")
    # Per GPU: the same check on another GPU is another reading; a FAIL the second run did not measure stands.
    other = [result("gpu.temperature", Status.FAIL, 90.0, subject="gpu07 GPU 5")]
    assert [(r.name, r.subject, r.status) for r in confirm_failures(first, other)] == [
        ("gpu.temperature", "gpu07 GPU 5", Status.WARN),
        ("gpu.temperature", "gpu07 GPU 3", Status.FAIL),
        ("gpu.ecc_uncorrectable", "gpu07 GPU 3", Status.FAIL),
    ]


def _health(argv: list[str], output: Path) -> RunOutcome:
    code = main(["health", *argv, "--output", str(output), "--json"])
    return RunOutcome(load_report(output), output / "report.json", code)


def test_recheck_runs_a_failing_health_once_more(bundle_copy: Any, tmp_path: Path, capsys: Any) -> None:
    """A GPU's hardware slowdown seen once (the hw-slowdown scenario), gone when re-measured (the bundle as
    captured): the rechecked report says WARN, shows both readings and drains nothing."""
    scenario = yaml.safe_load((FIXTURES / "scenarios" / "hw-slowdown.yaml").read_text())
    slowed = bundle_copy("h200x4")
    apply_scenario(slowed, scenario)
    first = _health(["--replay", str(slowed), "--set", "health.expected_gpus=4"], tmp_path / "first")
    assert first.exit_code == 2
    calls = []

    def rerun() -> RunOutcome:
        calls.append(1)
        argv = ["--replay", str(NODE_BUNDLES / "h200x4"), "--set", "health.expected_gpus=4"]
        return _health(argv, tmp_path / "second")

    confirmed = recheck(first, rerun)
    assert calls == [1] and confirmed.exit_code == 1
    (clocks,) = [r for r in confirmed.report.results if r.name == "gpu.clock_events" and r.gpu_index == 2]
    assert clocks.status is Status.WARN and "FAILed once, then not when re-measured" in clocks.message
    assert load_report(tmp_path / "second").to_dict() == confirmed.report.to_dict()  # written again
    assert drain_reason(list(confirmed.report.results)) is None
    # A run without a FAIL is not run again.
    assert recheck(confirmed, rerun) is confirmed and calls == [1]
