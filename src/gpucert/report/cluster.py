"""The cluster report: what a run of several nodes adds to the per-node results, and how its views divide.

Two judges compare the nodes with each other rather than with the profile:

- the golden-config diff: GPU model and count, driver, CUDA, NCCL, VBIOS, HCA firmware, kernel, gpucert and
  torch must be the same on every node (imbue's golden `config.json`, Google's `configcheck`). The majority's
  value is the golden one and every node that differs FAILs by name: one odd node in a job is the usual cause
  of a hang or a slow collective that no single-node check sees;
- outliers across nodes: a per-GPU benchmark figure well below the cluster median names the GPU, and the node
  when its median is low (gpu-fryer's 10 % rule, taken across nodes instead of within one).

Rank 0 of a multi-node run appends `cluster_results` to the results; `merge_reports` builds the same report
from per-node reports made separately (a Slurm prolog, a job array), for `gpucert report merge`.
Everything here is pure (no torch, no I/O) but `merge_reports`, which loads the profile by name, and
`write_merged`, which reads the per-node reports and writes the cluster report.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import shutil
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpucert.config.loader import dotted
from gpucert.config.profiles import Profile, load_profile
from gpucert.report.direction import HIGHER, direction_of
from gpucert.report.numbers import short
from gpucert.report.schema import Report, Result, RunMeta, Value
from gpucert.runtime.identity import node_labels
from gpucert.status import Status, worst

# The subject and category of results about the cluster as a whole; the views gather them in one section.
CLUSTER = "cluster"
GOLDEN_SOURCE = "golden config: every node of the run equal"
SAME_EVERYWHERE = "the same on every node"
MERGE_VERB = "report merge"


# Golden config


@dataclass(frozen=True)
class NotApplicable:
    """A field that does not apply to a node (no GPU, no HCA). Among nodes where it does apply it is compared
    as `text` (a GPU node beside a GPU-less one is a difference); on every node it is SKIP with `reason`."""

    text: str
    reason: str


# A field's value on one node: its text, NotApplicable, or None when the inventory could not tell.
Reading = str | NotApplicable | None

NO_GPU = "no NVIDIA GPU"


def _gpu_less(inv: dict[str, Any]) -> bool:
    # NVIDIA devices on the PCI bus with an empty GPU list mean NVML failed: unreadable, not a CPU node.
    return not inv.get("gpus") and not inv.get("nvidia_pci_devices")


def _per_gpu(key: str, absent: str = "none") -> Callable[[dict[str, Any]], Reading]:
    """The set of one GPU field's values on a node ("96.00.A5.00.1A"); None if any GPU could not say."""

    def read(inv: dict[str, Any]) -> Reading:
        if _gpu_less(inv):
            return NotApplicable(absent, NO_GPU)
        values = [g.get(key) for g in inv.get("gpus") or []]
        if not values or any(v is None for v in values):
            return None
        return ", ".join(sorted({str(v) for v in values}))

    return read


def _gpu_count(inv: dict[str, Any]) -> Reading:
    if _gpu_less(inv):
        return NotApplicable("0", NO_GPU)
    return str(len(inv["gpus"])) if inv.get("gpus") else None


def _gpu_fact(key: str) -> Callable[[dict[str, Any]], Reading]:
    def read(inv: dict[str, Any]) -> Reading:
        if _gpu_less(inv):
            return NotApplicable("none", NO_GPU)
        value = inv.get(key)
        return None if value is None else str(value)

    return read


def _software(key: str, gpu_only: bool = False) -> Callable[[dict[str, Any]], Reading]:
    def read(inv: dict[str, Any]) -> Reading:
        value = (inv.get("software") or {}).get(key)
        if value is None and gpu_only and _gpu_less(inv):
            return NotApplicable("none", NO_GPU)  # a CPU wheel of torch has no NCCL, and needs none
        return None if value is None else str(value)

    return read


def _hca_firmware(inv: dict[str, Any]) -> Reading:
    if "infiniband" not in inv:
        return None
    devices = inv["infiniband"] or []
    if not devices:
        return NotApplicable("none", "no InfiniBand or RoCE HCA")
    versions = [d.get("fw_ver") for d in devices]
    return None if any(v is None for v in versions) else ", ".join(sorted({str(v) for v in versions}))


@dataclass(frozen=True)
class ConfigField:
    key: str  # the result is cluster.config.<key>
    label: str  # in messages: "expected <label> <golden> ..."
    read: Callable[[dict[str, Any]], Reading]


GOLDEN_FIELDS = (
    ConfigField("gpu_model", "GPU model", _per_gpu("name", absent=NO_GPU)),
    ConfigField("gpu_count", "GPU count", _gpu_count),
    ConfigField("driver", "driver version", _gpu_fact("driver_version")),
    ConfigField("cuda_driver", "CUDA driver version", _gpu_fact("cuda_driver_version")),
    ConfigField("nccl", "NCCL version", _software("nccl", gpu_only=True)),
    ConfigField("vbios", "VBIOS version", _per_gpu("vbios")),
    ConfigField("ib_firmware", "InfiniBand/RoCE HCA firmware", _hca_firmware),
    ConfigField("kernel", "kernel release", _software("kernel")),
    ConfigField("gpucert", "gpucert version", _software("gpucert")),
    ConfigField("torch", "torch version", _software("torch")),
)


def _names(labels: Sequence[str], most: int = 3) -> str:
    """Node labels for a message, cut short on big clusters."""
    shown = ", ".join(labels[:most])
    return shown + (f" and {len(labels) - most} more" if len(labels) > most else "")


def _text(reading: str | NotApplicable) -> str:
    return reading.text if isinstance(reading, NotApplicable) else reading


def _cluster_result(name: str, status: Status, message: str, **fields: Any) -> Result:
    fields.setdefault("subject", CLUSTER)
    return Result(name=name, status=status, message=message, category=CLUSTER, **fields)


def _judge_field(f: ConfigField, nodes: dict[str, dict[str, Any]]) -> list[Result]:
    name = f"cluster.config.{f.key}"
    readings = {label: f.read(inv) for label, inv in nodes.items()}
    readable = {label: r for label, r in readings.items() if r is not None}
    unreadable = [label for label, r in readings.items() if r is None]
    if not readable:
        return [
            _cluster_result(
                name,
                Status.SKIP,
                f"{f.label} is in no node's inventory ({len(nodes)} nodes): nothing to compare",
                expected=SAME_EVERYWHERE,
                threshold_source=GOLDEN_SOURCE,
            )
        ]
    absent = [r for r in readable.values() if isinstance(r, NotApplicable)]
    if not unreadable and len(absent) == len(readable):
        return [
            _cluster_result(
                name,
                Status.SKIP,
                f"{f.label} does not apply: {absent[0].reason} on any of the {len(nodes)} nodes",
                expected=SAME_EVERYWHERE,
                threshold_source=GOLDEN_SOURCE,
            )
        ]
    texts = {label: _text(r) for label, r in readable.items()}
    counts = Counter(texts.values())
    most = max(counts.values())
    if list(counts.values()).count(most) > 1:
        return _no_majority(f, name, texts, unreadable, most)
    golden = max(counts, key=lambda value: counts[value])
    agreeing = [label for label, text in texts.items() if text == golden]
    results = []
    for label, reading in readings.items():
        if reading is None:
            results.append(
                _cluster_result(
                    name,
                    Status.ERROR,
                    f"expected {f.label} {golden} (as on {_names(agreeing)}), found it unreadable on {label}",
                    subject=label,
                    node=label,
                    expected=golden,
                    threshold_source=GOLDEN_SOURCE,
                    remediation=f"run `gpucert discover` on {label} and see why its {f.label} is missing "
                    "(an NVML error, a software probe that failed); it cannot be compared until it is read",
                )
            )
        elif texts[label] != golden:
            results.append(
                _cluster_result(
                    name,
                    Status.FAIL,
                    f"expected {f.label} {golden} (as on {_names(agreeing)}), found {texts[label]} on {label}",
                    value=texts[label],
                    subject=label,
                    node=label,
                    expected=golden,
                    threshold_source=GOLDEN_SOURCE,
                    remediation=f"bring {label} to the cluster's {f.label} ({golden}), or drain it from the "
                    "pool until it matches",
                    details={"golden": golden, "nodes_with_golden": len(agreeing)},
                )
            )
    if results:
        return results
    return [
        _cluster_result(
            name,
            Status.PASS,
            f"{f.label} {golden} on " + ("both nodes" if len(nodes) == 2 else f"all {len(nodes)} nodes"),
            value=golden,
            expected=SAME_EVERYWHERE,
            threshold_source=GOLDEN_SOURCE,
        )
    ]


def _no_majority(f: ConfigField, name: str, texts: dict[str, str], unreadable: list[str], most: int) -> list[Result]:
    """Nodes that differ with no value held by more of them than any other (two nodes, 550 and 535): nothing says
    which is right, so none is named the culprit. One FAIL for the run lists every value with its nodes."""
    groups: dict[str, list[str]] = {}
    for label, text in texts.items():
        groups.setdefault(text, []).append(label)
    listed = "; ".join(f"{text} on {_names(labels)}" for text, labels in groups.items())
    tied = [text for text, labels in groups.items() if len(labels) == most]
    results = [
        _cluster_result(
            name,
            Status.FAIL,
            f"expected one {f.label} on every node, found {len(groups)}: {listed}; no value is on more nodes than "
            "every other, so none is taken as the cluster's",
            value=f"{len(groups)} values",
            expected=SAME_EVERYWHERE,
            threshold_source=GOLDEN_SOURCE,
            remediation=f"bring every node to the {f.label} your site's image pins (one of {', '.join(tied)}), or "
            "run with more nodes so the odd ones out are named",
            details={"values": groups},
        )
    ]
    for label in unreadable:
        results.append(
            _cluster_result(
                name,
                Status.ERROR,
                f"expected {f.label} on {label} to compare with the other nodes' ({listed}), found it unreadable",
                subject=label,
                node=label,
                expected=SAME_EVERYWHERE,
                threshold_source=GOLDEN_SOURCE,
                remediation=f"run `gpucert discover` on {label} and see why its {f.label} is missing",
            )
        )
    return results


def golden_config_diff(nodes: dict[str, dict[str, Any]]) -> list[Result]:
    """Every golden field agreed (one PASS each) or each node that differs named (FAIL; ERROR if unreadable).

    `nodes` maps node label -> inventory dict (NodeInventory.to_dict()), in node order; one node gives [].
    """
    if len(nodes) < 2:
        return []
    return [result for f in GOLDEN_FIELDS for result in _judge_field(f, nodes)]


# Outliers across nodes

# Figures that were measured: INFO too (its node could not judge it, e.g. one GPU with no floor), since the
# cluster rule holds it to the other nodes' GPUs.
_JUDGED = (Status.INFO, Status.PASS, Status.WARN, Status.FAIL)


def _number(value: Value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _fmt(value: float, unit: str | None = None) -> str:
    return f"{short(value)} {unit}" if unit else short(value)


def per_gpu_figures(results: Sequence[Result]) -> dict[str, list[Result]]:
    """Judged per-GPU benchmark numbers where higher is better, by name, for names measured on >= 2 nodes."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        if (
            r.category == "benchmark"
            and r.gpu_index is not None
            and r.node is not None
            and r.status in _JUDGED
            and _number(r.value) is not None
            and direction_of(r) == HIGHER
        ):
            groups.setdefault(r.name, []).append(r)
    return {name: group for name, group in groups.items() if len({r.node for r in group}) >= 2}


def _judge_outliers(name: str, group: list[Result], pct: float, profile: Profile) -> list[Result]:
    values = [_number(r.value) or 0.0 for r in group]
    median = statistics.median(values)
    floor = median * (1 - pct / 100)
    unit = group[0].unit
    rule = f"within {pct:g} % of the cluster median {_fmt(median, unit)}"
    source = f"profile {profile.name}: benchmarks.cluster_deviation_pct"
    outlier = f"cluster.outlier.{name}"
    expected = f">= {_fmt(floor, unit)}"
    node_values: dict[str, list[float]] = {}
    for r, v in zip(group, values, strict=True):
        node_values.setdefault(r.node or "", []).append(v)
    results = []
    for label, mine in node_values.items():
        node_median = statistics.median(mine)
        if node_median < floor:
            below = sum(v < floor for v in mine)
            results.append(
                _cluster_result(
                    outlier,
                    Status.FAIL,
                    f"expected a node median >= {_fmt(floor, unit)} ({rule}), found {_fmt(node_median, unit)} "
                    f"on {label} ({below} of {len(mine)} GPUs below)",
                    value=node_median,
                    unit=unit,
                    subject=label,
                    node=label,
                    expected=expected,
                    threshold_source=source,
                    remediation=f"{label} is slow as a whole: compare its clocks, power caps and cooling with "
                    "its peers (telemetry) and the cluster.config results, and drain it until it matches",
                    details={"cluster_median": median, "floor": floor},
                )
            )
    for r, v in zip(group, values, strict=True):
        if v < floor:
            results.append(
                _cluster_result(
                    outlier,
                    Status.FAIL,
                    f"expected >= {_fmt(floor, unit)} ({rule}), found {_fmt(v, unit)} on {r.node} GPU {r.gpu_index}",
                    value=v,
                    unit=unit,
                    subject=f"{r.node} GPU {r.gpu_index}",
                    node=r.node,
                    gpu_index=r.gpu_index,
                    expected=expected,
                    threshold_source=source,
                    remediation=f"rerun on {r.node}; if GPU {r.gpu_index} stays slow, check its clocks, power "
                    "cap and temperature (telemetry) and drain the node to have the GPU replaced",
                    details={
                        "cluster_median": median,
                        "floor": floor,
                        **({"uuid": r.details["uuid"]} if "uuid" in r.details else {}),
                    },
                )
            )
    if results:
        return results
    return [
        _cluster_result(
            outlier,
            Status.PASS,
            f"{len(group)} GPUs on {len(node_values)} nodes {rule} (spread {_fmt(min(values))}.."
            f"{_fmt(max(values), unit)})",
            value=median,
            unit=unit,
            expected=f"within {pct:g} % of the cluster median",
            threshold_source=source,
            details={"median": median, "min": min(values), "max": max(values), "floor": floor, "gpus": len(group)},
        )
    ]


def cross_node_outliers(results: Sequence[Result], profile: Profile) -> list[Result]:
    """Per-GPU figures against the cluster median: the slow GPUs and slow nodes FAIL by name; one PASS (or
    SKIP, where the profile turns the rule off) per figure otherwise, so a big clean cluster stays short."""
    groups = per_gpu_figures(results)
    pct = profile.benchmarks.cluster_deviation_pct
    if pct is None:
        return [
            _cluster_result(
                f"cluster.outlier.{name}",
                Status.SKIP,
                f"not judged: profile {profile.name} turns the cross-node outlier rule off "
                "(benchmarks.cluster_deviation_pct: null)",
                threshold_source=f"profile {profile.name}: benchmarks.cluster_deviation_pct",
            )
            for name in groups
        ]
    return [r for name, group in groups.items() for r in _judge_outliers(name, group, pct, profile)]


def cluster_results(nodes: dict[str, dict[str, Any]], results: Sequence[Result], profile: Profile) -> list[Result]:
    """What rank 0 appends to a cluster run's results: the golden-config diff, then outliers across nodes."""
    return golden_config_diff(nodes) + cross_node_outliers(results, profile)


# The summary line


NO_FABRIC = "no active InfiniBand or RoCE port"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _tally(texts: Sequence[str], each: str) -> str:
    """'X each' when every node says X, else 'X on 3 nodes, Y on 1 node'."""
    counts = Counter(texts)
    if len(counts) == 1:
        return f"{texts[0]} {each}".rstrip()
    return ", ".join(f"{text} on {n} node{'s' if n > 1 else ''}" for text, n in counts.most_common())


def _fabric(inv: dict[str, Any]) -> str:
    ports = Counter(
        ("InfiniBand" if port.get("link_layer") == "InfiniBand" else "RoCE", port.get("rate_gbps"))
        for device in inv.get("infiniband") or []
        for port in device.get("ports") or []
        if port.get("state") == "ACTIVE"
    )
    if not ports:
        return NO_FABRIC
    return " + ".join(
        _plural(n, f"{kind} port") + (f" at {rate:g} Gb/s" if rate else "")
        for (kind, rate), n in sorted(ports.items(), key=lambda kv: (kv[0][0], -(kv[0][1] or 0)))
    )


def cluster_summary(nodes: dict[str, dict[str, Any]]) -> str:
    """One line for the whole run: '2 nodes x 8 GPUs = 16 NVIDIA H200 (140 GiB each); NVLink NV18 all-to-all
    within nodes; 8 InfiniBand ports at 400 Gb/s per node'. Missing inventory sections are left out."""
    invs = list(nodes.values())
    if not invs:
        return "no node inventory"
    n = len(invs)
    counts = Counter(len(inv.get("gpus") or []) for inv in invs)
    if len(counts) == 1:
        head = f"{n} node{'s' if n > 1 else ''} x {_plural(next(iter(counts)), 'GPU')}"
    else:
        head = f"{n} nodes (" + ", ".join(f"{k} x {_plural(c, 'GPU')}" for c, k in counts.most_common()) + ")"
    gpus = [g for inv in invs for g in inv.get("gpus") or []]
    parts = [head]
    if gpus:
        models = Counter(str(g.get("name") or "unknown GPU") for g in gpus)
        memory = sorted({round(g["memory_total_gib"]) for g in gpus if g.get("memory_total_gib")})
        parts[0] += " = " + " + ".join(f"{k} {name}" for name, k in models.items())
        if len(memory) == 1:
            parts[0] += f" ({memory[0]} GiB each)"
        elif memory:
            parts[0] += f" ({memory[0]}-{memory[-1]} GiB)"
        topologies = [
            str((inv.get("topology") or {}).get("summary") or "unknown topology")
            for inv in invs
            if len(inv.get("gpus") or []) > 1
        ]
        if topologies:
            links = [f"NVLink {t}" if t.startswith("NV") else t for t in topologies]
            parts.append(_tally(links, "within nodes"))
    else:
        cpus = [f"{(inv.get('cpu') or {}).get('logical_cpus') or '?'} CPUs" for inv in invs]
        parts.append(_tally(cpus, "each"))
    if any("infiniband" in inv for inv in invs):
        fabrics = [_fabric(inv) for inv in invs]
        parts.append(NO_FABRIC if set(fabrics) == {NO_FABRIC} else _tally(fabrics, "per node"))
    return "; ".join(parts)


# How views divide a report


def is_cluster(report: Report) -> bool:
    """A run of more than one node: its views get a cluster section and one section per node."""
    return len(report.meta.nodes) > 1 or bool(report.nodes)


@dataclass(frozen=True)
class NodeSection:
    label: str
    inventory: dict[str, Any]  # {} when the report holds none for this node
    results: list[Result]  # the node's own results (its cluster.* results are in the cluster section)
    status: Status  # worst of every result that names the node, cluster.* included


def split_by_node(report: Report) -> tuple[list[Result], list[NodeSection]]:
    """The cluster section's results (job-wide ones and every cluster.* judgement), and the nodes' sections
    in node order (meta.nodes, then any other node a result or inventory names)."""
    # One pass over the results: filtering them once per node was quadratic (26 s at 1,024 nodes x 8 GPUs).
    by_node: dict[str, list[Result]] = {}
    for r in report.results:
        if r.node is not None:
            by_node.setdefault(r.node, []).append(r)
    labels = list(dict.fromkeys([*report.meta.nodes, *report.nodes, *by_node]))
    cluster = [r for r in report.results if r.node is None or r.category == CLUSTER]
    # A report without per-node inventories carries its writer's own: node 0's, unless the writer was no node of
    # the job (`cluster localize` over ssh: its host's summary once stood beside gpu01, a host never reached).
    own = report.inventory.get("hostname") if isinstance(report.inventory, dict) else None
    sections = []
    for i, label in enumerate(labels):
        mine = not report.nodes and i == 0 and (own is None or label == own or label.startswith(f"{own}["))
        inventory = report.nodes.get(label) or (report.inventory if mine else {})
        named = by_node.get(label, [])
        sections.append(
            NodeSection(
                label=label,
                inventory=inventory,
                results=[r for r in named if r.category != CLUSTER],
                status=worst(r.status for r in named),
            )
        )
    return cluster, sections


# What the views show of a big cluster

# Up to this many nodes a view shows every node in full (its plots, inventory, every message); beyond it the
# views lead with a per-node x GPU heatmap of the key figures and keep each node's detail compact, so a
# 1,024 x 8 report stays a page a browser opens (docs/results/cluster-scale.md).
DETAILED_NODES_MAX = 16

# The statuses a person must look at. A set, not `>= Status.WARN`: the views test it on every result, and at
# 200,000 results the ordered comparison was seconds of a render.
PROBLEM = frozenset({Status.WARN, Status.FAIL, Status.ERROR})


def node_tally(sections: Sequence[NodeSection]) -> dict[Status, int]:
    """How many nodes are at each status, worst first, statuses with no node left out."""
    counts = Counter(s.status for s in sections)
    return {status: counts[status] for status in sorted(counts, reverse=True)}


@dataclass(frozen=True)
class ProblemGroup:
    """Every WARN, FAIL or ERROR of one check at one status: at 1,024 nodes one cause can give thousands."""

    name: str
    status: Status
    results: list[Result]


def problem_groups(results: Sequence[Result]) -> list[ProblemGroup]:
    """WARN/FAIL/ERROR results by (check, status), worst status first, then the rarer check first: the one
    bad GPU reads before the warning every node has."""
    groups: dict[tuple[str, Status], list[Result]] = {}
    for r in results:
        if r.status in PROBLEM:
            groups.setdefault((r.name, r.status), []).append(r)
    ordered = sorted(groups.items(), key=lambda kv: (-kv[0][1].rank, len(kv[1])))
    return [ProblemGroup(name, status, group) for (name, status), group in ordered]


def worst_first(sections: Sequence[NodeSection], results: Sequence[Result]) -> list[NodeSection]:
    """The nodes with a problem, worst status first, then the node whose rarest problem is rarest: the one node
    with a narrow PCIe link before 900 that a noisy figure names, a widespread cause never buries a lone one."""
    names: dict[str, set[str]] = {}
    for r in results:
        if r.node is not None and r.status in PROBLEM:
            names.setdefault(r.node, set()).add(r.name)
    spread = Counter(name for mine in names.values() for name in mine)
    bad = [s for s in sections if s.status in PROBLEM]
    rarest = {s.label: min((spread[n] for n in names.get(s.label, ())), default=0) for s in bad}
    return sorted(bad, key=lambda s: (-s.status.rank, rarest[s.label]))


@dataclass(frozen=True)
class Figure:
    """One per-GPU figure across the cluster, for the heatmap."""

    name: str
    unit: str | None
    median: float
    floor_pct: float | None  # the cluster rule's deviation (benchmarks.cluster_deviation_pct), None if off
    cells: dict[tuple[str, int], Result]  # (node, GPU index) -> the node's result
    outliers: dict[tuple[str, int], Result]  # (node, GPU index) -> the cluster.outlier FAIL naming that GPU


def key_figures(results: Sequence[Result]) -> list[Figure]:
    """The per-GPU figures the cluster rule compares (higher is better, on two nodes or more) that a person
    looks at first: those held to a floor of their own, then any other that names an outlier GPU none of
    those shows (a slow GPU is slow at every matmul size: its bf16 max shows it, the twelve others need not)."""
    outliers: dict[str, dict[tuple[str, int], Result]] = {}
    rules: dict[str, float | None] = {}
    for r in results:
        if r.category == CLUSTER and r.name.startswith("cluster.outlier."):
            name = r.name.removeprefix("cluster.outlier.")
            if r.status is Status.FAIL and r.node is not None and r.gpu_index is not None:
                outliers.setdefault(name, {})[(r.node, r.gpu_index)] = r
            floor, median = r.details.get("floor"), r.details.get("cluster_median", r.details.get("median"))
            if isinstance(floor, (int, float)) and isinstance(median, (int, float)) and median:
                rules[name] = round(100 * (1 - floor / median), 6)
    groups = per_gpu_figures(results)
    floored = [n for n, group in groups.items() if any((r.expected or "").lstrip().startswith(">") for r in group)]
    shown = set(floored)
    covered = {key for name in floored for key in outliers.get(name, {})}
    for name in groups:
        if name not in shown and not set(outliers.get(name, {})) <= covered:
            shown.add(name)
            covered |= set(outliers[name])
    figures = []
    for name, group in groups.items():
        if name not in shown:
            continue
        values = [_number(r.value) or 0.0 for r in group]
        figures.append(
            Figure(
                name=name,
                unit=group[0].unit,
                median=statistics.median(values),
                floor_pct=rules.get(name),
                cells={(r.node or "", r.gpu_index or 0): r for r in group},
                outliers=outliers.get(name, {}),
            )
        )
    return figures


# Merging per-node reports


def _label_of(report: Report) -> str:
    return report.meta.nodes[0] if report.meta.nodes else report.meta.host


def _relabel(result: Result, report: Report, old: str, new: str) -> Result:
    """A per-node report's result as the cluster report names it: node set, subjects carrying the new label."""
    hosts = {old, report.meta.host, str(report.inventory.get("hostname") or ""), *report.meta.nodes} - {""}
    subject = result.subject
    if result.gpu_index is not None:
        subject = f"{new} GPU {result.gpu_index}"
    elif subject in hosts:
        subject = new
    elif subject.startswith(f"{old} "):
        subject = new + subject[len(old) :]
    if result.status is Status.PASS and not result.expected:
        # Before schema 2.1 a figure held to nothing could read PASS; the merged report (2.1) shows it unjudged.
        return dataclasses.replace(
            result,
            node=new,
            subject=subject,
            status=Status.INFO,
            message=f"shown, not judged (PASS with no threshold in {old}'s report): {result.message}",
        )
    if result.node == new and result.subject == subject:
        return result  # already so named (write_merged labels as it reads, merge_reports again)
    return dataclasses.replace(result, node=new, subject=subject)


def _time(text: str) -> datetime:
    # Python 3.10's fromisoformat does not read a trailing Z.
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)


def _refuse_unmergeable(reports: Sequence[Report], sources: Sequence[str]) -> None:
    if len(reports) != len(sources):
        raise ValueError(f"{len(reports)} reports but {len(sources)} sources")
    if len(reports) < 2:
        raise ValueError(f"a cluster report needs at least 2 per-node reports, got {len(reports)}: {list(sources)}")
    for report, source in zip(reports, sources, strict=True):
        if is_cluster(report):
            held = ", ".join(report.meta.nodes or list(report.nodes))
            raise ValueError(f"{source} already holds several nodes ({held}); merge per-node reports only")
    checks = (
        ("verbs", lambda m: m.verb),
        ("profiles", lambda m: m.profile),
        ("method versions", lambda m: m.method_version),
    )
    for what, value in checks:
        seen = {value(r.meta) for r in reports}
        if len(seen) > 1:
            found = "; ".join(f"{value(r.meta)} in {s}" for r, s in zip(reports, sources, strict=True))
            raise ValueError(f"cannot merge reports whose {what} differ ({found}): they were judged differently")
    _refuse_config_differences(reports, sources)
    _refuse_shared_gpus(reports, sources)


# Settings that say nothing about how a result was judged: where runs are kept, how long ranks wait for each other.
UNJUDGED_CONFIG = ("runs_dir", "runtime")


def _refuse_config_differences(reports: Sequence[Report], sources: Sequence[str]) -> None:
    """Reports judged under different settings (`--set health.expected_gpus=4` on one, 8 on another) do not make
    one cluster verdict: refused, naming the first keys that differ and their values."""
    first = dotted({k: v for k, v in reports[0].meta.config.items() if k not in UNJUDGED_CONFIG})
    for report, source in zip(reports[1:], sources[1:], strict=True):
        other = dotted({k: v for k, v in report.meta.config.items() if k not in UNJUDGED_CONFIG})
        keys = sorted(k for k in first.keys() | other.keys() if first.get(k) != other.get(k))
        if keys:
            shown = "; ".join(f"{k} {first.get(k)!r} in {sources[0]}, {other.get(k)!r} in {source}" for k in keys[:3])
            more = f" (and {len(keys) - 3} more)" if len(keys) > 3 else ""
            raise ValueError(
                f"cannot merge reports judged under different settings: {shown}{more}; run the nodes with the same "
                "config and --set flags"
            )


def _refuse_shared_gpus(reports: Sequence[Report], sources: Sequence[str]) -> None:
    """One node's two runs (the same node label and the same GPUs, by UUID) are not two nodes: refused, naming both.
    Nodes of different names are let through whatever their UUIDs: a synthetic cluster made from one captured
    node (docs/fleet.md) carries one node's UUIDs under many names."""
    owner: dict[tuple[str, str], str] = {}
    gpuless: dict[str, str] = {}
    for report, source in zip(reports, sources, strict=True):
        label = _label_of(report)
        if not any(isinstance(g, dict) and g.get("uuid") for g in report.inventory.get("gpus") or []):
            # No GPU to tell them apart (a CPU node, NVML down): one name is one node.
            if label in gpuless:
                raise ValueError(
                    f"{gpuless[label]} and {source} are both node {label}, with no GPU to tell them apart: two runs "
                    "of one node, not two nodes; merge one report per node"
                )
            gpuless[label] = source
        for gpu in report.inventory.get("gpus") or []:
            uuid = gpu.get("uuid") if isinstance(gpu, dict) else None
            if not uuid:
                continue
            if (label, uuid) in owner and owner[(label, uuid)] != source:
                raise ValueError(
                    f"{owner[(label, uuid)]} and {source} are both node {label} with GPU {uuid}: two runs of one "
                    "node, not two nodes; merge one report per node"
                )
            owner[(label, uuid)] = source


def _load_profile(name: str) -> tuple[Profile | None, str | None]:
    try:
        return load_profile(name), None
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        return None, str(exc)


def merge_reports(reports: Sequence[Report], sources: Sequence[str], command: Sequence[str] = ()) -> Report:
    """One cluster report from per-node reports (2.x, or 1.x whose results name no node), with the cluster
    judgements appended; `command` is the merging command line, kept in meta.

    Refuses (ValueError naming the sources) fewer than two reports, a report that holds several nodes, and
    reports judged by different profiles or method versions. The common profile is loaded by name (the one
    piece of I/O here); where it cannot be, one ERROR stands in for the outlier judgement.
    """
    _refuse_unmergeable(reports, sources)
    old = [_label_of(r) for r in reports]
    # Position plays node rank: the same `host[n<i>]` a live run gives two nodes that share a hostname.
    labels = list(node_labels(dict(enumerate(old))).values())
    first = reports[0].meta
    started = min((r.meta.started_at for r in reports), key=_time)
    finished = max((r.meta.finished_at for r in reports), key=_time)
    meta = RunMeta(
        tool_version=first.tool_version,
        method_version=first.method_version,
        verb=MERGE_VERB,
        command=list(command),
        host=labels[0],
        started_at=started,
        finished_at=finished,
        duration_s=round((_time(finished) - _time(started)).total_seconds(), 3),
        profile=first.profile,
        config=first.config,
        software=first.software,
        nodes=labels,
    )
    nodes = {label: r.inventory for label, r in zip(labels, reports, strict=True)}
    results = [_relabel(res, r, o, n) for r, o, n in zip(reports, old, labels, strict=True) for res in r.results]
    judged = golden_config_diff(nodes)
    profile, error = _load_profile(first.profile)
    if profile is not None:
        judged += cross_node_outliers(results, profile)
    elif per_gpu_figures(results):
        # Only when there are figures to judge: a health-only merge loses nothing without the profile.
        judged.append(
            _cluster_result(
                "cluster.outlier",
                Status.ERROR,
                f"expected profile {first.profile} to judge per-GPU figures across nodes, found it unloadable "
                f"here: {error}",
                remediation=f"merge where profile {first.profile} can be loaded (a profile path must exist on "
                "the merging machine)",
            )
        )
    return Report(meta=meta, inventory=reports[0].inventory, results=results + judged, nodes=nodes)


def _result_json(result: Result) -> str:
    # The fields as they are (Result.to_dict's dataclasses.asdict deep-copies every details list first).
    return json.dumps({**vars(result), "status": result.status.value})


def report_json_chunks(report: Report, result_lines: Iterable[str] | None = None) -> Iterator[str]:
    """The report's JSON (the keys and values of Report.to_dict) in pieces: one line per result and per node
    inventory, so a cluster report of hundreds of MB is never one string. json.dumps with an indent runs the
    pure-Python encoder: the whole 1,024-node report with indent=1 took 38 s, one line per result takes 2-3.
    `result_lines`, when given, are the results already encoded (write_merged's, with their full details)."""
    status = report.status
    head = {
        "schema_version": report.schema_version,
        "status": status.value,
        "exit_code": status.exit_code,
        "counts": report.counts(),
        "meta": dataclasses.asdict(report.meta),
        "inventory": report.inventory,
    }
    yield "{\n"
    for key, value in head.items():
        yield f" {json.dumps(key)}: {json.dumps(value, indent=1)},\n"
    yield ' "results": [\n'
    lines = (_result_json(r) for r in report.results) if result_lines is None else result_lines
    for i, line in enumerate(lines):
        yield ("" if i == 0 else ",\n") + line
    yield '\n ],\n "nodes": {\n'
    for i, (label, inventory) in enumerate(report.nodes.items()):
        yield ("" if i == 0 else ",\n") + f"{json.dumps(label)}: {json.dumps(inventory)}"
    yield "\n }\n}\n"


def _scalar_details(result: Result) -> Result:
    """The result with only the scalar entries of its details: what the views of a big cluster read (a GPU's
    UUID, a floor), without the sweeps and series (the matmul sweep alone is 40 KB a GPU)."""
    details = {k: v for k, v in result.details.items() if v is None or isinstance(v, (str, int, float, bool))}
    return result if len(details) == len(result.details) else dataclasses.replace(result, details=details)


def write_merged(paths: list[Path], output: Path, command: list[str]) -> Report:
    """`gpucert report merge DIR... -o OUT`: per-node reports (run directories or report.json files) into one
    cluster report in OUT (JSON, Markdown and HTML). Unreadable or unmergeable reports raise ValueError.

    Each node's report is read once and its results go to report.json as they come (through a spool file
    beside it), so a 1,024-node merge never holds every sweep and telemetry series: past DETAILED_NODES_MAX
    nodes the report kept for the views (and returned) has scalar details only; report.json has them all."""
    # store renders the views, which import this module: imported here so either can be imported first.
    from gpucert.report.store import _missing_dirs

    # Every input is there before anything is created: a typo leaves no half-made output directory behind.
    missing = [str(p) for p in paths if not (p / "report.json" if p.is_dir() else p).is_file()]
    if missing:
        raise ValueError(
            "; ".join(f"{m}: not a readable gpucert report (no such run directory or report.json)" for m in missing)
        )
    _refuse_paths(paths, output)
    created = _missing_dirs(output)  # deepest first
    output.mkdir(parents=True, exist_ok=True)
    try:
        return _write_merged(paths, output, command)
    except BaseException:
        # Refused or failed part way (an unreadable report, profiles that differ): leave no directory made for it.
        if created:
            shutil.rmtree(created[-1], ignore_errors=True)
        raise


def _refuse_paths(paths: list[Path], output: Path) -> None:
    """Before anything is created: an input named twice (one node counted as two), and an --output that is an
    input's run directory or holds another verb's report (the cluster report would replace a node's own)."""
    from gpucert.report.store import check_reuse, check_writable

    files = [(p / "report.json" if p.is_dir() else p).resolve() for p in paths]
    seen: dict[Path, Path] = {}
    for path, file in zip(paths, files, strict=True):
        if file in seen:
            raise ValueError(f"{path} is given twice (also as {seen[file]}): merge one report per node")
        seen[file] = path
    target = output.resolve()
    inside = [path for path, file in zip(paths, files, strict=True) if file.parent == target]
    if inside:
        raise ValueError(
            f"--output {output} is where {inside[0]}'s report is: the cluster report would replace it; "
            "choose a new directory for the cluster report"
        )
    check_reuse(output, MERGE_VERB)  # a ConfigError, which is a ValueError as merge's other refusals are
    check_writable(output, "--output")  # a file there, a read-only mount: said as --output's, before any work


def _write_merged(paths: list[Path], output: Path, command: list[str]) -> Report:
    from gpucert.report.markdown import render_markdown
    from gpucert.report.store import load_report, write_atomic, write_html

    slim = len(paths) > DETAILED_NODES_MAX
    kept: list[Report] = []
    spans: list[tuple[int, int]] = []  # each report's lines in the spool
    with tempfile.TemporaryFile("w+b", dir=output, prefix=".merge-") as spool:
        for path in paths:
            report = load_report(path)
            old = _label_of(report)
            # Labelled by the node's own name now; merge_reports relabels when two nodes share a name.
            results = [_relabel(r, report, old, old) for r in report.results]
            start = spool.tell()
            for r in results:
                spool.write(_result_json(r).encode() + b"\n")
            spans.append((start, spool.tell()))
            kept.append(dataclasses.replace(report, results=[_scalar_details(r) for r in results] if slim else results))
            del report, results
        merged = merge_reports(kept, [str(path) for path in paths], command)
        per_node = sum(len(r.results) for r in kept)
        lines = _spooled_lines(merged, kept, spool, spans, merged.results[per_node:])
        write_atomic(output / "report.json", report_json_chunks(merged, lines))
    write_atomic(output / "report.md", render_markdown(merged))
    if importlib.util.find_spec("matplotlib") is not None:
        write_html(merged, output)
    return merged


def _spooled_lines(
    merged: Report, kept: list[Report], spool: Any, spans: list[tuple[int, int]], judged: list[Result]
) -> Iterator[str]:
    """The merged report's results as JSON lines: the nodes' from the spool (their full details), a node whose
    label merge_reports changed (a shared hostname) relabelled on the way, then the cluster judgements."""
    for report, (start, end), label in zip(kept, spans, merged.meta.nodes, strict=True):
        old = _label_of(report)
        spool.seek(start)
        for raw in spool.read(end - start).decode().splitlines():
            if label == old:
                yield raw
            else:
                yield _result_json(_relabel(Result.from_dict(json.loads(raw)), report, old, label))
    for r in judged:
        yield _result_json(r)
