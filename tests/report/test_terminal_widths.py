"""Tables on a terminal and in a file. A per-GPU value that is not PASS says its status in words, so the grid reads
right without colour.

Each report is a shipped fixture printed to a console that says it is a terminal of a given width, as rich sees
`COLUMNS=200` on a TTY, or to the command line's console writing to a file.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Iterator

import pytest
from rich.console import Console
from tests.conftest import FIXTURES

import gpucert.report.terminal as terminal
from gpucert.report.store import load_report
from gpucert.report.terminal import gpu_matrix, make_console, print_report
from gpucert.status import Status

ACCEPT = FIXTURES / "reports" / "accept-4xh200-synthetic.json"
REGRESSED = FIXTURES / "reports" / "accept-4xh200-synthetic-regressed.json"


@pytest.fixture(autouse=True)
def _auto_format() -> Iterator[None]:
    yield
    terminal.set_format("auto")


def on_terminal(width: int, render: Callable[[Console], None]) -> str:
    out = io.StringIO()
    render(Console(file=out, width=width, force_terminal=True, color_system=None, highlight=False, markup=False))
    return out.getvalue()


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
    (failed,) = [r for r in report.results if r.gpu_index is not None and r.status is not Status.PASS]
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
