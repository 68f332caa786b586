"""The cluster report: golden-config diff on the captured 4xH200 inventory (one copy altered per test),
outliers across nodes on synthetic per-GPU figures, `report merge` of per-node reports written to disk, and
the views and comparison of reports that name their nodes.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from rich.console import Console
from tests.conftest import NODE_BUNDLES

import gpucert.report
from gpucert.config.profiles import load_profile
from gpucert.hardware.inventory import bundle_sources, collect_inventory
from gpucert.report.cluster import (
    cluster_results,
    cluster_summary,
    cross_node_outliers,
    golden_config_diff,
    merge_reports,
    split_by_node,
    write_merged,
)
from gpucert.report.compare import compare_reports
from gpucert.report.html import render_html
from gpucert.report.markdown import render_markdown
from gpucert.report.schema import Report, Result, RunMeta
from gpucert.report.store import load_report, write_report
from gpucert.report.terminal import print_report
from gpucert.status import Status

SCHEMA = json.loads((Path(gpucert.report.__file__).parent / "report.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
H200 = load_profile("h200")
CPU = load_profile("cpu")


@functools.cache
def _captured_h200x4() -> dict[str, Any]:
    return collect_inventory(bundle_sources(NODE_BUNDLES / "h200x4"), probe_torch=False).to_dict()


def inventory(hostname: str = "vm") -> dict[str, Any]:
    """A fresh copy of the captured 4xH200 node's inventory, free to alter."""
    inv = copy.deepcopy(_captured_h200x4())
    inv["hostname"] = hostname
    return inv


def three_nodes() -> dict[str, dict[str, Any]]:
    return {label: inventory(label) for label in ("node-a", "node-b", "node-c")}


def by_status(results: list[Result], status: Status) -> list[Result]:
    return [r for r in results if r.status is status]


# golden config


def test_identical_nodes_pass_every_field_and_skip_the_absent_fabric() -> None:
    results = golden_config_diff(three_nodes())
    assert [(r.name, r.status) for r in results] == [
        ("cluster.config.gpu_model", Status.PASS),
        ("cluster.config.gpu_count", Status.PASS),
        ("cluster.config.driver", Status.PASS),
        ("cluster.config.cuda_driver", Status.PASS),
        ("cluster.config.nccl", Status.PASS),
        ("cluster.config.vbios", Status.PASS),
        ("cluster.config.ib_firmware", Status.SKIP),
        ("cluster.config.kernel", Status.PASS),
        ("cluster.config.gpucert", Status.PASS),
        ("cluster.config.torch", Status.PASS),
    ]
    driver = results[2]
    assert (driver.subject, driver.node, driver.value) == ("cluster", None, "580.159.04")
    assert driver.message == "driver version 580.159.04 on all 3 nodes"
    assert driver.expected == "the same on every node"
    assert driver.threshold_source == "golden config: every node of the run equal"
    assert "no InfiniBand or RoCE HCA on any of the 3 nodes" in results[6].message


def test_one_node_has_nothing_to_compare() -> None:
    assert golden_config_diff({"node-a": inventory()}) == []


def _alter(field: str, nodes: dict[str, dict[str, Any]], label: str) -> None:
    inv = nodes[label]
    if field == "driver":
        inv["driver_version"] = "570.86.15"
    elif field == "vbios":
        for gpu in inv["gpus"]:
            gpu["vbios"] = "96.00.99.00.01"
    elif field == "nccl":
        inv["software"]["nccl"] = "2.21.5"
    elif field == "gpu_count":
        inv["gpus"] = inv["gpus"][:3]


@pytest.mark.parametrize(
    ("field", "label", "golden", "found"),
    [
        ("driver", "driver version", "580.159.04", "570.86.15"),
        ("vbios", "VBIOS version", "96.00.A5.00.1A", "96.00.99.00.01"),
        ("nccl", "NCCL version", "2.28.9", "2.21.5"),
        ("gpu_count", "GPU count", "4", "3"),
    ],
)
def test_a_node_that_differs_fails_by_field_and_name(field: str, label: str, golden: str, found: str) -> None:
    nodes = three_nodes()
    _alter(field, nodes, "node-b")
    results = golden_config_diff(nodes)
    (fail,) = by_status(results, Status.FAIL)
    assert (fail.name, fail.subject, fail.node, fail.value) == (f"cluster.config.{field}", "node-b", "node-b", found)
    assert fail.message == f"expected {label} {golden} (as on node-a, node-c), found {found} on node-b"
    assert fail.remediation is not None and "node-b" in fail.remediation and "drain" in fail.remediation
    # The other fields still pass: only what differs is named.
    assert len(by_status(results, Status.PASS)) == 8


def test_the_majority_is_golden_and_with_no_majority_no_node_is_named() -> None:
    nodes = three_nodes()
    _alter("driver", nodes, "node-a")
    (fail,) = by_status(golden_config_diff(nodes), Status.FAIL)
    assert fail.node == "node-a" and "(as on node-b, node-c)" in fail.message
    # Two nodes that differ: nothing says which is right. Either order gives one FAIL for the run naming both
    # (it used to blame whichever node was listed second).
    for order in (("node-a", "node-b"), ("node-b", "node-a")):
        two = {label: inventory() for label in order}
        _alter("driver", two, "node-b")
        two["node-c"] = inventory()
        del two["node-c"]["driver_version"]
        results = golden_config_diff(two)
        (fail,) = by_status(results, Status.FAIL)
        assert (fail.subject, fail.node) == ("cluster", None)
        assert "expected one driver version on every node, found 2: " in fail.message
        assert "580.159.04 on node-a" in fail.message and "570.86.15 on node-b" in fail.message
        (error,) = by_status(results, Status.ERROR)
        assert error.node == "node-c" and "found it unreadable" in error.message


def test_an_unreadable_value_is_error_on_that_node_and_skip_when_nowhere() -> None:
    nodes = three_nodes()
    nodes["node-c"]["software"]["kernel"] = None
    (error,) = by_status(golden_config_diff(nodes), Status.ERROR)
    assert (error.name, error.node) == ("cluster.config.kernel", "node-c")
    assert "kernel release" in error.message and "unreadable on node-c" in error.message
    for inv in nodes.values():
        inv["software"]["kernel"] = None
    kernel = [r for r in golden_config_diff(nodes) if r.name == "cluster.config.kernel"]
    assert [r.status for r in kernel] == [Status.SKIP]
    assert "in no node's inventory" in kernel[0].message


def test_hca_firmware_is_compared_where_a_node_has_hcas() -> None:
    nodes = three_nodes()
    hca = {"name": "mlx5_0", "fw_ver": "28.39.1002", "ports": [], "netdevs": []}
    for inv in nodes.values():
        inv["infiniband"] = [dict(hca)]
    assert [r.status for r in golden_config_diff(nodes) if r.name.endswith("ib_firmware")] == [Status.PASS]
    nodes["node-b"]["infiniband"][0]["fw_ver"] = "28.41.1000"
    nodes["node-c"]["infiniband"] = []
    nodes["node-d"] = copy.deepcopy(nodes["node-a"])
    fails = [r for r in golden_config_diff(nodes) if r.name.endswith("ib_firmware")]
    assert [(r.status, r.node, r.value) for r in fails] == [
        (Status.FAIL, "node-b", "28.41.1000"),
        (Status.FAIL, "node-c", "none"),
    ]
    del nodes["node-d"]  # three nodes, three firmwares: none is the cluster's
    (fail,) = [r for r in golden_config_diff(nodes) if r.name.endswith("ib_firmware")]
    assert (fail.status, fail.node) == (Status.FAIL, None)
    assert "found 3: 28.39.1002 on node-a; 28.41.1000 on node-b; none on node-c" in fail.message


def test_a_gpu_node_beside_a_cpu_node_fails_and_cpu_nodes_skip_gpu_fields() -> None:
    cpu = inventory("cpu-1")
    cpu.update(gpus=[], driver_version=None, cuda_driver_version=None, nvidia_pci_devices=0)
    cpu["software"]["nccl"] = None
    mixed = golden_config_diff({"gpu-1": inventory("gpu-1"), "cpu-1": cpu})
    model = next(r for r in mixed if r.name == "cluster.config.gpu_model")
    assert model.status is Status.FAIL and "NVIDIA H200 on gpu-1; no NVIDIA GPU on cpu-1" in model.message
    only_cpu = golden_config_diff({"cpu-1": cpu, "cpu-2": copy.deepcopy(cpu)})
    skipped = {r.name.removeprefix("cluster.config.") for r in only_cpu if r.status is Status.SKIP}
    assert skipped == {"gpu_model", "gpu_count", "driver", "cuda_driver", "nccl", "vbios", "ib_firmware"}


def test_gpus_nvml_cannot_see_are_unreadable_not_a_cpu_node() -> None:
    nodes = three_nodes()
    nodes["node-b"].update(gpus=[], driver_version=None, nvidia_pci_devices=4)
    errors = {r.name.removeprefix("cluster.config.") for r in by_status(golden_config_diff(nodes), Status.ERROR)}
    assert errors == {"gpu_model", "gpu_count", "driver", "vbios"}


def test_cluster_summary() -> None:
    nodes = {"a": inventory(), "b": inventory()}
    assert cluster_summary(nodes) == (
        "2 nodes x 4 GPUs = 8 NVIDIA H200 (140 GiB each); NVLink NV18 all-to-all within nodes; "
        "no active InfiniBand or RoCE port"
    )
    port = {"port": 1, "state": "ACTIVE", "rate_gbps": 400.0, "link_layer": "InfiniBand"}
    for inv in nodes.values():
        inv["infiniband"] = [{"name": f"mlx5_{i}", "fw_ver": "1", "ports": [port]} for i in range(8)]
    nodes["b"]["gpus"] = nodes["b"]["gpus"][:3]
    assert cluster_summary(nodes) == (
        "2 nodes (1 x 4 GPUs, 1 x 3 GPUs) = 7 NVIDIA H200 (140 GiB each); NVLink NV18 all-to-all within nodes; "
        "8 InfiniBand ports at 400 Gb/s per node"
    )
    cpu = {"hostname": "c", "gpus": [], "cpu": {"logical_cpus": 2}}
    assert cluster_summary({"c1": cpu, "c2": cpu}) == "2 nodes x 0 GPUs; 2 CPUs each"


# outliers across nodes


def figure(node: str, gpu: int, value: float, name: str = "matmul.bf16.max", **fields: Any) -> Result:
    fields.setdefault("unit", "TFLOP/s")
    fields.setdefault("status", Status.PASS)
    return Result(
        name=name,
        subject=f"{node} GPU {gpu}",
        message=f"{value}",
        value=value,
        expected=">= 700",
        category="benchmark",
        gpu_index=gpu,
        node=node,
        details={"uuid": f"GPU-{node}-{gpu}"},
        **fields,
    )


def cluster_of(values: dict[str, list[float]], name: str = "matmul.bf16.max") -> list[Result]:
    return [figure(node, i, v, name) for node, vs in values.items() for i, v in enumerate(vs)]


def test_a_gpu_20_percent_below_the_median_fails_by_name() -> None:
    results = cluster_of({"node-a": [800, 800, 800, 800], "node-b": [800, 800, 640, 800]})
    (fail,) = cross_node_outliers(results, H200)
    assert (fail.status, fail.name, fail.subject, fail.node, fail.gpu_index) == (
        Status.FAIL,
        "cluster.outlier.matmul.bf16.max",
        "node-b GPU 2",
        "node-b",
        2,
    )
    assert fail.message == (
        "expected >= 720 TFLOP/s (within 10 % of the cluster median 800 TFLOP/s), found 640 TFLOP/s on node-b GPU 2"
    )
    assert fail.details["uuid"] == "GPU-node-b-2"
    assert fail.threshold_source == "profile h200: benchmarks.cluster_deviation_pct"


def test_a_slow_node_fails_by_name_with_its_gpus() -> None:
    results = cluster_of({"node-a": [800] * 4, "node-b": [700] * 4, "node-c": [805] * 4})
    outliers = cross_node_outliers(results, H200)
    assert [(r.subject, r.gpu_index) for r in outliers] == [
        ("node-b", None),
        *((f"node-b GPU {i}", i) for i in range(4)),
    ]
    assert outliers[0].message == (
        "expected a node median >= 720 TFLOP/s (within 10 % of the cluster median 800 TFLOP/s), "
        "found 700 TFLOP/s on node-b (4 of 4 GPUs below)"
    )


def test_a_clean_cluster_gives_one_pass_per_metric() -> None:
    results = [
        *cluster_of({f"node-{i}": [790 + i, 800, 810, 805] for i in range(16)}),
        *cluster_of({f"node-{i}": [4.2, 4.19, 4.21, 4.2] for i in range(16)}, "memory.copy"),
    ]
    outliers = cross_node_outliers(results, H200)
    assert [(r.name, r.status) for r in outliers] == [
        ("cluster.outlier.matmul.bf16.max", Status.PASS),
        ("cluster.outlier.memory.copy", Status.PASS),
    ]
    assert outliers[0].subject == "cluster" and outliers[0].node is None
    assert outliers[0].message == (
        "64 GPUs on 16 nodes within 10 % of the cluster median 805 TFLOP/s (spread 790..810 TFLOP/s)"
    )
    assert outliers[0].expected == "within 10 % of the cluster median"


def test_the_cpu_profile_skips_each_metric() -> None:
    results = cluster_of({"node-a": [1.0, 1.0], "node-b": [0.1, 1.0]})
    (skip,) = cross_node_outliers(results, CPU)
    assert (skip.status, skip.name) == (Status.SKIP, "cluster.outlier.matmul.bf16.max")
    assert "profile cpu turns the cross-node outlier rule off" in skip.message


def test_only_judged_higher_is_better_per_gpu_figures_across_nodes_count() -> None:
    lone = cluster_of({"node-a": [800, 100]})  # one node: the node's own deviation rule judges this
    errored = [figure("node-a", 0, 1.0, status=Status.ERROR), figure("node-b", 0, 800, status=Status.ERROR)]
    lower = [
        dataclasses.replace(figure(n, 0, v, "telemetry.peak", unit="C", status=Status.INFO), expected=None)
        for n, v in (("node-a", 40), ("node-b", 90))
    ]
    health = [dataclasses.replace(r, category="health") for r in cluster_of({"a": [1], "b": [9]}, "gpu.x")]
    job = [dataclasses.replace(r, node=None) for r in cluster_of({"a": [1], "b": [9]}, "collective.x")]
    assert cross_node_outliers([*lone, *errored, *lower, *health, *job], H200) == []


def test_cluster_results_are_the_golden_diff_then_the_outliers() -> None:
    nodes = {"node-a": inventory(), "node-b": inventory()}
    results = cluster_results(nodes, cluster_of({"node-a": [800], "node-b": [800]}), H200)
    assert [r.name for r in results][-1] == "cluster.outlier.matmul.bf16.max"
    assert len(results) == 11 and all(r.category == "cluster" for r in results)


# merge


def meta(host: str, **changes: Any) -> RunMeta:
    fields: dict[str, Any] = {
        "tool_version": "0.1.0",
        "method_version": "3",
        "verb": "accept",
        "command": ["gpucert", "accept"],
        "host": host,
        "started_at": "2026-11-22T09:00:00+00:00",
        "finished_at": "2026-11-22T09:20:00+00:00",
        "duration_s": 1200.0,
        "profile": "h200",
        "config": {"profile": "auto"},
        "software": {"torch": "2.11.0"},
        "nodes": [host],
    }
    return RunMeta(**{**fields, **changes})


def node_report(host: str, matmul: list[float], schema_1x: bool = False, **meta_changes: Any) -> Report:
    """A per-node accept report: schema 2.0 names its node in every result; 1.x names none."""
    node = None if schema_1x else host
    results = [
        Result(
            name="gpu.count",
            subject=host,
            status=Status.PASS,
            message="expected 4 GPUs, found 4",
            value=4,
            expected="4",
            node=node,
        ),
        *(
            dataclasses.replace(
                figure(host, i, v),
                node=node,
                subject=f"GPU {i} (NVIDIA H200)" if schema_1x else f"{host} GPU {i}",
            )
            for i, v in enumerate(matmul)
        ),
        Result(
            name="p2p.pair",
            subject="GPU 1 -> GPU 2",
            status=Status.PASS,
            message="ok",
            value=370.0,
            unit="GB/s",
            expected=UNJUDGED,
            category="benchmark",
            node=node,
        ),
        Result(
            name="memory.read",
            subject=host,
            status=Status.PASS,
            message="3.1 TB/s",
            value=3.1,
            unit="TB/s",
            expected=UNJUDGED,
            category="benchmark",
            node=node,
        ),
    ]
    if schema_1x:
        meta_changes.setdefault("nodes", [])
    return Report(
        meta=meta(host, **meta_changes),
        inventory=inventory(host),
        results=results,
        schema_version="1.0" if schema_1x else "2.0",
    )


# Stands for "no threshold" in node_report's memory.read and p2p.pair: a Result cannot PASS without one, but a
# report written before schema 2.1 could; write() takes it out of the file, as such a report has it.
UNJUDGED = "(none: taken out by write)"


def write(report: Report, directory: Path) -> Path:
    write_report(report, directory)
    path = directory / "report.json"
    data = json.loads(path.read_text())
    for r in data["results"]:
        if r.get("expected") == UNJUDGED:
            r["expected"] = None
    path.write_text(json.dumps(data))
    return directory


def test_merge_of_a_2x_and_a_1x_report_is_a_valid_cluster_report(tmp_path: Path) -> None:
    a = write(node_report("node-a", [800, 801, 799, 802], started_at="2026-11-22T09:05:00+00:00"), tmp_path / "a")
    b = write(
        node_report("node-b", [800, 640, 805, 798], schema_1x=True, finished_at="2026-11-22T09:30:00+00:00"),
        tmp_path / "b",
    )
    command = ["gpucert", "report", "merge", str(a), str(b), "-o", "out"]
    merged = write_merged([a, b], tmp_path / "out", command)
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert sorted(e.message for e in VALIDATOR.iter_errors(data)) == []
    assert load_report(tmp_path / "out") == merged
    # The per-node reports PASSed memory.read and p2p.pair with no threshold (as reports before 2.1 could): the
    # merged report shows them as INFO.
    unjudged = [r for r in merged.results if r.name in ("memory.read", "p2p.pair")]
    assert [r.status for r in unjudged] == [Status.INFO] * 4
    assert unjudged[0].message == "shown, not judged (PASS with no threshold in a schema 2.0 report): ok"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "report.json", "report.md"]

    m = merged.meta
    assert (m.verb, m.command, m.host, m.nodes, m.profile) == (
        "report merge",
        command,
        "node-a",
        ["node-a", "node-b"],
        "h200",
    )
    assert (m.started_at, m.finished_at, m.duration_s) == (
        "2026-11-22T09:00:00+00:00",
        "2026-11-22T09:30:00+00:00",
        1800.0,
    )
    assert list(merged.nodes) == ["node-a", "node-b"] and merged.inventory["hostname"] == "node-a"
    b_results = [r for r in merged.results if r.node == "node-b" and r.category != "cluster"]
    assert [r.subject for r in b_results] == [
        "node-b",
        *(f"node-b GPU {i}" for i in range(4)),
        "GPU 1 -> GPU 2",
        "node-b",
    ]
    fails = [(r.name, r.subject) for r in by_status(merged.results, Status.FAIL)]
    assert fails == [("cluster.outlier.matmul.bf16.max", "node-b GPU 1")]
    assert merged.status is Status.FAIL


def other_gpus(report: Report) -> Report:
    """The same report from another machine: its GPUs' UUIDs changed."""
    inv = copy.deepcopy(report.inventory)
    for gpu in inv["gpus"]:
        gpu["uuid"] = gpu["uuid"][:-4] + "beef"
    return dataclasses.replace(report, inventory=inv)


def without_gpus(report: Report) -> Report:
    return dataclasses.replace(report, inventory={**report.inventory, "gpus": []})


def test_merge_makes_shared_hostnames_unique(tmp_path: Path) -> None:
    # Two machines that both call themselves vm (their GPUs differ): two nodes, labelled apart.
    reports = [node_report("vm", [800] * 4), other_gpus(node_report("vm", [800] * 4, schema_1x=True))]
    merged = merge_reports(reports, ["r0", "r1"])
    assert merged.meta.nodes == ["vm[n0]", "vm[n1]"] and list(merged.nodes) == ["vm[n0]", "vm[n1]"]
    assert {r.subject for r in merged.results if r.name == "gpu.count"} == {"vm[n0]", "vm[n1]"}
    assert "vm[n1] GPU 3" in {r.subject for r in merged.results}
    assert VALIDATOR.is_valid(merged.to_dict())
    three = merge_reports([node_report("vm", [800]), node_report("other", [800]), other_gpus(node_report("vm", [800]))],
                          ["r0", "r1", "r2"])  # fmt: skip
    assert three.meta.nodes == ["vm[n0]", "other", "vm[n2]"]


@pytest.mark.parametrize(
    ("reports", "refusal"),
    [
        ([node_report("a", [1])], "needs at least 2 per-node reports, got 1"),
        (
            [node_report("a", [1]), node_report("b", [1], profile="h100-sxm")],
            "profiles differ (h200 in a.json; h100-sxm in b.json)",
        ),
        (
            [node_report("a", [1]), node_report("b", [1], method_version="4")],
            "method versions differ (3 in a.json; 4 in b.json)",
        ),
        (
            [node_report("a", [1]), node_report("b", [1], nodes=["b", "c"])],
            "b.json already holds several nodes (b, c)",
        ),
        (
            [node_report("a", [1]), node_report("a", [1])],
            "a.json and b.json are both node a with GPU GPU-",
        ),
        (
            [node_report("a", [1]), node_report("b", [1], config={"profile": "auto", "health": {"expected_gpus": 8}})],
            "judged under different settings: health.expected_gpus None in a.json, 8 in b.json",
        ),
        # A health run beside a discover run, and one CPU node's two runs, merged as a PASS cluster of two.
        (
            [node_report("a", [1]), node_report("b", [1], verb="discover")],
            "verbs differ (accept in a.json; discover in b.json)",
        ),
        (
            [without_gpus(node_report("a", [1])), without_gpus(node_report("a", [1]))],
            "a.json and b.json are both node a, with no GPU to tell them apart",
        ),
    ],
)
def test_merge_refuses_what_cannot_be_one_cluster(reports: list[Report], refusal: str) -> None:
    with pytest.raises(ValueError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        merge_reports(reports, ["a.json", "b.json"][: len(reports)])


def test_merge_with_an_unloadable_profile_errors_instead_of_judging_outliers() -> None:
    reports = [node_report(h, [800] * 4, profile="/nowhere/site.yaml") for h in ("a", "b")]
    merged = merge_reports(reports, ["a", "b"])
    (error,) = by_status(merged.results, Status.ERROR)
    assert error.name == "cluster.outlier" and "/nowhere/site.yaml" in error.message
    assert not [r for r in merged.results if r.name.startswith("cluster.outlier.")]


# views


@pytest.fixture(scope="module")
def two_nodes() -> Report:
    reports = [node_report("node-a", [800] * 4), node_report("node-b", [800, 800, 640, 800])]
    merged = merge_reports(reports, ["a", "b"])
    collective = Result(
        name="collective.all_reduce",
        subject="2 nodes x 4 GPUs (nccl)",
        status=Status.PASS,
        message="ok",
        value=350.0,
        unit="GB/s",
        expected=">= 300",
        category="benchmark",
        details={"sizes_bytes": [2**20, 2**30], "busbw_gbps": [90.0, 350.0]},
    )
    return dataclasses.replace(merged, results=[*merged.results, collective])


def test_split_by_node_puts_job_wide_and_cluster_results_first(two_nodes: Report) -> None:
    cluster, sections = split_by_node(two_nodes)
    assert [s.label for s in sections] == ["node-a", "node-b"]
    assert [s.status for s in sections] == [Status.PASS, Status.FAIL]
    assert all(r.node is None or r.category == "cluster" for r in cluster)
    assert "collective.all_reduce" in {r.name for r in cluster}
    assert all(r.category != "cluster" for s in sections for r in s.results)


def test_markdown_of_two_nodes_has_a_cluster_section_then_one_per_node(two_nodes: Report) -> None:
    text = render_markdown(two_nodes)
    lines = text.splitlines()
    assert lines[0] == "# gpucert report merge: FAIL on 2 nodes"
    assert lines[2].startswith("- **Cluster:** 2 nodes x 4 GPUs = 8 NVIDIA H200")
    assert lines[3] == "- **Nodes:** node-a (PASS), node-b (FAIL)"
    headings = [line for line in lines if line.startswith("## ")]
    assert headings == ["## Cluster", "## Node node-a: PASS", "## Node node-b: FAIL"]
    cluster_part = text.split("## Node node-a")[0]
    assert "| FAIL | cluster.outlier.matmul.bf16.max | node-b GPU 2 |" in cluster_part
    assert "| PASS | collective.all_reduce | 2 nodes x 4 GPUs (nccl) |" in cluster_part
    assert "| PASS | cluster.config.driver | cluster | 580.159.04 |" in cluster_part
    node_b = text.split("## Node node-b: FAIL")[1]
    assert "| PASS | matmul.bf16.max | node-b GPU 2 | 640 TFLOP/s |" in node_b
    assert "cluster.outlier" not in node_b


def test_terminal_of_two_nodes(two_nodes: Report) -> None:
    console = Console(record=True, width=160, force_terminal=True)  # a terminal: tables
    print_report(two_nodes, console, show_inventory=False, report_path=None)
    text = console.export_text()
    assert text.startswith("cluster: 2 nodes x 4 GPUs = 8 NVIDIA H200")
    assert "cluster checks" in text and "node node-a PASS" in text and "node node-b FAIL" in text
    assert text.index("cluster checks") < text.index("node node-a") < text.index("node node-b")
    assert "verdict: FAIL" in text


def test_html_of_two_nodes_has_anchored_node_sections_and_per_node_plots(two_nodes: Report) -> None:
    page = render_html(two_nodes)
    assert '<section id="cluster">' in page
    assert '<section id="node-node-a" class="node">' in page and '<a href="#node-node-b">' in page
    assert page.index('id="cluster"') < page.index('id="node-node-a"') < page.index('id="node-node-b"')
    assert 'data-plot="node-a/matmul"' in page and 'data-plot="node-b/matmul"' in page
    assert 'data-plot="cluster/collectives"' in page


def test_html_anchors_stay_unique_for_odd_labels() -> None:
    merged = merge_reports([node_report("vm", [800]), other_gpus(node_report("vm", [800]))], ["a", "b"])
    page = render_html(merged)
    assert 'id="node-vm-n0"' in page and 'id="node-vm-n1"' in page
    from gpucert.report.html import _anchors

    # "q " cleans to "q", and "q"'s first fallback was "q-2"'s own id: both pointed at one section.
    anchors = _anchors(["q-2", "q", "q ", "q-2 "])
    assert len(set(anchors.values())) == 4, anchors


def test_single_node_reports_render_as_before() -> None:
    report = node_report("node-a", [800] * 4)
    assert render_markdown(report).startswith("# gpucert accept: PASS on node-a\n\n- **Node:** ")
    assert "## Cluster" not in render_markdown(report)


# compare


def test_single_node_runs_of_different_hosts_pair_by_gpu_and_node() -> None:
    a = node_report("host-a", [800, 800, 800, 800])
    b = node_report("host-b", [800, 800, 700, 800])
    comparisons = compare_reports(a, b)
    assert not [c for c in comparisons if c.only_in]
    (regressed,) = [c for c in comparisons if c.regressed]
    assert (regressed.name, regressed.subject) == ("matmul.bf16.max", "GPU 2")
    assert ("gpu.count", "node") in {(c.name, c.subject) for c in comparisons}


def test_cluster_runs_pair_by_full_subject() -> None:
    first = merge_reports([node_report("a", [800] * 2), node_report("b", [800] * 2)], ["1", "2"])
    second = merge_reports([node_report("a", [800] * 2), node_report("b", [800, 600])], ["1", "2"])
    comparisons = compare_reports(first, second)
    regressed = {(c.name, c.subject) for c in comparisons if c.regressed}
    assert regressed == {("matmul.bf16.max", "b GPU 1")}
    # A node's result whose subject does not carry its label gets it, so the nodes' pairs stay apart.
    assert {c.subject for c in comparisons if c.name == "p2p.pair"} == {"a: GPU 1 -> GPU 2", "b: GPU 1 -> GPU 2"}
    assert ("cluster.outlier.matmul.bf16.max", "b GPU 1") in {(c.name, c.subject) for c in comparisons}


def test_the_two_node_h200_report_captured_on_the_gpus_reads_validates_and_renders() -> None:
    """docs/results: `gpucert accept --nnodes 2` on the lent 2xH200 (two "nodes" on one host, 2026-11-22)."""
    path = Path(__file__).resolve().parents[2] / "docs/results/2026-11-22-h200x2-two-nodes-accept.json"
    assert list(VALIDATOR.iter_errors(json.loads(path.read_text()))) == []
    report = load_report(path)
    assert report.meta.nodes == ["vm[n0]", "vm[n1]"] and set(report.nodes) == {"vm[n0]", "vm[n1]"}
    maxima = {(r.node, r.gpu_index, r.subject) for r in report.results if r.name == "matmul.bf16.max"}
    assert maxima == {("vm[n0]", 0, "vm[n0] GPU 0"), ("vm[n1]", 1, "vm[n1] GPU 1")}
    golden = {r.name: r.status for r in report.results if r.name.startswith("cluster.config.")}
    assert golden["cluster.config.driver"] is Status.PASS and golden["cluster.config.nccl"] is Status.PASS
    markdown = render_markdown(report)
    assert "## Cluster" in markdown and "## Node vm[n0]" in markdown and "## Node vm[n1]" in markdown
