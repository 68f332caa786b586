"""Plots of benchmark results for the HTML report: PNG bytes from matplotlib's Agg renderer.

Every plot reads benchmark results (category "benchmark", or "telemetry" for the telemetry series) by name
and returns None when the report lacks them, so a health-only report has no plots. What each one reads
(the names and keys src/gpucert/bench/*.py write):

- `collective.<op>`: details `sizes_bytes` and `busbw_gbps` (lists of one length); `expected` ">= X" is the
  floor, drawn as a dashed line.
- `matmul.<dtype>.<size>` and `matmul.<dtype>.max`: `value` in TFLOP/s and `gpu_index`.
- `memory.copy|read|write|triad` (TB/s) and `memory.h2d|d2h` (GB/s): `value` and `gpu_index`.
- `p2p.matrix`: details `matrix_gbps`, n x n, row = sending GPU, column = receiving GPU, null on the diagonal.
- `train.tokens_per_s_per_gpu`: details `world_sizes`, `tokens_per_s_per_gpu` and `loss` (world size -> curve).
- `telemetry.<benchmark>`: details `t_s` and `gpus` (GPU index -> `sm_clock_mhz`, `power_w`, `temperature_c`).

A null inside a loss curve or a telemetry series is a missed sample and leaves a gap in its line.

Figures are drawn on their own Agg canvas, never through pyplot, so nothing global changes (no backend
switch, no pyplot figure list, no rcParams): rendering a report is safe in any process.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FixedLocator, FuncFormatter

from gpucert.report.schema import Report, Result
from gpucert.status import Status

# GPU i is drawn in the same colour in every plot (matplotlib's tab10, then tab20 for bigger nodes).
_TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
_FLOOR_COLOUR = "#444444"
_BAD_COLOUR = "#cf222e"  # the HTML report's FAIL red
_DPI = 100
_PLOTTED_CATEGORIES = ("benchmark", "telemetry")
_HBM_OPS = ("copy", "read", "write", "triad")
_PCIE_OPS = ("h2d", "d2h")
_TELEMETRY_PANELS = (("sm_clock_mhz", "SM clock (MHz)"), ("power_w", "power (W)"), ("temperature_c", "temperature (C)"))


@dataclass(frozen=True)
class Plot:
    key: str  # stable id, e.g. "collectives" or "telemetry.matmul"; the HTML carries it as data-plot
    title: str
    png: bytes


def gpu_colour(index: int) -> str:
    return _TAB10[index % len(_TAB10)]


def human_bytes(size: float) -> str:
    """1024 -> "1K", 4 GiB -> "4G": binary multiples as nccl-tests labels its sizes."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return f"{size:g}"


def parse_limit(expected: str | None) -> tuple[str, float] | None:
    """(">=", 340.0) from ">= 340", ("<", 80.0) from "< 80 (FAIL at 87)"; None when there is no number."""
    if not expected:
        return None
    match = re.match(r"\s*(>=|<=|>|<|==)\s*(-?[0-9]+(?:\.[0-9]+)?)", expected)
    return (match.group(1), float(match.group(2))) if match else None


def _floor(result: Result) -> float | None:
    limit = parse_limit(result.expected)
    return limit[1] if limit and limit[0] in (">=", ">") else None


def _numbers(value: Any) -> list[float] | None:
    """A list of finite numbers, or None: odd details never break a report."""
    if not isinstance(value, list) or not value:
        return None
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        out.append(float(v))
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _series(value: Any) -> list[float] | None:
    """Like _numbers, but a null is a missed sample (NaN, a gap in the line); None if nothing is left."""
    if not isinstance(value, list) or not value:
        return None
    out = [math.nan if v is None else _number(v) for v in value]
    if any(v is None for v in out) or all(math.isnan(v) for v in out if v is not None):
        return None
    return [math.nan if v is None else v for v in out]


def _benchmarks(results: Sequence[Result]) -> list[Result]:
    return [r for r in results if r.category in _PLOTTED_CATEGORIES]


def _new_figure(width_in: float, height_in: float) -> Figure:
    fig = Figure(figsize=(width_in, height_in), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # No Software/date metadata: the same report renders to the same bytes.
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    return buf.getvalue()


def _style(ax: Any, title: str, ylabel: str) -> None:
    ax.set_title(title, loc="left", fontsize=11, fontweight="bold")
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_collectives(results: Sequence[Result]) -> bytes | None:
    """Bus bandwidth vs message size, one line per collective, its floor dashed in the same colour."""
    curves = []
    for r in _benchmarks(results):
        if not r.name.startswith("collective."):
            continue
        sizes, busbw = _numbers(r.details.get("sizes_bytes")), _numbers(r.details.get("busbw_gbps"))
        if sizes and busbw and len(sizes) == len(busbw) and min(sizes) > 0:
            curves.append((r, sizes, busbw))
    if not curves:
        return None
    fig = _new_figure(10, 4.6)
    ax = fig.add_subplot()
    for i, (r, sizes, busbw) in enumerate(curves):
        colour = _TAB10[i % len(_TAB10)]
        op = r.name.removeprefix("collective.")
        ax.plot(sizes, busbw, marker="o", markersize=3, linewidth=1.8, color=colour, label=op)
        floor = _floor(r)
        if floor is not None:
            ax.axhline(floor, color=colour, linestyle="--", linewidth=1, alpha=0.8, label=f"{op} floor {floor:g}")
    ax.set_xscale("log", base=2)
    all_sizes = sorted({s for _, sizes, _ in curves for s in sizes})
    # Every other power of two once the sweep is long, so the labels do not collide.
    step = 1 if len(all_sizes) <= 12 else 2
    ticks = all_sizes[::step]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: human_bytes(x)))
    ax.xaxis.set_minor_locator(FixedLocator([]))
    ax.set_xlabel("message size (bytes)")
    ax.set_ylim(bottom=0)
    _style(ax, "Collective bus bandwidth vs message size", "bus bandwidth (GB/s)")
    ax.grid(True, axis="x", color="#eeeeee", linewidth=0.6)
    ax.legend(loc="upper left", fontsize=9, frameon=False)
    return _png(fig)


def _size_key(label: str) -> tuple[int, str]:
    # Square sizes in numeric order, the max-achievable sweep last.
    return (int(label), "") if label.isdigit() else (1 << 62, label)


def _grouped_bars(ax: Any, groups: list[str], cells: dict[tuple[str, int], Result], gpus: list[int]) -> None:
    """Bars per group (x) and GPU (colour); a bar for a WARN/FAIL/ERROR result gets a red edge."""
    width = 0.8 / max(len(gpus), 1)
    for gi, gpu in enumerate(gpus):
        xs, heights, edges = [], [], []
        for x, group in enumerate(groups):
            r = cells.get((group, gpu))
            value = _number(r.value) if r else None
            if r is None or value is None:
                continue
            xs.append(x - 0.4 + width * (gi + 0.5))
            heights.append(value)
            edges.append(_BAD_COLOUR if r.status >= Status.WARN else "none")
        bars = ax.bar(
            xs, heights, width=width * 0.92, color=gpu_colour(gpu), edgecolor=edges, linewidth=2, label=f"GPU{gpu}"
        )
        for bar, edge, text in zip(bars, edges, ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=1), strict=True):
            if edge != "none":
                bar.set_hatch("//")
                text.set_color(_BAD_COLOUR)
                text.set_fontweight("bold")
    labels = []
    for x, group in enumerate(groups):
        floors = [f for (g, _), r in cells.items() if g == group and (f := _floor(r)) is not None]
        labels.append(group)
        if floors:
            # The floor goes in the tick label: text on the line would collide with the bar labels.
            floor = max(floors)
            ax.hlines(floor, x - 0.46, x + 0.46, colors="black", linestyles="--", linewidth=1.3, zorder=3)
            labels[-1] += f"\nfloor {floor:g} (- -)"
    ax.set_xticks(range(len(groups)), labels)
    ax.set_ylim(bottom=0)
    ax.margins(y=0.08)


def _legend_above(ax: Any, columns: int) -> None:
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=columns, fontsize=9, frameon=False)


def _per_gpu(results: Sequence[Result], prefix: str) -> dict[tuple[str, int], Result]:
    cells = {}
    for r in _benchmarks(results):
        if r.name.startswith(prefix) and r.gpu_index is not None and _number(r.value) is not None:
            cells[(r.name.removeprefix(prefix), r.gpu_index)] = r
    return cells


def plot_matmul(results: Sequence[Result]) -> bytes | None:
    """Matmul TFLOP/s per dtype and size (and the max-achievable sweep), a bar per GPU."""
    cells = {}
    for (rest, gpu), r in _per_gpu(results, "matmul.").items():
        dtype, _, size = rest.partition(".")
        if dtype and size:
            cells[(f"{dtype} {size}", gpu)] = r
    if not cells:
        return None
    groups = sorted({g for g, _ in cells}, key=lambda g: (g.split(" ")[0], _size_key(g.split(" ")[1])))
    gpus = sorted({gpu for _, gpu in cells})
    fig = _new_figure(10, 4.4)
    ax = fig.add_subplot()
    _grouped_bars(ax, groups, cells, gpus)
    ax.set_xlabel("dtype and M = N = K (max: best shape of the sweep)")
    _style(ax, "Matmul throughput per GPU", "TFLOP/s")
    _legend_above(ax, min(len(gpus), 8))
    return _png(fig)


def plot_memory(results: Sequence[Result]) -> bytes | None:
    """Device memory bandwidth (TB/s) and host <-> device copies over PCIe (GB/s), a bar per GPU."""
    cells = _per_gpu(results, "memory.")
    panels = [
        (ops, title, unit)
        for ops, title, unit in (
            ([op for op in _HBM_OPS if any(g == op for g, _ in cells)], "GPU memory bandwidth", "TB/s"),
            ([op for op in _PCIE_OPS if any(g == op for g, _ in cells)], "Host <-> GPU copies", "GB/s"),
        )
        if ops
    ]
    if not panels:
        return None
    gpus = sorted({gpu for _, gpu in cells})
    fig = _new_figure(10, 4.2)
    axes = fig.subplots(1, len(panels), width_ratios=[len(ops) for ops, _, _ in panels], squeeze=False)[0]
    for ax, (ops, title, unit) in zip(axes, panels, strict=True):
        _grouped_bars(ax, ops, {k: r for k, r in cells.items() if k[0] in ops}, gpus)
        _style(ax, title, unit)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(gpus), 8), fontsize=9, frameon=False)
    return _png(fig)


def plot_p2p(results: Sequence[Result]) -> bytes | None:
    """GPU-to-GPU copy bandwidth as an annotated heat map; pairs judged slow are boxed in red."""
    result = next((r for r in _benchmarks(results) if r.name == "p2p.matrix"), None)
    matrix = result.details.get("matrix_gbps") if result else None
    if result is None or not isinstance(matrix, list) or len(matrix) < 2:
        return None
    n = len(matrix)
    grid: list[list[float]] = []
    for row in matrix:
        if not isinstance(row, list) or len(row) != n:
            return None
        cells = [math.nan if v is None else _number(v) for v in row]
        if any(v is None for v in cells):
            return None
        grid.append([math.nan if v is None else v for v in cells])
    values = [v for row in grid for v in row if not math.isnan(v)]
    if not values:
        return None
    floor = _floor(result)
    # Pairs judged bad: the p2p.pair results (floor or deviation from the median), else those below the floor.
    flagged = {
        (r.details.get("src"), r.details.get("dst"))
        for r in _benchmarks(results)
        if r.name == "p2p.pair" and r.status >= Status.WARN
    }
    side = min(2.0 + 0.8 * n, 9.5)
    fig = _new_figure(side + 1.6, side)
    ax = fig.add_subplot()
    low = min(values + ([floor] if floor is not None else []))
    cmap = colormaps["RdYlGn"].with_extremes(bad="#eeeeee")
    image = ax.imshow(grid, cmap=cmap, vmin=low * 0.95, vmax=max(values) * 1.01)
    for a in range(n):
        for b in range(n):
            v = grid[a][b]
            text = "-" if math.isnan(v) else f"{v:.0f}"
            ax.text(b, a, text, ha="center", va="center", fontsize=10 if n <= 8 else 7, color="#111111")
            below = floor is not None and not math.isnan(v) and v < floor
            if (a, b) in flagged or below:
                ax.add_patch(Rectangle((b - 0.5, a - 0.5), 1, 1, fill=False, edgecolor=_BAD_COLOUR, linewidth=2.5))
    ax.set_xticks(range(n), [f"GPU{i}" for i in range(n)])
    ax.set_yticks(range(n), [f"GPU{i}" for i in range(n)])
    ax.set_xlabel("to")
    ax.set_ylabel("from")
    title = "GPU-to-GPU bandwidth (GB/s)"
    ax.set_title(
        title + (f", floor {floor:g}" if floor is not None else ""), loc="left", fontsize=11, fontweight="bold"
    )
    fig.colorbar(image, ax=ax, shrink=0.8, label="GB/s")
    return _png(fig)


def plot_training(results: Sequence[Result]) -> bytes | None:
    """Training proxy: tokens/s per GPU vs world size (flat is perfect scaling) and the loss curves."""
    result = next((r for r in _benchmarks(results) if r.name == "train.tokens_per_s_per_gpu"), None)
    if result is None:
        return None
    sizes, tps = _numbers(result.details.get("world_sizes")), _numbers(result.details.get("tokens_per_s_per_gpu"))
    throughput = sizes is not None and tps is not None and len(sizes) == len(tps)
    raw_loss = result.details.get("loss")
    losses = []
    if isinstance(raw_loss, dict):
        for key, curve in raw_loss.items():
            values = _series(curve)
            if values:
                losses.append((str(key), values))
    losses.sort(key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0, kv[0]))
    if not throughput and not losses:
        return None
    fig = _new_figure(10, 4.0)
    axes = fig.subplots(1, int(throughput) + int(bool(losses)), squeeze=False)[0]
    if throughput and sizes is not None and tps is not None:
        ax = axes[0]
        ax.plot(sizes, tps, marker="o", linewidth=2, color=_TAB10[0], label="measured")
        ax.axhline(tps[0], color=_FLOOR_COLOUR, linestyle="--", linewidth=1, label=f"perfect scaling from {sizes[0]:g}")
        for s, t in zip(sizes, tps, strict=True):
            ax.annotate(
                f"{t:,.0f}\n({100 * t / tps[0]:.0f} %)",
                (s, t),
                xytext=(0, -26),
                textcoords="offset points",
                ha="center",
                fontsize=8,
            )
        ax.set_xticks(sizes, [f"{s:g}" for s in sizes])
        ax.set_xlabel("GPUs (world size)")
        ax.set_ylim(0, max(tps) * 1.15)
        _style(ax, "Tokens/s per GPU", "tokens/s per GPU")
        ax.legend(loc="lower left", fontsize=9, frameon=False)
    if losses:
        ax = axes[-1]
        for i, (key, curve) in enumerate(losses):
            ax.plot(
                range(1, len(curve) + 1),
                curve,
                linewidth=1.6,
                color=_TAB10[(i + 1) % len(_TAB10)],
                label=f"{key} GPU{'s' if key != '1' else ''}",
            )
        ax.set_xlabel("step")
        _style(ax, "Training loss", "loss")
        ax.legend(loc="upper right", fontsize=9, frameon=False)
    return _png(fig)


def telemetry_benchmarks(results: Sequence[Result]) -> list[str]:
    """Benchmarks with telemetry in the report, in report order."""
    return [r.name.removeprefix("telemetry.") for r in _benchmarks(results) if r.name.startswith("telemetry.")]


def plot_telemetry(results: Sequence[Result], benchmark: str) -> bytes | None:
    """SM clock, power and temperature over time during one benchmark, a line per GPU."""
    result = next((r for r in _benchmarks(results) if r.name == f"telemetry.{benchmark}"), None)
    if result is None:
        return None
    t, gpus = _numbers(result.details.get("t_s")), result.details.get("gpus")
    if t is None or not isinstance(gpus, dict):
        return None
    series: dict[str, list[tuple[int, list[float]]]] = {field: [] for field, _ in _TELEMETRY_PANELS}
    for key, data in gpus.items():
        if not str(key).isdigit() or not isinstance(data, dict):
            continue
        for field, _ in _TELEMETRY_PANELS:
            values = _series(data.get(field))
            if values is not None and len(values) == len(t):
                series[field].append((int(key), values))
    panels = [(field, label) for field, label in _TELEMETRY_PANELS if series[field]]
    if not panels:
        return None
    fig = _new_figure(10, 0.9 + 1.9 * len(panels))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    limit = parse_limit(result.expected)
    for ax, (field, label) in zip(axes, panels, strict=True):
        for gpu, values in sorted(series[field]):
            ax.plot(t, values, linewidth=1.4, color=gpu_colour(gpu), label=f"GPU{gpu}")
        if field == "temperature_c" and limit and limit[0] in ("<", "<="):
            ax.axhline(limit[1], color=_BAD_COLOUR, linestyle="--", linewidth=1)
            ax.annotate(
                f"limit {limit[1]:g} C",
                (0, limit[1]),
                xycoords=("axes fraction", "data"),
                xytext=(4, -10),
                textcoords="offset points",
                fontsize=8,
                color=_BAD_COLOUR,
            )
        _style(ax, "", label)
        ax.grid(True, axis="x", color="#eeeeee", linewidth=0.6)
    axes[0].set_title(f"GPU telemetry during {benchmark}", loc="left", fontsize=11, fontweight="bold")
    _legend_above(axes[0], min(len(series[panels[0][0]]), 8))
    axes[-1].set_xlabel("time (s)")
    return _png(fig)


def report_plots(report: Report) -> list[Plot]:
    """Every plot the report has data for, in the order the HTML report shows them."""
    results = report.results
    fixed: list[tuple[str, str, Callable[[Sequence[Result]], bytes | None]]] = [
        ("collectives", "Collective bus bandwidth", plot_collectives),
        ("matmul", "Matmul throughput", plot_matmul),
        ("memory", "Memory bandwidth", plot_memory),
        ("p2p", "GPU-to-GPU bandwidth", plot_p2p),
        ("training", "Training proxy", plot_training),
    ]
    plots = [Plot(key, title, png) for key, title, draw in fixed if (png := draw(results)) is not None]
    for benchmark in telemetry_benchmarks(results):
        png = plot_telemetry(results, benchmark)
        if png is not None:
            plots.append(Plot(f"telemetry.{benchmark}", f"Telemetry during {benchmark}", png))
    return plots
