"""Markdown rendering of a report, for tickets, pull requests and docs/examples.

A report of several nodes opens with a cluster section (the summary line, the golden-config diff, results
about the whole job, outliers across nodes) and then has one section per node, rendered as a one-node
report's body is.
"""

from __future__ import annotations

from typing import Any

from gpucert.report.cluster import cluster_summary, is_cluster, split_by_node
from gpucert.report.schema import Report, Result
from gpucert.report.terminal import format_value


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", "<br>")


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
        links = sum(link["active"] for link in g["nvlinks"])
        lines.append(
            f"| {g['index']} | {g['name']} | {g['bus_id']} | {g['memory_total_gib']} GiB | "
            f"Gen{g['pcie_gen_current']} x{g['pcie_width_current']} | {links} | {g['vbios']} |"
        )
    return [*lines, "", f"Topology: {inv['topology']['summary']}", ""]


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
            f"| {r.status.value} | {r.name} | {_cell(r.subject)} | {_cell(format_value(r))} | "
            f"{_cell(r.expected or '')} | {_cell(message)} |"
        )
    return [*lines, ""]


def _verdict(report: Report) -> str:
    return f"{report.status.value} (exit code {report.status.exit_code}); " + ", ".join(
        f"{n} {s}" for s, n in report.counts().items() if n
    )


def _cluster_markdown(report: Report) -> str:
    meta = report.meta
    cluster, sections = split_by_node(report)
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
