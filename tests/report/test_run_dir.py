"""Run directories: unique per run even within one second, locked while a run writes into them, and nothing
left behind by a run that wrote nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpucert.cli import main
from gpucert.config.loader import ConfigError
from gpucert.report.store import claim_run_dir
from gpucert.runtime.dirlock import LOCK_FILE as LOCK_NAME

STARTED = datetime(2026, 11, 22, 19, 25, 27, 123456, tzinfo=timezone.utc)

# A process that claims DIR, says so, and sleeps until it is killed.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from datetime import datetime, timezone
    from pathlib import Path
    from gpucert.report.store import claim_run_dir
    claim_run_dir(Path(sys.argv[1]), Path("runs"), "h", datetime.now(timezone.utc))
    print("held", flush=True)
    time.sleep(120)
    """
)


@pytest.fixture
def holder(tmp_path: Path):
    """Start a process holding a run directory; stop it at the end."""
    started: list[subprocess.Popen[str]] = []

    def hold(directory: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        return proc

    yield hold
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_two_runs_started_in_the_same_second_get_two_directories(tmp_path: Path) -> None:
    first = claim_run_dir(None, tmp_path / "runs", "node1", STARTED)
    second = claim_run_dir(None, tmp_path / "runs", "node1", STARTED)
    assert first.path.name == "20261122T192527Z-node1"
    assert second.path.name == "20261122T192527Z-node1-2"
    assert first.path.is_dir() and second.path.is_dir()
    first.release()
    second.release()


def test_a_directory_held_by_another_run_is_refused_naming_it_and_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    held = claim_run_dir(out, tmp_path / "runs", "node1", STARTED)
    with pytest.raises(ConfigError) as info:
        claim_run_dir(out, tmp_path / "runs", "node1", STARTED)
    message = str(info.value)
    assert message.startswith(f"--output {out} is in use by another gpucert run (pid {os.getpid()} on host ")
    assert socket.gethostname() in message and "choose another --output" in message
    held.release()
    claim_run_dir(out, tmp_path / "runs", "node1", STARTED).release()  # free again


def test_release_leaves_no_lock_file_and_no_empty_directory(tmp_path: Path) -> None:
    out = tmp_path / "new" / "run"
    claimed = claim_run_dir(out, tmp_path / "runs", "node1", STARTED)
    assert (out / LOCK_NAME).exists()
    claimed.release()
    assert not (tmp_path / "new").exists()  # both made for this run, both empty

    kept = claim_run_dir(out, tmp_path / "runs", "node1", STARTED)
    (out / "report.json").write_text("{}")
    kept.release()
    kept.release()  # twice is harmless (the end of a run and an abort handler may both release)
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]


def test_an_existing_output_directory_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    claim_run_dir(out, tmp_path / "runs", "node1", STARTED).release()
    assert out.is_dir()


def test_a_stale_lock_file_blocks_nobody(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text("pid 999999 on host gone, since 2026-11-22T19:25:27+00:00\n")
    claimed = claim_run_dir(out, tmp_path / "runs", "node1", STARTED)
    assert f"pid {os.getpid()} on host" in (out / LOCK_NAME).read_text()
    claimed.release()


def test_the_lock_of_a_killed_run_is_gone_with_it(tmp_path: Path, holder) -> None:
    out = tmp_path / "run"
    proc = holder(out)
    with pytest.raises(ConfigError, match=rf"pid {proc.pid} on host"):
        claim_run_dir(out, tmp_path / "runs", "node1", STARTED)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (out / LOCK_NAME).exists()  # SIGKILL leaves the file; the kernel dropped the lock
    claim_run_dir(out, tmp_path / "runs", "node1", STARTED).release()


def test_a_second_run_on_a_held_output_exits_3_before_any_work(tmp_path: Path, holder, capsys) -> None:
    out = tmp_path / "run"
    proc = holder(out)
    code = main(["health", "--profile", "cpu", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 3
    assert f"--output {out} is in use by another gpucert run (pid {proc.pid} on host" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written beside the holder's lock


class _SameSecond(datetime):
    @classmethod
    def now(cls, tz=None):  # type: ignore[override]
        return STARTED


def test_two_cli_runs_in_the_same_second_write_two_reports(tmp_path: Path, monkeypatch, capsys) -> None:
    import gpucert.acceptance

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gpucert.acceptance, "datetime", _SameSecond)
    assert main(["discover"]) == 0
    assert main(["discover"]) == 0
    capsys.readouterr()
    runs = sorted((tmp_path / "runs").iterdir())
    host = runs[0].name.removeprefix("20261122T192527Z-")
    assert [r.name for r in runs] == [f"20261122T192527Z-{host}", f"20261122T192527Z-{host}-2"]
    for run in runs:
        assert sorted(p.name for p in run.iterdir()) == ["report.json", "report.md"]  # the lock is gone


def test_the_same_verb_rerun_in_an_output_replaces_the_earlier_runs_files_and_keeps_the_rest(
    tmp_path: Path, capsys
) -> None:
    """`health --drain --output /var/lib/gpucert/last` every 300 s: each run's directory holds that run alone."""
    out = tmp_path / "last"
    assert main(["health", "--profile", "cpu", "-o", str(out)]) == 0
    # What an earlier run of the verb left that this one would not write, and what no gpucert run writes.
    (out / "report.html").write_text("<title>gpucert health: an earlier run</title>")
    (out / "logs").mkdir()
    for name in ("rank-1.log", "error-rank-1.json", "node-0-gpu01.log"):
        (out / "logs" / name).write_text("earlier")
    (out / "job.sbatch").write_text("#!/bin/bash\n")
    assert main(["health", "--profile", "cpu", "-o", str(out)]) == 0
    capsys.readouterr()
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "job.sbatch",  # a launch's script and its node logs belong to whoever made them
        "logs",
        "logs/node-0-gpu01.log",
        "report.json",
        "report.md",
    ]


def test_another_verb_in_an_output_holding_a_report_is_refused_before_any_work(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["discover", "--profile", "cpu", "-o", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(["health", "--profile", "cpu", "-o", str(out)]) == 3
    err = capsys.readouterr().err
    assert f"--output {out} holds the report of an earlier `gpucert discover` run" in err
    assert "this `gpucert health` would mix its files with that run's" in err and f"remove {out} first" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_output_with_a_report_gpucert_cannot_read_is_refused_not_cleared(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "report.json").write_text("{not json")
    assert main(["health", "--profile", "cpu", "-o", str(out)]) == 3
    assert "a report.json gpucert cannot read" in capsys.readouterr().err
    assert (out / "report.json").read_text() == "{not json"


def test_a_run_stopped_in_its_start_up_leaves_no_directory_of_empty_logs(tmp_path: Path) -> None:
    """Ctrl-C while the ranks started left runs/<time>-<host>/logs/rank-1.log, empty, and nothing else."""
    started = datetime.now(timezone.utc)
    with claim_run_dir(None, tmp_path / "runs", "vm", started) as run_dir:
        (run_dir.path / "logs").mkdir()
        (run_dir.path / "logs" / "rank-1.log").write_text("")
    assert not (tmp_path / "runs").exists()
    # A run that wrote its report keeps its logs, empty or not.
    with claim_run_dir(None, tmp_path / "runs", "vm", started) as run_dir:
        (run_dir.path / "logs").mkdir()
        (run_dir.path / "logs" / "rank-1.log").write_text("")
        (run_dir.path / "report.json").write_text("{}")
    assert (run_dir.path / "logs" / "rank-1.log").exists()
