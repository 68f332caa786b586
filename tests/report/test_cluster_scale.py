"""`gpucert report merge` at 64 nodes x 8 GPUs: synthetic per-node reports (tools/synth_cluster.py: the
captured 4xH200 bundle widened to 8 GPUs, the fixture accept report's results with noise, seven faults on
seven nodes) merged and rendered. The merged report must name every injected fault, and nothing else, in its
summary, and its views must stay within the budgets that hold at 1,024 nodes (docs/results/cluster-scale.md).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from tests.report.test_html import CHROMIUM, _chromium
from tools.synth_cluster import Fault, write_cluster

import gpucert.report
from gpucert.report.cluster import PROBLEM, key_figures, write_merged
from gpucert.report.schema import Report
from gpucert.report.store import load_report
from gpucert.status import Status

NODES, GPUS = 64, 8
# The targets at 1,024 nodes, per node: a 10 MB page, and a Markdown a ticket can hold.
HTML_BYTES_PER_NODE = 10_000_000 // 1024
MARKDOWN_BYTES_MAX = 100_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, list[Fault], Path, int]:
    root = tmp_path_factory.mktemp("cluster")
    faults = write_cluster(root / "nodes", NODES, GPUS, seed=3)
    paths = sorted((root / "nodes").glob("node*"))
    merged = write_merged(paths, root / "out", ["gpucert", "report", "merge", "..."])
    inputs = sum((p / "report.json").stat().st_size for p in paths)
    return merged, faults, root / "out", inputs


def test_the_synthetic_cluster_has_its_faults_on_distinct_nodes(cluster: tuple[Report, list[Fault], Path, int]) -> None:
    merged, faults, _, _ = cluster
    assert sorted(f.kind for f in faults) == sorted(
        ["slow_gpu", "slow_gpu", "slow_node", "pcie", "ecc", "driver", "missing_gpu"]
    )
    assert len({f.node for f in faults}) == len(faults)
    assert len(merged.meta.nodes) == NODES and len(merged.nodes) == NODES
    gpus = {(r.node, r.gpu_index) for r in merged.results if r.name == "gpu.memory"}
    assert len(gpus) == NODES * GPUS - 1  # one node lost a GPU


def test_the_merge_names_every_fault_and_nothing_else(cluster: tuple[Report, list[Fault], Path, int]) -> None:
    merged, faults, _, _ = cluster
    failed = {(r.name, r.subject) for r in merged.results if r.status is Status.FAIL}
    for fault in faults:
        assert set(fault.expect) <= failed, fault
    # No false accusation: 1.5 % noise never crosses the 10 % rule, so only the faulty nodes have problems.
    accused = {r.node for r in merged.results if r.status in PROBLEM and r.node is not None}
    assert accused == {f.node for f in faults}
    assert not [r for r in merged.results if r.status in PROBLEM and r.node is None]
    assert merged.status is Status.FAIL


@pytest.mark.slow
def test_the_json_is_the_report_and_follows_the_schema(cluster: tuple[Report, list[Fault], Path, int]) -> None:
    merged, _, out, inputs = cluster
    loaded = load_report(out)
    # The report kept for the views has scalar details only; report.json has every sweep and series.
    assert loaded == dataclasses.replace(merged, results=loaded.results)
    assert [dataclasses.replace(r, details={}) for r in loaded.results] == [
        dataclasses.replace(r, details={}) for r in merged.results
    ]
    assert all(a.details.items() >= b.details.items() for a, b in zip(loaded.results, merged.results, strict=True))
    assert any(isinstance(v, list) for r in loaded.results for v in r.details.values())
    assert not any(isinstance(v, list) for r in merged.results if r.node for v in r.details.values())
    data = json.loads((out / "report.json").read_text())
    schema = json.loads((Path(gpucert.report.__file__).parent / "report.schema.json").read_text())
    data["results"] = data["results"][:: len(data["results"]) // 500]  # a spread sample: the whole takes 10 s
    assert [e.message for e in Draft202012Validator(schema).iter_errors(data)] == []
    # One line per result: no bigger than the per-node reports it joins (they are indented).
    assert (out / "report.json").stat().st_size < inputs


def test_the_html_leads_with_the_faulty_nodes_and_stays_small(cluster: tuple[Report, list[Fault], Path, int]) -> None:
    merged, faults, out, _ = cluster
    page = (out / "report.html").read_text()
    assert len(page.encode()) < NODES * HTML_BYTES_PER_NODE
    order = [page.index(f'id="{name}"') for name in ("problem-nodes", "problems", "cluster", "heatmap", "nodes")]
    assert order == sorted(order)
    table = page[page.index('id="problem-nodes"') : page.index('id="problems"')]
    assert set(re.findall(r'<td><a href="#node-(node\d+)">', table)) == {f.node for f in faults}
    assert f"Nodes with problems ({len(faults)} of {NODES})" in table
    # The heatmap boxes exactly the GPUs the cluster rule named in the figures it shows.
    heatmap = page[page.index('id="heatmap"') : page.index('id="nodes"')]
    named = sum(len(f.outliers) for f in key_figures(merged.results))
    assert len(re.findall(r'<td class="[^"]*\bout"', heatmap)) == named > 0
    assert heatmap.count("<tr id=") == NODES
    first_rows = re.findall(r'<tr id="hm-node-(node\d+)">', heatmap)[: len(faults)]
    assert set(first_rows) == {f.node for f in faults}  # problem nodes first
    # Per-node detail is collapsed and has no plots at this size; the faulty nodes' sections come first.
    assert page.count('class="node"><details>') == NODES and "<details open>" not in page
    assert "data-plot=" not in page


def test_the_markdown_is_a_summary(cluster: tuple[Report, list[Fault], Path, int]) -> None:
    _, faults, out, _ = cluster
    text = (out / "report.md").read_text()
    assert len(text.encode()) < MARKDOWN_BYTES_MAX
    assert text.startswith(f"# gpucert report merge: FAIL on {NODES} nodes\n")
    assert f"- **Nodes:** {len(faults)} FAIL, {NODES - len(faults)} PASS" in text
    headings = [
        line.removeprefix("## Node ").split(":")[0] for line in text.splitlines() if line.startswith("## Node ")
    ]
    assert sorted(headings) == sorted(f.node for f in faults)


def test_nodes_that_share_a_name_are_relabelled_in_the_streamed_json(tmp_path: Path) -> None:
    """Past DETAILED_NODES_MAX nodes write_merged streams each node's results before it knows every label."""
    write_cluster(tmp_path / "nodes", 17, 2, seed=1)
    twin = tmp_path / "nodes/node0016/report.json"
    data = json.loads(twin.read_text())
    data["meta"].update(host="node0000", nodes=["node0000"])
    data["inventory"]["hostname"] = "node0000"
    for r in data["results"]:
        r["node"] = "node0000"
        r["subject"] = r["subject"].replace("node0016", "node0000")
    twin.write_text(json.dumps(data))
    merged = write_merged(sorted((tmp_path / "nodes").glob("node*")), tmp_path / "out", ["gpucert"])
    assert merged.meta.nodes[0] == "node0000[n0]" and merged.meta.nodes[16] == "node0000[n16]"
    loaded = load_report(tmp_path / "out")
    twins = [r for r in loaded.results if r.node == "node0000[n16]" and r.gpu_index == 1 and r.name == "gpu.memory"]
    assert [r.subject for r in twins] == ["node0000[n16] GPU 1"]
    assert {r.node for r in loaded.results if r.node} == set(merged.meta.nodes)
    assert [(r.node, r.subject) for r in loaded.results] == [(r.node, r.subject) for r in merged.results]


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (CI installs it)")
def test_the_heatmap_shows_its_outliers_in_a_real_browser(
    cluster: tuple[Report, list[Fault], Path, int], tmp_path: Path
) -> None:
    """The heatmap alone, in the page's own style: the outlier cells and the F marks must be drawn in the FAIL
    red (a CSS rule of the table's own shade once painted them over, white on near-white)."""
    from PIL import Image

    _, _, out, _ = cluster
    page = (out / "report.html").read_text()
    head = page[: page.index("<body>")]
    heatmap = page[page.index('<section id="heatmap">') : page.index('<div id="nodes">')]
    only = tmp_path / "heatmap.html"
    only.write_text(f"{head}<body><main>{heatmap}</main></body></html>")
    shot = tmp_path / "shot.png"
    run = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,900", only.as_uri())
    assert shot.exists(), run.stderr[-2000:]
    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None
    red = sum(n for n, (r, g, b) in colours if abs(r - 0xCF) < 12 and abs(g - 0x22) < 12 and abs(b - 0x2E) < 12)
    # The legend's two red swatches are about 2,700 pixels; the faulty nodes' rows (first) bring it to about
    # 7,000 (with the table's shade painted over the cells: 2,700).
    assert red > 5000, red
