"""Tables on a terminal of 80, 100, 120 and 200 columns, and in a file: names (check, subject) and figures (a value
with its unit, a change in %) are never folded mid-token nor cut with an ellipsis, and every table keeps its
borders. On a terminal the free text (an expectation, a message) wraps at word boundaries to make room; where even
that is not enough, the results print as the plain lines a pipe gets. A per-GPU value that is not PASS says its
status in words, so the grid reads right without colour.

Each report is a shipped fixture printed to a console that says it is a terminal of a given width, as rich sees
`COLUMNS=80` on a TTY.
"""

from __future__ import annotations

import dataclasses
import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from tests.conftest import FIXTURES

import gpucert.report.terminal as terminal
from gpucert.report.compare import compare_reports, print_comparison
from gpucert.report.schema import Result
from gpucert.report.store import load_report
from gpucert.report.terminal import (
    fit_table,
    format_value,
    gpu_matrices,
    gpu_matrix,
    make_console,
    node_table,
    print_report,
)
from gpucert.status import Status

ACCEPT = FIXTURES / "reports" / "accept-4xh200-synthetic.json"
REGRESSED = FIXTURES / "reports" / "accept-4xh200-synthetic-regressed.json"
TWO_NODES = FIXTURES / "localize" / "h200x2-slowed" / "pairs" / "r1-00" / "report.json"
WIDTHS = (80, 100, 120, 200)
# A table's lines begin and end with a border; a table cropped at the window's edge loses its right one.
TABLE_LINE = re.compile(r"^[┏┃┡│└┌├]")
RIGHT_BORDER = ("┓", "┃", "┩", "│", "┘", "┐", "┤")


@pytest.fixture(autouse=True)
def _auto_format() -> Iterator[None]:
    yield
    terminal.set_format("auto")


def on_terminal(width: int, render: Callable[[Console], None]) -> str:
    out = io.StringIO()
    render(Console(file=out, width=width, force_terminal=True, color_system=None, highlight=False, markup=False))
    return out.getvalue()


def assert_tables_whole(text: str, width: int) -> None:
    """No cell cut with an ellipsis, every table line within the window and closed by its right border."""
    assert "…" not in text, text
    for line in text.splitlines():
        if TABLE_LINE.match(line):
            assert len(line) <= width and line.endswith(RIGHT_BORDER), f"{len(line)} columns: {line!r}"


def _cell(text: str) -> str:
    # A cell: the text whole on one line, padded to its column.
    return rf"{re.escape(text)} +│"


def assert_result_whole(text: str, r: Result) -> None:
    """The result's name, subject and value each whole on one line: its plain line, its row of the node table, or
    its cell of the per-GPU grid."""
    value = format_value(r)
    plain = f"{r.status.value:<5} | {r.name} | {r.subject} | {value} | "
    row = rf"│ {r.status.value} +│ {_cell(r.name)} {_cell(r.subject)} {_cell(value)}"
    grid = rf"│ {_cell(r.name)}.* {re.escape(value)}( {r.status.value})? +│"
    found = plain in text or re.search(row, text) or (r.gpu_index is not None and re.search(grid, text))
    assert found, f"{r.status.value} {r.name} ({r.subject}) {value}: not whole in\n{text}"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("path", [ACCEPT, REGRESSED, TWO_NODES], ids=["accept", "regressed", "two-nodes"])
def test_a_report_keeps_every_name_and_figure_whole_at_any_width(path: Path, width: int) -> None:
    report = load_report(path)
    text = on_terminal(width, lambda console: print_report(report, console, False, None))
    assert_tables_whole(text, width)
    for r in report.results:
        assert_result_whole(text, r)
    # Too narrow for the node checks with their names and figures whole: the lines a pipe gets, and why.
    if width == 80:
        assert re.match(r"one line per result: the table needs \d+ columns", text) and "┏" not in text
    if width == 200:
        assert "┏" in text


def table_rows(text: str) -> list[list[str]]:
    """The rows of the tables in `text` that have a status column, each cell's lines joined by a space."""
    rows: list[list[list[str]]] = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if not line.startswith("│") or not cells:
            continue
        if cells[0]:
            rows.append([[cell] for cell in cells])
        elif rows:
            for parts, cell in zip(rows[-1], cells, strict=True):
                parts.append(cell)
    return [[" ".join(part for part in parts if part) for parts in row] for row in rows]


def test_at_120_columns_the_free_text_wraps_at_words_and_the_rest_stays_whole() -> None:
    report = load_report(REGRESSED)
    text = on_terminal(120, lambda console: print_report(report, console, False, None))
    assert "node checks" in text and "per-GPU checks" in text
    assert_tables_whole(text, 120)
    rows = {(row[1], row[2]): row for row in table_rows(text) if row[0] in {s.value for s in Status}}
    for r in report.results:
        if r.gpu_index is None:
            row = rows[(r.name, r.subject)]
            assert row[:4] == [r.status.value, r.name, r.subject, format_value(r)]
            # Free text wraps at spaces; a word wider than its column (a config key in a message) folds.
            assert [cell.replace(" ", "") for cell in row[4:]] == [
                (r.expected or "-").replace(" ", ""),
                r.message.replace(" ", ""),
            ]
    # The first line of a wrapped row holds its name, subject and figure whole.
    (first,) = [line for line in text.splitlines() if line.startswith("│ WARN ")]
    assert re.search(r"│ collective.all_gather +│ 4 ranks \(nccl\) +│ 330.4 GB/s +│", first), first


def test_a_table_forced_into_a_file_keeps_the_expectation_at_its_natural_width(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--format table > f`: the message was over 200 columns while `expected` wrapped at 16."""
    terminal.set_format("table")
    report = load_report(ACCEPT)
    print_report(report, make_console(), False, None)
    text = capsys.readouterr().out
    (xid,) = [r for r in report.results if r.name == "node.xid"]
    assert re.search(
        rf"│ {_cell(xid.name)} {_cell(xid.subject)} {_cell(format_value(xid))} {_cell(xid.expected or '')}", text
    )
    assert "collective.reduce_scatter " in text and "…" not in text


@pytest.mark.parametrize("width", WIDTHS)
def test_a_comparison_keeps_every_name_and_figure_whole(width: int) -> None:
    comparisons = [c for c in compare_reports(load_report(ACCEPT), load_report(REGRESSED)) if c.changed]
    text = on_terminal(width, lambda console: print_comparison(console, comparisons, "A", "B", changed_only=True))
    assert_tables_whole(text, width)
    for fragment in ("sub", "jec", "794", "TFL"):  # a header or a figure folded to the width of a narrow column
        assert f"│ {fragment} " not in text
    plain = "FAIL  | matmul.bf16.max | GPU 2 | 804 TFLOP/s | 691.4 TFLOP/s | PASS → FAIL | REGRESSED, -14.0 %"
    row = r"│ FAIL +│ matmul.bf16.max +│ GPU 2 +│ 804 TFLOP/s +│ 691.4 TFLOP/s +│ PASS → FAIL +│ -14.0 % +│"
    assert plain in text if width < 140 else re.search(row, text), text


def test_a_grid_too_wide_for_the_terminal_is_split_into_fewer_gpus_each() -> None:
    results = load_report(ACCEPT).results
    console = Console(file=io.StringIO(), width=80, force_terminal=True)
    tables = gpu_matrices(results, console)
    assert [[str(c.header) for c in t.columns] for t in tables] == [
        ["check", "GPU0", "GPU1"],
        ["check", "GPU2", "GPU3"],
    ]
    assert [t.title for t in tables] == ["per-GPU checks, GPU0 to GPU1", "per-GPU checks, GPU2 to GPU3"]
    for table in tables:
        text = on_terminal(80, lambda c, table=table: c.print(table))
        assert_tables_whole(text, 80)
    wide = Console(file=io.StringIO(), width=200, force_terminal=True)
    assert len(gpu_matrices(results, wide)) == 1


def test_fit_table_narrows_only_the_free_text_and_says_when_it_cannot() -> None:
    report = load_report(REGRESSED)
    table = node_table(report.results)
    assert isinstance(table, Table)
    console = Console(file=io.StringIO(), width=120, force_terminal=True)
    narrowest = fit_table(table, console)
    assert narrowest <= 120
    widths = {str(c.header): c.width for c in table.columns}
    assert widths["status"] is widths["check"] is widths["subject"] is widths["value"] is None
    assert widths["expected"] is not None and widths["message"] is not None
    assert widths["expected"] >= terminal.EXPECTED_MIN_WIDTH and widths["message"] >= terminal.MESSAGE_MIN_WIDTH
    assert console.measure(table).maximum == 120

    table = node_table(report.results)
    assert isinstance(table, Table)
    assert fit_table(table, Console(file=io.StringIO(), width=80, force_terminal=True)) == narrowest
    assert all(c.width is None for c in table.columns)  # untouched: the caller prints lines


def _cell_of(text: str, check: str, gpu: int) -> str:
    (row,) = [line for line in text.splitlines() if line.startswith(f"│ {check} ")]
    return row.split("│")[gpu + 2].strip()


@pytest.mark.parametrize("where", ["terminal", "file"])
def test_a_per_gpu_value_that_is_not_pass_says_its_status_in_words(
    where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """GPU 2's 691.4 TFLOP/s FAILs its floor: colour alone said so, lost in a log file or to a colour-blind
    reader."""
    report = load_report(REGRESSED)
    if where == "terminal":
        text = on_terminal(200, lambda console: print_report(report, console, False, None))
    else:
        terminal.set_format("table")
        print_report(report, make_console(), False, None)
        text = capsys.readouterr().out
    (failed,) = [r for r in report.results if r.gpu_index is not None and r.status >= Status.WARN]
    assert (failed.name, failed.gpu_index, failed.status) == ("matmul.bf16.max", 2, Status.FAIL)
    assert _cell_of(text, "matmul.bf16.max", 2) == "691.4 TFLOP/s FAIL"
    assert _cell_of(text, "matmul.bf16.max", 1) == "797.8 TFLOP/s"
    assert _cell_of(text, "memory.copy", 3) == "3.88 TB/s"


def test_a_skipped_per_gpu_check_says_skip() -> None:
    skipped = [
        dataclasses.replace(r, status=Status.SKIP) if (r.name, r.gpu_index) == ("gpu.nvlink", 0) else r
        for r in load_report(ACCEPT).results
    ]
    text = on_terminal(200, lambda console: console.print(gpu_matrix(skipped)))
    assert _cell_of(text, "gpu.nvlink", 0) == "18 links SKIP" and _cell_of(text, "gpu.nvlink", 1) == "18 links"
