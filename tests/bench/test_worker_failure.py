"""A worker's own exception is what the ERROR result says: its type, its message and where it was raised,
for one rank (no shared store to record it in) and for several, through `gpucert bench` and `launch_local`.

The failing case passes validation in the parent and fails inside the worker: the spec the worker reads carries
a key its benchmark's config does not have (a TypeError in the worker, as any exception there would be).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import gpucert.bench.suite
from gpucert.bench import worker
from gpucert.bench.suite import LaunchError, launch_local, worker_failure
from gpucert.cli import main
from gpucert.runtime.group import AbortRecord
from gpucert.runtime.spawn import WorkerExit

EXCEPTION = "TypeError: MemoryBenchConfig.__init__() got an unexpected keyword argument 'bogus'"


@pytest.fixture
def broken_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    real = gpucert.bench.suite.bench_spec

    def with_bogus_key(*args: Any) -> tuple[dict[str, Any], dict[str, str]]:
        spec, env = real(*args)
        return {**spec, "config": {**spec["config"], "bogus": 1}}, env

    monkeypatch.setattr(gpucert.bench.suite, "bench_spec", with_bogus_key)


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_error_result_shows_the_workers_exception(nproc: int, broken_spec: None, tmp_path: Path, capsys) -> None:
    code = main(["bench", "memory", "--profile", "cpu", "--nproc", str(nproc), "-o", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 3
    (error,) = json.loads((tmp_path / "report.json").read_text())["results"]
    assert error["status"] == "ERROR" and error["name"] == "bench.memory"
    message = error["message"]
    assert message.startswith("the memory benchmark failed: rank ")
    assert f"failed during bench memory: {EXCEPTION} (raised at gpucert/bench/memory.py:" in message
    assert message.endswith(" in measure)")
    assert "exit code" not in message and "start-up" not in message  # not how the process ended: why
    assert error["details"]["traceback"][-1] == EXCEPTION
    assert any("memory.py" in line for line in error["details"]["traceback"])
    assert str(tmp_path / "logs") in error["remediation"]
    assert EXCEPTION in " ".join(out.split())  # the terminal's problem lines (wrapped to its width)


def test_launch_local_raises_with_the_workers_exception(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as info:
        launch_local(2, {"benchmark": "memory", "config": {"bogus": 1}}, tmp_path, timeout_s=120)
    assert EXCEPTION in str(info.value) and "memory.py" in str(info.value)


def test_a_failure_file_left_by_an_earlier_step_is_not_read(tmp_path: Path) -> None:
    spec = {"benchmark": "memory", "config": {"size_mib": 4, "warmup": 1, "repeats": 2}}
    worker.failure_path(tmp_path / "result.json", 0).write_text("{not json")
    assert launch_local(1, spec, tmp_path, timeout_s=120)["ranks"]
    assert not list(tmp_path.glob("failure-rank*.json"))


def test_a_record_without_the_ranks_own_account_is_shown_as_it_is(tmp_path: Path) -> None:
    """A rank on another node: its cause came through the job's store, its file stayed on its node."""
    record = AbortRecord("rank 9 (node-b rank 9 (H200))", "ValueError: bad", "bench memory", 9, "node-b")
    assert worker_failure(tmp_path, record) == (
        "rank 9 (node-b rank 9 (H200)) failed during bench memory: ValueError: bad",
        {},
    )


def test_raised_at_names_the_package_path_of_the_raising_function() -> None:
    from gpucert.runtime.device import pick_ordinal

    with pytest.raises(Exception) as info:
        pick_ordinal(3, 4, 2, None)
    where = worker.raised_at(info.value)
    assert where is not None and where.startswith("gpucert/runtime/device.py:") and where.endswith(" in pick_ordinal")


def test_a_worker_killed_by_sigkill_points_at_the_oom_killer(tmp_path: Path) -> None:
    assert "OOM killer" in WorkerExit(0, 0, -9, tmp_path / "log").cause
    assert WorkerExit(0, 0, 3, tmp_path / "log").cause == "exit code 3"
