"""Markdown rendering of a report, for tickets, pull requests and docs/examples.

A report of several nodes opens with a cluster section (the summary line, the golden-config diff, results
about the whole job, outliers across nodes) and then has one section per node, rendered as a one-node
report's body is. Past DETAILED_NODES_MAX nodes it stays a page a person reads: the problems by check, the
nodes with problems, the cluster section, the key figures' spread, and a section for each node with a problem
(its problems only); the nodes with none are named in one line, their results are in report.json and
report.html.
"""

from __future__ import annotations

import re
from typing import Any

from gpucert.report.cluster import (
    DETAILED_NODES_MAX,
    PROBLEM,
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
from gpucert.report.schema import Report, Result
from gpucert.report.terminal import format_value


def md_cell(text: object) -> str:
    """Text for a Markdown table cell: `|` escaped, line breaks as <br>, and a `<` that would open a tag as an
    entity, so a message that quotes markup (`found a malformed <tool_call> block`) shows it instead of a renderer
    taking it for a tag and dropping it; `<= 6.5` and `->` stay as they read."""
    return _TAG_OPEN.sub("&lt;", str(text)).replace("|", "\\|").replace("\n", "<br>")


# A `<` that starts an HTML tag, comment or declaration for a Markdown renderer.
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")


def _gpu_lines(inv: dict[str, Any], heading: str) -> list[str]:
    if not inv.get("gpus"):
        return []
    lines = [
        heading,
        "",
        "| # | name | bus id | memory | PCIe | NVLink active | VBIOS |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in inv["gpus"]:
        # An older gpucert's inventory may lack a key a later one writes: "-" for it.
        links = sum(bool(link.get("active")) for link in g.get("nvlinks") or [] if isinstance(link, dict))
        memory = g.get("memory_total_gib")
        cells = [
            g["index"],
            g["name"],
            g.get("bus_id") or "-",
            f"{memory} GiB" if memory is not None else "-",
            f"Gen{g['pcie_gen_current']} x{g.get('pcie_width_current')}" if g.get("pcie_gen_current") else "-",
            links,
            g.get("vbios") or "-",
        ]
        lines.append("| " + " | ".join(md_cell(cell) for cell in cells) + " |")
    topology = (inv.get("topology") or {}).get("summary") or "-"
    return [*lines, "", f"Topology: {md_cell(topology)}", ""]


def _result_lines(results: list[Result], heading: str) -> list[str]:
    if not results:
        return []
    lines = [
        heading,
        "",
        "| status | check | subject | value | expected | message |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        message = r.message + (
            f" → {r.remediation}" if r.remediation and r.status.value in ("WARN", "FAIL", "ERROR") else ""
        )
        lines.append(
            f"| {r.status.value} | {md_cell(r.name)} | {md_cell(r.subject)} | {md_cell(format_value(r))} | "
            f"{md_cell(r.expected or '')} | {md_cell(message)} |"
        )
    return [*lines, ""]


def _verdict(report: Report) -> str:
    return f"{report.status.value} (exit code {report.status.exit_code}); " + ", ".join(
        f"{n} {s}" for s, n in report.counts().items() if n
    )


# Problems of one check listed in a big cluster's Markdown before the rest are only counted.
_PROBLEM_ROWS_MAX = 20


def _big_cluster_markdown(report: Report, cluster: list[Result], sections: list[NodeSection]) -> str:
    meta = report.meta
    tally = ", ".join(f"{n:,} {s.value}" for s, n in node_tally(sections).items())
    command = meta.command[:6] + ([f"... ({len(meta.command) - 6:,} more arguments)"] if len(meta.command) > 6 else [])
    lines = [
        f"# gpucert {meta.verb}: {report.status.value} on {len(sections):,} nodes",
        "",
        f"- **Cluster:** {cluster_summary(report.nodes) if report.nodes else f'{len(sections):,} nodes'}",
        f"- **Nodes:** {tally}",
        f"- **Profile:** {meta.profile}",
        f"- **When:** {meta.started_at} ({meta.duration_s:.1f} s)",
        f"- **Tool:** gpucert {meta.tool_version}, method {meta.method_version}, schema {report.schema_version}",
        f"- **Command:** `{' '.join(command)}`",
        f"- **Verdict:** {_verdict(report)}",
        "",
    ]
    groups = problem_groups(report.results)
    if groups:
        lines += [f"## Problems ({sum(len(g.results) for g in groups):,})", ""]
    for g in groups:
        nodes = len({r.node for r in g.results if r.node is not None})
        where = f" on {nodes:,} node{'s' if nodes != 1 else ''}" if nodes else ""
        lines += _result_lines(
            g.results[:_PROBLEM_ROWS_MAX], f"### {g.status.value} {g.name}: {len(g.results):,}{where}"
        )
        if len(g.results) > _PROBLEM_ROWS_MAX:
            lines += [f"and {len(g.results) - _PROBLEM_ROWS_MAX:,} more (report.json, report.html)", ""]
    bad = worst_first(sections, report.results)
    if bad:
        lines += ["## Nodes with problems", "", "| node | status | own problems | checks |", "|---|---|---|---|"]
        for s in bad:
            mine = [r for r in s.results if r.status in PROBLEM]
            names = ", ".join(dict.fromkeys(r.name for r in mine)) or "cluster judgements only"
            lines.append(f"| {md_cell(s.label)} | {s.status.value} | {len(mine)} | {md_cell(names)} |")
        lines.append("")
    lines += _result_lines(cluster, "## Cluster")
    figures = key_figures(report.results)
    if figures:
        lines += ["## Key figures across the cluster", "", "| figure | GPUs | median | min | max | outliers |"]
        lines.append("|---|---|---|---|---|---|")
        for f in figures:
            values = [float(r.value) for r in f.cells.values() if isinstance(r.value, (int, float))]
            unit = f" {f.unit}" if f.unit else ""
            lines.append(
                f"| {f.name} | {len(values):,} | {short(f.median)}{unit} | {short(min(values))}{unit} | "
                f"{short(max(values))}{unit} | {len(f.outliers)} |"
            )
        lines.append("")
    for s in bad:
        lines += [f"## Node {s.label}: {s.status.value}", ""]
        if s.inventory.get("summary"):
            lines += [f"- **Node:** {s.inventory['summary']}", ""]
        lines += _result_lines([r for r in s.results if r.status in PROBLEM], "### Problems")
    clean = [s.label for s in sections if s.status not in PROBLEM]
    if clean:
        lines += [f"## The other {len(clean):,} nodes: no problem", "", ", ".join(clean), ""]
    return "\n".join(lines)


def _cluster_markdown(report: Report) -> str:
    meta = report.meta
    cluster, sections = split_by_node(report)
    if len(sections) > DETAILED_NODES_MAX:
        return _big_cluster_markdown(report, cluster, sections)
    lines = [
        f"# gpucert {meta.verb}: {report.status.value} on {len(sections)} nodes",
        "",
        f"- **Cluster:** {cluster_summary(report.nodes) if report.nodes else f'{len(sections)} nodes'}",
        "- **Nodes:** " + ", ".join(f"{s.label} ({s.status.value})" for s in sections),
        f"- **Profile:** {meta.profile}",
        f"- **When:** {meta.started_at} ({meta.duration_s:.1f} s)",
        f"- **Tool:** gpucert {meta.tool_version}, method {meta.method_version}, schema {report.schema_version}",
        f"- **Command:** `{' '.join(meta.command)}`",
        f"- **Verdict:** {_verdict(report)}",
        "",
    ]
    lines += _result_lines(cluster, "## Cluster")
    for section in sections:
        lines += [f"## Node {section.label}: {section.status.value}", ""]
        if section.inventory.get("summary"):
            lines += [f"- **Node:** {section.inventory['summary']}", ""]
        lines += _gpu_lines(section.inventory, "### GPUs")
        lines += _result_lines(section.results, "### Results")
    return "\n".join(lines)


def render_markdown(report: Report) -> str:
    if is_cluster(report):
        return _cluster_markdown(report)
    meta, inv = report.meta, report.inventory
    lines = [
        f"# gpucert {meta.verb}: {report.status.value} on {meta.host}",
        "",
        f"- **Node:** {inv['summary']}",
        f"- **Profile:** {meta.profile}",
        f"- **When:** {meta.started_at} ({meta.duration_s:.1f} s)",
        f"- **Tool:** gpucert {meta.tool_version}, method {meta.method_version}, schema {report.schema_version}",
        f"- **Command:** `{' '.join(meta.command)}`",
        f"- **Verdict:** {_verdict(report)}",
        "",
    ]
    lines += _gpu_lines(inv, "## GPUs")
    lines += _result_lines(report.results, "## Results")
    return "\n".join(lines)
