"""A report as Prometheus metrics, in node_exporter's textfile format (`--metrics-file PATH` on any verb).

node_exporter's textfile collector serves every `*.prom` file of one directory, so a health check run by cron,
a Slurm HealthCheckProgram or a Kubernetes CronJob is scraped with the node's other metrics; name one file per
verb (`gpucert-health.prom`, `gpucert-accept.prom`): series of different verbs differ by their `verb` label.

Names are stable and carry their unit; values are converted to Prometheus' base units (bytes, seconds, ratios):

    gpucert_run_info{verb,node,tool_version,method_version,schema_version,profile}        1
    gpucert_run_status{verb,node}                 the worst status of the node's results (the legend below)
    gpucert_run_finished_timestamp_seconds{verb,node}, gpucert_run_duration_seconds{verb,node}
    gpucert_result_status{verb,node,gpu,uuid,check,subject,category}                      one per result
    gpucert_result_<unit>{same labels}            its measured value: _bytes_per_second, _flop_per_second,
                                                  _celsius, _watts, _ratio, _seconds, _errors, ...

Status is a gauge in gpucert's order: 0 SKIP, 1 INFO, 2 PASS, 3 WARN, 4 FAIL, 5 ERROR, so `>= 4` is "FAIL or
ERROR" and `== 4` is "drain it". `gpu` and `uuid` are empty for node and job results; a run of several nodes
(written by node 0) has one gpucert_run_status per node and one without a `node` label for the whole run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, write_to_textfile
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpucert.config.loader import ConfigError
from gpucert.report.schema import Report, Result
from gpucert.status import Status, worst

PREFIX = "gpucert"
STATUS_LEGEND = ", ".join(f"{s.rank} {s.value}" for s in sorted(Status))

# A result's unit -> (the metric name's unit suffix, the factor to Prometheus' base unit). Units missing here
# are spelled out in the name as they are (`links`, `gpus`), never scaled.
UNITS: dict[str, tuple[str, float]] = {
    "TB/s": ("bytes_per_second", 1e12),
    "GB/s": ("bytes_per_second", 1e9),
    "MB/s": ("bytes_per_second", 1e6),
    "Gb/s": ("bits_per_second", 1e9),
    "TFLOP/s": ("flop_per_second", 1e12),
    "tokens/s": ("tokens_per_second", 1.0),
    "samples/s": ("samples_per_second", 1.0),
    "ops/s": ("operations_per_second", 1.0),
    "%": ("ratio", 0.01),
    "C": ("celsius", 1.0),
    "W": ("watts", 1.0),
    "s": ("seconds", 1.0),
    "ms": ("seconds", 1e-3),
    "us": ("seconds", 1e-6),
    "GiB": ("bytes", 2.0**30),
    "MB": ("bytes", 1e6),
    "relative error": ("relative_error", 1.0),
    "nats/token": ("nats_per_token", 1.0),
}

RESULT_LABELS = ("verb", "node", "gpu", "uuid", "check", "subject", "category")


def unit_suffix(unit: str | None) -> tuple[str, float]:
    """The metric name suffix and scale of a result's unit: `GB/s` -> (`bytes_per_second`, 1e9)."""
    if unit is None:
        return "value", 1.0
    if unit in UNITS:
        return UNITS[unit]
    # A rate spelled out (`ops/s` -> `ops_per_second`): `_s` is an abbreviated unit to promtool's lint.
    per_second = unit.endswith("/s")
    slug = re.sub(r"[^a-z0-9]+", "_", unit.lower().removesuffix("/s")).strip("_")
    if per_second:
        return f"{slug or 'value'}_per_second", 1.0
    return slug or "value", 1.0


def _numeric(value: object) -> float | None:
    # A bool (ECC on) or a string (Gen5 x16) is a state its status already says; only numbers become samples.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _uuids(report: Report) -> dict[tuple[str, int], str]:
    inventories = report.nodes or {_head(report): report.inventory}
    return {
        (label, gpu["index"]): gpu["uuid"]
        for label, inventory in inventories.items()
        for gpu in inventory.get("gpus", [])
        if gpu.get("uuid")
    }


def _head(report: Report) -> str:
    return report.meta.nodes[0] if report.meta.nodes else report.meta.host


def _node_of(result: Result, report: Report) -> str:
    """The node a result belongs to: its own label; in a one-node run (or a 1.x report) the run's node; empty
    for a result about the job across several nodes."""
    if result.node is not None:
        return result.node
    return "" if len(report.meta.nodes) > 1 else _head(report)


class ReportCollector(Collector):
    """prometheus-client's view of one report: every sample built from it on each collect()."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def collect(self) -> Iterator[Metric]:
        report, meta = self.report, self.report.meta
        head = _head(report)
        info = GaugeMetricFamily(
            f"{PREFIX}_run_info",
            "gpucert run: tool and measurement method versions, report schema, hardware profile (value 1)",
            labels=["verb", "node", "tool_version", "method_version", "schema_version", "profile"],
        )
        info.add_metric(
            [meta.verb, head, meta.tool_version, meta.method_version, report.schema_version, meta.profile], 1
        )
        yield info

        run_status = GaugeMetricFamily(
            f"{PREFIX}_run_status",
            f"worst status of the run's results on the node: {STATUS_LEGEND}",
            labels=["verb", "node"],
        )
        by_node: dict[str, list[Status]] = {label: [] for label in meta.nodes or [head]}
        for result in report.results:
            by_node.setdefault(_node_of(result, report), []).append(result.status)
        for node, statuses in by_node.items():
            if node:
                run_status.add_metric([meta.verb, node], worst(statuses).rank)
        if len(meta.nodes) > 1:
            run_status.add_metric([meta.verb, ""], report.status.rank)
        yield run_status

        finished = GaugeMetricFamily(
            f"{PREFIX}_run_finished_timestamp_seconds", "when the run finished (Unix time)", labels=["verb", "node"]
        )
        finished.add_metric([meta.verb, head], datetime.fromisoformat(meta.finished_at).timestamp())
        yield finished
        duration = GaugeMetricFamily(f"{PREFIX}_run_duration_seconds", "how long the run took", labels=["verb", "node"])
        duration.add_metric([meta.verb, head], meta.duration_s)
        yield duration

        yield from self._results()

    def _results(self) -> Iterator[Metric]:
        report = self.report
        uuids = _uuids(report)
        status = GaugeMetricFamily(
            f"{PREFIX}_result_status", f"status of one check or measurement: {STATUS_LEGEND}", labels=RESULT_LABELS
        )
        values: dict[str, GaugeMetricFamily] = {}
        seen: dict[tuple[str, ...], Status] = {}
        measured: set[tuple[str, tuple[str, ...]]] = set()
        for result in report.results:
            node = _node_of(result, report)
            gpu = "" if result.gpu_index is None else str(result.gpu_index)
            uuid = str(result.details.get("uuid") or "")
            if not uuid and result.gpu_index is not None:
                uuid = uuids.get((node, result.gpu_index), "")
            labels = (report.meta.verb, node, gpu, uuid, result.name, result.subject, result.category)
            # Two results under one label set would make the scrape fail: the worse status stands for both.
            seen[labels] = max(seen.get(labels, result.status), result.status)
            number = _numeric(result.value)
            if number is None:
                continue
            suffix, scale = unit_suffix(result.unit)
            if (suffix, labels) in measured:
                continue
            measured.add((suffix, labels))
            if suffix not in values:
                values[suffix] = GaugeMetricFamily(
                    f"{PREFIX}_result_{suffix}",
                    f"measured value of one check, in {suffix.replace('_', ' ')}",
                    labels=RESULT_LABELS,
                )
            values[suffix].add_metric(list(labels), number * scale)
        for label_values, worst_status in seen.items():
            status.add_metric(list(label_values), worst_status.rank)
        yield status
        yield from (values[suffix] for suffix in sorted(values))


def registry_of(report: Report) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReportCollector(report))
    return registry


def render_metrics(report: Report) -> str:
    """The report in Prometheus' text exposition format."""
    return generate_latest(registry_of(report)).decode()


def write_metrics(report: Report, path: Path) -> Path:
    """Write the report's metrics to `path` atomically (prometheus-client writes a temporary file beside it and
    renames it), so node_exporter never serves half a file."""
    try:
        write_to_textfile(str(path), registry_of(report))
    except OSError as exc:
        raise ConfigError(f"--metrics-file {path}: cannot write it: {exc.strerror or exc}") from None
    return path
