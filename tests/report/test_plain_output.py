"""Reports printed where stdout is not a terminal (a pipe, `tee`, a Slurm job log, CI): one whole line per result,
in one layout for every verb, never a table folded to 80 columns.

Each verb's report is built by the code that builds real ones (or is a captured run) and printed to a file, as a
pipe is; the CLI runs in a subprocess with stdout a pipe. A line is whole when it starts with the result's status,
names its check and subject, and carries its message (and, for a problem, what to do) to the end; the number of
lines is the number of results plus the fixed frame, so a wrapped line would show as one too many.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from rich.console import Console
from tests.conftest import FIXTURES, NODE_BUNDLES
from tests.training_runs import training_report

import gpucert.report.terminal as terminal
from gpucert.cluster import slurm_checks
from gpucert.cluster.fs_checks import judge_mounts
from gpucert.cluster.localize import NodeSpec, Pair, PairOutcome, Rule, conclude, judge_pair
from gpucert.finetune.config import EvalThresholds
from gpucert.finetune.eval.evaluate import expected_turns, score
from gpucert.finetune.eval.report import evaluation_report, evaluation_results
from gpucert.report.cluster import is_cluster, split_by_node
from gpucert.report.compare import compare_reports, print_comparison
from gpucert.report.schema import Report, Result
from gpucert.report.store import load_report
from gpucert.report.terminal import print_report
from gpucert.status import Status

REPO = FIXTURES.parent.parent
ACCEPT = FIXTURES / "reports" / "accept-4xh200-synthetic.json"
REGRESSED = FIXTURES / "reports" / "accept-4xh200-synthetic-regressed.json"
# A two-node accept run on two H200s (a localize pair job), as the cluster views print it.
TWO_NODES = FIXTURES / "localize" / "h200x2-slowed" / "pairs" / "r1-00" / "report.json"
STATUS_WORD = re.compile(r"^(SKIP|INFO|PASS|WARN|FAIL|ERROR) *\| ")
HEADER = "status | check | subject | value | expected | message"
GPUCERT = [sys.executable, "-m", "gpucert"]


@pytest.fixture(autouse=True)
def _auto_format() -> Iterator[None]:
    """Each test starts, and leaves the module, with the default: tables on a terminal, lines elsewhere."""
    yield
    if hasattr(terminal, "set_format"):
        terminal.set_format("auto")


# Each verb's report, built as the verb builds it.


def _as_verb(verb: str, results: list[Result]) -> Report:
    base = load_report(ACCEPT)
    return dataclasses.replace(base, meta=dataclasses.replace(base.meta, verb=verb), results=results)


def accept() -> Report:
    return load_report(ACCEPT)


def bench() -> Report:
    return _as_verb("bench matmul", [r for r in load_report(ACCEPT).results if r.name.startswith("matmul.")])


def finetune() -> Report:
    return training_report()


def evaluate() -> Report:
    cases = [json.loads(line) for line in (FIXTURES / "finetune_eval" / "cases.jsonl").read_text().splitlines()]
    turns = [t for i, c in enumerate(cases) for t in expected_turns(c["conversation"], index=i)]
    scores = score(turns, [c["output"] for c in cases])
    thresholds = EvalThresholds(overall_min_pct=40, args_match_min_pct=50)
    return evaluation_report(
        evaluation_results(scores, 0.5, thresholds, "configs/finetune/x.yaml"),
        command=["gpucert", "evaluate", "--adapter", "runs/x/adapter"],
        config={},
        started_at=datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc),
        finished_at=datetime(2026, 11, 30, 12, 3, tzinfo=timezone.utc),
        inventory=load_report(ACCEPT).inventory,
    )


def cluster_slurm() -> Report:
    partitions = slurm_checks.judge_partitions([{"PartitionName": "gpu", "State": "DOWN", "Nodes": "gpu[01-16]"}])
    controller = slurm_checks.judge_controller(None, "slurm_load_ctl_conf error: Unable to contact slurm controller")
    return _as_verb("cluster slurm", [controller, *partitions])


def cluster_fs() -> Report:
    nfs = {"source": "fs1:/export/shared", "target": "/shared", "fstype": "nfs4", "options": ["rw", "vers=4.2"]}
    other = {**nfs, "source": "fs2:/export/scratch"}
    return _as_verb("cluster fs", judge_mounts("/shared/x", {"node1": nfs, "node2": other, "node3": nfs}))


def cluster_localize() -> Report:
    a, b, c, d = (NodeSpec(n, n) for n in ("gpu01", "gpu02", "gpu03", "gpu04"))
    rule = Rule(floor=None, floor_source=None, pct=10.0, pct_source="profile h200: benchmarks.cluster_deviation_pct")

    def outcome(round_: int, index: int, head: NodeSpec, other: NodeSpec, busbw: float) -> PairOutcome:
        return PairOutcome(Pair(round_, index, head, other), Path("/shared/loc/pairs"), busbw_gbps=busbw)

    first = [outcome(1, 0, a, b, 40.0), outcome(1, 1, c, d, 20.0)]
    judged = [
        (o, judge_pair(o, [p.busbw_gbps for p in first if p is not o], rule, "Ring all_gather 1 GiB")) for o in first
    ]
    again = [outcome(2, 0, a, c, 40.0), outcome(2, 1, b, d, 21.0)]
    judged += [(o, judge_pair(o, [40.0], rule, "Ring all_gather 1 GiB")) for o in again]
    return _as_verb("cluster localize", conclude([a, b, c, d], judged, {}, []))


def two_nodes() -> Report:
    return load_report(TWO_NODES)


VERBS: dict[str, Callable[[], Report]] = {
    "accept": accept,
    "bench": bench,
    "finetune": finetune,
    "evaluate": evaluate,
    "cluster slurm": cluster_slurm,
    "cluster fs": cluster_fs,
    "cluster localize": cluster_localize,
    "accept on two nodes": two_nodes,
}


# What a whole line is.


def _field(text: str) -> str:
    return text.replace("\n", "\\n")


def assert_one_whole_line_per_result(text: str, results: list[Result]) -> None:
    """Every result on exactly one line that starts with its status and holds its fields whole, the message
    (with what to do, for a problem) to the end of the line."""
    lines = [line.split(" | ", 5) for line in text.splitlines() if STATUS_WORD.match(line)]
    assert len(lines) == len(results), "\n".join(" | ".join(line) for line in lines)
    left = list(lines)
    for r in results:
        line = next(
            (f for f in left if (f[0].strip(), f[1], f[2]) == (r.status.value, r.name, _field(r.subject))), None
        )
        assert line is not None, f"no whole line for {r.status.value} {r.name} ({r.subject}) in:\n{text}"
        left.remove(line)
        assert len(line) == 6 and line[4] == _field(r.expected or "-"), line
        assert line[5].startswith(_field(r.message)), (line[5], r.message)
        if r.status >= Status.WARN and r.remediation:
            assert line[5].endswith(_field(r.remediation)), line[5]


def frame_lines(report: Report, report_path: bool) -> int:
    """The lines around the results: what ran, the column header, node sections, problems, verdict, path."""
    first = 2 + bool(report.inventory.get("replayed_from")) if not is_cluster(report) else 2
    sections = len(split_by_node(report)[1]) if is_cluster(report) else 0
    problems = any(r.status >= Status.WARN for r in report.results)
    return first + 1 + sections + problems + 1 + report_path


def printed(report: Report, show_inventory: bool = False, width: int = 80) -> str:
    """The report as `gpucert ... | cat` prints it: to a file, where rich's width is 80 columns."""
    out = io.StringIO()
    print_report(
        report, Console(file=out, width=width), show_inventory=show_inventory, report_path="runs/x/report.json"
    )
    return out.getvalue()


@pytest.mark.parametrize("verb", VERBS)
def test_every_verbs_report_prints_one_whole_line_per_result_to_a_file(verb: str) -> None:
    report = VERBS[verb]()
    text = printed(report)
    assert_one_whole_line_per_result(text, report.results)
    lines = text.splitlines()
    assert len(lines) == len(report.results) + frame_lines(report, report_path=True), text
    assert HEADER in lines
    assert lines[-2].startswith(f"verdict: {report.status.value}  (") and lines[-2].endswith(
        f"exit code {report.status.exit_code})"
    )
    assert lines[-1] == "report: runs/x/report.json"
    if report.status >= Status.WARN:
        problems = next(line for line in lines if line.startswith("problems: "))
        assert all(
            f"{r.status.value} {r.name} ({r.subject})" in problems for r in report.results if r.status >= Status.WARN
        )


def test_the_same_lines_at_any_width() -> None:
    report = evaluate()
    assert printed(report, width=40) == printed(report, width=80) == printed(report, width=300)


def test_a_message_with_a_newline_and_a_bar_stays_on_its_line() -> None:
    odd = Result(
        name="eval.example",
        subject="held-out turn 3",
        status=Status.FAIL,
        message="expected get_weather(city='Paris'), found:\n<tool_call> | {'name': 'get_weather'}" + " x" * 200,
        expected=">= 1 call",
        remediation="train longer",
    )
    text = printed(_as_verb("evaluate", [odd]))
    assert_one_whole_line_per_result(text, [odd])
    [line] = [line for line in text.splitlines() if line.startswith("FAIL")]
    assert "found:\\n<tool_call> | {'name'" in line and line.endswith(" x → train longer")


def test_discover_prints_the_inventory_as_lines() -> None:
    report = dataclasses.replace(load_report(REPO / "docs" / "examples" / "h200x4-discover.json"), results=[])
    lines = printed(report, show_inventory=True).splitlines()
    gpus = [line for line in lines if line.startswith("  #: ")]
    assert len(gpus) == 4
    assert all(", name: H200, bus id: " in line and ", temp: " in line for line in gpus)
    host = lines.index("Host:")
    assert lines[host + 1].startswith("  CPU: ") and lines[host + 2].startswith("  memory: ")
    # After what ran, every line is a title or a row of the inventory: none is the tail of another.
    assert lines[0].startswith(f"{report.inventory['hostname']}: 4x NVIDIA H200 | ")
    assert lines[-2].startswith("gpucert discover, profile ") and lines[-1] == "report: runs/x/report.json"
    assert all(line.endswith(":") or line.startswith("  ") for line in lines[1:-2]), lines
    assert not any(set(line) & set("│┃┏┗━─") for line in lines)


def test_a_comparison_prints_one_whole_line_per_changed_result() -> None:
    base, new = load_report(ACCEPT), load_report(REGRESSED)
    comparisons = compare_reports(base, new)
    changed = [c for c in comparisons if c.changed]
    assert changed
    out = io.StringIO()
    print_comparison(Console(file=out, width=80), comparisons, "last week", "today", changed_only=True)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["last week → today", "status | check | subject | baseline | candidate | run status | change"]
    assert len(lines) == 2 + len(changed) + 1
    for c, line in zip(changed, lines[2:-1], strict=True):
        fields = line.split(" | ", 6)
        assert (fields[1], fields[2]) == (c.name, c.subject), line
        assert fields[0].strip() == c.status.value and fields[5].endswith(c.candidate_status.value), line  # type: ignore[union-attr]
    assert any("REGRESSED" in line for line in lines)
    assert lines[-1].startswith("comparison: FAIL  ")


def test_grep_fail_finds_every_regression_of_a_piped_comparison() -> None:
    """`gpucert report BASE NEW | grep '^FAIL'`: one line for each regression and each result newly failing, each
    leading with the comparison's FAIL, not the candidate's own status (2 of the 4 regressed rows would begin with
    PASS: those figures still pass their profile). The candidate's own status stays in its column."""
    done = run_gpucert("report", str(ACCEPT), str(REGRESSED))
    assert done.returncode == 2, done.stderr
    counted = [
        c for c in compare_reports(load_report(ACCEPT), load_report(REGRESSED)) if c.regressed or c.newly_failing
    ]
    fails = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert [(f[1], f[2]) for f in fails] == [(c.name, c.subject) for c in counted] and len(fails) == 4
    by_check = {(f[1], f[2]): f for f in fails}
    assert by_check[("memory.copy", "GPU 3")][3:6] == ["4.217 TB/s", "3.88 TB/s", "PASS"]
    assert by_check[("collective.all_reduce", "4 ranks (nccl)")][5] == "PASS → FAIL"
    # Still failing its profile, 16 % better than before: no regression, the run's own FAIL in its column.
    (p2p,) = [line for line in done.stdout.splitlines() if " | p2p.matrix | " in line]
    assert p2p.startswith("PASS  | ") and " | FAIL | improved, +16.0 %" in p2p


def test_every_comparison_view_puts_the_baseline_before_the_candidate() -> None:
    """Plain, table and Markdown: status, check, subject, baseline, candidate, the run's status (the plain
    header once said candidate | baseline, the Markdown baseline | candidate)."""
    columns = ["status", "check", "subject", "baseline", "candidate", "run status"]
    plain = run_gpucert("report", str(ACCEPT), str(REGRESSED)).stdout.splitlines()[1]
    table = run_gpucert("report", str(ACCEPT), str(REGRESSED), "--format", "table").stdout
    markdown = run_gpucert("report", str(ACCEPT), str(REGRESSED), "--markdown").stdout
    assert plain.split(" | ")[:6] == columns
    header = next(line for line in table.splitlines() if "status" in line and "check" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")][:6] == columns
    assert "| " + " | ".join(columns) + " | change |" in markdown


def test_the_format_is_chosen_by_the_output_or_forced() -> None:
    report = bench()

    def shown(terminal_: bool) -> str:
        out = io.StringIO()
        print_report(report, Console(file=out, width=120, force_terminal=terminal_), False, None)
        return out.getvalue()

    tables, lines = "┏", f"\n{HEADER}\n"
    assert tables in shown(True) and lines in shown(False)  # auto
    terminal.set_format("plain")
    assert lines in shown(True) and tables not in shown(True)
    terminal.set_format("table")
    assert tables in shown(False)
    with pytest.raises(ValueError, match="'csv': expected one of auto, table, plain"):
        terminal.set_format("csv")


def test_the_cli_console_does_not_wrap_long_lines_in_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    """Results on stdout, progress lines (`running benchmark ...`, a node that joined) on stderr: neither wraps."""
    line = "node gpu07 joined " + "x" * 300
    terminal.make_console().print(line, style="dim")
    terminal.make_console(stderr=True).print(line, style="dim")
    assert capsys.readouterr() == (line + "\n", line + "\n")


# The command line, its stdout a pipe.


def run_gpucert(*args: str) -> subprocess.CompletedProcess[str]:
    # As a pipe is: nothing in the environment says "a terminal" or "this wide".
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    return subprocess.run([*GPUCERT, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


def test_health_of_a_captured_node_to_a_pipe(tmp_path: Path) -> None:
    done = run_gpucert("health", "--replay", str(NODE_BUNDLES / "h100"), "--output", str(tmp_path / "run"))
    report = load_report(tmp_path / "run")
    assert done.returncode == report.status.exit_code, done.stderr
    assert_one_whole_line_per_result(done.stdout, report.results)
    assert len(done.stdout.splitlines()) == len(report.results) + frame_lines(report, report_path=True), done.stdout


def test_report_of_a_run_to_a_pipe_and_the_format_option() -> None:
    done = run_gpucert("report", str(ACCEPT))
    report = load_report(ACCEPT)
    assert done.returncode == report.status.exit_code, done.stderr
    assert_one_whole_line_per_result(done.stdout, report.results)
    lines = done.stdout.splitlines()
    inventory = lines[1 : lines.index("gpucert accept, profile h200  (gpucert 0.1.0, method 1, schema 1.0)")]
    assert len([line for line in inventory if line.startswith("  #: ")]) == 4
    assert all(line.endswith(":") or line.startswith("  ") for line in inventory), inventory
    assert len(lines) == len(report.results) + frame_lines(report, report_path=False) + len(inventory)

    tables = run_gpucert("report", str(ACCEPT), "--format", "table")
    assert "┏" in tables.stdout and not any(STATUS_WORD.match(line) for line in tables.stdout.splitlines())


def test_report_a_b_to_a_pipe() -> None:
    done = run_gpucert("report", str(ACCEPT), str(REGRESSED))
    changed = [c for c in compare_reports(load_report(ACCEPT), load_report(REGRESSED)) if c.changed]
    lines = done.stdout.splitlines()
    assert len(lines) == 2 + len(changed) + 1, done.stdout
    assert all(STATUS_WORD.match(line) for line in lines[2:-1]) and lines[-1].startswith("comparison: ")


def test_a_table_forced_into_a_pipe_prints_at_its_own_width_not_80_columns() -> None:
    """`gpucert report RUN --format table | less`: rich fitted the table to a pipe's 80 columns, folding every
    cell into fragments (and the problems' lines at 80); rows are whole now, as on a terminal wide enough."""
    done = run_gpucert("report", str(ACCEPT), "--format", "table")
    lines = done.stdout.splitlines()
    node_results = [r for r in load_report(ACCEPT).results if r.gpu_index is None]
    longest = max(node_results, key=lambda r: len(r.message))
    assert len(longest.message) > 80 and any(longest.message in line for line in lines), done.stdout[-3000:]
    (problem,) = [line for line in lines if line.startswith("FAIL  p2p.matrix  ")]
    assert problem.endswith("benchmarks.p2p_pair_deviation_pct]"), problem


@pytest.mark.slow
def test_accept_on_this_machine_to_a_pipe(tmp_path: Path) -> None:
    skip = "matmul,p2p,collectives,train,burn"  # every one is refused: accept then judges nothing it adds
    done = run_gpucert("accept", "--profile", "cpu", "--skip", skip, "--output", str(tmp_path / "run"))
    report = load_report(tmp_path / "run")
    assert done.returncode == report.status.exit_code, done.stderr
    assert_one_whole_line_per_result(done.stdout, report.results)
    lines = done.stdout.splitlines()
    host = lines.index("Host:")
    assert all(line.startswith("  ") and ": " in line for line in lines[host + 1 : host + 8]), lines


@pytest.mark.parametrize("fmt", [[], ["--markdown"], ["--format", "plain"]])
def test_a_reader_that_leaves_ends_gpucert_quietly_with_the_shells_sigpipe_code(fmt: list[str]) -> None:
    """`gpucert report ... | head`: the reader closes the pipe before gpucert writes. No traceback, no "Broken
    pipe" error line, and exit 141 (a shell's code for a writer SIGPIPE ended), not a verdict: rich's own handler
    exited 1 (WARN) and the markdown path 3 (ERROR)."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [*GPUCERT, "report", str(FIXTURES / "reports" / "accept-cpu-a.json"), *fmt],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, ""), done.stderr[-2000:]


# An accept run's reader: results on stdout, progress on stderr; a reader that leaves stops the run.
ONE_BENCHMARK = ["accept", "--profile", "cpu", "--skip", "burn,memory,p2p,collectives,train"]


def run_into_closed_pipe(args: list[str], stderr_too: bool) -> subprocess.CompletedProcess[str]:
    """gpucert with its stdout (and its stderr, with stderr_too) a pipe whose reader has already left."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [*GPUCERT, *args], stdout=write, stderr=write if stderr_too else subprocess.PIPE, text=True,
            cwd=REPO, timeout=120,
        )  # fmt: skip
    finally:
        os.close(write)


@pytest.mark.slow
def test_accept_says_its_progress_on_stderr_and_its_results_on_stdout(tmp_path: Path) -> None:
    """`gpucert accept | grep '^FAIL'` reads results only; `running benchmark matmul...` goes to stderr."""
    done = run_gpucert(*ONE_BENCHMARK, "--output", str(tmp_path / "run"))
    report = load_report(tmp_path / "run")
    assert done.returncode == report.status.exit_code, done.stderr[-2000:]
    assert "running benchmark matmul..." in done.stderr and "running benchmark" not in done.stdout
    assert_one_whole_line_per_result(done.stdout, report.results)


@pytest.mark.slow
def test_accept_whose_reader_left_before_the_report_exits_141_quietly_with_the_whole_report(tmp_path: Path) -> None:
    """`gpucert accept | head -3`: the run ends as it would (stdout is first written with the report), then
    exits 141 with nothing on stderr but its progress. It once exited 141 after `rank 0 on this node ended: exit
    code 141`, rank 0's own exit taken for a failed rank."""
    done = run_into_closed_pipe([*ONE_BENCHMARK, "--output", str(tmp_path / "run")], stderr_too=False)
    assert done.returncode == 141, done.stderr[-2000:]
    assert re.fullmatch(r"starting \d+ ranks? on \S+\.\.\.\nrunning benchmark matmul\.\.\.\n", done.stderr), done.stderr
    report = load_report(tmp_path / "run")
    assert report.status < Status.ERROR and any(r.name == "matmul.fp32.max" for r in report.results)


@pytest.mark.slow
def test_accept_whose_reader_left_before_it_began_exits_141_leaving_nothing(tmp_path: Path) -> None:
    """`gpucert accept 2>&1 | true`: its first line (`starting N ranks on ...`) finds the reader gone. Nothing ran,
    so nothing is reported: exit 141, no word, and no run directory left behind."""
    done = run_into_closed_pipe([*ONE_BENCHMARK, "--output", str(tmp_path / "run")], stderr_too=True)
    assert done.returncode == 141
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_accept_whose_reader_left_stops_before_the_next_benchmark_and_says_what_did_not_run(tmp_path: Path) -> None:
    """`gpucert accept 2>&1 | head`: the first progress line finds the reader gone. The run stops there (no
    benchmark started), exits 141 without a word, and its partial report names what was not run, as not run: it
    once went on through every benchmark, each recorded as an ERROR of that benchmark ("nothing after this point
    was run or judged"), and ended with a BrokenPipeError on stderr."""
    two = ["accept", "--profile", "cpu", "--skip", "burn,p2p,collectives,train", "--output", str(tmp_path / "run")]
    # The reader takes the first line (`starting 2 ranks on ...`, said before the ranks start) and leaves.
    proc = subprocess.Popen([*GPUCERT, *two], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    assert proc.stdout is not None
    assert re.fullmatch(r"starting \d+ ranks? on \S+\.\.\.\n", proc.stdout.readline())
    proc.stdout.close()
    assert proc.wait(timeout=120) == 141
    report = load_report(tmp_path / "run")
    ran = [r for r in report.results if r.name.startswith(("matmul.", "memory.", "bench.")) and r.status != Status.SKIP]
    assert not ran, report.results
    assert {r.name for r in report.results if r.name.startswith("bench.")} == {  # what --skip left out, said so
        "bench.burn",
        "bench.p2p",
        "bench.collectives",
        "bench.train",
    }
    (stopped,) = [r for r in report.results if r.status is Status.ERROR]
    assert stopped.name == "run.aborted" and "before benchmark matmul" in stopped.message
    assert "not run: matmul, memory" in stopped.message and "reader of gpucert's output closed it" in stopped.message
    assert any(r.name == "node.xid" for r in report.results)  # the node checks ran, and stand


@pytest.mark.parametrize(
    ("value", "unit", "shown"),
    [(32646.3, "tokens/s", "32,646 tokens/s"), (989.43, "TFLOP/s", "989.4 TFLOP/s"), (0.029134, None, "0.02913"),
     (2.5e15, "B", "2.5e+15 B"), (7, "GPUs", "7 GPUs")],
)  # fmt: skip
def test_a_value_reads_as_the_other_views_show_it_never_as_an_exponent_below_1e15(
    value: float, unit: str | None, shown: str
) -> None:
    """The terminal printed 3.265e+04 tokens/s where the comparison view showed 32,646 (one rule now: numbers.short)."""
    from gpucert.report.schema import Result
    from gpucert.status import Status

    assert (
        terminal.format_value(Result(name="x", subject="run", status=Status.INFO, message="", value=value, unit=unit))
        == shown
    )
