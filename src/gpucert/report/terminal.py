"""Terminal rendering (rich) of a report: the inventory for `discover`, the judged results for the rest.

Two formats. On a terminal, tables fitted to the window (fit_table): names and figures whole, free text wrapped at
word boundaries; a window too narrow for that gets the plain lines instead. Where stdout is not a terminal (a pipe,
`tee`, a Slurm job log, CI) or with `gpucert --format plain`, plain lines: rich would fit a table to 80
columns there and fold every message into fragments of a few characters. A plain result is one line, never
wrapped, in the same layout for every verb:

    status | check | subject | value | expected | message
    FAIL  | gpu.count | node-a | 4 GPUs | == 8 | expected 8 GPUs, found 4 [threshold: ...] → what to do

so `grep '^FAIL'`, `grep gpu.count` or `awk -F ' [|] '` read a log file as they read the JSON report.
"""

from __future__ import annotations

import dataclasses
import errno
import math
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpucert.report.cluster import cluster_summary, is_cluster, split_by_node
from gpucert.report.numbers import short
from gpucert.report.schema import Report, Result
from gpucert.status import Status

FORMATS = ("auto", "table", "plain")
_format = "auto"

STATUS_STYLE = {
    Status.SKIP: "dim",
    Status.INFO: "cyan",
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
}
# The same colours in shades that read on white, for the HTML pages (report/html.py, report/compare_html.py).
STATUS_COLOUR = {
    Status.SKIP: "#6e7781",
    Status.INFO: "#0969da",
    Status.PASS: "#1a7f37",
    Status.WARN: "#9a6700",
    Status.FAIL: "#cf222e",
    Status.ERROR: "#a626a4",
}


def set_format(name: str) -> None:
    """How every report prints from now on: "table", "plain", or "auto" (tables on a terminal, else plain)."""
    global _format
    if name not in FORMATS:
        raise ValueError(f"output format {name!r}: expected one of {', '.join(FORMATS)}")
    _format = name


def plain_output(console: Console) -> bool:
    """Lines rather than tables: asked for, or "auto" and the console does not write to a terminal (rich's
    test, which honours FORCE_COLOR and TTY_COMPATIBLE)."""
    return _format == "plain" or (_format == "auto" and not console.is_terminal)


def make_console(stderr: bool = False) -> Console:
    """The command line's console. No markup: node labels (`host[n1]`), messages and paths print as they are,
    never read as rich tags. Where output is plain or not a terminal, long lines are not wrapped either (soft
    wrap): a pipe's 80 columns are rich's guess, not a reader's window."""
    console = _Console(stderr=stderr, highlight=False, markup=False)
    console.soft_wrap = plain_output(console) or not console.is_terminal
    return console


# Wider than any table gpucert prints: the room a table is measured in before it prints at its own width.
_UNLIMITED_WIDTH = 100_000


class _Console(Console):
    def print(self, *objects: Any, **kwargs: Any) -> None:
        """As rich prints, except a table into a pipe or a file (`--format table` there): rich fits it to 80
        columns, folding every cell into fragments; here it prints at its natural width, as on a terminal wide
        enough, for a log or a pager to keep."""
        tables = [o for o in objects if isinstance(o, Table)]
        if self.is_terminal or not tables:
            super().print(*objects, **kwargs)
            return
        room = self.options.update_width(_UNLIMITED_WIDTH)
        natural = max(self.measure(table, options=room).maximum for table in tables)
        width = self.width
        self.width = max(width, natural)
        try:
            super().print(*objects, **kwargs)
        finally:
            self.width = width

    def on_broken_pipe(self) -> None:
        # rich exits 1 here, which gpucert's exit codes read as WARN: the CLI's own handler says what happened.
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader of gpucert's output closed it")


def _natural_width(console: Console, options: ConsoleOptions, renderables: Iterable[Any], least: int) -> int:
    """The width of the widest line of `renderables`, at least `least` (padding not counted)."""
    return max([least, *(Measurement.get(console, options, renderable).maximum for renderable in renderables)])


def _water_fill(highs: list[int], lows: list[int], room: int) -> list[int]:
    """Widths between lows and highs that sum to at most room, the widest lowered first."""
    cap, widths = max(highs, default=0), highs
    while sum(widths) > room and cap > 0:
        cap -= 1
        widths = [max(low, min(high, cap)) for low, high in zip(lows, highs, strict=True)]
    return widths


def fit_table(table: Table, console: Console) -> int:
    """Narrow a table's free-text columns until it fits the console; the narrowest width it can take.

    Names and figures sit in columns made with `no_wrap`: they keep their natural width, never folded mid-token
    nor cut with an ellipsis, which is what made a check read `matmu…` or a value `794`/`.4`/`TFL`. Free text sits
    in columns that wrap, their `min_width` the narrowest they may take; the widest of them gives way first, at
    word boundaries, their headers before their cells. Where even the narrowest is wider than the console,
    nothing changes: the caller prints lines.
    """
    room = console.options.update_width(_UNLIMITED_WIDTH)
    natural = console.measure(table, options=room).maximum
    free = [column for column in table.columns if not column.no_wrap]
    cells = [_natural_width(console, room, column.cells, column.min_width or 0) for column in free]
    whole = [
        max(width, _natural_width(console, room, [column.header], 0)) for column, width in zip(free, cells, strict=True)
    ]
    least = [min(width, column.min_width or width) for column, width in zip(free, cells, strict=True)]
    narrowest = natural - sum(whole) + sum(least)
    if natural <= console.width or narrowest > console.width:
        return narrowest
    room_left = sum(whole) - (natural - console.width)
    # Wrapping a header (`values over time (newest last)`) is enough where it is wider than its cells.
    enough = room_left >= sum(cells)
    narrowed = _water_fill(whole, cells, room_left) if enough else _water_fill(cells, least, room_left)
    for column, width, was in zip(free, narrowed, whole, strict=True):
        if width < was:
            column.width = width
    return narrowest


def fit_tables(console: Console, tables: Sequence[Table]) -> int | None:
    """Fit each table to the terminal (fit_table); None where all fit, else the width the widest needs.

    A console that is not a terminal (a file, a pipe: `--format table > f`) takes every table at its natural
    width (_Console.print): long lines for a pager to keep, nothing to fit."""
    if not console.is_terminal or not tables:
        return None
    need = max(fit_table(table, console) for table in tables)
    return need if need > console.width else None


def too_narrow_line(need: int, console: Console) -> Text:
    """Why a terminal shows lines rather than tables: the window a table needs (80 columns fit the line)."""
    return Text(
        f"one line per result: the table needs {need} columns, this terminal has {console.width}",
        style="dim",
    )


def print_line(console: Console, line: str | Text) -> None:
    """One line as it is: never wrapped or cropped to the console's width (a pipe's is 80 columns)."""
    console.print(line if isinstance(line, Text) else Text(line), soft_wrap=True)


PLAIN_HEADER = "status | check | subject | value | expected | message"


def _field(value: object) -> str:
    # A field is never empty and never breaks its line: an embedded newline (a model's output quoted in an
    # evaluation message) is written as \n.
    text = str(value).replace("\r\n", "\n").replace("\n", "\\n")
    return text if text.strip() else "-"


def plain_fields(status: str, *fields: object) -> str:
    """A plain line of any view: the status first (padded to the longest word, ERROR), then the fields separated
    by ' | ', free text (a message) last, so a '|' inside it cannot shift a field."""
    return " | ".join([f"{status:<5}", *(_field(f) for f in fields)])


def plain_line(status: str, check: str, subject: str, value: str, expected: str | None, message: str) -> str:
    """The one plain layout of a result: status, check, subject, value, expected and message."""
    return plain_fields(status, check, subject, value, expected or "-", message)


def result_line(result: Result) -> str:
    """A result as one plain line; a WARN, FAIL or ERROR also says where its threshold came from and what to do,
    which the table view prints in its problems list."""
    message = result.message
    if result.status >= Status.WARN:
        if result.threshold_source:
            message += f" [threshold: {result.threshold_source}]"
        if result.remediation:
            message += f" → {result.remediation}"
    return plain_line(result.status.value, result.name, result.subject, format_value(result), result.expected, message)


def table_lines(table: Table) -> list[str]:
    """A table as plain lines: its title, then one line per row with each cell named by its column's header
    (a headerless table's first cell names the row). The inventory prints the same facts in both formats."""
    headers = [str(column.header) for column in table.columns]
    columns = [[c.plain if isinstance(c, Text) else str(c) for c in column.cells] for column in table.columns]
    title = table.title.plain if isinstance(table.title, Text) else table.title
    lines = [f"{title}:"] if title else []
    for row in zip(*columns, strict=True):
        if table.show_header and headers[0]:
            lines.append("  " + ", ".join(f"{h}: {v}" for h, v in zip(headers, row, strict=True) if v))
        elif table.show_header:
            rest = ", ".join(f"{h}: {v}" for h, v in zip(headers[1:], row[1:], strict=True) if v)
            lines.append(f"  {row[0]}: {rest}")
        else:
            lines.append(f"  {row[0]}: {', '.join(v for v in row[1:] if v)}")
    return lines


def format_value(result: Result) -> str:
    if result.value is None:
        return "-"
    if isinstance(result.value, bool):
        return "on" if result.value else "off"
    text = short(result.value) if isinstance(result.value, float) else str(result.value)
    return f"{text} {result.unit}" if result.unit and not isinstance(result.value, bool) else text


def _gpu_cell(result: Result) -> Text:
    # The status in words beside a value that is not PASS: colour does not survive a log file or a reader who
    # cannot tell red from green, and the grid must read right without it.
    value = format_value(result)
    text = value if result.status is Status.PASS else f"{value} {result.status.value}"
    return Text(text, style=STATUS_STYLE[result.status])


def gpu_matrix(results: list[Result], title: str = "per-GPU checks", gpus: Sequence[int] | None = None) -> Table | None:
    """Per-GPU checks as a check x GPU grid of values coloured by status: a bad GPU stands out as a column. A
    value that is not PASS says its status in words (`691.4 TFLOP/s FAIL`).

    Columns are NVML indices, so give it one node's results at a time; `gpus` picks some of its GPUs."""
    per_gpu = [r for r in results if r.gpu_index is not None and (gpus is None or r.gpu_index in gpus)]
    if not per_gpu:
        return None
    columns = sorted({r.gpu_index for r in per_gpu if r.gpu_index is not None})
    checks = list(dict.fromkeys(r.name for r in per_gpu))
    cells = {(r.name, r.gpu_index): r for r in per_gpu}
    table = Table(title=title)
    table.add_column("check", no_wrap=True)
    for index in columns:
        table.add_column(f"GPU{index}", no_wrap=True)
    for check in checks:
        row: list[Text | str] = [check]
        for index in columns:
            r = cells.get((check, index))
            row.append(_gpu_cell(r) if r else "")
        table.add_row(*row)
    return table


def gpu_matrices(results: list[Result], console: Console, title: str = "per-GPU checks") -> list[Table]:
    """The per-GPU grid as one table, or as several of fewer GPUs each (each with the check column) where the
    terminal is too narrow for every GPU side by side: eight GPUs' figures need about 160 columns."""
    gpus = sorted({r.gpu_index for r in results if r.gpu_index is not None})
    if not gpus:
        return []
    room = console.options.update_width(_UNLIMITED_WIDTH)
    tables: list[Table] = []
    for count in range(1, len(gpus) + 1):
        size = math.ceil(len(gpus) / count)
        chunks = [gpus[i : i + size] for i in range(0, len(gpus), size)]
        tables = [
            table
            for chunk in chunks
            if (table := gpu_matrix(results, title if len(chunks) == 1 else _gpus_title(title, chunk), chunk))
        ]
        if not console.is_terminal or all(console.measure(t, options=room).maximum <= console.width for t in tables):
            break
    return tables


def _gpus_title(title: str, gpus: list[int]) -> str:
    return f"{title}, GPU{gpus[0]}" if len(gpus) == 1 else f"{title}, GPU{gpus[0]} to GPU{gpus[-1]}"


# The narrowest the free text of a result wraps to on a narrow terminal: a message at 20 columns reads as a few
# words a line, an expectation (`>= 340 GB/s busbw at 4 GiB`) at 12 keeps a figure and its unit on one line.
MESSAGE_MIN_WIDTH = 20
EXPECTED_MIN_WIDTH = 12


def node_table(results: list[Result], title: str = "node checks") -> Table | None:
    """Results without a GPU as a table: names and figures whole, the expectation and the message (free text)
    wrap at word boundaries where the terminal is narrow (fit_table)."""
    node = [r for r in results if r.gpu_index is None]
    if not node:
        return None
    table = Table(title=title)
    table.add_column("status", no_wrap=True, min_width=5)
    table.add_column("check", no_wrap=True)
    table.add_column("subject", no_wrap=True)
    table.add_column("value", no_wrap=True)
    # What a judged value was held to, beside it: a PASS says both (README, Reading a result).
    table.add_column("expected", overflow="fold", min_width=EXPECTED_MIN_WIDTH)
    table.add_column("message", overflow="fold", min_width=MESSAGE_MIN_WIDTH)
    for r in node:
        status = Text(r.status.value, style=STATUS_STYLE[r.status])
        table.add_row(status, r.name, r.subject, format_value(r), r.expected or "-", r.message)
    return table


def problem_lines(results: list[Result]) -> list[Text]:
    """Every WARN, FAIL and ERROR in full: what was expected, what was found, where, and what to do."""
    lines = []
    for r in sorted((r for r in results if r.status >= Status.WARN), key=lambda r: r.status, reverse=True):
        line = Text.assemble((f"{r.status.value:5} ", STATUS_STYLE[r.status]), (r.name, "bold"), f"  {r.message}")
        if r.threshold_source:
            line.append(f" [threshold: {r.threshold_source}]", style="dim")
        if r.remediation:
            line.append(f"\n      → {r.remediation}")
        lines.append(line)
    return lines


def _yes_no(value: Any) -> str:
    return "-" if value is None else "on" if value else "off"


def inventory_tables(inv: dict[str, Any]) -> list[Table | Text]:
    if not inv["gpus"]:
        tables: list[Table | Text] = [Text(f"No NVIDIA GPU found ({inv.get('nvml_error')}).", style="yellow")]
    else:
        tables = [_gpu_table(inv)]
    tables += _topology_and_fabric(inv)
    tables.append(_host_table(inv))
    return tables


def _gpu_table(inv: dict[str, Any]) -> Table:
    gpus = Table(title=f"GPUs (driver {inv.get('driver_version')}, CUDA {inv.get('cuda_driver_version')})")
    for column in ("#", "name", "bus id", "memory", "PCIe now (max)", "NVLink", "ECC", "MIG", "power cap", "temp"):
        gpus.add_column(column)
    for g in inv["gpus"]:
        # Report.from_dict checked the types; an older gpucert's inventory may lack a key a later one writes.
        links = g.get("nvlinks") or []
        bus_id = str(g.get("bus_id") or "-")
        memory, power, temp = g.get("memory_total_gib"), g.get("power_enforced_limit_w"), g.get("temperature_c")
        gpus.add_row(
            str(g["index"]),
            g["name"].removeprefix("NVIDIA "),
            # NVML pads the PCI domain to 8 hex digits; the usual 4 are enough to find the slot.
            bus_id[4:] if bus_id.startswith("0000") else bus_id,
            f"{memory:.0f} GiB" if memory else "-",
            f"Gen{g.get('pcie_gen_current')} x{g.get('pcie_width_current')} "
            f"(Gen{g.get('pcie_gen_max')} x{g.get('pcie_width_max')})",
            f"{sum(bool(link.get('active')) for link in links)}/{len(links)}" if links else "-",
            _yes_no(g.get("ecc_enabled")),
            _yes_no(g.get("mig_enabled")),
            f"{power:.0f} W" if power else "-",
            f"{temp:.0f} C" if temp is not None else "-",
        )
    return gpus


def _topology_and_fabric(inv: dict[str, Any]) -> list[Table | Text]:
    tables: list[Table | Text] = []
    topology = inv.get("topology") or {}  # an older gpucert's inventory may have none
    matrix = topology.get("matrix") or []
    if len(matrix) > 1:
        topo = Table(title=f"GPU topology: {topology.get('summary')}")
        topo.add_column("")
        for i in range(len(matrix)):
            topo.add_column(f"GPU{i}")
        topo.add_column("CPU affinity")
        for i, row in enumerate(matrix):
            topo.add_row(f"GPU{i}", *row, str(inv["gpus"][i]["cpu_affinity"]))
        tables.append(topo)
    if inv.get("infiniband"):
        ib = Table(title="InfiniBand / RoCE")
        for column in ("HCA", "port", "state", "rate", "link layer", "firmware", "netdev"):
            ib.add_column(column)
        for dev in inv["infiniband"]:
            for port in dev["ports"]:
                ib.add_row(
                    dev["name"],
                    str(port["port"]),
                    str(port["state"]),
                    str(port["rate_text"]),
                    str(port["link_layer"]),
                    str(dev["fw_ver"]),
                    ", ".join(dev["netdevs"]),
                )
        tables.append(ib)
    return tables


def _host_table(inv: dict[str, Any]) -> Table:
    host = Table(title="Host", show_header=False)
    host.add_column("what")
    host.add_column("value", overflow="fold")
    cpu, mem = inv.get("cpu") or {}, inv.get("memory") or {}
    sw, env = inv.get("software") or {}, inv.get("environment") or {}
    host.add_row(
        "CPU",
        f"{cpu.get('sockets')}x {cpu.get('model')}, {cpu.get('logical_cpus')} logical CPUs, "
        f"SMT {_yes_no(cpu.get('smt_enabled'))}, {len(cpu.get('numa_nodes') or [])} NUMA nodes",
    )
    host.add_row("memory", f"{mem['total_gib']:.0f} GiB" if mem.get("total_gib") else "-")
    nets = [f"{n['name']} {n['operstate']} {n['speed_mbps'] or '?'} Mb/s" for n in inv.get("network", [])]
    host.add_row("network", ", ".join(nets) or "-")
    shared = [f"{m['target']} ({m['fstype']})" for m in inv.get("mounts", []) if m["shared_candidate"]]
    host.add_row("shared filesystems", ", ".join(shared) or "none found")
    host.add_row("software", ", ".join(f"{k} {v}" for k, v in sw.items() if v))
    slurm = env.get("slurm")
    host.add_row(
        "scheduler",
        f"Slurm job {slurm['job_id']} on {slurm['nodelist']}"
        if slurm
        else "Kubernetes pod"
        if env.get("kubernetes")
        else "none detected",
    )
    virt = env.get("virtualization") or {}
    host.add_row(
        "virtualization",
        ", ".join(str(v) for v in (virt.get("container"), virt.get("hypervisor")) if v) or "bare metal (no hint found)",
    )
    return host


def header_line(report: Report) -> Text:
    """What ran, judged by which profile, and with which tool, method and schema: numbers of another method
    version are not comparable (the Markdown and HTML views say the same)."""
    meta = report.meta
    return Text.assemble(
        (f"gpucert {meta.verb}, profile {meta.profile}", "bold"),
        (f"  (gpucert {meta.tool_version}, method {meta.method_version}, schema {report.schema_version})", "dim"),
    )


def _without_none(*tables: Table | None) -> list[Table]:
    return [table for table in tables if table is not None]


def _cluster_tables(report: Report, console: Console) -> tuple[list[Table], list[list[Table]]]:
    """The cluster's own table (empty or one), then each node's tables, in split_by_node's order."""
    cluster, sections = split_by_node(report)
    # Every cluster result sits in one table, per-GPU outliers included (they name their node and GPU).
    own = _without_none(node_table([dataclasses.replace(r, gpu_index=None) for r in cluster], "cluster checks"))
    return own, [[*gpu_matrices(s.results, console), *_without_none(node_table(s.results))] for s in sections]


def _print_cluster(
    report: Report, console: Console, show_inventory: bool, own: list[Table], per_node: list[list[Table]]
) -> None:
    """The cluster's line and judgements first, then each node as a one-node report shows it; the tables are
    _cluster_tables'."""
    _cluster, sections = split_by_node(report)
    summary = cluster_summary(report.nodes) if report.nodes else f"{len(sections)} nodes"
    console.print(Text(f"cluster: {summary}", style="bold"))
    if show_inventory:
        for section in sections:
            if section.inventory:
                console.rule(f"node {section.label}: {section.inventory.get('summary', '')}")
                for table in inventory_tables(section.inventory):
                    console.print(table)
    console.print(header_line(report))
    if not report.results:
        return
    for table in own:
        console.print(table)
    for section, parts in zip(sections, per_node, strict=True):
        console.rule(Text.assemble(f"node {section.label} ", (section.status.value, STATUS_STYLE[section.status])))
        if section.inventory.get("summary"):
            console.print(Text(section.inventory["summary"], style="dim"))
        for part in parts:
            console.print(part)


def verdict_line(report: Report) -> Text:
    counts = ", ".join(f"{n} {s}" for s, n in report.counts().items() if n)
    return Text.assemble(
        ("verdict: ", "bold"),
        (report.status.value, STATUS_STYLE[report.status]),
        f"  ({counts}; exit code {report.status.exit_code})",
    )


def _print_verdict(report: Report, console: Console) -> None:
    problems = problem_lines(report.results)
    if problems:
        console.print(Text("problems:", style="bold"))
        for line in problems:
            console.print(line)
    console.print(verdict_line(report))


def _plain_problems(results: list[Result]) -> str | None:
    """The problems named on one line, worst first: each is printed in full among the results, so that
    `grep -c '^FAIL'` counts every FAIL once."""
    problems = sorted((r for r in results if r.status >= Status.WARN), key=lambda r: r.status, reverse=True)
    if not problems:
        return None
    return "problems: " + ", ".join(f"{r.status.value} {r.name} ({r.subject})" for r in problems)


def _plain_results(results: Iterable[Result], console: Console) -> None:
    for r in results:
        line = Text(result_line(r))
        line.stylize(STATUS_STYLE[r.status], 0, len(r.status.value))  # shows only where the console has colour
        print_line(console, line)


def _plain_inventory(inv: dict[str, Any], console: Console) -> None:
    for table in inventory_tables(inv):
        for line in table_lines(table) if isinstance(table, Table) else [table.plain]:
            print_line(console, line)


def _print_plain(report: Report, console: Console, show_inventory: bool) -> None:
    """The report as plain lines: what ran, the inventory as lines when asked, then one line per result (a
    cluster's own results first, then each node's after a line naming it), the problems and the verdict."""
    if is_cluster(report):
        cluster, sections = split_by_node(report)
        print_line(console, f"cluster: {cluster_summary(report.nodes) if report.nodes else f'{len(sections)} nodes'}")
        if show_inventory:
            for section in sections:
                if section.inventory:
                    print_line(console, f"node {section.label}: {section.inventory.get('summary', '')}")
                    _plain_inventory(section.inventory, console)
        print_line(console, header_line(report))
        if report.results:
            print_line(console, PLAIN_HEADER)
            _plain_results(cluster, console)
            for section in sections:
                summary = section.inventory.get("summary")
                print_line(
                    console, f"node {section.label}: {section.status.value}" + (f"  ({summary})" if summary else "")
                )
                _plain_results(section.results, console)
    else:
        inv = report.inventory
        print_line(console, Text(f"{inv['hostname']}: {inv['summary']}", style="bold"))
        if inv.get("replayed_from"):
            print_line(console, f"(replayed from {inv['replayed_from']})")
        if show_inventory:
            _plain_inventory(inv, console)
        print_line(console, header_line(report))
        if report.results:
            print_line(console, PLAIN_HEADER)
            _plain_results(report.results, console)
    if report.results:
        problems = _plain_problems(report.results)
        if problems:
            print_line(console, problems)
        print_line(console, verdict_line(report))


def print_report(report: Report, console: Console, show_inventory: bool, report_path: str | None) -> None:
    """The report as tables on a terminal, as lines elsewhere (plain_output) or on a terminal too narrow for its
    tables with every name and figure whole."""
    plain = plain_output(console)
    own: list[Table] = []
    per_node: list[list[Table]] = []
    tables: list[Table] = []
    if not plain and is_cluster(report):
        own, per_node = _cluster_tables(report, console)
        tables = [*own, *(table for parts in per_node for table in parts)]
    elif not plain:
        tables = [*gpu_matrices(report.results, console), *_without_none(node_table(report.results))]
    need = fit_tables(console, tables)
    if need is not None:
        console.print(too_narrow_line(need, console))
    if plain or need is not None:
        _print_plain(report, console, show_inventory)
        if report_path:
            print_line(console, f"report: {report_path}")
        return
    if is_cluster(report):
        _print_cluster(report, console, show_inventory, own, per_node)
        if report.results:
            _print_verdict(report, console)
        if report_path:
            console.print(Text(f"report: {report_path}", style="dim"))
        return
    inv = report.inventory
    console.print(Text(f"{inv['hostname']}: {inv['summary']}", style="bold"))
    if inv.get("replayed_from"):
        console.print(Text(f"(replayed from {inv['replayed_from']})", style="dim"))
    if show_inventory:
        for table in inventory_tables(inv):
            console.print(table)
    console.print(header_line(report))
    if report.results:
        for table in tables:
            console.print(table)
        _print_verdict(report, console)
    if report_path:
        console.print(Text(f"report: {report_path}", style="dim"))
