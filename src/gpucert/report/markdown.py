"""Markdown rendering of a report, for tickets, pull requests and docs/examples."""

from __future__ import annotations

from gpucert.report.schema import Report
from gpucert.report.terminal import format_value


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", "<br>")


def render_markdown(report: Report) -> str:
    meta, inv = report.meta, report.inventory
    lines = [
        f"# gpucert {meta.verb}: {report.status.value} on {meta.host}",
        "",
        f"- **Node:** {inv['summary']}",
        f"- **Profile:** {meta.profile}",
        f"- **When:** {meta.started_at} ({meta.duration_s:.1f} s)",
        f"- **Tool:** gpucert {meta.tool_version}, method {meta.method_version}, schema {report.schema_version}",
        f"- **Command:** `{' '.join(meta.command)}`",
        f"- **Verdict:** {report.status.value} (exit code {report.status.exit_code}); "
        + ", ".join(f"{n} {s}" for s, n in report.counts().items() if n),
        "",
    ]
    if inv["gpus"]:
        lines += [
            "## GPUs",
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
        lines += ["", f"Topology: {inv['topology']['summary']}", ""]
    if report.results:
        lines += [
            "## Results",
            "",
            "| status | check | subject | value | expected | message |",
            "|---|---|---|---|---|---|",
        ]
        for r in report.results:
            message = r.message + (
                f" → {r.remediation}" if r.remediation and r.status.value in ("WARN", "FAIL", "ERROR") else ""
            )
            lines.append(
                f"| {r.status.value} | {r.name} | {_cell(r.subject)} | {_cell(format_value(r))} | "
                f"{_cell(r.expected or '')} | {_cell(message)} |"
            )
        lines.append("")
    return "\n".join(lines)
