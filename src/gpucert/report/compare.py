"""Comparing two reports: what got worse, what changed status, what one of them lacks.

`gpucert report BASELINE CANDIDATE` pairs results by name and subject and prints one row per pair with a
number on both sides, a status change or a value change, and one row per result only one report has.

The rule (docs/reports.md says the same for users):
- A result that is FAIL or ERROR in the candidate and was neither in the baseline is a regression
  (`newly_failing`): a status change for the worse counts whatever the numbers did.
- A number counts (`judged`) only where both runs judged it (PASS, WARN or FAIL: held to a threshold) and a
  direction is declared: the result's own threshold (">= 340" means higher is better) or else its unit (GB/s,
  TFLOP/s up; C, W, errors down). It regressed when it moved the wrong way by more than its noise band: the
  tolerance (`threshold_pct`, or a per-metric one in `tolerances`), or twice the spread of the run's own
  repeats where the result's details carry one and that is wider (direction.py `noise_band_pct`).
- INFO rows (shown, not judged: nothing held them to a threshold) and numbers with no direction are shown, with
  their change and band, and never counted: two runs of the same healthy node compare PASS however much an
  unjudged figure wobbles.
Each row has the comparison's own status (`Comparison.status`): FAIL a regression or a result newly FAIL/ERROR,
WARN a status that got worse short of that or a result one side lacks that matters, INFO moved but not judged,
else PASS; every view leads with it, so `grep '^FAIL'` finds every regression. The candidate's own status (its
judgement against the profile) has a column of its own. `comparison_status` is the worst row, at least PASS, so
the verb can exit non-zero on it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpucert.report.cluster import is_cluster
from gpucert.report.direction import HIGHER, LOWER, direction_of, noise_band_pct
from gpucert.report.markdown import md_cell
from gpucert.report.numbers import short
from gpucert.report.schema import Report, Result, Value
from gpucert.report.terminal import (
    STATUS_STYLE,
    fit_tables,
    plain_fields,
    plain_output,
    print_line,
    too_narrow_line,
)
from gpucert.status import Status, worst


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
    # How far (in %) the number may move by chance; None without a number on both sides.
    band_pct: float | None
    # The number counts: judged (PASS/WARN/FAIL) in both runs and a direction declared.
    judged: bool
    regressed: bool  # judged, and worse by more than the band
    improved: bool  # judged, and better by more than the band

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
        """Not failing before (SKIP, INFO, PASS or WARN), FAIL or ERROR now."""
        return (
            self.baseline_status is not None
            and self.baseline_status < Status.FAIL
            and self.candidate_status is not None
            and self.candidate_status >= Status.FAIL
        )

    @property
    def got_worse(self) -> bool:
        """The candidate's status is worse than the baseline's and a problem (WARN or worse)."""
        return (
            self.status_changed
            and self.candidate_status is not None
            and self.baseline_status is not None
            and self.candidate_status >= Status.WARN
            and self.candidate_status > self.baseline_status
        )

    @property
    def no_longer_judged(self) -> bool:
        """Passed a threshold before, only shown now (a run without its threshold): what the baseline checked, the
        candidate does not, and a number that got worse there would pass unseen. (FAIL before and unjudged now is
        no worse: the failure is gone from view, as the other way round a fix is.)"""
        return self.baseline_status in (Status.PASS, Status.WARN) and self.candidate_status is Status.INFO

    @property
    def status(self) -> Status:
        """The comparison's judgement of this row, not the candidate's own status: a number that regressed beyond
        its band is FAIL even where it still passes its profile, and one that still fails its profile but did
        not get worse is PASS here (docs/reports.md)."""
        if self.regressed or self.newly_failing:
            return Status.FAIL
        if self.only_in == "candidate" and self.candidate_status is Status.ERROR:
            # Could not run now (a partial candidate's run.aborted, a benchmark that crashed): never a pass, and
            # newly so. A new check that FAILs is a WARN below: the baseline never ran it to compare.
            return Status.FAIL
        lost = self.only_in == "baseline"
        new_problem = (
            self.only_in == "candidate" and self.candidate_status is not None and (self.candidate_status >= Status.WARN)
        )
        if self.got_worse or lost or new_problem or self.no_longer_judged:
            return Status.WARN
        return Status.INFO if self.moved_unjudged else Status.PASS

    @property
    def beyond_band(self) -> bool:
        """The number moved further than chance would move it, whether or not it is judged."""
        if self.change_pct is None:
            # From zero there is no percentage: any move is beyond the band.
            return _number(self.baseline) == 0 and _number(self.candidate) not in (None, 0.0)
        return self.band_pct is not None and abs(self.change_pct) > self.band_pct

    @property
    def moved_unjudged(self) -> bool:
        """Shown for a reader, never counted: an INFO row (or one with no direction) beyond its band."""
        return not self.judged and self.beyond_band

    @property
    def changed(self) -> bool:
        """Worth a reader's eye: moved beyond its band, changed status or value, or on one side only."""
        return (
            self.regressed
            or self.improved
            or self.moved_unjudged
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


# Statuses that held a result to a threshold. INFO was shown, not judged; SKIP did not apply; ERROR measured
# nothing trustworthy: none of them gives a number that can regress.
JUDGED = frozenset({Status.PASS, Status.WARN, Status.FAIL})


def _compare_pair(
    name: str, subject: str, base: Result | None, cand: Result | None, tolerance_pct: float, by_value: bool = True
) -> Comparison:
    either = cand if cand is not None else base
    assert either is not None
    b = _number(base.value) if base else None
    c = _number(cand.value) if cand else None
    # The threshold that says which way is better may be on one side only (a floor added to the profile).
    direction = direction_of(next((r for r in (cand, base) if r is not None and r.expected), either))
    judged = (
        by_value
        and direction is not None
        and base is not None
        and cand is not None
        and base.status in JUDGED
        and cand.status in JUDGED
    )
    change = band = None
    regressed = improved = False
    if b is not None and c is not None:
        band = noise_band_pct([base, cand], tolerance_pct)
        if b == c:
            change = 0.0
        elif b != 0:
            change = 100.0 * (c - b) / abs(b)
            worse = -change if direction == HIGHER else change if direction == LOWER else 0.0
            regressed, improved = judged and worse > band, judged and -worse > band
        elif judged:
            # From zero there is no percentage: any error where there were none is a regression.
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
        band_pct=band,
        judged=judged,
        regressed=regressed,
        improved=improved,
    )


def compare_reports(
    baseline: Report,
    candidate: Report,
    threshold_pct: float = 5.0,
    tolerances: Mapping[str, float] | None = None,
) -> list[Comparison]:
    """Pairs of results with a number on both sides, a status or value change, or on one side only.

    `threshold_pct` is the tolerance of every number, `tolerances` a per-metric one by result name (a noisier
    figure given more room); either widens to the measurement's own spread. Baseline order first, then what
    only the candidate has. A result with the same non-numeric value and status in both (ECC on, MIG off) is
    left out: it says nothing about the change.
    """
    tolerances = tolerances or {}
    for what, pct in [("threshold_pct", threshold_pct), *((f"tolerance of {k}", v) for k, v in tolerances.items())]:
        if not pct >= 0:
            raise ValueError(f"{what} must be >= 0 %, got {pct}")
    # Two one-node runs pair by GPU index whatever their hosts; once either is a cluster, by full subject
    # (a node's own run then pairs with its part in the cluster run).
    single_node = not is_cluster(baseline) and not is_cluster(candidate)
    base, cand = _keyed(baseline, single_node), _keyed(candidate, single_node)
    # A misspelt name would leave its tolerance silently unused.
    names = {name for name, _, _ in [*base, *cand]}
    unknown = sorted(set(tolerances) - names)
    if unknown:
        # The names these reports do have that hold a number (a tolerance applies to nothing else), nearest first.
        import difflib

        figures = sorted({k[0] for k, r in [*base.items(), *cand.items()] if _number(r.value) is not None})
        near = difflib.get_close_matches(unknown[0], figures, n=3, cutoff=0.5)
        listed = near or figures[:8]
        raise ValueError(
            f"tolerance for {', '.join(unknown)}: no result of that name in either report; the check column names "
            f"them, here {', '.join(listed)}{'' if near or len(figures) <= 8 else ', ...'}"
        )
    # Measured by different methods, numbers are not comparable (docs/commands.md): shown, and statuses compared.
    by_value = baseline.meta.method_version == candidate.meta.method_version
    comparisons = []
    for key in [*base, *(k for k in cand if k not in base)]:
        tolerance = tolerances.get(key[0], threshold_pct)
        comp = _compare_pair(key[0], key[1], base.get(key), cand.get(key), tolerance, by_value)
        numeric = _number(comp.baseline) is not None and _number(comp.candidate) is not None
        if numeric or comp.changed:
            comparisons.append(comp)
    return comparisons


def _gpu_models(report: Report) -> str:
    names = sorted({str(g.get("name")) for g in report.inventory.get("gpus") or [] if isinstance(g, dict)})
    return ", ".join(names) or "no GPU"


def mismatches(baseline: Report, candidate: Report) -> list[str]:
    """What makes the two runs less than like for like, one line each, for every view to print above the rows: a
    different method version (numbers then shown, not judged: compare_reports), verb, profile or GPU model."""
    b, c = baseline.meta, candidate.meta
    notes = []
    if b.method_version != c.method_version:
        notes.append(
            f"method versions differ ({b.method_version} in the baseline, {c.method_version} in the candidate; "
            f"gpucert {b.tool_version} and {c.tool_version}): numbers measured differently are shown, not judged; "
            "statuses are still compared"
        )
    for what, one, other in (
        ("verbs", f"gpucert {b.verb}", f"gpucert {c.verb}"),
        ("profiles", b.profile, c.profile),
        ("GPU models", _gpu_models(baseline), _gpu_models(candidate)),
    ):
        if one != other:
            notes.append(f"{what} differ ({one} in the baseline, {other} in the candidate): not like for like")
    return notes


def parse_tolerances(items: Sequence[str]) -> dict[str, float]:
    """`--tolerance NAME=PCT` items as {result name: tolerance in %}; ValueError names the bad item."""
    tolerances = {}
    for item in items:
        name, sep, pct = item.partition("=")
        try:
            value = float(pct)
        except ValueError:
            value = math.nan
        if not sep or not name.strip() or not value >= 0:
            raise ValueError(
                f"--tolerance {item!r}: expected NAME=PCT with a result name and a percentage >= 0, "
                "e.g. --tolerance matmul.bf16.max=8"
            )
        tolerances[name.strip()] = value
    return tolerances


def comparison_status(comparisons: Sequence[Comparison]) -> Status:
    """The worst row (Comparison.status), at least PASS: FAIL on a regression or a result newly FAIL/ERROR; WARN
    on another status that got worse or a result the candidate lost (a check that stopped running hides whatever
    it used to catch). Unjudged rows (INFO) never count, however far they moved."""
    return max(Status.PASS, worst(c.status for c in comparisons))


def _value_text(value: Value, unit: str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    text = short(value) if isinstance(value, float) else str(value)
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
    if c.no_longer_judged:
        return "no longer judged"
    if c.moved_unjudged:
        return "not judged"
    return ""


def _band_text(c: Comparison) -> str:
    return f"±{c.band_pct:.3g} %" if c.band_pct is not None else ""


# One column order in every view (plain, table, Markdown, HTML): the comparison's status first, then the
# baseline before the candidate, as the title reads (BASE → NEW), then the candidate's own status.
COLUMNS = ("status", "check", "subject", "baseline", "candidate", "run status")
PLAIN_HEADER = " | ".join([*COLUMNS, "change"])


def _plain_row(c: Comparison) -> str:
    """A pair as one plain line, the comparison's status leading as every verb's status does, the change (what
    happened, by how much, within which band) last."""
    band = f"noise band {_band_text(c)}" if c.band_pct is not None else ""
    message = ", ".join(t for t in [_verdict_text(c), _change_text(c), band] if t) or "unchanged"
    fields = [c.name, c.subject, _value_text(c.baseline, c.unit), _value_text(c.candidate, c.unit), _status_text(c)]
    return plain_fields(c.status.value, *fields, message)


def summary_line(comparisons: Sequence[Comparison]) -> str:
    counts = [
        (sum(c.regressed for c in comparisons), "regressed"),
        (sum(c.improved for c in comparisons), "improved"),
        (sum(c.newly_failing for c in comparisons), "now failing"),
        (sum(c.status_changed for c in comparisons), "changed status"),
        (sum(c.only_in == "baseline" for c in comparisons), "only in baseline"),
        (sum(c.only_in == "candidate" for c in comparisons), "only in candidate"),
    ]
    parts = [f"{n} {what}" for n, what in counts if n]
    unjudged = sum(c.moved_unjudged for c in comparisons)
    if unjudged:
        parts.append(f"{unjudged} moved but not judged (INFO or no direction)")
    judged = sum(c.judged for c in comparisons)
    return (", ".join(parts) or "no change beyond the noise band") + (
        f" ({len(comparisons)} results compared, {judged} judged by value)"
    )


def rule_text(threshold_pct: float) -> str:
    """The comparison rule in one sentence, for the views' headers."""
    return (
        "a result newly FAIL or ERROR regresses; a number judged in both runs (PASS/WARN/FAIL) with a direction "
        f"regresses when it moves the wrong way by more than its band: {threshold_pct:g} %, or twice the spread of "
        "its repeats where wider; INFO rows are shown, not judged"
    )


def render_comparison_markdown(
    comparisons: Sequence[Comparison],
    baseline_label: str = "baseline",
    candidate_label: str = "candidate",
    threshold_pct: float | None = None,
    changed_only: bool = False,
    notes: Sequence[str] = (),
) -> str:
    rows = [c for c in comparisons if c.changed] if changed_only else list(comparisons)
    lines = [
        f"# gpucert comparison: {comparison_status(comparisons).value}",
        "",
        f"- **Baseline:** {baseline_label}",
        f"- **Candidate:** {candidate_label}",
        *(f"- **Note:** {md_cell(note)}" for note in notes),
    ]
    if threshold_pct is not None:
        lines.append(f"- **Rule:** {rule_text(threshold_pct)}")
    lines += [f"- **Summary:** {summary_line(comparisons)}", ""]
    if not rows:
        lines += ["No result changed.", ""]
        return "\n".join(lines)
    headers = [*COLUMNS, "change", "band", "direction", "verdict"]
    lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for c in rows:
        flag = _verdict_text(c)
        flag = f"**{flag}**" if c.regressed or c.newly_failing else flag
        cells = [
            f"**{c.status.value}**" if c.status >= Status.FAIL else c.status.value,
            c.name,
            c.subject,
            _value_text(c.baseline, c.unit),
            _value_text(c.candidate, c.unit),
            _status_text(c),
            _change_text(c),
            _band_text(c),
            c.direction or "",
            flag,
        ]
        lines.append("| " + " | ".join(md_cell(x) for x in cells) + " |")
    lines.append("")
    return "\n".join(lines)


def _comparison_table(rows: Sequence[Comparison], title: str) -> Table:
    """The pairs as a table; every cell is a name, a figure or a word, never wrapped or cut (fit_tables)."""
    table = Table(title=title)
    table.add_column("status", no_wrap=True, min_width=5)
    for column in (*COLUMNS[1:], "change", "band", "verdict"):
        table.add_column(column, no_wrap=True)
    for c in rows:
        bad = c.regressed or c.newly_failing
        change_style = "bold red" if c.regressed else "green" if c.improved else ""
        status_style = STATUS_STYLE.get(c.candidate_status or c.baseline_status or Status.SKIP, "")
        table.add_row(
            Text(c.status.value, style=STATUS_STYLE[c.status]),
            Text(c.name, style="bold red" if bad else ""),
            c.subject,
            _value_text(c.baseline, c.unit),
            _value_text(c.candidate, c.unit),
            Text(_status_text(c), style=status_style if c.status_changed or c.only_in else ""),
            Text(_change_text(c), style=change_style),
            _band_text(c),
            Text(_verdict_text(c), style="bold red" if bad else "green" if c.improved else "dim"),
        )
    return table


def print_comparison(
    console: Console,
    comparisons: Sequence[Comparison],
    baseline_label: str = "baseline",
    candidate_label: str = "candidate",
    changed_only: bool = False,
) -> None:
    """The pairs as a table on a terminal wide enough for it, else (a pipe, a file, a narrow terminal) as lines."""
    rows = [c for c in comparisons if c.changed] if changed_only else list(comparisons)
    title = f"{baseline_label} → {candidate_label}"
    plain = plain_output(console)
    table = _comparison_table(rows, title) if rows and not plain else None
    need = fit_tables(console, [table]) if table is not None else None
    if need is not None:
        console.print(too_narrow_line(need, console))
    if rows and (plain or need is not None):
        print_line(console, title)
        print_line(console, PLAIN_HEADER)
        for c in rows:
            line = Text(_plain_row(c))
            line.stylize(STATUS_STYLE[c.status], 0, len(c.status.value))  # shows only where the console has colour
            print_line(console, line)
    elif table is not None:
        console.print(table)
    status = comparison_status(comparisons)
    print_line(
        console,
        Text.assemble(("comparison: ", "bold"), (status.value, STATUS_STYLE[status]), f"  {summary_line(comparisons)}"),
    )
