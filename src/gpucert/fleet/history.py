"""Each node's history: its measured figures over time, and drift against its own baseline.

    gpucert report history NODE [RUNS_DIR]      (RUNS_DIR: default runs/, the runs_dir every verb writes to)

Every run directory under RUNS_DIR (`<time>-<host>/report.json`) is indexed into RUNS_DIR/history.sqlite, once:
a run directory deleted later keeps its figures there. A figure is a result with a number and a direction
(report/direction.py: benchmarks, training, evaluation), per node, check and subject (`node GPU 2`).

For each figure of NODE, the baseline is its first run measured with the same method version as its latest
(figures of another METHOD_VERSION were measured differently and are not compared). The latest value is judged
twice: against the profile (the status the run gave it) and against the baseline: worse by more than the
tolerance (--threshold, 5 %; or twice the repeats' spread where wider) is a WARN drift, e.g. "matmul.bf16.max
on node GPU 2: 688.6 TFLOP/s, 14.0 % below its baseline 800.5 (2026-11-22)". One run only is INFO: nothing to
compare yet. Each figure's row leads with the worse of the two; the exit code is the worst row, as for any
report (0 PASS, 1 WARN, 2 FAIL), and the last line (the verdict) says so with both judgements counted. Piped, or
on a terminal too narrow for the table with its names and figures whole, rows are `status | check | subject |
baseline | latest | change | profile | drift | message` lines.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpucert.config.loader import ConfigError
from gpucert.report.direction import HIGHER, NOISE_SIGMAS, direction_of, relative_spread
from gpucert.report.schema import Report
from gpucert.report.store import load_report
from gpucert.report.terminal import (
    STATUS_STYLE,
    fit_tables,
    plain_fields,
    plain_output,
    print_line,
    too_narrow_line,
)
from gpucert.status import Status, worst

HISTORY_FILE = "history.sqlite"
SCHEMA_VERSION = 1
# The newest values shown beside the baseline.
SHOWN_VALUES = 6

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    started_at TEXT NOT NULL,
    verb TEXT NOT NULL,
    host TEXT NOT NULL,
    status TEXT NOT NULL,
    tool_version TEXT NOT NULL,
    method_version TEXT NOT NULL,
    profile TEXT NOT NULL,
    mtime_ns INTEGER NOT NULL,
    UNIQUE (path, started_at)
);
CREATE TABLE IF NOT EXISTS figures (
    run_id INTEGER NOT NULL REFERENCES runs (id),
    node TEXT NOT NULL,
    name TEXT NOT NULL,
    subject TEXT NOT NULL,
    gpu_index INTEGER,
    uuid TEXT,
    value REAL NOT NULL,
    unit TEXT,
    status TEXT NOT NULL,
    direction TEXT NOT NULL,
    spread REAL
);
CREATE INDEX IF NOT EXISTS figures_by_node ON figures (node, name, subject);
"""


@contextlib.contextmanager
def open_history(path: Path) -> Iterator[sqlite3.Connection]:
    """The history database at `path`, created if need be; committed and closed when the block ends."""
    try:
        conn = sqlite3.connect(path, timeout=30)
    except sqlite3.Error as exc:
        raise ConfigError(f"{path}: cannot open the history database: {exc}") from None
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise ConfigError(f"{path}: history schema {version}, this gpucert reads {SCHEMA_VERSION}")
        conn.executescript(_SCHEMA)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        yield conn
        conn.commit()
    except sqlite3.Error as exc:
        raise ConfigError(f"{path}: the history database is unusable: {exc}") from None
    finally:
        conn.close()


def add_report(conn: sqlite3.Connection, report: Report, path: Path, mtime_ns: int = 0) -> bool:
    """Index one report's figures; False when this run (its directory and start time) is already there."""
    meta = report.meta
    cursor = conn.execute(
        "INSERT OR IGNORE INTO runs (path, started_at, verb, host, status, tool_version, method_version, profile,"
        " mtime_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            str(path),
            meta.started_at,
            meta.verb,
            meta.host,
            report.status.value,
            meta.tool_version,
            meta.method_version,
            meta.profile,
            mtime_ns,
        ),
    )
    if cursor.rowcount == 0:
        conn.execute(
            "UPDATE runs SET mtime_ns = ? WHERE path = ? AND started_at = ?", (mtime_ns, str(path), meta.started_at)
        )
        return False
    run_id = cursor.lastrowid
    head = meta.nodes[0] if meta.nodes else meta.host
    rows = []
    for r in report.results:
        direction = direction_of(r)
        if direction is None or isinstance(r.value, bool) or not isinstance(r.value, (int, float)):
            continue
        node = r.node if r.node is not None else (head if len(meta.nodes) <= 1 else "")
        uuid = r.details.get("uuid") if isinstance(r.details, dict) else None
        spread = relative_spread(r)
        rows.append(
            (
                run_id,
                node,
                r.name,
                r.subject,
                r.gpu_index,
                uuid,
                float(r.value),
                r.unit,
                r.status.value,
                direction,
                spread,
            )
        )
    conn.executemany("INSERT INTO figures VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return True


def index_runs(conn: sqlite3.Connection, runs_dir: Path) -> tuple[int, list[str]]:
    """Index every `runs_dir/*/report.json` not indexed yet: (runs added, reports that could not be read)."""
    added, problems = 0, []
    # A report is read again only when its file changed (a fixed --output written over by the next run).
    seen = set(conn.execute("SELECT path, mtime_ns FROM runs"))
    for path in sorted(runs_dir.glob("*/report.json")):
        directory, mtime_ns = str(path.parent.resolve()), path.stat().st_mtime_ns
        if (directory, mtime_ns) in seen:
            continue
        try:
            report = load_report(path)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        added += add_report(conn, report, Path(directory), mtime_ns)
    return added, problems


@dataclass(frozen=True)
class Point:
    started_at: str
    value: float
    status: Status
    spread: float | None
    method_version: str
    run: str


@dataclass(frozen=True)
class Series:
    name: str
    subject: str
    unit: str | None
    direction: str
    points: list[Point]  # oldest first, all of the latest point's method version
    older_method: int  # points left out: measured with another method version


def node_series(conn: sqlite3.Connection, node: str) -> list[Series]:
    """Every figure of `node` over time, in the order the checks first ran."""
    rows = conn.execute(
        "SELECT f.name, f.subject, f.unit, f.direction, r.started_at, f.value, f.status, f.spread, r.method_version,"
        " r.path FROM figures f JOIN runs r ON r.id = f.run_id WHERE f.node = ? ORDER BY r.started_at, f.rowid",
        (node,),
    ).fetchall()
    grouped: dict[tuple[str, str], list[tuple[str | None, str, Point]]] = {}
    for name, subject, unit, direction, started, value, status, spread, method, run in rows:
        point = Point(started, value, Status(status), spread, method, run)
        grouped.setdefault((name, subject), []).append((unit, direction, point))
    series = []
    for (name, subject), entries in grouped.items():
        unit, direction, latest = entries[-1]
        same = [p for _, _, p in entries if p.method_version == latest.method_version]
        series.append(Series(name, subject, unit, direction, same, len(entries) - len(same)))
    return series


def known_nodes(conn: sqlite3.Connection) -> list[str]:
    return [row[0] for row in conn.execute("SELECT DISTINCT node FROM figures WHERE node != '' ORDER BY node")]


@dataclass(frozen=True)
class Drift:
    series: Series
    change_pct: float | None  # latest against baseline, signed (+ is higher); None with one run
    band_pct: float
    status: Status  # against the baseline: PASS within the band, WARN worse beyond it, INFO one run only
    message: str


def judge_drift(series: Series, tolerance_pct: float) -> Drift:
    """The latest value against the baseline (the first of the same method): worse beyond the noise band is WARN."""
    base, latest = series.points[0], series.points[-1]
    spreads = [p.spread for p in (base, latest) if p.spread is not None]
    band = max([tolerance_pct, *(100.0 * NOISE_SIGMAS * s for s in spreads)])
    unit = f" {series.unit}" if series.unit else ""
    if len(series.points) == 1:
        return Drift(series, None, band, Status.INFO, f"{series.name} on {series.subject}: one run, the baseline")
    if base.value == 0:
        return Drift(series, None, band, Status.INFO, f"{series.name} on {series.subject}: baseline is 0, no ratio")
    change = 100.0 * (latest.value - base.value) / abs(base.value)
    worse = -change if series.direction == HIGHER else change
    way = "below" if change < 0 else "above"
    moved = f"{abs(change):.1f} % {way}" if change else "the same as"
    said = (
        f"{series.name} on {series.subject}: {latest.value:g}{unit}, {moved} its baseline "
        f"{base.value:g}{unit} ({base.started_at[:10]})"
    )
    if worse > band:
        return Drift(series, change, band, Status.WARN, f"{said}; more than the {band:.1f} % allowed: re-measure it")
    if -worse > band:
        return Drift(series, change, band, Status.PASS, f"{said}; better, by more than the {band:.1f} % band")
    return Drift(series, change, band, Status.PASS, f"{said}; within {band:.1f} %")


def run_history(rest: list[str], tolerance_pct: float, console: Console) -> int:
    """`gpucert report history NODE [RUNS_DIR]`: index RUNS_DIR, show NODE's figures and drift; the exit code."""
    if not 1 <= len(rest) <= 2:
        raise ConfigError("report history takes a node and optionally the runs directory: history NODE [RUNS_DIR]")
    if not 0 <= tolerance_pct < math.inf:  # nan fails both and passed every drift; inf would find none ever
        raise ConfigError(
            f"--threshold (the % worse than the baseline that is a drift) must be a number >= 0, found {tolerance_pct}"
        )
    node, runs_dir = rest[0], Path(rest[1] if len(rest) == 2 else "runs")
    if not runs_dir.is_dir():
        raise ConfigError(f"{runs_dir}: no such runs directory (gpucert writes runs to runs_dir, default runs/)")
    with open_history(runs_dir / HISTORY_FILE) as conn:
        _added, problems = index_runs(conn, runs_dir)
        series = node_series(conn, node)
        nodes = known_nodes(conn)
    for problem in problems:
        console.print(f"not indexed: {problem}", style="yellow")
    if not series:
        raise ConfigError(
            f"no measured figures of node {node!r} in {runs_dir} (nodes with figures: {', '.join(nodes) or 'none'}); "
            "run gpucert accept or bench on it first"
        )
    drifts = [judge_drift(s, tolerance_pct) for s in series]
    print_history(node, runs_dir, drifts, console)
    return worst([row_status(d) for d in drifts]).exit_code


def _short(started_at: str) -> str:
    return started_at[:16].replace("T", " ")


# The columns of every view; piped, each row is one line that leads with its status, as every verb's does.
COLUMNS = ("status", "check", "subject", "baseline", "latest", "change", "profile", "drift")
PLAIN_HEADER = " | ".join([*COLUMNS, "message"])


def row_status(d: Drift) -> Status:
    """A figure's status, the worse of its two judgements: the latest run's against the profile and the drift
    against the baseline (as the exit code is, over every figure)."""
    return worst([d.status, d.series.points[-1].status])


def verdict_line(drifts: list[Drift]) -> str:
    """The verdict and why: each judgement counted, so an exit code 2 with only drift WARNs in sight is explained
    by the profile's FAILs."""
    status = worst([row_status(d) for d in drifts])

    def counts(statuses: list[Status]) -> str:
        return ", ".join(f"{statuses.count(s)} {s.value}" for s in sorted(set(statuses), reverse=True))

    profile = counts([d.series.points[-1].status for d in drifts])
    drift = counts([d.status for d in drifts])
    return (
        f"verdict: {status.value}  (the worse of two judgements: the latest run against its profile, {profile}; "
        f"against the baseline, {drift}; exit code {status.exit_code})"
    )


# The narrowest the values over time wrap to on a narrow terminal: two values a line.
VALUES_MIN_WIDTH = 14


@dataclass(frozen=True)
class _Row:
    status: Status
    baseline: tuple[str, str]  # the figure and, in brackets, when it was measured
    cells: list[str]  # check, subject, baseline, latest, change, profile, drift
    values: str


def _row(d: Drift) -> _Row:
    s, base, latest = d.series, d.series.points[0], d.series.points[-1]
    unit = f" {s.unit}" if s.unit else ""
    values = " ".join(f"{p.value:g}" for p in s.points[-SHOWN_VALUES:])
    if len(s.points) > SHOWN_VALUES:
        values = "... " + values
    baseline = (f"{base.value:g}{unit}", f"({_short(base.started_at)})")
    cells = [
        s.name,
        s.subject,
        " ".join(baseline),
        f"{latest.value:g}{unit}",
        "" if d.change_pct is None else f"{d.change_pct:+.1f} %",
        latest.status.value,
        d.status.value,
    ]
    return _Row(row_status(d), baseline, cells, values)


def _history_table(rows: list[_Row], stacked: bool) -> Table:
    """The rows as a table, names and figures whole (report/terminal.py fit_tables): the values over time wrap
    between values where the terminal is narrow, and `stacked` puts a baseline's date under its figure."""
    table = Table(show_lines=False)
    for column in COLUMNS:
        table.add_column(column, no_wrap=True)
    longest = max((len(value) for row in rows for value in row.values.split()), default=0)
    table.add_column("values over time (newest last)", overflow="fold", min_width=max(VALUES_MIN_WIDTH, longest))
    for row in rows:
        cells = list(row.cells)
        if stacked:
            cells[2] = "\n".join(row.baseline)
        table.add_row(Text(row.status.value, style=STATUS_STYLE[row.status]), *cells, row.values)
    return table


def _fitted_history_table(rows: list[_Row], console: Console) -> tuple[Table, int | None]:
    """The table that fits the terminal, a baseline on one line where there is room, and the width it needs
    where none does (fit_tables)."""
    table = _history_table(rows, stacked=False)
    if fit_tables(console, [table]) is None:
        return table, None
    table = _history_table(rows, stacked=True)
    return table, fit_tables(console, [table])


def print_history(node: str, runs_dir: Path, drifts: list[Drift], console: Console) -> None:
    """A table on a terminal wide enough for it; piped, written to a file with `--format plain` or on a narrow
    terminal, one line per figure."""
    runs = {p.run for d in drifts for p in d.series.points}
    print_line(console, f"{node}: {len(drifts)} figures from {len(runs)} runs in {runs_dir}")
    rows = [_row(d) for d in drifts]
    table, need = (None, None) if plain_output(console) else _fitted_history_table(rows, console)
    if need is not None:
        console.print(too_narrow_line(need, console))
    if table is not None and need is None:
        console.print(table)
        # Piped, each drift's row says it in full already: once, so `grep -c '^WARN'` counts each figure once.
        for d in drifts:
            if d.status is Status.WARN:
                print_line(console, f"WARN {d.message}")
    else:
        print_line(console, PLAIN_HEADER)
        for d, row in zip(drifts, rows, strict=True):
            line = Text(plain_fields(row.status.value, *row.cells, f"{d.message}; values (newest last): {row.values}"))
            line.stylize(STATUS_STYLE[row.status], 0, len(row.status.value))  # shows only where the console has colour
            print_line(console, line)
    older = sum(d.series.older_method for d in drifts)
    if older:
        console.print(f"{older} older values measured with another method version are not compared", style="dim")
    print_line(console, verdict_line(drifts))
