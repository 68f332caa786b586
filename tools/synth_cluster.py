"""Synthetic per-node accept reports for a cluster of N nodes x G GPUs, with noise and injected faults.

No machine measured these numbers: every node is the captured 4xH200 bundle (tests/fixtures/nodes/h200x4)
widened to G GPUs, and its results are those of a base accept report (by default the synthetic one in
tests/fixtures/reports, whose weak p2p pair is healed here so the base node is clean; `--base
docs/results/2026-11-21-h200x4-accept.json` takes the real 4xH200 report, full matmul sweeps included, about
4x the bytes) with GPU i playing base GPU i mod 4. Benchmark figures get Gaussian noise (1.5 % per GPU on a
0.5 % per-node factor, 1 % for node-wide figures) and a fixed set of faults is injected on distinct nodes:

- slow_gpu (x2): every matmul figure of one GPU at 75 %;
- slow_node: every HBM figure (memory.copy/read/write/triad) of a node's GPUs at 80 %;
- pcie: one GPU's link at x8 (gpu.pcie_link FAIL) and its host<->GPU copies at 50 %;
- ecc: 2 volatile uncorrectable ECC errors on one GPU (gpu.ecc_uncorrectable FAIL);
- driver: one node on another driver (the golden-config diff names it);
- missing_gpu: one node where NVML sees G - 1 GPUs (gpu.count FAIL, golden GPU count).

Usage:
    python tools/synth_cluster.py OUT [--nodes 1024] [--gpus 8] [--seed 0] [--base REPORT]
    gpucert report merge OUT/node* -o MERGED
    python tools/synth_cluster.py OUT --measure MERGED    # the same merge phase by phase: time, bytes, peak RSS

OUT/<node>/report.json is one node's report (schema 2.1, the node named in every result) and OUT/faults.json
lists what was injected and the (result name, subject) each fault must FAIL in the merged report.
tests/report/test_cluster_scale.py runs it at 64 x 8; docs/results/cluster-scale.md has the 1,024 x 8 figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "tests/fixtures/nodes/h200x4"
BASE_REPORT = ROOT / "tests/fixtures/reports/accept-4xh200-synthetic.json"

GPU_NOISE = 0.015
NODE_FACTOR_NOISE = 0.005
NODE_NOISE = 0.01
OTHER_DRIVER = "570.86.15"
# Fault kinds in the order they are placed; slow_gpu twice, so two GPUs on two nodes are slow.
FAULT_KINDS = ("slow_gpu", "slow_gpu", "slow_node", "pcie", "ecc", "driver", "missing_gpu")


@dataclass
class Fault:
    kind: str
    node: str
    gpu: int | None
    # (result name, subject) pairs the merged report must hold as FAIL.
    expect: list[tuple[str, str]] = field(default_factory=list)


def node_label(i: int) -> str:
    return f"node{i:04d}"


def base_inventory(bundle: Path = BUNDLE) -> dict[str, Any]:
    """The captured node's inventory as a report holds it (the collect -> parse path over the bundle)."""
    from gpucert.hardware.inventory import bundle_sources, collect_inventory

    return collect_inventory(bundle_sources(bundle), probe_torch=False).to_dict()


def widen_inventory(base: dict[str, Any], label: str, gpus: int) -> dict[str, Any]:
    """The base node with `gpus` GPUs (GPU i a copy of base GPU i mod n, with its own index, bus id, UUID and
    serial), an all-to-all topology of the base's link type, and `label` as hostname."""
    inv = copy.deepcopy(base)
    old = base["gpus"]
    inv["hostname"] = label
    inv["replayed_from"] = None
    inv["gpus"] = []
    for i in range(gpus):
        g = copy.deepcopy(old[i % len(old)])
        ident = uuid.uuid5(uuid.NAMESPACE_DNS, f"{label}.{i}")
        g.update(
            index=i,
            bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            uuid=f"GPU-{ident}",
            serial=str(1653924000000 + ident.int % 10**6),
        )
        inv["gpus"].append(g)
    link = base["topology"]["matrix"][0][1] if len(old) > 1 else "NV18"
    count = base["topology"]["nvlink_counts"][0][1] if len(old) > 1 else 18
    inv["topology"]["matrix"] = [["X" if a == b else link for b in range(gpus)] for a in range(gpus)]
    inv["topology"]["nvlink_counts"] = [[0 if a == b else count for b in range(gpus)] for a in range(gpus)]
    memory = round(sum(g["memory_total_gib"] for g in inv["gpus"]))
    parts = base["summary"].split(" | ")
    parts[0] = f"{gpus}x {old[0]['name']}"
    parts[1] = f"{memory} GiB GPU memory"
    inv["summary"] = " | ".join(parts)
    return inv


def _floor(expected: str | None) -> float | None:
    match = re.match(r"\s*>=?\s*([0-9.]+)", expected or "")
    return float(match.group(1)) if match else None


def _scaled(r: dict[str, Any], factor: float, where: str) -> dict[str, Any]:
    """A benchmark result with its value times `factor`, FAIL where that falls below its own floor."""
    value = r["value"]
    if isinstance(value, bool) or not isinstance(value, float):
        return r
    r = dict(r, value=round(value * factor, 3))
    floor = _floor(r["expected"])
    if floor is not None and r["value"] < floor and r["status"] in ("PASS", "WARN"):
        r.update(
            status="FAIL",
            message=f"expected >= {floor:g} {r['unit']}, found {r['value']:g} {r['unit']} on {where}",
            remediation="rerun; if it stays low, check the GPU's clocks, power cap and cooling",
        )
    return r


def _healed_p2p(r: dict[str, Any], gpus: int, rng: random.Random) -> dict[str, Any]:
    """The base's p2p matrix widened to `gpus` with every pair near the base median: a clean node."""
    values = [v for row in r["details"]["matrix_gbps"] for v in row if v is not None]
    median = sorted(values)[len(values) // 2]
    matrix = [[None if a == b else round(median * rng.gauss(1, 0.005), 3) for b in range(gpus)] for a in range(gpus)]
    low = min(v for row in matrix for v in row if v is not None)
    details = dict(r["details"], matrix_gbps=matrix)
    for key in ("cv", "wrong", "peer_access"):
        details.pop(key, None)
    details.pop("uuids", None)
    return dict(
        r,
        status="PASS",
        value=low,
        subject=f"{gpus} GPUs",
        message=f"every one of {gpus * (gpus - 1)} pairs >= {low:.1f} GB/s (median {median:.1f})",
        details=details,
    )


def _widened_telemetry(r: dict[str, Any], gpus: int) -> dict[str, Any]:
    per_gpu = r["details"].get("gpus")
    if not isinstance(per_gpu, dict) or not per_gpu:
        return r
    n = len(per_gpu)
    keys = sorted(per_gpu, key=int)
    return dict(r, details=dict(r["details"], gpus={str(i): per_gpu[keys[i % n]] for i in range(gpus)}))


def _base_gpus(base: dict[str, Any]) -> int:
    return len({r["gpu_index"] for r in base["results"] if r["gpu_index"] is not None})


def node_report(
    base: dict[str, Any], inventory: dict[str, Any], label: str, index: int, gpus: int, seed: int, fault: str | None
) -> dict[str, Any]:
    """One node's report (a dict as report.json holds it): the base results for `gpus` GPUs with noise and
    at most one fault (its kind; the faulty GPU is the node index mod `gpus`)."""
    rng = random.Random(f"{seed}/{index}")
    nb = _base_gpus(base)
    bad_gpu = index % gpus
    present = gpus - 1 if fault == "missing_gpu" else gpus
    node_factor = rng.gauss(1, NODE_FACTOR_NOISE)
    host = base["meta"]["host"]
    per_gpu: dict[str, list[dict[str, Any]]] = {}
    results: list[dict[str, Any]] = []
    for r in base["results"]:
        if r["gpu_index"] is not None:
            per_gpu.setdefault(r["name"], []).append(r)
            continue
        if r["name"] == "p2p.pair":
            continue  # the base's weak pair; a healed matrix has no short pair
        r = dict(r, node=label, subject=label if r["subject"] == host else r["subject"])
        if r["name"] == "p2p.matrix":
            if present < 2:
                continue  # one GPU has no peer
            r = _healed_p2p(r, present, rng)
        elif r["category"] == "telemetry":
            r = _widened_telemetry(r, present)
        elif r["category"] == "benchmark":
            r = _scaled(r, node_factor * rng.gauss(1, NODE_NOISE), label)
        if r["name"] in ("gpu.count", "node.vbios_uniform", "node.inforom_uniform"):
            r = {k: v.replace(f"{nb} GPU", f"{gpus} GPU") if isinstance(v, str) else v for k, v in r.items()}
            if r["name"] == "gpu.count":
                r.update(value=present, expected=f"== {gpus}", message=f"{present} GPUs found")
                if present != gpus:
                    r.update(
                        status="FAIL",
                        message=f"expected {gpus} GPUs, found {present} on {label}",
                        remediation="a GPU fell off the bus: check dmesg for XID 79, reseat or replace it",
                    )
        if r["name"] == "software.driver" and fault == "driver":
            r.update(value=OTHER_DRIVER, message=f"driver {OTHER_DRIVER}")
        results.append(r)
    for name, rows in per_gpu.items():
        by_index = {r["gpu_index"]: r for r in rows}
        for i in range(present):
            r = dict(by_index[sorted(by_index)[i % len(by_index)]], gpu_index=i, node=label, subject=f"{label} GPU {i}")
            where = f"{label} GPU {i}"
            if r["category"] == "benchmark":
                factor = node_factor * rng.gauss(1, GPU_NOISE)
                if fault == "slow_gpu" and i == bad_gpu and name.startswith("matmul."):
                    factor *= 0.75
                if fault == "slow_node" and name in ("memory.copy", "memory.read", "memory.write", "memory.triad"):
                    factor *= 0.8
                if fault == "pcie" and i == bad_gpu and name in ("memory.h2d", "memory.d2h"):
                    factor *= 0.5
                r = _scaled(r, factor, where)
            elif fault == "pcie" and i == bad_gpu and name == "gpu.pcie_link":
                r.update(
                    status="FAIL",
                    value="Gen5 x8",
                    message=f"expected PCIe x16, found x8 on GPU {i} ({inventory['gpus'][i]['bus_id']})",
                    remediation="a narrow link cuts host<->GPU bandwidth: reseat the GPU or riser, check the slot; "
                    "DCGM diag -r 2 measures it",
                )
            elif fault == "ecc" and i == bad_gpu and name == "gpu.ecc_uncorrectable":
                r.update(
                    status="FAIL",
                    value=2,
                    message=f"expected 0 uncorrectable ECC errors since boot, found 2 on GPU {i}",
                    remediation="drain the node; reset the GPU to trigger row remapping, RMA if errors recur",
                    details={"volatile": 2, "aggregate": 2},
                )
            results.append(r)
    # The base is a schema 1.0 report, whose PASS could name no threshold; from 2.1 such a figure is INFO, as
    # gpucert reads the base itself (report.schema).
    results = [dict(r, status="INFO") if r["status"] == "PASS" and not r.get("expected") else r for r in results]
    counts = {s: 0 for s in ("SKIP", "INFO", "PASS", "WARN", "FAIL", "ERROR")}
    for r in results:
        counts[r["status"]] += 1
    status = next(s for s in ("ERROR", "FAIL", "WARN", "PASS", "INFO", "SKIP") if counts[s] or s == "SKIP")
    meta = dict(base["meta"], host=label, nodes=[label])
    meta["started_at"] = f"2026-11-22T09:{index // 60 % 60:02d}:{index % 60:02d}+00:00"
    meta["finished_at"] = f"2026-11-22T10:{index // 60 % 60:02d}:{index % 60:02d}+00:00"
    meta["duration_s"] = 3600.0
    return {
        "schema_version": "2.1",
        "status": status,
        "exit_code": {"SKIP": 0, "INFO": 0, "PASS": 0, "WARN": 1, "FAIL": 2, "ERROR": 3}[status],
        "counts": counts,
        "meta": meta,
        "inventory": inventory,
        "results": results,
        "nodes": {},
    }


def place_faults(nodes: int, gpus: int, seed: int) -> dict[int, Fault]:
    """Node index -> the fault injected there, on distinct nodes spread by the seed."""
    if nodes < len(FAULT_KINDS):
        raise ValueError(f"{len(FAULT_KINDS)} faults need at least as many nodes, got {nodes}")
    where = random.Random(seed).sample(range(nodes), len(FAULT_KINDS))
    faults = {}
    for index, kind in zip(where, FAULT_KINDS, strict=True):
        label, gpu = node_label(index), index % gpus
        on_gpu = f"{label} GPU {gpu}"
        expect = {
            "slow_gpu": [("cluster.outlier.matmul.bf16.max", on_gpu)],
            "slow_node": [("cluster.outlier.memory.copy", label), ("cluster.outlier.memory.triad", label)],
            "pcie": [("gpu.pcie_link", on_gpu), ("cluster.outlier.memory.h2d", on_gpu)],
            "ecc": [("gpu.ecc_uncorrectable", on_gpu)],
            "driver": [("cluster.config.driver", label)],
            "missing_gpu": [("gpu.count", label), ("cluster.config.gpu_count", label)],
        }[kind]
        faults[index] = Fault(kind, label, gpu if kind in ("slow_gpu", "pcie", "ecc") else None, expect)
    return faults


def synth_reports(
    nodes: int, gpus: int, seed: int = 0, base: Path = BASE_REPORT
) -> Iterator[tuple[str, dict[str, Any], Fault | None]]:
    """(label, report dict, its fault or None) for every node, one at a time (a 1,024-node cluster is never
    held in memory)."""
    base_report = json.loads(base.read_text())
    inventory = base_inventory()
    faults = place_faults(nodes, gpus, seed)
    for index in range(nodes):
        label, fault = node_label(index), faults.get(index)
        kind = fault.kind if fault else None
        inv = widen_inventory(inventory, label, gpus)
        if kind == "driver":
            inv["driver_version"] = OTHER_DRIVER
        if kind == "missing_gpu":
            inv["gpus"] = inv["gpus"][:-1]
        yield label, node_report(base_report, inv, label, index, gpus, seed, kind), fault


def write_cluster(out: Path, nodes: int, gpus: int, seed: int = 0, base: Path = BASE_REPORT) -> list[Fault]:
    """OUT/<node>/report.json for every node (indented as gpucert writes them) and OUT/faults.json."""
    faults = []
    for label, report, fault in synth_reports(nodes, gpus, seed, base):
        directory = out / label
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        if fault is not None:
            faults.append(fault)
    (out / "faults.json").write_text(json.dumps([asdict(f) for f in faults], indent=1) + "\n")
    return faults


def measure_merge(nodes_dir: Path, out: Path) -> dict[str, Any]:
    """`gpucert report merge` of OUT's node reports into MERGED (write_merged: read, merge and judge, and write
    report.json, report.md and report.html), timed (wall and CPU seconds), then each view alone on the merged
    report and the terminal view; peak RSS of the whole."""
    import io
    import resource

    from rich.console import Console

    from gpucert.report.cluster import write_merged
    from gpucert.report.html import render_html
    from gpucert.report.markdown import render_markdown
    from gpucert.report.terminal import print_report

    paths = sorted(nodes_dir.glob("node*"))
    phases: dict[str, Any] = {}

    def timed(name: str, work: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        value = work()
        phases[name] = {"wall_s": round(time.perf_counter() - wall, 2), "cpu_s": round(time.process_time() - cpu, 2)}
        return value

    report = timed("write_merged", lambda: write_merged(paths, out, ["gpucert", "report", "merge", "..."]))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    timed("markdown", lambda: render_markdown(report))
    timed("html", lambda: render_html(report))
    text = io.StringIO()
    timed("terminal", lambda: print_report(report, Console(file=text, width=160), False, None))
    phases["terminal"]["bytes"] = len(text.getvalue().encode())
    phases["terminal"]["lines"] = text.getvalue().count("\n")
    return {
        "nodes": len(paths),
        "input_bytes": sum((p / "report.json").stat().st_size for p in paths),
        "results": len(report.results),
        "peak_rss_gib_merge": round(rss, 3),
        "bytes": {name: (out / name).stat().st_size for name in ("report.json", "report.md", "report.html")},
        "phases": phases,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory for OUT/<node>/report.json and OUT/faults.json")
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base", type=Path, default=BASE_REPORT, help="the accept report every node copies")
    parser.add_argument(
        "--measure", type=Path, metavar="MERGED", help="merge OUT's node reports into MERGED phase by phase, timed"
    )
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure_merge(args.out, args.measure), indent=1))
        return 0
    faults = write_cluster(args.out, args.nodes, args.gpus, args.seed, args.base)
    for f in faults:
        print(f"{f.kind:12} {f.node}" + (f" GPU {f.gpu}" if f.gpu is not None else ""))
    print(f"{args.nodes} node reports in {args.out}; merge: gpucert report merge {args.out}/node* -o MERGED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
