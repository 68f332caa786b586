"""Each node's history in a real SQLite file beside the runs: indexing run directories once, a node's figures
over time, drift against its own baseline (the first run of the same method), `gpucert report history`."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from gpucert.cli import main
from gpucert.fleet.history import (
    HISTORY_FILE,
    Point,
    Series,
    index_runs,
    judge_drift,
    node_series,
    open_history,
    run_history,
)
from gpucert.report.direction import HIGHER
from gpucert.report.schema import Report
from gpucert.report.store import load_report
from gpucert.status import Status
from tests.conftest import FIXTURES

REPORTS = FIXTURES / "reports"
NODE = "h200x4-synth"


def copy_run(runs: Path, name: str, fixture: str) -> Path:
    directory = runs / name
    directory.mkdir(parents=True)
    shutil.copy(REPORTS / fixture, directory / "report.json")
    return directory


def write_run(runs: Path, name: str, report: Report) -> Path:
    directory = runs / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps(report.to_dict()))
    return directory


def scaled(report: Report, started_at: str, factor: float, method_version: str | None = None) -> Report:
    """The report measured again: every benchmark value times factor, at another time."""
    meta = dataclasses.replace(
        report.meta, started_at=started_at, method_version=method_version or report.meta.method_version
    )
    results = [
        dataclasses.replace(r, value=round(r.value * factor, 3))
        if r.category == "benchmark" and isinstance(r.value, float)
        else r
        for r in report.results
    ]
    return dataclasses.replace(report, meta=meta, results=results)


def figure(series: list[Series], name: str, subject: str) -> Series:
    (found,) = [s for s in series if (s.name, s.subject) == (name, subject)]
    return found


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """The week-apart pair of report fixtures, as two run directories."""
    runs = tmp_path / "runs"
    copy_run(runs, "20261122T091204Z-h200x4-synth", "accept-4xh200-synthetic.json")
    copy_run(runs, "20261129T090540Z-h200x4-synth", "accept-4xh200-synthetic-regressed.json")
    return runs


def drifted(out: str) -> list[list[str]]:
    """The piped rows (`status | check | ... | drift | message`) whose drift column says WARN."""
    rows = [line.split(" | ") for line in out.splitlines() if " | " in line and not line.startswith("status |")]
    return [row for row in rows if row[7] == "WARN"]


def test_report_history_flags_drift_against_the_first_run(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Exit 2: the latest run FAILs against the profile (matmul.bf16.max on GPU 2, the p2p pair) as well.
    assert main(["report", "history", NODE, str(runs)]) == 2
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[:2] == [
        f"{NODE}: 49 figures from 2 runs in {runs}",
        "status | check | subject | baseline | latest | change | profile | drift | message",
    ]
    warned = {(row[1], row[2]): row for row in drifted(out)}
    assert len(warned) == 7
    # Each row leads with the worse of its two judgements: GPU 2's max matmul FAILs its profile and drifted.
    matmul = warned[("matmul.bf16.max", "GPU 2 (NVIDIA H200)")]
    assert matmul[0] == "FAIL " and matmul[3:7] == [
        "803.96 TFLOP/s (2026-11-22 09:12)",
        "691.41 TFLOP/s",
        "-14.0 %",
        "FAIL",
    ]
    assert matmul[8].startswith(
        "matmul.bf16.max on GPU 2 (NVIDIA H200): 691.41 TFLOP/s, 14.0 % below its baseline 803.96 TFLOP/s "
        "(2026-11-22); more than the 5.0 % allowed: re-measure it"
    )
    copy = warned[("memory.copy", "GPU 3 (NVIDIA H200)")]
    assert copy[0] == "WARN " and copy[6] == "PASS" and "3.88 TB/s, 8.0 % below" in copy[8]
    # all_gather is 3 % down (within 5 %), the weak p2p pair 16 % up (better): neither drifted.
    assert not [key for key in warned if "all_gather" in key[0] or "p2p" in key[0]]
    # `grep '^FAIL'`: the figures whose latest run FAILs its profile; the last line says why the exit code is 2.
    assert len([line for line in lines if line.startswith("FAIL  | ")]) == 5
    assert lines[-1] == (
        "verdict: FAIL  (the worse of two judgements: the latest run against its profile, 5 FAIL, 1 WARN, 17 PASS, "
        "26 INFO; against the baseline, 7 WARN, 42 PASS; exit code 2)"
    )
    # A tolerance of 20 % lets every change pass; the profile's FAILs still give exit 2.
    assert main(["report", "history", NODE, str(runs), "--threshold", "20"]) == 2
    out = capsys.readouterr().out
    assert not drifted(out) and out.splitlines()[-1].endswith("against the baseline, 49 PASS; exit code 2)")


def test_a_forced_table_of_history_is_whole_in_a_pipe(runs: Path) -> None:
    """`gpucert report history NODE --format table | less`: every row whole (it was folded to 80 columns), the
    verdict line last."""
    done = subprocess.run(
        [sys.executable, "-m", "gpucert", "report", "history", NODE, str(runs), "--format", "table"],
        capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stdout.splitlines()
    (row,) = [line for line in lines if "│ matmul.bf16.max " in line and "GPU 2 (NVIDIA H200)" in line]
    assert "803.96 TFLOP/s (2026-11-22 09:12)" in row and "691.41 TFLOP/s" in row and "803.96 691.41" in row
    assert lines[-1].startswith("verdict: FAIL  (")


def test_the_store_is_sqlite_indexed_once_and_outlives_the_run_directories(runs: Path) -> None:
    db = runs / HISTORY_FILE
    with open_history(db) as conn:
        assert index_runs(conn, runs) == (2, [])
    with open_history(db) as conn:
        assert index_runs(conn, runs) == (0, [])  # nothing new
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (2,)
        assert conn.execute("SELECT count(DISTINCT node) FROM figures").fetchone() == (1,)
    # A run directory deleted (a runs/ cleaned up) keeps its figures in the history.
    shutil.rmtree(runs / "20261122T091204Z-h200x4-synth")
    with open_history(db) as conn:
        index_runs(conn, runs)
        matmul = figure(node_series(conn, NODE), "matmul.bf16.max", "GPU 2 (NVIDIA H200)")
    assert [p.value for p in matmul.points] == [803.96, 691.41]


def test_a_directory_written_over_is_indexed_again(tmp_path: Path) -> None:
    """A fixed --output (a CronJob's, a health plugin's) holds one report at a time; each one is kept."""
    runs = tmp_path / "runs"
    base = load_report(REPORTS / "accept-4xh200-synthetic.json")
    directory = write_run(runs, "nightly", base)
    with open_history(runs / HISTORY_FILE) as conn:
        assert index_runs(conn, runs) == (1, [])
        write_run(runs, "nightly", scaled(base, "2026-11-23T09:00:00+00:00", 0.99))
        os.utime(directory / "report.json", ns=(1, 1))  # a new mtime even on a coarse clock
        assert index_runs(conn, runs) == (1, [])
        assert {len(s.points) for s in node_series(conn, NODE)} == {2}


def test_the_baseline_is_the_first_run_of_the_latest_method(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    base = load_report(REPORTS / "accept-4xh200-synthetic.json")
    write_run(runs, "a", base)
    # The measurement method changed (METHOD_VERSION 2): its first run is the new baseline, 10 % lower is no drift.
    write_run(runs, "b", scaled(base, "2026-11-23T09:00:00+00:00", 0.90, method_version="2"))
    write_run(runs, "c", scaled(base, "2026-11-24T09:00:00+00:00", 0.90, method_version="2"))
    assert main(["report", "history", NODE, str(runs)]) == 2  # the p2p pair FAILs in every run
    out = capsys.readouterr().out
    assert not drifted(out)
    assert "older values measured with another method version are not compared" in out


def test_values_over_time_and_one_run_is_only_a_baseline(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    base = load_report(REPORTS / "accept-4xh200-synthetic.json")
    write_run(runs, "r0", base)
    with open_history(runs / HISTORY_FILE) as conn:
        index_runs(conn, runs)
        drifts = [judge_drift(s, 5.0) for s in node_series(conn, NODE)]
    assert {d.status for d in drifts} == {Status.INFO}
    for day in range(1, 9):
        write_run(runs, f"r{day}", scaled(base, f"2026-11-{22 + day}T09:00:00+00:00", 1 - day / 100))
    with open_history(runs / HISTORY_FILE) as conn:
        index_runs(conn, runs)
        series = figure(node_series(conn, NODE), "memory.copy", "GPU 0 (NVIDIA H200)")
    assert [p.value for p in series.points] == [4.191] + [round(4.191 * (1 - d / 100), 3) for d in range(1, 9)]
    drift = judge_drift(series, 5.0)
    assert (drift.status, round(drift.change_pct or 0, 1)) == (Status.WARN, -8.0)


def test_the_repeats_spread_widens_the_band() -> None:
    def point(value: float, spread: float | None) -> Point:
        return Point("2026-11-22T00:00:00", value, Status.PASS, spread, "3", "run")

    noisy = Series("matmul.bf16.4096", "n GPU 0", "TFLOP/s", HIGHER, [point(800, 0.05), point(736, 0.05)], 0)
    assert judge_drift(noisy, 5.0).status is Status.PASS  # 8 % is within 2 x 5 % spread
    steady = dataclasses.replace(noisy, points=[point(800, 0.001), point(736, 0.001)])
    assert judge_drift(steady, 5.0).status is Status.WARN
    higher_is_worse = Series("x", "n", "C", "lower is better", [point(60, None), point(70, None)], 0)
    assert judge_drift(higher_is_worse, 5.0).status is Status.WARN


def test_unknown_node_and_bad_reports_are_named(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (runs / "broken").mkdir()
    (runs / "broken" / "report.json").write_text("{not json")
    assert main(["report", "history", "gpu-node-7", str(runs)]) == 3
    err = capsys.readouterr().err
    assert f"no measured figures of node 'gpu-node-7' in {runs} (nodes with figures: {NODE})" in err
    assert main(["report", "history", NODE, str(runs)]) == 2
    assert f"not indexed: {runs / 'broken' / 'report.json'}: not a readable gpucert report" in capsys.readouterr().out
    assert main(["report", "history", NODE, str(runs / "missing")]) == 3
    assert "no such runs directory" in capsys.readouterr().err
    for bad in ("-1", "nan", "inf"):  # nan passed every drift ("within nan %"); inf would find none
        assert main(["report", "history", NODE, str(runs), "--threshold", bad]) == 3
        err = capsys.readouterr().err
        assert f"--threshold (the % worse than the baseline that is a drift) must be a number >= 0, found {bad}" in err


@pytest.mark.parametrize("width", [80, 100, 120, 200])
def test_on_a_terminal_every_check_subject_and_figure_is_whole(runs: Path, width: int) -> None:
    """At 120 columns `matmul.bf16.…` hid which of 4096, 8192 and 16384 a row was, and at 80 `716.…` the figure:
    a table where it fits with every name and figure whole, else one line per figure, never an ellipsis."""
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None, highlight=False, markup=False)
    assert run_history([NODE, str(runs)], 5.0, console) == 2
    text = out.getvalue()
    assert "…" not in text
    with open_history(runs / HISTORY_FILE) as conn:
        series = node_series(conn, NODE)
    assert {s.name for s in series} >= {"matmul.bf16.4096", "matmul.bf16.8192", "matmul.bf16.16384"}
    for s in series:
        unit = f" {s.unit}" if s.unit else ""
        base, latest = f"{s.points[0].value:g}{unit}", f"{s.points[-1].value:g}{unit}"
        cells = [re.escape(cell) for cell in (s.name, s.subject, base)]
        line = rf" [|│] {cells[0]} +[|│] {cells[1]} +[|│] {cells[2]} .*[|│] {re.escape(latest)} +[|│]"
        assert re.search(line, text), f"{s.name} on {s.subject}: not whole in\n{text}"
    for line in text.splitlines():
        if line.startswith(("┏", "┃", "┡", "│", "└")):
            assert len(line) <= width and line.endswith(("┓", "┃", "┩", "│", "┘")), line
    assert ("┏" in text) == (width >= 146)
