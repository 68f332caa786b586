"""Reports as Prometheus metrics: names, units, labels and status (on captured bundles and the report fixtures),
and a real Prometheus (Debian's package) scraping them and answering a query for a FAIL."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gpucert.acceptance import RunOutcome
from gpucert.cli import main
from gpucert.fleet.metrics import render_metrics, unit_suffix, write_metrics
from gpucert.fleet.options import metrics_path
from gpucert.report.schema import Report, Result
from gpucert.report.store import load_report
from gpucert.report.terminal import make_console
from gpucert.status import Status
from tests.conftest import FIXTURES, NODE_BUNDLES
from tests.fleet import prometheus_server

SYNTHETIC = FIXTURES / "reports" / "accept-4xh200-synthetic.json"


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of an exposition, by metric name; parsing it is itself the check that the text is valid."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family.name
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def only(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    matches = [value for have, value in found[name] if all(have.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, f"expected one {name} sample with {labels}, found {len(matches)}"
    return matches[0]


def test_metric_names_are_stable_and_carry_their_units() -> None:
    found = samples(render_metrics(load_report(SYNTHETIC)))
    assert sorted(found) == [
        "gpucert_result_bytes",
        "gpucert_result_bytes_per_second",
        "gpucert_result_celsius",
        "gpucert_result_errors",
        "gpucert_result_events",
        "gpucert_result_flop_per_second",
        "gpucert_result_gpus",
        "gpucert_result_links",
        "gpucert_result_ports",
        "gpucert_result_ratio",
        "gpucert_result_relative_error",
        "gpucert_result_rows",
        "gpucert_result_status",
        "gpucert_result_tokens_per_second",
        "gpucert_result_watts",
        "gpucert_run_duration_seconds",
        "gpucert_run_finished_timestamp_seconds",
        "gpucert_run_info",
        "gpucert_run_status",
    ]


def test_values_in_base_units_and_status_in_gpucert_order() -> None:
    found = samples(render_metrics(load_report(SYNTHETIC)))
    node = "h200x4-synth"
    # 250.312 GB/s, the weak pair's p2p bandwidth, FAIL.
    pair = {"check": "p2p.pair", "node": node, "subject": "GPU 1 -> GPU 2"}
    assert only(found, "gpucert_result_bytes_per_second", **pair) == pytest.approx(250.312e9)
    assert only(found, "gpucert_result_status", **pair) == Status.FAIL.rank == 4
    assert only(found, "gpucert_result_flop_per_second", check="matmul.bf16.max", gpu="0") == pytest.approx(800.47e12)
    assert only(found, "gpucert_result_ratio", check="train.mfu") == pytest.approx(0.3354)
    assert only(found, "gpucert_result_status", check="ib.ports") == Status.SKIP.rank == 0
    assert only(found, "gpucert_run_status", node=node, verb="accept") == 4
    info = found["gpucert_run_info"][0][0]
    assert (info["tool_version"], info["method_version"], info["profile"]) == ("0.1.0", "1", "h200")
    # GPU results carry the GPU's index and its UUID (from the inventory when the result has none).
    temperature = [labels for labels, _ in found["gpucert_result_celsius"] if labels["check"] == "gpu.temperature"]
    assert {labels["gpu"]: labels["uuid"] for labels in temperature}["2"] == "GPU-fd7e8359-c39a-1ce1-d741-506c67b86d56"
    # A string (Gen5 x16) or bool (ECC on) is a state its status says; it becomes no value sample.
    valued = {
        labels.get("check") for name, rows in found.items() if name != "gpucert_result_status" for labels, _ in rows
    }
    assert "gpu.pcie_link" not in valued
    assert only(found, "gpucert_result_status", check="gpu.pcie_link", gpu="0") == 2


@pytest.mark.parametrize(
    ("unit", "expected"),
    [
        ("GB/s", ("bytes_per_second", 1e9)),
        ("TB/s", ("bytes_per_second", 1e12)),
        ("Gb/s", ("bits_per_second", 1e9)),
        ("ms", ("seconds", 1e-3)),
        ("%", ("ratio", 0.01)),
        ("GPUs", ("gpus", 1.0)),
        (None, ("value", 1.0)),
        # cluster fs's rate: `gpucert_result_ops_s` failed promtool's lint (`_s` an abbreviated unit).
        ("ops/s", ("operations_per_second", 1.0)),
        ("rows/s", ("rows_per_second", 1.0)),
    ],
)
def test_unit_suffix(unit: str | None, expected: tuple[str, float]) -> None:
    assert unit_suffix(unit) == expected


def _result(name: str, status: Status, node: str | None, **kw: object) -> Result:
    kw.setdefault("expected", "x")  # a PASS names its threshold
    return Result(name=name, subject=f"{node} thing", status=status, message="m", node=node, **kw)  # type: ignore[arg-type]


def test_several_nodes_one_status_each_and_one_for_the_run() -> None:
    base = load_report(SYNTHETIC)
    report = Report(
        meta=dataclasses.replace(base.meta, nodes=["a", "b"]),
        inventory=base.inventory,
        nodes={"a": base.inventory, "b": {"gpus": []}},
        results=[
            _result("gpu.temperature", Status.PASS, "a", gpu_index=0, value=40.0, unit="C"),
            _result("gpu.temperature", Status.WARN, "b", gpu_index=0, value=80.0, unit="C"),
            Result("collective.all_reduce", "2 nodes", Status.FAIL, "m", value=100.0, unit="GB/s"),
        ],
    )
    found = samples(render_metrics(report))
    assert only(found, "gpucert_run_status", node="a") == 2
    assert only(found, "gpucert_run_status", node="b") == 3
    assert only(found, "gpucert_run_status", node="") == 4  # the whole run: the job's FAIL
    assert only(found, "gpucert_result_bytes_per_second", check="collective.all_reduce", node="") == 1e11
    uuid_a = base.inventory["gpus"][0]["uuid"]
    assert only(found, "gpucert_result_status", node="a", gpu="0") == 2
    assert [labels["uuid"] for labels, _ in found["gpucert_result_status"] if labels["node"] == "a"] == [uuid_a]


def test_two_results_under_one_label_set_become_one_sample_with_the_worse_status() -> None:
    base = load_report(SYNTHETIC)
    same = _result("p2p.pair", Status.PASS, base.meta.host, value=300.0, unit="GB/s")
    report = dataclasses.replace(base, results=[same, dataclasses.replace(same, status=Status.FAIL, value=200.0)])
    found = samples(render_metrics(report))
    assert found["gpucert_result_status"] == [(found["gpucert_result_status"][0][0], 4.0)]
    assert len(found["gpucert_result_bytes_per_second"]) == 1


def test_health_writes_the_metrics_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gpucert-health.prom"
    argv = ["health", "--replay", str(NODE_BUNDLES / "h100"), "--set", "health.expected_gpus=8"]
    assert main([*argv, "-o", str(tmp_path / "run"), "--metrics-file", str(path), "--json"]) == 2
    found = samples(path.read_text())
    assert only(found, "gpucert_result_status", check="gpu.count", node="h100", verb="health") == 4
    assert only(found, "gpucert_result_gpus", check="gpu.count") == 1
    assert only(found, "gpucert_run_status", node="h100") == 4
    # The file says what the report says.
    report = load_report(tmp_path / "run")
    assert path.read_text() == render_metrics(report).replace(
        _line(render_metrics(report), "gpucert_run_finished"), _line(path.read_text(), "gpucert_run_finished")
    )


def _line(text: str, prefix: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(prefix))


def test_a_metrics_file_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["health", "--replay", str(NODE_BUNDLES / "h100"), "-o", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--metrics-file", str(tmp_path / "missing" / "g.prom")])
    assert refused.value.code == 3
    err = capsys.readouterr().err
    assert f"argument --metrics-file: {tmp_path / 'missing'} does not exist" in err
    assert not (tmp_path / "run").exists()  # refused before anything ran
    with pytest.raises(SystemExit):
        main([*argv, "--metrics-file", str(tmp_path)])
    assert "is a directory: name the file" in capsys.readouterr().err
    # Root passes os.access everywhere: /proc said yes, and the write failed after the benchmarks.
    with pytest.raises(SystemExit):
        main([*argv, "--metrics-file", "/proc/g.prom"])
    assert "argument --metrics-file: /proc: cannot write a file there: " in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit):
        main([*argv, "--metrics-file", str(tmp_path / "afile" / "g.prom")])
    assert f"{tmp_path / 'afile'} is not a directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # the probe is gone


def test_a_rank_of_gpucerts_launcher_neither_probes_nor_writes_the_metrics_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its node process checked the path before starting the ranks and writes the file once after them."""
    from gpucert.cli import _show
    from gpucert.runtime.launch_env import VERDICT_FILE

    monkeypatch.setenv(VERDICT_FILE, str(tmp_path / "verdict"))
    gone = tmp_path / "gone" / "g.prom"
    assert metrics_path(str(gone)) == gone  # no probe: refusing it now would stop a run that was fine to start
    args = argparse.Namespace(metrics_file=gone, npd=False, json=True, verb="health")
    assert _show(RunOutcome(load_report(SYNTHETIC), None, 0), args, make_console()) == 0  # no write, so no error
    assert not gone.parent.exists()


def test_write_metrics_error_names_the_file(tmp_path: Path) -> None:
    target = tmp_path / "gone" / "g.prom"
    with pytest.raises(Exception, match=r"--metrics-file .*gone/g.prom: cannot write it"):
        write_metrics(load_report(SYNTHETIC), target)


class TextfileCollector(Collector):
    """node_exporter's textfile collector in miniature: the file re-read and served on every scrape."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def collect(self) -> Iterator:  # type: ignore[type-arg]
        yield from text_string_to_metric_families(self.path.read_text())


@pytest.fixture
def prometheus_binary() -> str:
    reason = prometheus_server.reason_cannot_install()
    if reason is not None:
        pytest.skip(reason)
    try:
        return prometheus_server.install()
    except prometheus_server.PrometheusSetupError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.mark.slow
def test_real_prometheus_scrapes_a_fail(tmp_path: Path, prometheus_binary: str) -> None:
    path = tmp_path / "gpucert-health.prom"
    argv = ["health", "--replay", str(NODE_BUNDLES / "h100"), "--set", "health.expected_gpus=8", "--json"]
    assert main([*argv, "-o", str(tmp_path / "run"), "--metrics-file", str(path)]) == 2
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TextfileCollector(path))
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    prometheus = prometheus_server.start(prometheus_binary, tmp_path, f"127.0.0.1:{server.server_port}")
    try:
        failed = prometheus.wait_for("gpucert_result_status == 4", timeout_s=60)
        assert [(r["metric"]["check"], r["metric"]["node"], r["metric"]["job"]) for r in failed] == [
            ("gpu.count", "h100", "gpucert")
        ]
        assert prometheus.query('gpucert_run_status{node="h100",verb="health"}')[0]["value"][1] == "4"
        uuid = load_report(tmp_path / "run").inventory["gpus"][0]["uuid"]
        temperature = prometheus.query('gpucert_result_celsius{check="gpu.temperature"}')
        assert [(r["metric"]["gpu"], r["metric"]["uuid"]) for r in temperature] == [("0", uuid)]
    finally:
        prometheus_server.stop(prometheus)
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_report_writes_metrics_of_a_run_and_of_a_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "accept.prom"
    assert main(["report", str(SYNTHETIC), "--metrics-file", str(path)]) == 2
    assert path.read_text() == render_metrics(load_report(SYNTHETIC))
    runs = []
    for node in ("gpu-a", "gpu-b"):
        # A bundle names its host; its sysfs links are copied as links.
        bundle = shutil.copytree(NODE_BUNDLES / "h200x4", tmp_path / "bundles" / node, symlinks=True)
        runs.append(str(tmp_path / node))
        argv = ["health", "--replay", str(bundle), "--set", "health.expected_gpus=4", "--json"]
        assert main([*argv, "-o", runs[-1]]) == 0
    merged = tmp_path / "cluster.prom"
    assert main(["report", "merge", *runs, "-o", str(tmp_path / "merged"), "--metrics-file", str(merged)]) == 0
    found = samples(merged.read_text())
    assert {labels["node"] for labels, _ in found["gpucert_run_status"]} == {"gpu-a", "gpu-b", ""}
    assert {labels["node"] for labels, _ in found["gpucert_result_status"]} >= {"gpu-a", "gpu-b"}


ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "gpucert-alerts.yaml"


def _series(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_alert_rules_fire_on_a_real_fail(tmp_path: Path, prometheus_binary: str) -> None:
    """promtool (Debian's prometheus package) checks deploy/prometheus/gpucert-alerts.yaml and evaluates it on the
    series of a real FAIL report: GpucertCheckFailed fires for the failing check, with its labels, and no other."""
    promtool = str(Path(prometheus_binary).with_name("promtool"))
    path = tmp_path / "gpucert-health.prom"
    argv = ["health", "--replay", str(NODE_BUNDLES / "h100"), "--set", "health.expected_gpus=8", "--json"]
    assert main([*argv, "-o", str(tmp_path / "run"), "--metrics-file", str(path)]) == 2
    found = samples(path.read_text())
    inputs = [
        {"series": name + _series(labels), "values": f"{value:g}x5"}
        for name, rows in found.items()
        if name != "gpucert_run_finished_timestamp_seconds"  # promtool's clock starts at 0: no staleness here
        for labels, value in rows
    ]
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    failed = next(r for r in rules if r["alert"] == "GpucertCheckFailed")
    (labels,) = [labels for labels, value in found["gpucert_result_status"] if value == 4]

    def render(template: str) -> str:
        """Go's template, as far as the rules use it: {{ $labels.x }} and {{ if $labels.x }}...{{ end }}."""
        condition = r"\{\{ if \$labels\.(\w+) \}\}(.*?)\{\{ end \}\}"
        shown = re.sub(condition, lambda m: m.group(2) if labels[m.group(1)] else "", template)
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], shown)

    test = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "alert_rule_test": [
                    {
                        "eval_time": "2m",
                        "alertname": "GpucertCheckFailed",
                        "exp_alerts": [
                            {
                                # Prometheus drops a label whose value is empty (gpu, uuid on a node check).
                                "exp_labels": {**{k: v for k, v in labels.items() if v}, **failed["labels"]},
                                "exp_annotations": {k: render(v) for k, v in failed["annotations"].items()},
                            }
                        ],
                    },
                    {"eval_time": "2m", "alertname": "GpucertCheckError", "exp_alerts": []},
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    for args in (["check", "rules", str(ALERTS)], ["test", "rules", str(tmp_path / "test.yaml")]):
        command = [promtool, *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert labels["check"] == "gpu.count"


def test_the_report_of_this_run_is_known_by_its_file_not_its_clock(tmp_path: Path) -> None:
    """Node 0's process takes the report its rank 0 wrote (for --metrics-file, a partial report's path) by the file
    having changed since the ranks started. By mtime, a shared filesystem whose server clock runs behind made this
    run's report look older than the run, and the metrics file was silently not written."""
    from gpucert.acceptance import _written_since
    from gpucert.report.store import file_identity, write_report

    path = tmp_path / "report.json"
    before = file_identity(path)
    assert _written_since(path, before) is None  # none yet
    write_report(load_report(SYNTHETIC), tmp_path)
    os.utime(path, (0, 0))  # written "in 1970": the server's clock
    assert _written_since(path, before) == path
    earlier = file_identity(path)
    assert _written_since(path, earlier) is None  # an earlier run's report, untouched, is not this run's
