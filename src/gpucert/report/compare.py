"""Comparing two reports: what got slower, what changed status, what one of them lacks.

`gpucert report BASELINE CANDIDATE` pairs results by name and subject and prints one row per pair with a
number on both sides, a status change or a value change, and one row per result only one report has.
A number is a regression when it moved the wrong way by more than `threshold_pct`; which way is wrong comes
from the result's own threshold (">= 340" means higher is better) or else from its unit (GB/s, TFLOP/s up;
C, W, errors down). `comparison_status` is FAIL on any regression or any result that went from PASS/WARN to
FAIL/ERROR, so the verb can exit non-zero on it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpucert.report.cluster import is_cluster
from gpucert.report.direction import HIGHER, LOWER, direction_of
from gpucert.report.schema import Report, Result, Value
from gpucert.report.terminal import STATUS_STYLE
from gpucert.status import Status


@dataclass(frozen=True)
class Comparison:
    """One result in both reports (or in one only: the other side's value and status are None)."""

    name: str
    subject: str
    unit: str | None
    baseline: Value
    candidate: Value
    baseline_status: Status | None
    candidate_status: Status | None
    # (candidate - baseline) / baseline in %; None when either side is not a number or the baseline is 0.
    change_pct: float | None
    direction: str | None  # HIGHER, LOWER, or None where neither the threshold nor the unit says
    regressed: bool  # worse by more than the threshold
    improved: bool  # better by more than the threshold

    @property
    def only_in(self) -> str | None:
        if self.baseline_status is None:
            return "candidate"
        if self.candidate_status is None:
            return "baseline"
        return None

    @property
    def status_changed(self) -> bool:
        return self.only_in is None and self.baseline_status is not self.candidate_status

    @property
    def newly_failing(self) -> bool:
        """PASS or WARN before, FAIL or ERROR now."""
        return (
            self.baseline_status in (Status.PASS, Status.WARN)
            and self.candidate_status is not None
            and self.candidate_status >= Status.FAIL
        )

    @property
    def changed(self) -> bool:
        """Worth a reader's eye: moved beyond the threshold, changed status or value, or on one side only."""
        return (
            self.regressed
            or self.improved
            or self.status_changed
            or self.only_in is not None
            or (self.change_pct is None and self.baseline != self.candidate)
        )


def _number(value: Value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _subject_key(result: Result, hosts: set[str], single_node: bool) -> str:
    if not single_node:
        # A cluster's subjects carry the node label ("hostA GPU 3"); a node's result whose subject does not
        # (a merged 1.x report's "GPU 1 -> GPU 2") gets it here, so two nodes' results never pair up.
        if result.node is not None and not result.subject.startswith(result.node):
            return f"{result.node}: {result.subject}"
        return result.subject
    # Two nodes have different hosts and bus ids: pair per-GPU results by GPU index and node results as
    # "node", so a node can be compared against a golden node as well as against itself last week.
    if result.gpu_index is not None:
        return f"GPU {result.gpu_index}"
    if result.subject in hosts:
        return "node"
    host = next((h for h in hosts if result.subject.startswith(f"{h} ")), None)
    return result.subject[len(host) + 1 :] if host else result.subject


def _keyed(report: Report, single_node: bool) -> dict[tuple[str, str, int], Result]:
    names = {report.meta.host, str(report.inventory.get("hostname", "")), *report.meta.nodes}
    keyed: dict[tuple[str, str, int], Result] = {}
    seen: Counter[tuple[str, str]] = Counter()
    for r in report.results:
        hosts = (names | {r.node} if r.node else names) - {""}
        subject = _subject_key(r, hosts, single_node)
        # The n-th result of one name and subject pairs with the n-th in the other report.
        keyed[(r.name, subject, seen[(r.name, subject)])] = r
        seen[(r.name, subject)] += 1
    return keyed


def _compare_pair(
    name: str, subject: str, base: Result | None, cand: Result | None, threshold_pct: float
) -> Comparison:
    either = cand if cand is not None else base
    assert either is not None
    b = _number(base.value) if base else None
    c = _number(cand.value) if cand else None
    # The threshold that says which way is better may be on one side only (a floor added to the profile).
    direction = direction_of(next((r for r in (cand, base) if r is not None and r.expected), either))
    change = None
    regressed = improved = False
    if b is not None and c is not None:
        if b == c:
            change = 0.0
        elif b != 0:
            change = 100.0 * (c - b) / abs(b)
            worse = -change if direction == HIGHER else change if direction == LOWER else 0.0
            regressed, improved = worse > threshold_pct, -worse > threshold_pct
        elif c != 0 and direction is not None:
            # From zero there is no percentage: any ECC error or XID where there were none is a regression.
            regressed, improved = (c > 0) == (direction == LOWER), (c > 0) == (direction == HIGHER)
    return Comparison(
        name=name,
        subject=subject,
        unit=either.unit,
        baseline=base.value if base else None,
        candidate=cand.value if cand else None,
        baseline_status=base.status if base else None,
        candidate_status=cand.status if cand else None,
        change_pct=change,
        direction=direction,
        regressed=regressed,
        improved=improved,
    )


def compare_reports(baseline: Report, candidate: Report, threshold_pct: float = 5.0) -> list[Comparison]:
    """Pairs of results with a number on both sides, a status or value change, or on one side only.

    Baseline order first, then what only the candidate has. A result with the same non-numeric value and
    status in both (ECC on, MIG off) is left out: it says nothing about the change.
    """
    if threshold_pct < 0:
        raise ValueError(f"threshold_pct must be >= 0, got {threshold_pct}")
    # Two one-node runs pair by GPU index whatever their hosts; once either is a cluster, by full subject
    # (a node's own run then pairs with its part in the cluster run).
    single_node = not is_cluster(baseline) and not is_cluster(candidate)
    base, cand = _keyed(baseline, single_node), _keyed(candidate, single_node)
    comparisons = []
    for key in [*base, *(k for k in cand if k not in base)]:
        comp = _compare_pair(key[0], key[1], base.get(key), cand.get(key), threshold_pct)
        numeric = _number(comp.baseline) is not None and _number(comp.candidate) is not None
        if numeric or comp.changed:
            comparisons.append(comp)
    return comparisons


def comparison_status(comparisons: Sequence[Comparison]) -> Status:
    """FAIL on a regression or a result newly FAIL/ERROR; WARN on another status that got worse or a result
    the candidate lost (a check that stopped running hides whatever it used to catch); else PASS."""
    if any(c.regressed or c.newly_failing for c in comparisons):
        return Status.FAIL
    worse = any(
        c.status_changed
        and c.candidate_status is not None
        and c.baseline_status is not None
        and c.candidate_status >= Status.WARN
        and c.candidate_status > c.baseline_status
        for c in comparisons
    )
    lost = any(c.only_in == "baseline" for c in comparisons)
    new_problem = any(
        c.only_in == "candidate" and c.candidate_status is not None and c.candidate_status >= Status.WARN
        for c in comparisons
    )
    return Status.WARN if worse or lost or new_problem else Status.PASS


def _value_text(value: Value, unit: str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        # Grouped thousands rather than an exponent: 44,590 tokens/s.
        text = f"{value:,.0f}" if 1e4 <= abs(value) < 1e15 else f"{value:.4g}"
    else:
        text = str(value)
    return f"{text} {unit}" if unit else text


def _change_text(c: Comparison) -> str:
    if c.only_in:
        return f"only in {c.only_in}"
    if c.change_pct is not None:
        return f"{c.change_pct:+.1f} %"
    if _number(c.baseline) == 0 and _number(c.candidate) not in (None, 0.0):
        return "from 0"
    return "" if c.baseline == c.candidate else "changed"


def _status_text(c: Comparison) -> str:
    if c.status_changed:
        before, after = c.baseline_status, c.candidate_status
        return f"{before.value if before else '-'} → {after.value if after else '-'}"
    status = c.candidate_status or c.baseline_status
    return status.value if status else "-"


def _verdict_text(c: Comparison) -> str:
    if c.regressed:
        return "REGRESSED"
    if c.newly_failing:
        return "NOW FAILING"
    if c.improved:
        return "improved"
    return ""


def summary_line(comparisons: Sequence[Comparison]) -> str:
    counts = [
        (sum(c.regressed for c in comparisons), "regressed"),
        (sum(c.improved for c in comparisons), "improved"),
        (sum(c.status_changed for c in comparisons), "changed status"),
        (sum(c.only_in == "baseline" for c in comparisons), "only in baseline"),
        (sum(c.only_in == "candidate" for c in comparisons), "only in candidate"),
    ]
    parts = [f"{n} {what}" for n, what in counts if n]
    return (", ".join(parts) or "no change beyond the threshold") + f" ({len(comparisons)} results compared)"


def render_comparison_markdown(
    comparisons: Sequence[Comparison],
    baseline_label: str = "baseline",
    candidate_label: str = "candidate",
    threshold_pct: float | None = None,
    changed_only: bool = False,
) -> str:
    rows = [c for c in comparisons if c.changed] if changed_only else list(comparisons)
    lines = [
        f"# gpucert comparison: {comparison_status(comparisons).value}",
        "",
        f"- **Baseline:** {baseline_label}",
        f"- **Candidate:** {candidate_label}",
    ]
    if threshold_pct is not None:
        lines.append(f"- **Threshold:** a number that moved the wrong way by more than {threshold_pct:g} %")
    lines += [f"- **Summary:** {summary_line(comparisons)}", ""]
    if not rows:
        lines += ["No result changed.", ""]
        return "\n".join(lines)
    lines += [
        "| | check | subject | baseline | candidate | change | direction | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in rows:
        flag = _verdict_text(c)
        flag = f"**{flag}**" if c.regressed or c.newly_failing else flag
        cells = [
            flag,
            c.name,
            c.subject,
            _value_text(c.baseline, c.unit),
            _value_text(c.candidate, c.unit),
            _change_text(c),
            c.direction or "",
            _status_text(c),
        ]
        lines.append("| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    lines.append("")
    return "\n".join(lines)


def print_comparison(
    console: Console,
    comparisons: Sequence[Comparison],
    baseline_label: str = "baseline",
    candidate_label: str = "candidate",
    changed_only: bool = False,
) -> None:
    rows = [c for c in comparisons if c.changed] if changed_only else list(comparisons)
    table = Table(title=f"{baseline_label} → {candidate_label}")
    for column in ("check", "subject", "baseline", "candidate", "change", "status", ""):
        table.add_column(column, overflow="fold")
    for c in rows:
        bad = c.regressed or c.newly_failing
        change_style = "bold red" if c.regressed else "green" if c.improved else ""
        status_style = STATUS_STYLE.get(c.candidate_status or c.baseline_status or Status.SKIP, "")
        table.add_row(
            Text(c.name, style="bold red" if bad else ""),
            c.subject,
            _value_text(c.baseline, c.unit),
            _value_text(c.candidate, c.unit),
            Text(_change_text(c), style=change_style),
            Text(_status_text(c), style=status_style if c.status_changed or c.only_in else ""),
            Text(_verdict_text(c), style="bold red" if bad else "green"),
        )
    if rows:
        console.print(table)
    status = comparison_status(comparisons)
    console.print(
        Text.assemble(("comparison: ", "bold"), (status.value, STATUS_STYLE[status]), f"  {summary_line(comparisons)}")
    )
