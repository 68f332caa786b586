"""HTML rendering of a run comparison: one self-contained page (`gpucert report A B --html`).

Inline CSS, no script, no image and no external URL, like the report page (report/html.py), so it reads the
same offline or attached to a ticket. It draws no plot, so it does not import html.py and its matplotlib: a
light install can write it. Every piece of report text is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path

from gpucert.report.compare import (
    COLUMNS,
    Comparison,
    _band_text,
    _change_text,
    _status_text,
    _value_text,
    _verdict_text,
    comparison_status,
    rule_text,
    summary_line,
)
from gpucert.report.schema import Report
from gpucert.report.store import write_atomic
from gpucert.report.terminal import STATUS_COLOUR

_CSS = """
body { margin: 0; background: #f6f8fa; color: #1f2328;
  font: 14px/1.45 -apple-system, "Segoe UI", "Helvetica Neue", Arial, "DejaVu Sans", sans-serif; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 24px; margin: 0 0 6px; }
h2 { font-size: 18px; margin: 0 0 12px; padding-bottom: 6px; border-bottom: 1px solid #d0d7de; }
section, header { background: #fff; border: 1px solid #d0d7de; border-radius: 8px; padding: 18px 20px;
  margin: 18px 0; }
header { border-left: 8px solid #8c959f; }
.badge { display: inline-block; padding: 2px 14px; border-radius: 14px; font-weight: 700;
  border: 1px solid currentColor; }
.rule, .none { color: #57606a; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border: 1px solid #d8dee4; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; white-space: nowrap; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.regressed td { background: #ffe0de; }
tr.regressed td.verdict { color: #cf222e; font-weight: 700; }
tr.improved td.verdict { color: #1a7f37; }
tr.unjudged td { color: #57606a; }
details summary { cursor: pointer; color: #0969da; margin-top: 10px; }
footer { color: #8c959f; font-size: 12px; text-align: center; }
""" + "\n".join(
    f".s-{s.value} {{ color: {c}; }}\nheader.b-{s.value} {{ border-left-color: {c}; }}"
    for s, c in STATUS_COLOUR.items()
)

HEADERS = [*COLUMNS, "change", "band", "direction", "verdict"]


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _row_class(c: Comparison) -> str:
    if c.regressed or c.newly_failing:
        return "regressed"
    if c.improved:
        return "improved"
    return "" if c.judged else "unjudged"


def _row(c: Comparison) -> str:
    cells = [
        (f"s-{c.status.value}", c.status.value),
        ("", c.name),
        ("", c.subject),
        ("num", _value_text(c.baseline, c.unit)),
        ("num", _value_text(c.candidate, c.unit)),
        ("", _status_text(c)),
        ("num", _change_text(c)),
        ("num", _band_text(c)),
        ("", c.direction or ""),
        ("verdict", _verdict_text(c)),
    ]
    css = _row_class(c)
    tds = "".join(f'<td class="{k}">{_e(v)}</td>' if k else f"<td>{_e(v)}</td>" for k, v in cells)
    return f'<tr class="{css}">{tds}</tr>' if css else f"<tr>{tds}</tr>"


def _table(rows: Sequence[Comparison]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in HEADERS)
    body = "".join(_row(c) for c in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _run_text(label: str, report: Report | None) -> str:
    if report is None:
        return _e(label)
    meta = report.meta
    return (
        f"<code>{_e(label)}</code>: {_e(meta.verb)} on {_e(meta.host)}, {_e(meta.started_at)}, profile "
        f'{_e(meta.profile)}, verdict <span class="s-{report.status.value}">{_e(report.status.value)}</span>'
    )


def render_comparison_html(
    comparisons: Sequence[Comparison],
    baseline_label: str = "baseline",
    candidate_label: str = "candidate",
    threshold_pct: float = 5.0,
    baseline: Report | None = None,
    candidate: Report | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The comparison as one HTML page: verdict and rule, what changed, then every compared result."""
    status = comparison_status(comparisons)
    changed = [c for c in comparisons if c.changed]
    header = (
        f'<header class="b-{status.value}"><h1>gpucert comparison: '
        f'<span class="badge s-{status.value}">{_e(status.value)}</span></h1>'
        f"<div>Baseline: {_run_text(baseline_label, baseline)}</div>"
        f"<div>Candidate: {_run_text(candidate_label, candidate)}</div>"
        + "".join(f'<p class="note">Note: {_e(note)}</p>' for note in notes)
        + f"<p>{_e(summary_line(comparisons))}</p>"
        f'<p class="rule">Rule: {_e(rule_text(threshold_pct))}.</p></header>'
    )
    what_changed = (
        _table(changed) if changed else '<p class="none">No result changed beyond its noise band or status.</p>'
    )
    every = (
        f"<details><summary>All {len(comparisons)} compared results</summary>{_table(comparisons)}</details>"
        if comparisons
        else ""
    )
    title = f"gpucert comparison: {status.value}: {baseline_label} → {candidate_label}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body><main>"
        f"{header}<section><h2>What changed</h2>{what_changed}{every}</section>"
        "<footer>gpucert report BASELINE CANDIDATE</footer></main></body></html>\n"
    )


def write_comparison_html(page: str, directory: Path) -> Path:
    """comparison.html in `directory` (the candidate's run directory unless the user chose one)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "comparison.html"
    write_atomic(path, page)
    return path
