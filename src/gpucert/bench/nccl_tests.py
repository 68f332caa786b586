"""Read the text nccl-tests prints (all_reduce_perf and friends) and set it beside a gpucert collectives curve.

`parse_nccl_tests(text)` turns one or more runs of any *_perf binary into rows of size, time, algbw, busbw and
#wrong for the out-of-place and in-place columns. `side_by_side(run, curve)` pairs them with the same sizes of
a `gpucert bench collectives` curve (the `details` of a `collective.<op>` result), and `compare_markdown` writes
the table tools/device_nccl_compare.sh leaves in $OUT. Both tools count sizes and bandwidths the same way
(nccl-tests doc/PERFORMANCE.md), so their busbw should agree within a few % from a few MiB up.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

# nccl-tests binary -> gpucert op name.
PERF_OPS = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "alltoall_perf": "all_to_all",
    "broadcast_perf": "broadcast",
    "sendrecv_perf": "send_recv",
}
# gpucert runs these in place (output buffer = input buffer), the others out of place: compare like with like.
IN_PLACE_OPS = ("all_reduce", "broadcast")


@dataclass(frozen=True)
class Placement:
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None where nccl-tests prints N/A


@dataclass(frozen=True)
class Row:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    out_of_place: Placement
    in_place: Placement | None  # None where nccl-tests prints no in-place columns

    def placement(self, in_place: bool) -> Placement:
        return self.in_place if in_place and self.in_place is not None else self.out_of_place


@dataclass
class Run:
    """One run of a *_perf binary: its header facts and its rows."""

    test: str | None = None  # "all_reduce_perf", from "# Collective test starting:" (nccl-tests >= 2.14)
    version: str | None = None
    n_gpus: int | None = None  # the -g of the header; ranks is what took part
    ranks: int = 0
    graph_launches: int = 0  # -G
    iters: int | None = None
    rows: list[Row] = field(default_factory=list)
    avg_busbw_gbps: float | None = None

    @property
    def op(self) -> str | None:
        return PERF_OPS.get(self.test or "")


_HEADER = re.compile(r"nGpus (\d+).*?warmup iters: \d+ iters: (\d+).*?graph: (\d+)")


def parse_nccl_tests(text: str) -> list[Run]:
    """Every run in text, in order; a run starts at its `# nThread ... nGpus ...` line."""
    runs: list[Run] = []
    pending_test: str | None = None
    pending_version: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("# nccl-tests version"):
            pending_version = line.split()[3]
        elif line.startswith("# Collective test starting:"):
            pending_test = line.split(":", 1)[1].strip()
        elif line.startswith("# nThread"):
            header = _HEADER.search(line)
            runs.append(
                Run(
                    test=pending_test,
                    version=pending_version,
                    n_gpus=int(header[1]) if header else None,
                    iters=int(header[2]) if header else None,
                    graph_launches=int(header[3]) if header else 0,
                )
            )
            pending_test = pending_version = None
        elif not runs:
            continue
        elif re.match(r"#\s+Rank\s+\d+", line):
            runs[-1].ranks += 1
        elif line.startswith("# Avg bus bandwidth"):
            runs[-1].avg_busbw_gbps = float(line.split(":", 1)[1])
        elif line and line[0].isdigit():
            runs[-1].rows.append(_row(line))
    return runs


def _row(line: str) -> Row:
    """`size count type redop root  time algbw busbw #wrong  time algbw busbw #wrong`."""
    cells = line.split()
    if len(cells) < 9:
        raise ValueError(f"nccl-tests row with {len(cells)} columns, expected 9 or 13: {line!r}")
    return Row(
        size_bytes=int(cells[0]),
        count=int(cells[1]),
        dtype=cells[2],
        redop=cells[3],
        root=int(cells[4]),
        out_of_place=_placement(cells[5:9]),
        in_place=_placement(cells[9:13]) if len(cells) >= 13 else None,
    )


def _placement(cells: list[str]) -> Placement:
    return Placement(float(cells[0]), float(cells[1]), float(cells[2]), None if cells[3] == "N/A" else int(cells[3]))


@dataclass(frozen=True)
class Pair:
    size_bytes: int
    nccl_time_us: float
    ours_time_us: float
    nccl_busbw_gbps: float
    ours_busbw_gbps: float

    @property
    def ratio(self) -> float:
        """Our busbw over nccl-tests' (1.0 = the same; below 1, we are slower)."""
        return self.ours_busbw_gbps / self.nccl_busbw_gbps if self.nccl_busbw_gbps > 0 else float("nan")


def side_by_side(runs: list[Run], curve: dict[str, Any]) -> list[Pair]:
    """The sizes both measured, nccl-tests as the mean of its runs of this op (e.g. one before, one after)."""
    op = curve["op"]
    in_place = op in IN_PLACE_OPS
    pairs = []
    for k, size in enumerate(curve["sizes_bytes"]):
        theirs = [row.placement(in_place) for run in runs if run.op == op for row in run.rows if row.size_bytes == size]
        if not theirs:
            continue
        pairs.append(
            Pair(
                size_bytes=size,
                nccl_time_us=statistics.fmean(p.time_us for p in theirs),
                ours_time_us=curve["time_us"][k],
                nccl_busbw_gbps=statistics.fmean(p.busbw_gbps for p in theirs),
                ours_busbw_gbps=curve["busbw_gbps"][k],
            )
        )
    return pairs


def compare_markdown(runs: list[Run], curves: list[dict[str, Any]]) -> str:
    """One table per op: size, both times, both busbw, and our busbw over theirs."""
    out = []
    for curve in curves:
        pairs = side_by_side(runs, curve)
        graphs = {run.graph_launches for run in runs if run.op == curve["op"]}
        placement = "in place" if curve["op"] in IN_PLACE_OPS else "out of place"
        out.append(
            f"## {curve['op']}, {curve['world_size']} ranks, {curve['dtype']} ({placement}; nccl-tests -G "
            f"{'/'.join(map(str, sorted(graphs))) or '?'}, gpucert cuda_graph {curve.get('cuda_graph', False)}, "
            f"buffers {curve.get('buffers', 'torch')})\n"
        )
        if not pairs:
            out.append("no size measured by both\n")
            continue
        out.append(
            "| size (B) | nccl-tests time (us) | gpucert time (us) | nccl-tests busbw (GB/s) "
            "| gpucert busbw (GB/s) | ratio |"
        )
        out.append("|---:|---:|---:|---:|---:|---:|")
        for p in pairs:
            out.append(
                f"| {p.size_bytes} | {p.nccl_time_us:.2f} | {p.ours_time_us:.2f} | {p.nccl_busbw_gbps:.2f} | "
                f"{p.ours_busbw_gbps:.2f} | {p.ratio:.3f} |"
            )
        out.append("")
    return "\n".join(out) + "\n"
