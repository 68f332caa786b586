"""`gpucert health --npd` keeps node-problem-detector's custom plugin contract: exit 0 OK, 1 a problem, 2 unknown,
one line on stdout (the condition's message). Replayed on the captured bundles with the health scenarios' faults."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucert.cli import main
from gpucert.fleet.npd import MESSAGE_CHARS, plugin_answer
from gpucert.report.store import load_report
from tests.conftest import FIXTURES, NODE_BUNDLES
from tests.health.test_scenarios import apply_scenario

SCENARIOS = FIXTURES / "scenarios"


def scenario_argv(names: list[str], bundle_copy: Any) -> list[str]:
    """health --replay of a bundle with every named scenario's fault applied (all on the same base bundle)."""
    scenarios = [yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text()) for name in names]
    bundle = bundle_copy(scenarios[0]["base"])
    argv = ["health", "--npd", "--replay", str(bundle)]
    for scenario in scenarios:
        assert scenario["base"] == scenarios[0]["base"]
        apply_scenario(bundle, scenario)
        for item in scenario.get("set", []):
            argv += ["--set", item]
    return argv


@pytest.mark.parametrize(
    ("scenarios", "code", "message"),
    [
        (["healthy-h200x4"], 0, "PASS "),
        (["healthy-h100"], 0, "PASS "),
        # An idle GPU at PCIe Gen1 (power saving) WARNs: named, but no condition set.
        (["pcie-gen-idle"], 0, "WARN gpu.pcie_link: expected PCIe Gen5, found Gen1"),
        (["xid-79"], 1, "FAIL node.xid: expected no critical XID events, found XID 79 on PCI 0000:00:08\n"),
        (["hw-slowdown"], 1, "FAIL gpu.clock_events: "),
        (["nvml-unreadable"], 2, "ERROR gpu.temperature: could not read temperature on h200x4 GPU 1"),
        # A lost GPU: what NVML still answers about it (no NVLink visible) FAILs, so it is a problem, not unknown.
        (["gpu-lost"], 1, "FAIL gpu.nvlink: expected 18 active NVLinks, found none visible on h200x4 GPU 2"),
        # A FAIL beside an ERROR is a problem: what could be read is bad.
        (["nvml-unreadable", "xid-79"], 1, "FAIL node.xid: "),
    ],
)
def test_plugin_contract_on_scenarios(
    scenarios: list[str], code: int, message: str, bundle_copy: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = scenario_argv(scenarios, bundle_copy)
    assert main([*argv, "--output", str(tmp_path / "run")]) == code
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(message), out
    assert len(out.strip()) <= MESSAGE_CHARS
    if code == 0 and message == "PASS ":
        assert re.fullmatch(r"PASS \d+ checks on h(100|200x4)\n", out), out
    # The report is written as for any run, with the verdict the message gives.
    report = load_report(tmp_path / "run")
    assert plugin_answer(report) == (out.strip(), code)


def test_more_failures_are_counted(bundle_copy: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = scenario_argv(["xid-79", "hw-slowdown"], bundle_copy)
    assert main([*argv, "--output", str(tmp_path / "run")]) == 1
    assert capsys.readouterr().out.rstrip().endswith("(+1 more)")


def test_a_run_that_cannot_start_is_unknown_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-bundle"
    assert main(["health", "--npd", "--replay", str(missing), "--output", str(tmp_path / "run")]) == 2
    out, err = capsys.readouterr()
    assert out == f"UNKNOWN gpucert could not check this node: {missing}: not a capture bundle directory\n"
    assert "not a capture bundle directory" in err


def test_the_installed_command_keeps_the_contract(tmp_path: Path) -> None:
    """As NPD runs it: a process whose exit status and stdout are all NPD reads."""
    argv = [sys.executable, "-m", "gpucert", "health", "--npd", "--replay", str(NODE_BUNDLES / "h200x4")]
    done = subprocess.run(
        [*argv, "--set", "health.expected_gpus=8", "--output", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (1, "FAIL gpu.count: expected 8 GPUs, found 4 on h200x4\n")


def test_a_refused_command_line_still_answers_npd_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """NPD reads stdout and the exit code: a flag it does not know is Unknown (2) with the reason, not exit 3."""
    assert main(["health", "--npd", "--bogus"]) == 2
    out = capsys.readouterr().out
    assert out == (
        "UNKNOWN gpucert could not check this node: the command line was refused: unrecognized arguments: --bogus\n"
    )
    # --json would print the report on the one line's stdout: refused, answered the same way.
    assert main(["health", "--npd", "--json", "--replay", str(NODE_BUNDLES / "h200x4")]) == 2
    assert capsys.readouterr().out.startswith("UNKNOWN gpucert could not check this node: --npd answers")
