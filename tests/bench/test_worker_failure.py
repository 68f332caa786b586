"""A rank's own exception is what the ERROR result says: its type, its message and where it was raised, for one
rank and for several, through `gpucert bench` and `launch_local`.

The failing case passes validation in the node's process and fails inside the ranks: the spec the ranks build
carries a key its benchmark's config does not have (a TypeError in the rank, as any exception there would be).
The ranks are processes of their own, so the fault goes in through a sitecustomize module on their PYTHONPATH.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpucert.bench.suite import LaunchError, launch_local
from gpucert.cli import main
from gpucert.runtime.group import raised_at
from gpucert.runtime.spawn import exit_cause

EXCEPTION = "TypeError: MemoryBenchConfig.__init__() got an unexpected keyword argument 'bogus'"

BOGUS_SPEC = """\
import gpucert.bench.suite as suite

_real = suite.bench_spec


def _with_bogus_key(*args):
    spec = _real(*args)
    return {**spec, "config": {**spec["config"], "bogus": 1}}


suite.bench_spec = _with_bogus_key
"""


@pytest.fixture
def broken_spec(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every rank started from here builds its spec with a key the benchmark's config does not have."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BOGUS_SPEC)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_the_error_result_shows_the_ranks_exception(nproc: int, broken_spec: None, tmp_path: Path, capfd) -> None:
    out_dir = tmp_path / "run"
    code = main(["bench", "memory", "--profile", "cpu", "--nproc", str(nproc), "-o", str(out_dir)])
    out = capfd.readouterr().out
    assert code == 3
    (error,) = json.loads((out_dir / "report.json").read_text())["results"]
    assert error["status"] == "ERROR" and error["name"] == "bench.memory"
    message = error["message"]
    assert message.startswith("the memory benchmark failed: rank ")
    assert f"failed during bench memory: {EXCEPTION} (raised at gpucert/bench/memory.py:" in message
    assert message.endswith(" in measure)")
    assert "exit code" not in message and "start-up" not in message  # not how the process ended: why
    assert error["details"]["traceback"][-1] == EXCEPTION
    assert any("memory.py" in line for line in error["details"]["traceback"])
    assert str(out_dir / "logs") in error["remediation"]
    # The suite goes on with fresh ranks after a failed benchmark: the remediation must not say it stopped.
    assert error["remediation"].endswith("the run went on with fresh ranks for the benchmarks after this one")
    assert EXCEPTION in " ".join(out.split())  # rank 0's report on the terminal


@pytest.mark.slow
def test_launch_local_raises_with_the_ranks_exception(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as info:
        launch_local(2, {"benchmark": "memory", "config": {"bogus": 1}}, tmp_path, timeout_s=120)
    assert EXCEPTION in str(info.value) and "memory.py" in str(info.value)


def test_raised_at_names_the_package_path_of_the_raising_function() -> None:
    from gpucert.runtime.device import pick_ordinal

    with pytest.raises(Exception) as info:
        pick_ordinal(3, 4, 2, None)
    where = raised_at(info.value)
    assert where is not None and where.startswith("gpucert/runtime/device.py:") and where.endswith(" in pick_ordinal")


def test_a_rank_killed_by_sigkill_points_at_the_oom_killer() -> None:
    assert "OOM killer" in exit_cause(-9)
    assert exit_cause(3) == "exit code 3"
