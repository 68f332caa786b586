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

A fine-tuning run (`gpucert finetune`, category "training"; src/gpucert/finetune/train/report.py) and an
evaluation (`gpucert evaluate`, category "evaluation") have plots of their own (`training_plots`,
`evaluation_plots`), drawn in their own sections of the HTML report:
- `steps`: details `step` and, aligned with it, `loss`, `tokens_per_s_per_gpu`,
  `supervised_tokens_per_s_per_gpu`, `mfu_pct`, `memory_peak_gib`, `memory_allocated_gib`, `rss_gib`,
  `warmup`; `eval_step` and `eval_loss` for the held-out loss. `final_loss`'s `expected` ("<= X") is drawn as
  the loss threshold; `tokens_per_s_per_gpu` and `mfu` values (the run's timed mean) as dotted lines.
- evaluation results in % (`value`, `expected` ">= X" as the threshold), one bar each; a name that repeats
  over subjects (eval.tool, one per tool) gets a chart of its own, a bar per subject.

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

from gpucert.report.numbers import sig
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
            # The share of the first size's figure, where that is a number to divide by.
            share = f"\n({100 * t / tps[0]:.0f} %)" if tps[0] else ""
            ax.annotate(
                f"{t:,.0f}{share}",
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


# --- Fine-tuning runs and evaluations ------------------------------------------------------------------------

_TRAINING = "training"
_EVALUATION = "evaluation"
_WARMUP_COLOUR = "#9a9a9a"


def _training_result(results: Sequence[Result], name: str) -> Result | None:
    return next((r for r in results if r.category == _TRAINING and r.name == name), None)


def _aligned(details: dict[str, Any], key: str, length: int) -> list[float] | None:
    """A per-step series as long as `step`, nulls as gaps; None when absent, misshapen or all null."""
    values = _series(details.get(key))
    return values if values is not None and len(values) == length else None


def _steps(results: Sequence[Result]) -> tuple[dict[str, Any], list[float]] | None:
    """The details of the run's `steps` result and its step numbers; None without a usable series."""
    result = _training_result(results, "steps")
    steps = _numbers(result.details.get("step")) if result else None
    return (result.details, steps) if result and steps else None


def _run_line(ax: Any, result: Result | None, label: str) -> None:
    """The run's figure (a timed mean, not a step) as a dotted line across the panel; in significant figures
    (a tiny model's 0.008 % MFU read "0.0" at one decimal)."""
    value = _number(result.value) if result else None
    if value is not None:
        ax.axhline(value, color=_FLOOR_COLOUR, linestyle=":", linewidth=1.2, label=f"{label} {sig(value)}")


def _points(ax: Any, x: list[float], y: list[float], warmup: list[bool], colour: str, label: str) -> None:
    """A per-step line; the warm-up steps (left out of the run's figures) as grey points."""
    ax.plot(x, y, linewidth=1.5, color=colour, marker="o" if len(x) <= 60 else None, markersize=3, label=label)
    warm = [(a, b) for a, b, w in zip(x, y, warmup, strict=True) if w and not math.isnan(b)]
    if warm:
        ax.plot(
            *zip(*warm, strict=True),
            linestyle="none",
            marker="o",
            markersize=5,
            color=_WARMUP_COLOUR,
            label="warm-up step (not in the run's figure)",
        )


def plot_finetune_loss(results: Sequence[Result]) -> bytes | None:
    """Training loss per step and the held-out loss at each evaluation; train.final_loss_max dashed."""
    found = _steps(results)
    if found is None:
        return None
    details, steps = found
    loss = _aligned(details, "loss", len(steps))
    if loss is None:
        return None
    fig = _new_figure(10, 4.2)
    ax = fig.add_subplot()
    ax.plot(steps, loss, linewidth=1.5, color=_TAB10[0], label="train loss (per step)")
    eval_steps, eval_loss = _numbers(details.get("eval_step")), _numbers(details.get("eval_loss"))
    if eval_steps and eval_loss and len(eval_steps) == len(eval_loss):
        ax.plot(eval_steps, eval_loss, linewidth=1.5, marker="o", markersize=5, color=_TAB10[1], label="eval loss")
    final = _training_result(results, "final_loss")
    limit = parse_limit(final.expected) if final else None
    if final is not None and limit is not None and limit[0] in ("<", "<="):
        bad = final.status >= Status.WARN
        ax.axhline(
            limit[1],
            color=_BAD_COLOUR if bad else _FLOOR_COLOUR,
            linestyle="--",
            linewidth=1.2,
            label=f"final loss limit {limit[1]:g} ({final.threshold_source or 'threshold'})",
        )
    ax.set_xlabel("optimizer step")
    _style(ax, "Training and eval loss", "loss (nats/token)")
    ax.legend(loc="best", fontsize=9, frameon=False)
    return _png(fig)


def plot_finetune_throughput(results: Sequence[Result]) -> bytes | None:
    """Effective (and supervised) tokens/s per GPU per step, and MFU per step where a peak was known."""
    found = _steps(results)
    if found is None:
        return None
    details, steps = found
    effective = _aligned(details, "tokens_per_s_per_gpu", len(steps))
    if effective is None:
        return None
    supervised = _aligned(details, "supervised_tokens_per_s_per_gpu", len(steps))
    mfu = _aligned(details, "mfu_pct", len(steps))
    raw_warmup = details.get("warmup")
    warmup = [bool(w) for w in raw_warmup] if isinstance(raw_warmup, list) else []
    warmup = warmup if len(warmup) == len(steps) else [False] * len(steps)
    fig = _new_figure(10, 4.0 if mfu is None else 6.2)
    axes = fig.subplots(1 if mfu is None else 2, 1, sharex=True, squeeze=False)[:, 0]
    ax = axes[0]
    _points(ax, steps, effective, warmup, _TAB10[0], "effective tokens/s per GPU")
    if supervised is not None:
        ax.plot(steps, supervised, linewidth=1.0, linestyle="--", color=_TAB10[2], label="supervised tokens/s per GPU")
    _run_line(ax, _training_result(results, "tokens_per_s_per_gpu"), "run (timed steps):")
    ax.set_ylim(bottom=0)
    _style(ax, "Throughput per step", "tokens/s per GPU")
    ax.legend(loc="best", fontsize=9, frameon=False)
    if mfu is not None:
        ax = axes[1]
        _points(ax, steps, mfu, warmup, _TAB10[4], "LoRA-aware MFU")
        _run_line(ax, _training_result(results, "mfu"), "run (timed steps):")
        ax.set_ylim(bottom=0)
        _style(ax, "", "MFU (%)")
        ax.legend(loc="best", fontsize=9, frameon=False)
    axes[-1].set_xlabel("optimizer step")
    return _png(fig)


def plot_finetune_memory(results: Sequence[Result]) -> bytes | None:
    """Device memory (allocated after each step, peak so far) and host peak RSS, rank 0's, per step."""
    found = _steps(results)
    if found is None:
        return None
    details, steps = found
    device = [
        (label, values, colour, style)
        for key, label, colour, style in (
            ("memory_peak_gib", "device peak so far", _TAB10[3], "-"),
            ("memory_allocated_gib", "device allocated after the step", _TAB10[0], "--"),
        )
        if (values := _aligned(details, key, len(steps))) is not None
    ]
    rss = _aligned(details, "rss_gib", len(steps))
    panels = int(bool(device)) + int(rss is not None)
    if not panels:
        return None
    fig = _new_figure(10, 1.2 + 2.4 * panels)
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    if device:
        ax = axes[0]
        for label, values, colour, style in device:
            ax.plot(steps, values, linewidth=1.5, linestyle=style, color=colour, label=label)
        _run_line(ax, _training_result(results, "peak_memory_gib"), "run peak over ranks:")
        ax.set_ylim(bottom=0)
        _style(ax, "Memory per step (rank 0)", "GPU memory (GiB)")
        ax.legend(loc="best", fontsize=9, frameon=False)
    if rss is not None:
        ax = axes[-1]
        ax.plot(steps, rss, linewidth=1.5, color=_TAB10[2], label="host peak RSS so far")
        ax.set_ylim(bottom=0)
        _style(ax, "" if device else "Memory per step (rank 0)", "host memory (GiB)")
        ax.legend(loc="best", fontsize=9, frameon=False)
    axes[-1].set_xlabel("optimizer step")
    return _png(fig)


def _scores(results: Sequence[Result]) -> list[tuple[Result, float]]:
    return [
        (r, value)
        for r in results
        if r.category == _EVALUATION and r.unit == "%" and (value := _number(r.value)) is not None
    ]


def plot_evaluation(scores: Sequence[tuple[Result, float]], title: str, label_by_subject: bool = False) -> bytes | None:
    """Scores in %, a bar each, red where judged bad; a recipe threshold (">= X") as a dashed tick on its bar."""
    if not scores:
        return None
    fig = _new_figure(10, 1.3 + 0.42 * len(scores))
    ax = fig.add_subplot()
    for y, (r, value) in enumerate(scores):
        bad = r.status >= Status.WARN
        floor = _floor(r)
        ax.barh(y, value, height=0.6, color=_BAD_COLOUR if bad else _TAB10[0], alpha=0.9 if bad else 0.8)
        if floor is not None:
            ax.vlines(floor, y - 0.4, y + 0.4, colors="black", linestyles="--", linewidth=1.4, zorder=3)
        ax.annotate(
            f"{value:.1f} % {r.status.value}",
            # Right of the threshold tick too, which would cross the text.
            (max(value, floor or 0.0), y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
            color=_BAD_COLOUR if bad else "#111111",
        )
    if all(value == 0 for _, value in scores):  # bars of width 0: say so rather than draw an empty chart
        ax.text(
            0.5,
            0.5,
            "no correct calls: every score here is 0 %",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=11,
            color=_BAD_COLOUR,
        )
    ax.set_yticks(range(len(scores)), [r.subject if label_by_subject else r.name for r, _ in scores])
    ax.invert_yaxis()
    ax.set_xlim(0, 115)
    judged = any(_floor(r) is not None for r, _ in scores)
    ax.set_xlabel("score (%)" + ("; - - the recipe's threshold" if judged else ", no threshold in the recipe"))
    ax.grid(True, axis="x", color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, loc="left", fontsize=11, fontweight="bold")
    return _png(fig)


def training_plots(report: Report) -> list[Plot]:
    """A fine-tuning run's curves, in the order the HTML report shows them; [] for any other report."""
    drawn = [
        ("finetune.loss", "Training and eval loss", plot_finetune_loss(report.results)),
        ("finetune.throughput", "Throughput and MFU per step", plot_finetune_throughput(report.results)),
        ("finetune.memory", "Memory per step", plot_finetune_memory(report.results)),
    ]
    return [Plot(key, title, png) for key, title, png in drawn if png is not None]


def evaluation_plots(report: Report) -> list[Plot]:
    """An evaluation's scores: one chart of the metrics (a result each), then one per name that repeats over
    subjects (eval.tool: one bar per tool)."""
    scores = _scores(report.results)
    names = [r.name for r, _ in scores]
    repeated = list(dict.fromkeys(n for n in names if names.count(n) > 1))
    plots = []
    png = plot_evaluation([(r, v) for r, v in scores if r.name not in repeated], "Evaluation scores")
    if png is not None:
        plots.append(Plot("evaluation.scores", "Evaluation scores", png))
    for name in repeated:
        png = plot_evaluation([(r, v) for r, v in scores if r.name == name], f"{name} per subject", True)
        if png is not None:
            plots.append(Plot(f"evaluation.{name}", f"{name} per subject", png))
    return plots


def report_plots(report: Report) -> list[Plot]:
    """Every benchmark plot the report has data for, in the order the HTML report shows them."""
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
