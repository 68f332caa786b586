"""HTML rendering of a report: one self-contained page to attach to a ticket or open from a run directory.

Everything is inline (CSS in a <style> block, plots as base64 PNG), no script and no external URL, so the
page reads the same offline, in a mail client or from an artifact store. Every piece of report text is
escaped: a message may carry anything a driver or a command printed.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import struct
from collections import Counter
from html import escape
from typing import Any

from gpucert.report.cluster import (
    DETAILED_NODES_MAX,
    PROBLEM,
    Figure,
    NodeSection,
    cluster_summary,
    is_cluster,
    key_figures,
    node_tally,
    problem_groups,
    split_by_node,
    worst_first,
)
from gpucert.report.numbers import short
from gpucert.report.plots import Plot, evaluation_plots, report_plots, training_plots
from gpucert.report.schema import Report, Result
from gpucert.report.terminal import STATUS_COLOUR, format_value
from gpucert.status import Status, worst

STATUS_BACKGROUND = {
    Status.SKIP: "#f3f4f6",
    Status.INFO: "#ddf4ff",
    Status.PASS: "#dafbe1",
    Status.WARN: "#fff3c4",
    Status.FAIL: "#ffe0de",
    Status.ERROR: "#f6dcf5",
}

_CSS = """
* { box-sizing: border-box; }
body { margin: 0; background: #f6f8fa; color: #1f2328; line-height: 1.45;
  font: 14px/1.45 -apple-system, "Segoe UI", "Helvetica Neue", Arial, "DejaVu Sans", sans-serif; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 24px; margin: 0 0 6px; display: flex; align-items: center; gap: 14px; flex-wrap: wrap; }
h2 { font-size: 18px; margin: 0 0 12px; padding-bottom: 6px; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 15px; margin: 18px 0 8px; }
section { background: #fff; border: 1px solid #d0d7de; border-radius: 8px; padding: 18px 20px; margin: 18px 0; }
header.verdict { background: #fff; border: 1px solid #d0d7de; border-left: 8px solid #8c959f; border-radius: 8px;
  padding: 18px 20px; }
.summary { font-size: 15px; margin: 4px 0 10px; color: #424a53; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 12px; font-weight: 700; font-size: 12px;
  letter-spacing: .02em; border: 1px solid currentColor; }
.badge.big { font-size: 20px; padding: 2px 16px; border-radius: 16px; }
.counts { color: #424a53; }
.counts span + span::before { content: " · "; color: #8c959f; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border: 1px solid #d8dee4; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; white-space: nowrap; }
tbody tr:nth-child(even) td { background-color: #fbfcfd; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
.grid td.cell { white-space: nowrap; font-variant-numeric: tabular-nums; }
.grid td.check, .nodes td.check { white-space: nowrap; font-family: ui-monospace, "DejaVu Sans Mono", monospace;
  font-size: 12px; }
.scroll { overflow-x: auto; }
.meta { width: auto; }
.meta th { width: 170px; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12px; }
pre { background: #f6f8fa; padding: 10px; border-radius: 6px; overflow-x: auto; margin: 6px 0 0; }
details summary { cursor: pointer; color: #0969da; margin-top: 10px; }
.problem { border: 1px solid #d0d7de; border-left: 6px solid; border-radius: 6px; padding: 8px 12px;
  margin: 8px 0; }
.problem .what { font-weight: 600; }
.problem .subject { color: #57606a; font-weight: 400; }
.problem .why { color: #57606a; font-size: 12px; margin-top: 2px; }
.problem .todo { margin-top: 4px; }
.s-FAIL, .s-ERROR { font-weight: 600; }
.nodes td.subject { white-space: nowrap; }
.none { color: #57606a; font-style: italic; }
figure { margin: 0 0 22px; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #eaeef2; border-radius: 4px; }
figcaption { font-size: 12px; color: #57606a; margin-top: 4px; }
footer { color: #8c959f; font-size: 12px; text-align: center; }
.legend span { margin-right: 12px; }
.node-nav { margin-top: 8px; }
.node-nav a { margin-left: 10px; color: #0969da; text-decoration: none; }
.node-nav a:first-child { margin-left: 0; }
section.node { padding: 10px 20px; margin: 8px 0; }
section.node > details > summary { margin: 0; color: inherit; }
section.node > details > summary h2 { display: inline; border: 0; margin: 0; padding: 0; font-size: 16px; }
.heat-wrap { max-height: 85vh; overflow: auto; }
table.heat { width: auto; font-size: 11px; }
.heat th, .heat td { padding: 1px 4px; border: 1px solid #fff; text-align: right; white-space: nowrap;
  font-variant-numeric: tabular-nums; }
.heat thead th { position: sticky; top: 0; z-index: 2; text-align: center; background: #eaeef2; }
.heat thead tr + tr th { top: 31px; }
.heat tbody th { position: sticky; left: 0; z-index: 1; text-align: left; font-weight: 400; background: #f6f8fa; }
.heat .unit { font-weight: 400; color: #57606a; }
.heat-legend span { padding: 0 6px; margin-right: 4px; }
.heat td { background: #f6f8fa; }
.h1, .heat td.h1 { background: #ddf4ff; } .h-1, .heat td.h-1 { background: #ffe3c2; }
.h-2, .heat td.h-2 { background: #ffab66; } .h-3, .heat td.h-3 { background: #cf222e; color: #fff; }
.out { outline: 2px solid #1f2328; outline-offset: -2px; font-weight: 700; }
.heat td.p { background: #dafbe1; } .heat td.g-INFO, .heat td.g-SKIP { background: #f3f4f6; }
.heat td.g-WARN { background: #fff3c4; text-align: center; }
.heat td.g-FAIL { background: #cf222e; color: #fff; font-weight: 700; text-align: center; }
.heat td.g-ERROR { background: #a626a4; color: #fff; font-weight: 700; text-align: center; }
td.gone { background: repeating-linear-gradient(45deg, #d0d7de, #d0d7de 2px, #fff 2px, #fff 5px); }
ul.lines { columns: 3; font-size: 12px; margin: 4px 0; }
p.phrases { font-size: 12px; color: #424a53; margin: 6px 0; }
table.compact td, table.compact th { padding: 1px 6px; font-size: 12px; }
td.same { color: #57606a; text-align: center; }
.heat-legend .h0 { background: #f6f8fa; }
""" + "\n".join(
    f".s-{s.value} {{ color: {STATUS_COLOUR[s]}; }}\n"
    f"td.s-{s.value}.bad, .badge.s-{s.value} {{ background: {STATUS_BACKGROUND[s]}; }}\n"
    f"header.b-{s.value}, .problem.b-{s.value} {{ border-left-color: {STATUS_COLOUR[s]}; }}"
    for s in Status
)


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _badge(status: Status, big: bool = False) -> str:
    return f'<span class="badge s-{status.value}{" big" if big else ""}">{_e(status.value)}</span>'


def _table(headers: list[str], rows: list[list[str]], css: str = "") -> str:
    """A table of cells that are already HTML; headers are escaped here."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _td(text: object, css: str = "", title: str | None = None) -> str:
    attrs = (f' class="{css}"' if css else "") + (f' title="{_e(title)}"' if title else "")
    return f"<td{attrs}>{_e(text)}</td>"


def _tooltip(r: Result) -> str:
    parts = [f"{r.status.value}: {r.message}"]
    if r.expected:
        parts.append(f"expected {r.expected}")
    return "\n".join(parts)


def _header(report: Report) -> str:
    meta, inv, status = report.meta, report.inventory, report.status
    counts = "".join(f'<span class="s-{s}">{n} {_e(s)}</span>' for s, n in report.counts().items() if n)
    verdict = (
        f'<div class="counts">{counts or "no results"}; exit code {status.exit_code}</div>'
        if report.results
        else '<div class="counts">no judged results (inventory only)</div>'
    )
    replayed = (
        f'<div class="summary">replayed from <code>{_e(inv["replayed_from"])}</code></div>'
        if inv.get("replayed_from")
        else ""
    )
    return (
        f'<header class="verdict b-{status.value}">'
        f"<h1>gpucert {_e(meta.verb)} on {_e(meta.host)} {_badge(status, big=True)}</h1>"
        f'<div class="summary">{_e(inv.get("summary", ""))}</div>{replayed}{verdict}'
        f"</header>"
    )


def _run_meta(report: Report) -> str:
    meta = report.meta
    rows = [
        ("tool", f"{meta.tool} {meta.tool_version}"),
        ("method version", meta.method_version),
        ("schema version", report.schema_version),
        ("verb", meta.verb),
        ("profile", meta.profile),
        ("host", meta.host),
        ("started", meta.started_at),
        ("finished", meta.finished_at),
        ("duration", f"{meta.duration_s:.1f} s"),
    ]
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    body += f"<tr><th>command</th><td><code>{_e(' '.join(meta.command))}</code></td></tr>"
    software = ", ".join(f"{k} {v}" for k, v in meta.software.items() if v)
    body += f"<tr><th>software</th><td>{_e(software or '-')}</td></tr>"
    config = json.dumps(meta.config, indent=2, sort_keys=False)
    return (
        f'<section id="run"><h2>Run</h2><table class="meta"><tbody>{body}</tbody></table>'
        f"<details><summary>resolved configuration</summary><pre>{_e(config)}</pre></details></section>"
    )


def _problems(results: list[Result]) -> str:
    problems = sorted((r for r in results if r.status >= Status.WARN), key=lambda r: r.status, reverse=True)
    if not problems:
        return '<section id="problems"><h2>Problems</h2><p class="none">No WARN, FAIL or ERROR.</p></section>'
    items = []
    for r in problems:
        why = []
        if r.expected:
            why.append(f"expected {_e(r.expected)}")
        if r.value is not None:
            why.append(f"found {_e(format_value(r))}")
        if r.threshold_source:
            why.append(f"threshold: {_e(r.threshold_source)}")
        items.append(
            f'<div class="problem b-{r.status.value}">'
            f'<div class="what">{_badge(r.status)} {_e(r.name)} <span class="subject">on {_e(r.subject)}</span></div>'
            f'<div class="msg">{_e(r.message)}</div>'
            + (f'<div class="why">{" · ".join(why)}</div>' if why else "")
            + (f'<div class="todo">→ {_e(r.remediation)}</div>' if r.remediation else "")
            + "</div>"
        )
    return f'<section id="problems"><h2>Problems ({len(problems)})</h2>{"".join(items)}</section>'


def _gpu_grid(results: list[Result], title: str) -> str:
    """Per-GPU results as a check x GPU grid coloured by status, as the terminal shows them."""
    gpus = sorted({r.gpu_index for r in results if r.gpu_index is not None})
    checks = list(dict.fromkeys(r.name for r in results))
    cells = {(r.name, r.gpu_index): r for r in results}
    rows = []
    for check in checks:
        row = [_td(check, "check")]
        for index in gpus:
            r = cells.get((check, index))
            if r is None:
                row.append("<td></td>")
            else:
                css = f"cell s-{r.status.value}" + (" bad" if r.status >= Status.WARN else "")
                row.append(_td(format_value(r), css, _tooltip(r)))
        rows.append(row)
    return f"<h3>{_e(title)}</h3>" + _table(["check", *[f"GPU{i}" for i in gpus]], rows, "grid")


def _node_table(results: list[Result], title: str) -> str:
    rows = [
        [
            _td(r.status.value, f"s-{r.status.value}" + (" bad" if r.status >= Status.WARN else "")),
            _td(r.name, "check"),
            _td(r.subject, "subject"),
            _td(format_value(r), "num"),
            _td(r.expected or ""),
            _td(r.message),
        ]
        for r in results
    ]
    return f"<h3>{_e(title)}</h3>" + _table(
        ["status", "check", "subject", "value", "expected", "message"], rows, "nodes"
    )


def _result_parts(results: list[Result]) -> list[str]:
    """Results grouped by category: a check x GPU grid for per-GPU ones, a table for the rest."""
    parts = []
    categories = list(dict.fromkeys(r.category for r in results))
    for category in categories:
        mine = [r for r in results if r.category == category]
        per_gpu = [r for r in mine if r.gpu_index is not None]
        node = [r for r in mine if r.gpu_index is None]
        label = "checks" if category == "health" else f"{category} results"
        if per_gpu:
            parts.append(_gpu_grid(per_gpu, f"per-GPU {label}"))
        if node:
            parts.append(_node_table(node, f"node {label}"))
    return parts


def _legend() -> str:
    legend = " ".join(f'<span class="s-{s.value}">■ {s.value}</span>' for s in Status)
    return f'<div class="legend">{legend} <span class="none">(hover a cell for its message)</span></div>'


def _results(results: list[Result]) -> str:
    if not results:
        return ""
    return f'<section id="results"><h2>Results</h2>{_legend()}{"".join(_result_parts(results))}</section>'


def _png_size(png: bytes) -> str:
    # Width and height from the IHDR chunk, so the browser lays the page out before decoding the image.
    width, height = struct.unpack(">II", png[16:24])
    return f'width="{width}" height="{height}"'


def _images(plots: list[Plot], key_prefix: str = "") -> str:
    return "".join(
        f'<figure><img data-plot="{_e(key_prefix + p.key)}" alt="{_e(p.title)}" {_png_size(p.png)} '
        f'src="data:image/png;base64,{base64.b64encode(p.png).decode("ascii")}"></figure>'
        for p in plots
    )


def _figures(report: Report, key_prefix: str = "") -> str:
    return _images(report_plots(report), key_prefix)


def _plots(report: Report) -> str:
    figures = _figures(report)
    if not figures:
        return ""
    return f'<section id="plots"><h2>Benchmarks</h2>{figures}</section>'


# --- Fine-tuning runs and evaluations ------------------------------------------------------------------------

# Keys of the data-preparation report read as shares (0..1), shown in %.
_SHARE_KEYS = ("share", "fill", "fraction")


def _scalar_text(key: str, value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return _yes_no(value) if isinstance(value, bool) else "-"
    if isinstance(value, float) and any(word in key for word in _SHARE_KEYS):
        return f"{value:.1%}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Scalars of a nested dict, keyed "a.b" (count dicts the data report may add, e.g. repairs by kind)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        elif not isinstance(value, list):
            flat[f"{prefix}{key}"] = value
    return flat


def _example_text(example: Any) -> str:
    if isinstance(example, list | tuple):
        return ": ".join(str(part) for part in example)
    if isinstance(example, dict):
        return ", ".join(f"{k}: {v}" for k, v in example.items())
    return str(example)


def _examples(name: str, examples: list[Any], limit: int = 20) -> str:
    """A collapsed list of examples (row and reason, a failing turn), the first `limit` of them."""
    if not examples:
        return ""
    items = "".join(f"<li><code>{_e(_example_text(x))}</code></li>" for x in examples[:limit])
    more = f'<li class="none">and {len(examples) - limit} more</li>' if len(examples) > limit else ""
    return f"<details><summary>{_e(name)} ({len(examples)})</summary><ul>{items}{more}</ul></details>"


def _lists(data: dict[str, Any], prefix: str = "") -> list[tuple[str, list[Any]]]:
    found = []
    for key, value in data.items():
        if isinstance(value, list):
            found.append((f"{prefix}{key}".replace("_", " "), value))
        elif isinstance(value, dict):
            found += _lists(value, f"{prefix}{key} ")
    return found


def _tallies(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The case tallies of the data report (dropped / repaired: case -> {count, examples})."""
    return {
        key: value
        for key, value in stats.items()
        if isinstance(value, dict)
        and value
        and all(isinstance(t, dict) and isinstance(t.get("count"), int) for t in value.values())
    }


def _cases(tallies: dict[str, dict[str, Any]]) -> str:
    """Each dropped or repaired case: its count and first example, all its examples collapsed."""
    rows = []
    for kind, cases in tallies.items():
        for case, tally in sorted(cases.items(), key=lambda item: (-item[1]["count"], item[0])):
            examples = tally.get("examples") or []
            first = f"<code>{_e(_example_text(examples[0]))}</code>" if examples else ""
            rest = _examples("all examples", examples) if len(examples) > 1 else ""
            rows.append([_td(kind), _td(case, "check"), _td(f"{tally['count']:,}", "num"), f"<td>{first}{rest}</td>"])
    return "<h3>Rows dropped and repaired</h3>" + _table(["", "case", "rows", "example"], rows, "data-cases")


def _data_preparation(result: Result) -> str:
    """prepare.py's stats as tables: the source, the cases dropped and repaired, one column per split, then
    the other examples it kept (unparsable rows, lines skipped)."""
    stats = result.details
    splits = [name for name in ("train", "eval") if isinstance(stats.get(name), dict)]
    tallies = _tallies(stats)
    rest = {k: v for k, v in stats.items() if k not in splits and k not in tallies}
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(_scalar_text(k, v))}</td></tr>" for k, v in _flatten(rest).items())
    html = f'<h3>Data preparation</h3><div class="summary">{_e(result.message)}</div>'
    html += f'<table class="meta data-source"><tbody>{rows}</tbody></table>'
    if tallies:
        html += _cases(tallies)
    if splits:
        per_split = {name: _flatten(stats[name]) for name in splits}
        keys = list(dict.fromkeys(k for flat in per_split.values() for k in flat))
        table_rows = [
            [_td(key, "check"), *(_td(_scalar_text(key, per_split[name].get(key)), "num") for name in splits)]
            for key in keys
        ]
        html += "<h3>Per split</h3>" + _table(["", *splits], table_rows, "data-splits")
    examples = [
        _examples(name, values) for name, values in _lists({k: v for k, v in stats.items() if k not in tallies})
    ]
    return html + "".join(examples)


def _training(report: Report) -> str:
    """A fine-tuning run's curves and its data-preparation report; "" for any other report."""
    plots = training_plots(report)
    data = next((r for r in report.results if r.name == "data.preparation" and r.category == "data"), None)
    if not plots and data is None:
        return ""
    return (
        '<section id="training"><h2>Training</h2>'
        + _images(plots)
        + (_data_preparation(data) if data is not None else "")
        + "</section>"
    )


def _breakdown(name: str, table: dict[str, Any]) -> str:
    """A dict of dicts (per tool, per category) as a table: a row per key, a column per inner key."""
    columns = list(dict.fromkeys(k for row in table.values() for k in _flatten(row)))
    rows = [
        [_td(key, "check"), *(_td(_scalar_text(c, _flatten(row).get(c)), "num") for c in columns)]
        for key, row in table.items()
    ]
    return f"<h3>{_e(name)}</h3>" + _table(["", *columns], rows, "breakdown")


def _records(name: str, records: list[Any], limit: int = 20) -> str:
    """A collapsed table of records (failing turns with their reasons), the first `limit` of them."""
    if not records:
        return ""
    if not all(isinstance(x, dict) for x in records):
        return _examples(name, records, limit)
    columns = list(dict.fromkeys(k for record in records for k in record))
    rows = [
        [_td(_example_text(record.get(c)) if record.get(c) is not None else "") for c in columns]
        for record in records[:limit]
    ]
    more = f'<p class="none">and {len(records) - limit} more</p>' if len(records) > limit else ""
    return f"<details><summary>{_e(name)} ({len(records)})</summary>{_table(columns, rows, 'records')}{more}</details>"


def _evaluation_details(result: Result) -> str:
    """What an evaluation result carries beyond its score and message: breakdown tables (per tool), counts,
    example failures. "" for a result with nothing but counts (a per-tool row: its message says them)."""
    details = result.details
    tables = {
        k: v for k, v in details.items() if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values())
    }
    lists = {k: v for k, v in details.items() if isinstance(v, list) and v}
    if not (tables or lists):
        return ""
    scalars = _flatten({k: v for k, v in details.items() if k not in tables and not isinstance(v, list)})
    counts = ", ".join(f"{k} {_scalar_text(k, v)}" for k, v in scalars.items())
    if isinstance(details.get("summary"), str):  # counts worded as a sentence (eval.overall): not the raw keys
        counts = details["summary"]
    return (
        f'<div class="eval-result"><h3>{_e(result.name)} {_badge(result.status)}</h3>'
        + (f'<div class="summary">{_e(counts)}</div>' if counts else "")
        + "".join(_breakdown(f"{result.name}: {k.replace('_', ' ')}", v) for k, v in tables.items())
        + "".join(_records(k.replace("_", " "), v) for k, v in lists.items())
        + "</div>"
    )


def _evaluation(report: Report) -> str:
    """An evaluation's scores against the recipe's thresholds and each metric's breakdown; "" otherwise."""
    results = [r for r in report.results if r.category == "evaluation"]
    if not results:
        return ""
    return (
        '<section id="evaluation"><h2>Evaluation</h2>'
        + _images(evaluation_plots(report))
        + "".join(_evaluation_details(r) for r in results)
        + "</section>"
    )


def _yes_no(value: Any) -> str:
    return "-" if value is None else "on" if value else "off"


def _gpu_inventory(inv: dict[str, Any]) -> str:
    if not inv.get("gpus"):
        return f'<p class="none">No NVIDIA GPU found ({_e(inv.get("nvml_error") or "no error recorded")}).</p>'
    headers = [
        "#",
        "name",
        "bus id",
        "memory",
        "PCIe now (max)",
        "NVLink",
        "ECC",
        "MIG",
        "power cap",
        "temp",
        "VBIOS",
        "serial",
    ]
    rows = []
    for g in inv["gpus"]:
        links = g.get("nvlinks") or []
        memory, power, temp = g.get("memory_total_gib"), g.get("power_enforced_limit_w"), g.get("temperature_c")
        rows.append(
            [
                _td(g["index"], "num"),
                _td(str(g["name"]).removeprefix("NVIDIA ")),
                _td(g.get("bus_id", "-")),
                _td(f"{memory:.1f} GiB" if memory else "-", "num"),
                _td(
                    f"Gen{g.get('pcie_gen_current')} x{g.get('pcie_width_current')} "
                    f"(Gen{g.get('pcie_gen_max')} x{g.get('pcie_width_max')})"
                ),
                _td(f"{sum(bool(link.get('active')) for link in links)}/{len(links)}" if links else "-", "num"),
                _td(_yes_no(g.get("ecc_enabled"))),
                _td(_yes_no(g.get("mig_enabled"))),
                _td(f"{power:.0f} W" if power else "-", "num"),
                _td(f"{temp:.0f} C" if temp is not None else "-", "num"),
                _td(g.get("vbios") or "-"),
                _td(g.get("serial") or "-"),
            ]
        )
    title = f"GPUs (driver {inv.get('driver_version')}, CUDA {inv.get('cuda_driver_version')})"
    return f"<h3>{_e(title)}</h3>" + _table(headers, rows)


def _topology(inv: dict[str, Any]) -> str:
    topology = inv.get("topology") or {}
    matrix = topology.get("matrix") or []
    if len(matrix) <= 1:
        return ""
    gpus = inv.get("gpus") or []
    rows = []
    for i, row in enumerate(matrix):
        affinity = gpus[i].get("cpu_affinity") if i < len(gpus) else None
        rows.append([f"<th>GPU{i}</th>", *(_td(c) for c in row), _td(affinity if affinity is not None else "-")])
    headers = ["", *[f"GPU{i}" for i in range(len(matrix))], "CPU affinity"]
    return f"<h3>{_e('GPU topology: ' + str(topology.get('summary', '')))}</h3>" + _table(headers, rows, "meta")


def _infiniband(inv: dict[str, Any]) -> str:
    if not inv.get("infiniband"):
        return ""
    rows = [
        [
            _td(dev.get("name")),
            _td(port.get("port")),
            _td(port.get("state")),
            _td(port.get("rate_text")),
            _td(port.get("link_layer")),
            _td(dev.get("fw_ver")),
            _td(", ".join(dev.get("netdevs") or [])),
        ]
        for dev in inv["infiniband"]
        for port in dev.get("ports") or []
    ]
    return "<h3>InfiniBand / RoCE</h3>" + _table(
        ["HCA", "port", "state", "rate", "link layer", "firmware", "netdev"], rows
    )


def _host(inv: dict[str, Any]) -> str:
    cpu, mem = inv.get("cpu") or {}, inv.get("memory") or {}
    env, software = inv.get("environment") or {}, inv.get("software") or {}
    rows: list[tuple[str, str]] = []
    if cpu:
        rows.append(
            (
                "CPU",
                f"{cpu.get('sockets')}x {cpu.get('model')}, {cpu.get('logical_cpus')} logical CPUs, "
                f"SMT {_yes_no(cpu.get('smt_enabled'))}, {len(cpu.get('numa_nodes') or [])} NUMA nodes",
            )
        )
    rows.append(("memory", f"{mem['total_gib']:.0f} GiB" if mem.get("total_gib") else "-"))
    nets = [f"{n.get('name')} {n.get('operstate')} {n.get('speed_mbps') or '?'} Mb/s" for n in inv.get("network") or []]
    rows.append(("network", ", ".join(nets) or "-"))
    shared = [f"{m.get('target')} ({m.get('fstype')})" for m in inv.get("mounts") or [] if m.get("shared_candidate")]
    rows.append(("shared filesystems", ", ".join(shared) or "none found"))
    rows.append(("software", ", ".join(f"{k} {v}" for k, v in software.items() if v) or "-"))
    slurm = env.get("slurm")
    scheduler = (
        f"Slurm job {slurm.get('job_id')} on {slurm.get('nodelist')}"
        if slurm
        else "Kubernetes pod"
        if env.get("kubernetes")
        else "none detected"
    )
    rows.append(("scheduler", scheduler))
    virt = env.get("virtualization") or {}
    rows.append(
        (
            "virtualization",
            ", ".join(str(v) for v in (virt.get("container"), virt.get("hypervisor")) if v)
            or "bare metal (no hint found)",
        )
    )
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<h3>Host {_e(inv.get("hostname", ""))}</h3><table class="meta"><tbody>{body}</tbody></table>'


def _inventory_parts(inv: dict[str, Any]) -> str:
    return "".join([_gpu_inventory(inv), _topology(inv), _infiniband(inv), _host(inv)])


def _inventory(inv: dict[str, Any]) -> str:
    return f'<section id="inventory"><h2>Inventory</h2>{_inventory_parts(inv)}</section>'


def _anchors(labels: list[str]) -> dict[str, str]:
    """An id per node label: labels may hold any character (`host[n1]`), ids keep to a URL-safe few."""
    anchors: dict[str, str] = {}
    taken: set[str] = set()
    for i, label in enumerate(labels):
        anchor = "node-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-") or str(i))
        # Two labels may clean to one id ("q " and "q"), and a suffix may be another label's id ("q-2"): count up
        # until free.
        unique, n = anchor, i
        while unique in taken:
            unique, n = f"{anchor}-{n}", n + 1
        anchors[label] = unique
        taken.add(unique)
    return anchors


# --- Clusters --------------------------------------------------------------------------------------------------

# Problems of one check shown in full before the rest of them collapse to a line each, and the most lines kept
# (the rest are in report.json): one cause on every GPU of 1,024 nodes is 8,192 problems.
_PROBLEMS_IN_FULL = 5
_PROBLEM_LINES_MAX = 2000


def _problem(r: Result) -> str:
    why = []
    if r.expected:
        why.append(f"expected {_e(r.expected)}")
    if r.value is not None:
        why.append(f"found {_e(format_value(r))}")
    if r.threshold_source:
        why.append(f"threshold: {_e(r.threshold_source)}")
    return (
        f'<div class="problem b-{r.status.value}">'
        f'<div class="what">{_badge(r.status)} {_e(r.name)} <span class="subject">on {_e(r.subject)}</span></div>'
        f'<div class="msg">{_e(r.message)}</div>'
        + (f'<div class="why">{" · ".join(why)}</div>' if why else "")
        + (f'<div class="todo">→ {_e(r.remediation)}</div>' if r.remediation else "")
        + "</div>"
    )


def _cluster_problems(results: list[Result], anchors: dict[str, str]) -> str:
    """Problems by check, worst first: the first few of each in full, the rest one line each, collapsed."""
    groups = problem_groups(results)
    if not groups:
        return '<section id="problems"><h2>Problems</h2><p class="none">No WARN, FAIL or ERROR.</p></section>'
    total = sum(len(g.results) for g in groups)
    parts = []
    for g in groups:
        nodes = len({r.node for r in g.results if r.node is not None})
        where = f" on {nodes:,} node{'s' if nodes != 1 else ''}" if nodes else ""
        parts.append(f"<h3>{_badge(g.status)} {_e(g.name)}: {len(g.results):,}{where}</h3>")
        parts += [_problem(r) for r in g.results[:_PROBLEMS_IN_FULL]]
        rest = g.results[_PROBLEMS_IN_FULL:]
        if rest:
            lines = "".join(
                "<li>"
                + (f'<a href="#{anchors[r.node]}">{_e(r.subject)}</a>' if r.node in anchors else _e(r.subject))
                + f": {_e(format_value(r))}</li>"
                for r in rest[:_PROBLEM_LINES_MAX]
            )
            more = len(rest) - _PROBLEM_LINES_MAX
            lines += f'<li class="none">and {more:,} more in report.json</li>' if more > 0 else ""
            parts.append(f'<details><summary>{len(rest):,} more</summary><ul class="lines">{lines}</ul></details>')
    return f'<section id="problems"><h2>Problems ({total:,})</h2>{"".join(parts)}</section>'


def _places(places: list[int | None]) -> str:
    """'node, GPUs 0-3, 5': where on a node one check found problems."""
    gpus = sorted({i for i in places if i is not None})
    runs: list[list[int]] = []
    for i in gpus:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)
    parts = (["node"] if None in places else []) + ([("GPU " if len(gpus) == 1 else "GPUs ") + text] if gpus else [])
    return ", ".join(parts)


def _problem_nodes(report: Report, sections: list[NodeSection], anchors: dict[str, str]) -> str:
    """One row per node with a WARN, FAIL or ERROR, the cluster's judgements of it included: what to drain or
    look at first, each problem named by check and GPU."""
    problems: dict[str, list[Result]] = {}
    for r in report.results:
        if r.node is not None and r.status in PROBLEM:
            problems.setdefault(r.node, []).append(r)
    rows = []
    for s in worst_first(sections, report.results):
        mine = problems.get(s.label, [])
        where: dict[str, list[int | None]] = {}
        for r in mine:
            where.setdefault(r.name, []).append(r.gpu_index)
        what = "; ".join(f"{name} ({_places(places)})" for name, places in where.items())
        rows.append(
            [
                f'<td><a href="#{anchors[s.label]}">{_e(s.label)}</a></td>',
                _td(s.status.value, f"s-{s.status.value} bad"),
                _td(f"{len(mine):,}", "num"),
                _td(what),
            ]
        )
    if not rows:
        return ""
    return (
        f'<section id="problem-nodes"><h2>Nodes with problems ({len(rows):,} of {len(sections):,})</h2>'
        + _table(["node", "status", "problems", "what"], rows, "nodes")
        + "</section>"
    )


def _heat_class(value: float, figure: Figure) -> str:
    """A cell's shade: its deviation from the cluster median against the cluster rule (10 % unless the
    profile says otherwise): below the rule, past half of it, past a fifth, within, above a fifth."""
    pct = figure.floor_pct or 10.0
    dev = 100 * (value - figure.median) / figure.median if figure.median else 0.0
    if dev <= -pct:
        return "h-3"
    if dev <= -pct / 2:
        return "h-2"
    if dev <= -pct / 5:
        return "h-1"
    return "h1" if dev >= pct / 5 else ""  # the table's own shade: most cells, so no class to repeat


def _heatmap(report: Report, sections: list[NodeSection], anchors: dict[str, str]) -> str:
    """Node x GPU, one row per node in `sections`' order: each GPU's health (worst per-GPU check) and the key
    figures, shaded by their deviation from the cluster median; an outlier the cluster rule named is boxed and
    carries its message."""
    figures = key_figures(report.results)
    health: dict[tuple[str, int], list[Result]] = {}
    for section in sections:
        for r in section.results:
            if r.category == "health" and r.gpu_index is not None:
                health.setdefault((section.label, r.gpu_index), []).append(r)
    gpus = sorted({i for _, i in health} | {i for f in figures for _, i in f.cells})
    if not gpus:
        return ""
    n = len(gpus)
    head = ['<th rowspan="2">node</th><th rowspan="2">status</th>', f'<th colspan="{n}">health</th>']
    for f in figures:
        head.append(
            f'<th colspan="{n}" title="{_e(f.name)}">{_e(f.name)}<br><span class="unit">{_e(f.unit or "")}'
            f", median {_e(short(f.median))}</span></th>"
        )
    sub = "".join(f"<th>{i}</th>" for i in gpus) * (1 + len(figures))
    rows = []
    for section in sections:
        label = section.label
        cells = [
            f'<th><a href="#{anchors[label]}">{_e(label)}</a></th>',
            f'<td class="s-{section.status.value}">{_e(section.status.value)}</td>',
        ]
        for i in gpus:
            checks = health.get((label, i))
            if not checks:
                cells.append('<td class="gone" title="no result for this GPU"></td>')
                continue
            status = worst(c.status for c in checks)
            bad = [c for c in checks if c.status in PROBLEM]
            title = f' title="{_e(chr(10).join(c.message for c in bad))}"' if bad else ""
            mark = status.value[0] if bad else ""
            css = "p" if status is Status.PASS else f"g-{status.value}"
            cells.append(f'<td class="{css}"{title}>{mark}</td>')
        for f in figures:
            for i in gpus:
                cell = f.cells.get((label, i))
                value = cell.value if cell is not None else None
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    cells.append('<td class="gone"></td>')
                    continue
                outlier = f.outliers.get((label, i))
                css = " ".join(c for c in (_heat_class(value, f), "out" if outlier else "") if c)
                attrs = (f' class="{css}"' if css else "") + (f' title="{_e(outlier.message)}"' if outlier else "")
                cells.append(f"<td{attrs}>{short(value)}</td>")
        rows.append(f'<tr id="hm-{anchors[label]}">' + "".join(cells) + "</tr>")
    legend = (
        '<div class="legend heat-legend">shade: deviation from the cluster median '
        '<span class="h1">above +2 %</span><span class="h0">within ±2 %</span><span class="h-1">-2 to -5 %</span>'
        '<span class="h-2">-5 to -10 %</span><span class="h-3">below -10 % (the rule)</span>'
        '<span class="h-3 out">outlier named</span> (for a rule of 10 %; it scales with the profile\'s); '
        "health: the worst per-GPU check, W/F/E for WARN/FAIL/ERROR (hover for the message)</div>"
    )
    return (
        f'<section id="heatmap"><h2>Nodes x GPUs</h2>{legend}'
        f'<div class="scroll heat-wrap"><table class="heat"><thead><tr>{"".join(head)}</tr><tr>{sub}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div></section>"
    )


def _bare(r: Result) -> str:
    """format_value without the unit (the compact grid puts it beside the check once)."""
    if r.value is None:
        return "-"
    if isinstance(r.value, bool):
        return "on" if r.value else "off"
    return f"{r.value:.4g}" if isinstance(r.value, float) else str(r.value)


def _compact_grid(results: list[Result]) -> str:
    """A node's per-GPU results, value only (the unit beside the check), coloured and explained where not
    PASS: a few KB per node instead of the detailed grid's tens."""
    gpus = sorted({r.gpu_index for r in results if r.gpu_index is not None})
    checks = list(dict.fromkeys(r.name for r in results))
    cells = {(r.name, r.gpu_index): r for r in results}
    units = {r.name: r.unit for r in results if r.unit}
    rows = []
    for check in checks:
        row = [_td(check + (f" ({units[check]})" if check in units else ""), "check")]
        mine = [cells.get((check, index)) for index in gpus]
        texts = {_bare(r) for r in mine if r is not None}
        if len(texts) == 1 and all(r is not None and r.status not in PROBLEM for r in mine):
            # A health check every GPU passes with the same value (ECC on, Gen5 x16): one cell, not eight.
            row.append(f'<td colspan="{len(gpus)}" class="same">{_e(texts.pop())} on every GPU</td>')
            rows.append("".join(row))
            continue
        for index in gpus:
            r = cells.get((check, index))
            if r is None:
                row.append("<td></td>")
            elif r.status in PROBLEM:
                row.append(_td(_bare(r), f"s-{r.status.value} bad", r.message))
            else:
                row.append(f"<td>{_e(_bare(r))}</td>")
        rows.append("".join(row))
    head = "".join(f"<th>{_e(h)}</th>" for h in ["check", *[f"GPU{i}" for i in gpus]])
    body = "".join(f"<tr>{row}</tr>" for row in rows)
    table = f'<table class="grid compact"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    return f'<div class="scroll">{table}</div>'


def _compact_node(section: NodeSection) -> str:
    """A node's detail in a big cluster: its problems in full, its per-GPU figures as a compact grid, the rest
    of its results one phrase each."""
    problems = [r for r in section.results if r.status in PROBLEM]
    per_gpu = [r for r in section.results if r.gpu_index is not None]
    rest = [r for r in section.results if r.gpu_index is None and r.status not in PROBLEM]
    html = _node_table(problems, "problems") if problems else ""
    html += _compact_grid(per_gpu) if per_gpu else ""
    if rest:
        phrases = "; ".join(f'<span class="s-{r.status.value}">{_e(r.name)}</span> {_e(format_value(r))}' for r in rest)
        html += f'<p class="phrases">{phrases}</p>'
    return html


def _node_section(report: Report, section: NodeSection, anchor: str, detailed: bool) -> str:
    inv = section.inventory
    counts = Counter(r.status for r in section.results)
    tally = ", ".join(f"{counts[s]} {s.value}" for s in sorted(counts, reverse=True))
    head = (
        f'<summary><h2>Node {_e(section.label)} {_badge(section.status)}</h2> <span class="counts">{_e(tally)}'
        + (f" · {_e(inv['summary'])}" if inv.get("summary") else "")
        + "</span></summary>"
    )
    if detailed:
        body = (
            "".join(_result_parts(section.results))
            + _figures(dataclasses.replace(report, results=section.results), f"{section.label}/")
            + (f"<details><summary>inventory</summary>{_inventory_parts(inv)}</details>" if inv else "")
        )
    else:
        body = _compact_node(section)
    return f'<section id="{anchor}" class="node"><details{" open" if detailed else ""}>{head}{body}</details></section>'


def _cluster_body(report: Report) -> str:
    """Verdict and cluster summary, the nodes with problems, problems by check, the cluster's own results, the
    node x GPU heatmap, then one collapsible section per node (in full up to DETAILED_NODES_MAX nodes,
    compact beyond, problem nodes first), run."""
    meta, status = report.meta, report.status
    cluster, sections = split_by_node(report)
    detailed = len(sections) <= DETAILED_NODES_MAX
    anchors = _anchors([s.label for s in sections])
    counts = "".join(f'<span class="s-{s}">{n:,} {_e(s)}</span>' for s, n in report.counts().items() if n)
    nodes = "".join(f'<span class="s-{s.value}">{n:,} {_e(s.value)}</span>' for s, n in node_tally(sections).items())
    nav = (
        " ".join(f'<a href="#{anchors[s.label]}">{_e(s.label)}</a> {_badge(s.status)}' for s in sections)
        if detailed
        else '<a href="#problem-nodes">nodes with problems</a> <a href="#problems">problems</a> '
        '<a href="#cluster">cluster checks</a> <a href="#heatmap">nodes x GPUs</a> <a href="#nodes">every node</a>'
    )
    summary = cluster_summary(report.nodes) if report.nodes else f"{len(sections)} nodes"
    header = (
        f'<header class="verdict b-{status.value}">'
        f"<h1>gpucert {_e(meta.verb)} on {len(sections):,} nodes {_badge(status, big=True)}</h1>"
        f'<div class="summary">{_e(summary)}</div>'
        f'<div class="counts">nodes: {nodes}</div>'
        f'<div class="counts">results: {counts or "no results"}; exit code {status.exit_code}</div>'
        f'<nav class="node-nav">{nav}</nav></header>'
    )
    # Cluster results name many nodes' GPUs: one table, never a grid keyed by GPU index.
    job = _figures(dataclasses.replace(report, results=cluster), "cluster/")
    shown = cluster if detailed else [r for r in cluster if r.status not in PROBLEM]
    # A big cluster's cluster.* problems are listed under Problems already (an outlier node gives 9 each).
    listed = "" if shown is cluster else f'<p class="none">{len(cluster) - len(shown):,} more under Problems.</p>'
    cluster_html = (
        '<section id="cluster"><h2>Cluster</h2>'
        + (_legend() if report.results else "")
        + (_node_table(shown, "cluster checks") + listed if cluster else '<p class="none">No cluster result.</p>')
        + job
        + "</section>"
    )
    # A big cluster's problem nodes come first, in the heatmap and below it, so no one scrolls 1,000 rows.
    bad = worst_first(sections, report.results)
    order = sections if detailed else [*bad, *(s for s in sections if s.status not in PROBLEM)]
    nodes_html = "".join(_node_section(report, s, anchors[s.label], detailed) for s in order)
    note = (
        ""
        if detailed
        else f'<p class="none">{len(sections):,} nodes, those with problems first; each opens on a click. '
        f"Per-node plots and inventories are drawn for up to {DETAILED_NODES_MAX} nodes "
        "(`gpucert report` of a node's own run directory draws them).</p>"
    )
    return "".join(
        [
            header,
            _problem_nodes(report, sections, anchors),
            _cluster_problems(report.results, anchors) if report.results else "",
            cluster_html,
            _heatmap(report, order, anchors),
            f'<div id="nodes">{note}{nodes_html}</div>',
            _run_meta(report),
        ]
    )


def render_html(report: Report) -> str:
    """The whole report as one HTML page: verdict, problems, results, a fine-tuning run's curves and data report,
    an evaluation's scores and breakdowns, benchmark plots, inventory, run."""
    meta = report.meta
    where = f"{len(split_by_node(report)[1])} nodes" if is_cluster(report) else meta.host
    title = f"gpucert {meta.verb}: {report.status.value} on {where}"
    footer = (
        f"<footer>gpucert {_e(meta.tool_version)}, report schema {_e(report.schema_version)}, "
        f"method {_e(meta.method_version)}</footer>"
    )
    if is_cluster(report):
        body = _cluster_body(report) + footer
    else:
        body = "".join(
            [
                _header(report),
                _problems(report.results) if report.results else "",
                _results(report.results),
                _training(report),
                _evaluation(report),
                _plots(report),
                _inventory(report.inventory),
                _run_meta(report),
                footer,
            ]
        )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )
