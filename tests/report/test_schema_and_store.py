from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

import gpucert.report
from gpucert.config.loader import describe_os_error
from gpucert.report import store
from gpucert.report.markdown import render_markdown
from gpucert.report.schema import SCHEMA_VERSION, Report, Result, RunMeta
from gpucert.report.store import load_report, write_report
from gpucert.status import Status

SCHEMA = json.loads((Path(gpucert.report.__file__).parent / "report.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)

INVENTORY: dict[str, Any] = {
    "hostname": "n1",
    "summary": "s",
    "gpus": [],
    "topology": {"matrix": [], "nvlink_counts": [], "summary": "no GPUs"},
}

META = RunMeta(
    tool_version="0.1.0",
    method_version="1",
    verb="health",
    command=["gpucert", "health", "--set", "health.expected_gpus=8"],
    host="n1",
    started_at="2026-11-21T18:50:00+00:00",
    finished_at="2026-11-21T18:50:12+00:00",
    duration_s=12.34,
    profile="h100-sxm",
    config={"profile": "auto", "runs_dir": "runs", "health": {"expected_gpus": 8, "liveness": True}},
    software={"driver": "580.159.04", "torch": "2.6.0"},
)

PASS_RESULT = Result(
    name="gpu.count",
    subject="node",
    status=Status.PASS,
    message="expected 8 GPUs, found 8",
    value=8,
    unit="GPUs",
    expected="8",
    threshold_source="config health.expected_gpus",
    # Shown only for problems: a PASS must not tell anyone to act.
    remediation="nothing to do",
)
WARN_RESULT = Result(
    name="gpu.temperature",
    subject="GPU 3",
    status=Status.WARN,
    message="expected below 80 C, found 83 C | hot aisle?",
    value=83.0,
    unit="C",
    expected="< 80 C",
    threshold_source="profile h100-sxm: gpu.temperature_c_warn",
    remediation="check the airflow",
    gpu_index=3,
)
FAIL_RESULT = Result(
    name="gpu.ecc",
    subject="GPU 5",
    status=Status.FAIL,
    message="expected 0 uncorrectable ECC errors, found 3\non GPU 5",
    value=3,
    expected="0",
    threshold_source="fixed: any uncorrectable error",
    remediation="drain the node | RMA GPU 5",
    gpu_index=5,
    details={"volatile": {"dram": 3, "sram": 0}},
)


def make_report(results: list[Result] | None = None) -> Report:
    return Report(
        meta=META,
        inventory=INVENTORY,
        results=[PASS_RESULT, WARN_RESULT, FAIL_RESULT] if results is None else results,
    )


def schema_errors(data: dict[str, Any]) -> list[str]:
    return sorted(error.message for error in VALIDATOR.iter_errors(data))


# schema


def test_report_dict_validates_against_the_json_schema() -> None:
    assert schema_errors(make_report().to_dict()) == []


def test_the_json_schema_rejects_what_it_should() -> None:
    data = make_report().to_dict()
    data["status"] = "OK"
    data["results"][0]["extra"] = 1
    data["results"][1]["gpu_index"] = -1
    data["meta"]["started_at"] = "yesterday"
    data["schema_version"] = "3.0"
    assert schema_errors(data) == [
        "'3.0' does not match '^[12]\\\\.[0-9]+$'",
        "'OK' is not one of ['SKIP', 'INFO', 'PASS', 'WARN', 'FAIL', 'ERROR']",
        "'yesterday' is not a 'date-time'",
        "-1 is less than the minimum of 0",
        "Additional properties are not allowed ('extra' was unexpected)",
    ]


def test_report_status_exit_code_and_counts() -> None:
    report = make_report()
    assert report.status is Status.FAIL
    data = report.to_dict()
    assert data["schema_version"] == SCHEMA_VERSION == "2.1"
    assert data["status"] == "FAIL"
    assert data["exit_code"] == 2
    assert data["counts"] == {"SKIP": 0, "INFO": 0, "PASS": 1, "WARN": 1, "FAIL": 1, "ERROR": 0}
    assert data["meta"]["tool"] == "gpucert"
    assert data["inventory"] == INVENTORY


def test_result_dict_carries_every_field_with_the_status_as_text() -> None:
    assert FAIL_RESULT.to_dict() == {
        "name": "gpu.ecc",
        "subject": "GPU 5",
        "status": "FAIL",
        "message": "expected 0 uncorrectable ECC errors, found 3\non GPU 5",
        "value": 3,
        "unit": None,
        "expected": "0",
        "threshold_source": "fixed: any uncorrectable error",
        "remediation": "drain the node | RMA GPU 5",
        "category": "health",
        "gpu_index": 5,
        "details": {"volatile": {"dram": 3, "sram": 0}},
        "node": None,
    }


@pytest.mark.parametrize(
    ("statuses", "status", "exit_code"),
    [
        ([], "SKIP", 0),
        ([Status.PASS, Status.SKIP], "PASS", 0),
        ([Status.PASS, Status.WARN], "WARN", 1),
        ([Status.ERROR, Status.FAIL, Status.PASS], "ERROR", 3),
    ],
)
def test_report_status_is_the_worst_result(statuses: list[Status], status: str, exit_code: int) -> None:
    results = [dataclasses.replace(PASS_RESULT, status=s) for s in statuses]
    data = make_report(results).to_dict()
    assert (data["status"], data["exit_code"]) == (status, exit_code)
    assert sum(data["counts"].values()) == len(statuses)
    assert schema_errors(data) == []


def test_from_dict_round_trips() -> None:
    report = make_report()
    assert Report.from_dict(report.to_dict()) == report
    again = Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    assert again.results[1].status is Status.WARN


def test_from_dict_reads_a_newer_minor_version() -> None:
    data = make_report().to_dict()
    data["schema_version"] = "2.7"
    assert Report.from_dict(data).schema_version == "2.7"


def test_a_1x_report_without_nodes_is_still_read_and_valid() -> None:
    """Reports written before results named their node: no `node` per result, no `nodes`."""
    data = make_report().to_dict()
    data["schema_version"] = "1.0"
    del data["nodes"]
    for result in data["results"]:
        del result["node"]
    assert schema_errors(data) == []
    report = Report.from_dict(data)
    assert report.nodes == {} and all(r.node is None for r in report.results)


@pytest.mark.parametrize(("version", "shown"), [("3.0", "'3.0'"), ("10.0", "'10.0'")])
def test_from_dict_rejects_another_major_version(version: str | None, shown: str) -> None:
    data = make_report().to_dict()
    data["schema_version"] = version
    with pytest.raises(ValueError) as info:
        Report.from_dict(data)
    assert str(info.value) == f"report schema {shown} is not readable by this gpucert (reads 1.x, 2.x)"


def _without(key: str) -> Any:
    data = make_report().to_dict()
    del data[key]
    return data


def _result_changed(**changes: Any) -> Any:
    data = make_report().to_dict()
    data["results"][1] = {k: v for k, v in {**data["results"][1], **changes}.items() if v is not None}
    return data


def _changed(part: str, **changes: Any) -> Any:
    data = make_report().to_dict()
    data[part].update(changes)
    return data


def _gpu_changed(drop: str | None = None, **changes: Any) -> Any:
    data = make_report().to_dict()
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_gib": 79.6, **changes}
    data["inventory"] = {**data["inventory"], "gpus": [{k: v for k, v in gpu.items() if k != drop}]}
    return data


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ([], "the file holds a JSON list; a gpucert report is an object"),
        (42, "the file holds a JSON number; a gpucert report is an object"),
        ({"driver": "550"}, "no schema_version: not a gpucert report (every report.json gpucert writes has one)"),
        (_without("meta"), "meta is missing, expected an object"),
        (_without("results"), "results is missing, expected a list"),
        ({**make_report().to_dict(), "results": {}}, "results is a JSON object, expected a list"),
        ({**make_report().to_dict(), "results": []}, "results is empty: this `gpucert health` report judged nothing"),
        (_result_changed(name=None), "results[1] has no name: every result names its check, subject, status"),
        (
            _result_changed(status="OK"),
            "results[1] (gpu.temperature): status 'OK' is not one of SKIP, INFO, PASS, WARN",
        ),
        # A field of the wrong type is named on load; each of these broke a renderer later with a bare TypeError.
        (_result_changed(message=12), "results[1] (gpu.temperature): message is a number, expected a string"),
        (_result_changed(gpu_index="0"), "results[1] (gpu.temperature): gpu_index is a string, expected an integer"),
        (_result_changed(gpu_index=True), "results[1] (gpu.temperature): gpu_index is a boolean, expected an integer"),
        (_result_changed(details=[]), "results[1] (gpu.temperature): details is a list, expected an object"),
        (_changed("meta", duration_s="5 s"), "meta: duration_s is a string, expected a number"),
        (_changed("meta", nodes=None), "meta: nodes is null, expected a list"),
        (_changed("meta", nodes=["a", 2]), "meta.nodes[1] is a number, expected a string (a node label)"),
        (_changed("meta", command="gpucert accept"), "meta: command is a string, expected a list"),
        ({**make_report().to_dict(), "nodes": ["a"]}, "nodes is a JSON list, expected an object (node label ->"),
        (_gpu_changed(index="0"), "inventory.gpus[0]: index is a string, expected an integer"),
        (_gpu_changed(memory_total_gib="80"), "inventory.gpus[0]: memory_total_gib is a string, expected a number"),
        (_gpu_changed(name=None, drop="name"), "inventory.gpus[0] has no name: every GPU of an inventory has its"),
        ({**make_report().to_dict(), "nodes": {"a": {"gpus": {}}}}, "nodes.a.gpus is an object, expected a list"),
    ],
)
def test_from_dict_names_what_is_missing_or_wrong(data: Any, said: str) -> None:
    """Not a report, or one missing a part: one line naming the key and what was expected, never Python's own
    words (`'list' object has no attribute 'get'`, `__init__() missing 1 required positional argument`)."""
    with pytest.raises(ValueError) as info:
        Report.from_dict(data)
    assert str(info.value).startswith(said), str(info.value)


def test_a_newer_minor_versions_keys_are_left_unread() -> None:
    data = make_report().to_dict()
    data["schema_version"], data["meta"]["newmeta"], data["results"][0]["newkey"] = "2.9", 1, 2
    assert Report.from_dict(data).results[0].name == make_report().results[0].name


def test_a_pass_with_no_threshold_before_schema_2_1_is_read_as_info() -> None:
    """Before 2.1 a figure held to nothing could read PASS; every view now reads it as what it was."""
    data = make_report().to_dict()
    data["schema_version"] = "1.0"
    data["results"][0].update(status="PASS", expected=None, message="3.1 TB/s")
    first = Report.from_dict(data).results[0]
    assert first.status is Status.INFO
    assert first.message == "shown, not judged (PASS with no threshold in a schema 1.0 report): 3.1 TB/s"
    data["schema_version"] = "2.1"  # against the schema (a PASS names its threshold): read the same way, not refused
    first = Report.from_dict(data).results[0]
    assert first.status is Status.INFO
    assert first.message == "shown, not judged (PASS with no threshold against the schema): 3.1 TB/s"
    data["results"][0]["expected"] = ">= 3"
    assert Report.from_dict(data).results[0].status is Status.PASS


# store


def test_write_report_writes_json_and_markdown(tmp_path: Path) -> None:
    report = make_report()
    directory = tmp_path / "runs" / "20261121T185000Z-n1"
    path = write_report(report, directory)
    assert path == directory / "report.json"
    # No temporary files left behind by the atomic writes.
    assert sorted(p.name for p in directory.iterdir()) == ["report.json", "report.md"]
    assert json.loads(path.read_text()) == report.to_dict()
    assert (directory / "report.md").read_text() == render_markdown(report)


def test_write_report_replaces_an_earlier_report(tmp_path: Path) -> None:
    write_report(make_report(), tmp_path)
    write_report(make_report([PASS_RESULT]), tmp_path)
    assert load_report(tmp_path).status is Status.PASS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]


def test_load_report_from_directory_and_from_file(tmp_path: Path) -> None:
    report = make_report()
    path = write_report(report, tmp_path / "run")
    assert load_report(tmp_path / "run") == report
    assert load_report(path) == report


def test_written_report_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_report(make_report(), tmp_path)
    finally:
        os.umask(old)
    modes = {name: stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("report.json", "report.md")}
    assert modes == {"report.json": 0o644, "report.md": 0o644}


def test_corrupt_report_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text('{"schema_version": "1.0",')
    with pytest.raises(ValueError) as info:
        load_report(tmp_path)
    assert str(info.value) == (
        f"{path}: not a readable gpucert report: not JSON: Expecting property name enclosed in double quotes at "
        "line 1 column 26 (cut short, or not a report.json?)"
    )
    path.write_text("\n")
    with pytest.raises(ValueError, match="the file is empty"):
        load_report(path)


def test_an_unfinished_fine_tuning_run_is_named_with_how_to_finish_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints" / "step-20").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {name: tiny}\n")
    with pytest.raises(ValueError) as info:
        load_report(run)
    assert str(info.value) == (
        f"{run}: a fine-tuning run that has not finished (no report.json yet; checkpoints in {run / 'checkpoints'}): "
        f"finish it with gpucert finetune --config {run / 'config.yaml'} --output {run} --resume auto"
    )


def test_report_missing_a_section_names_the_path(tmp_path: Path) -> None:
    data = make_report().to_dict()
    del data["meta"]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        load_report(path)
    assert str(info.value) == f"{path}: not a readable gpucert report: meta is missing, expected an object"


def test_report_of_another_major_version_names_the_path(tmp_path: Path) -> None:
    data = make_report().to_dict()
    data["schema_version"] = "3.0"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        load_report(path)
    assert str(info.value) == (
        f"{path}: not a readable gpucert report: report schema '3.0' is not readable by this gpucert (reads 1.x, 2.x)"
    )


def test_missing_report_names_the_path(tmp_path: Path) -> None:
    """Said in words, not as Python's `[Errno 2] No such file or directory`."""
    with pytest.raises(ValueError) as info:
        load_report(tmp_path)
    assert str(info.value) == (
        f"{tmp_path}: no report.json: not a gpucert run directory, or a run that stopped before writing its report "
        "(its logs/ and stderr say why)"
    )
    with pytest.raises(ValueError) as info:
        load_report(tmp_path / "nothere")
    assert str(info.value) == f"{tmp_path / 'nothere'}: no such run directory or report.json"


# markdown

EXPECTED_MARKDOWN = "\n".join(
    [
        "# gpucert health: FAIL on n1",
        "",
        "- **Node:** s",
        "- **Profile:** h100-sxm",
        "- **When:** 2026-11-21T18:50:00+00:00 (12.3 s)",
        "- **Tool:** gpucert 0.1.0, method 1, schema 2.1",
        "- **Command:** `gpucert health --set health.expected_gpus=8`",
        "- **Verdict:** FAIL (exit code 2); 1 PASS, 1 WARN, 1 FAIL",
        "",
        "## Results",
        "",
        "| status | check | subject | value | expected | message |",
        "|---|---|---|---|---|---|",
        "| PASS | gpu.count | node | 8 GPUs | 8 | expected 8 GPUs, found 8 |",
        "| WARN | gpu.temperature | GPU 3 | 83 C | < 80 C | expected below 80 C, found 83 C \\| hot aisle? "
        "→ check the airflow |",
        "| FAIL | gpu.ecc | GPU 5 | 3 | 0 | expected 0 uncorrectable ECC errors, found 3<br>on GPU 5 → drain the node "
        "\\| RMA GPU 5 |",
        "",
    ]
)


def test_markdown_matches_the_golden_rendering() -> None:
    assert render_markdown(make_report()) == EXPECTED_MARKDOWN


def test_markdown_has_the_verdict_and_one_row_per_result() -> None:
    lines = render_markdown(make_report()).splitlines()
    assert "- **Verdict:** FAIL (exit code 2); 1 PASS, 1 WARN, 1 FAIL" in lines
    rows = [line for line in lines if line.startswith(("| PASS ", "| WARN ", "| FAIL "))]
    assert [row.split(" | ")[1] for row in rows] == ["gpu.count", "gpu.temperature", "gpu.ecc"]
    # Escaped pipes keep every row at the header's six columns.
    assert {row.replace("\\|", "").count("|") for row in rows} == {7}


def test_markdown_without_results_has_no_results_table() -> None:
    text = render_markdown(make_report([]))
    assert "- **Verdict:** SKIP (exit code 0); " in text
    assert "## Results" not in text
    assert "## GPUs" not in text


def test_markdown_lists_gpus_when_the_inventory_has_them() -> None:
    gpu = {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-0",
        "bus_id": "00000000:19:00.0",
        "memory_total_gib": 79.6,
        "pcie_gen_current": 5,
        "pcie_width_current": 16,
        "nvlinks": [{"active": True}] * 17 + [{"active": False}],
        "vbios": "96.00.74.00.01",
    }
    inventory = {**INVENTORY, "gpus": [gpu], "topology": {"matrix": [["X"]], "summary": "1 GPU"}}
    report = Report(meta=META, inventory=inventory, results=[PASS_RESULT])
    assert schema_errors(report.to_dict()) == []
    lines = render_markdown(report).splitlines()
    assert "| 0 | NVIDIA H100 80GB HBM3 | 00000000:19:00.0 | 79.6 GiB | Gen5 x16 | 17 | 96.00.74.00.01 |" in lines
    assert "Topology: 1 GPU" in lines


# terminal


@pytest.mark.parametrize("results", [None, []], ids=["judged", "discover"])
def test_terminal_header_names_tool_method_and_schema_versions(results: list[Result] | None) -> None:
    from rich.console import Console

    from gpucert.report.terminal import print_report

    console = Console(record=True, width=160)
    print_report(make_report(results), console, show_inventory=False, report_path=None)
    assert "gpucert health, profile h100-sxm  (gpucert 0.1.0, method 1, schema 2.1)" in console.export_text()


def test_a_check_cannot_make_a_pass_without_a_threshold() -> None:
    """The rule is held where results are made: a check that forgets its threshold fails its first test (two
    cluster checks did, unnoticed, until 2026-11-30), not a user's report."""
    with pytest.raises(ValueError, match=r"localize\.node on n1: a PASS must name what it was held to"):
        Result(name="localize.node", subject="n1", status=Status.PASS, message="passes")
    # A figure that came out nan passes every `value < floor` test: it is an ERROR, not a crash of the run.
    nan = Result(name="x", subject="n1", status=Status.PASS, message="m", value=float("nan"), expected=">= 1")
    assert (nan.status, nan.message) == (Status.ERROR, "measured nan, not a number to judge: m")
    inf = Result(name="x", subject="n1", status=Status.PASS, message="m", value=float("inf"), expected=">= 1")
    assert inf.status is Status.ERROR
    assert Result(name="x", subject="n1", status=Status.INFO, message="m", value=float("nan")).status is Status.INFO


def test_from_schema_2_1_a_pass_must_name_what_it_was_held_to() -> None:
    """A PASS that could not have failed misleads: from 2.1 the schema refuses one without `expected` (INFO is
    the status for a shown, unjudged figure); 2.0 reports, written before the rule, still validate."""
    data = make_report([PASS_RESULT]).to_dict()
    data["results"][0]["expected"] = None
    assert schema_errors(data) == ["None is not of type 'string'"]
    data["results"][0]["status"] = "INFO"
    assert schema_errors(data) == []
    data["results"][0]["status"] = "PASS"
    data["schema_version"] = "2.0"
    assert schema_errors(data) == []


def test_a_full_disk_while_writing_names_the_file_and_leaves_nothing(tmp_path: Path) -> None:
    """A write's ENOSPC carries no file name: gpucert said only "No space left on device (errno 28)"."""

    def chunks() -> Iterator[str]:
        yield "{"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as caught:
        store.write_atomic(tmp_path / "report.json", chunks())
    assert describe_os_error(caught.value) == f"{tmp_path / 'report.json'}: No space left on device"
    assert list(tmp_path.iterdir()) == []


def test_a_report_cut_inside_a_string_reads_once_at(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text('{"meta": {"verb": "acc')
    with pytest.raises(ValueError) as caught:
        load_report(tmp_path)
    assert "not JSON: Unterminated string starting at line 1 column 19 (cut short" in str(caught.value), caught.value


def test_an_older_inventorys_gpu_with_only_index_and_name_renders_everywhere() -> None:
    """An inventory from an older gpucert may lack keys a later one writes (bus id, links, a topology): each
    view shows "-" for them where Markdown and the terminal stopped with a KeyError."""
    from rich.console import Console

    from gpucert.report.html import render_html
    from gpucert.report.terminal import print_report

    data = _gpu_changed()
    data["inventory"]["gpus"][0] = {"index": 0, "name": "NVIDIA H100 80GB HBM3"}
    del data["inventory"]["topology"]
    report = Report.from_dict(data)
    assert "| 0 | NVIDIA H100 80GB HBM3 | - | - | - | 0 | - |" in render_markdown(report)
    assert "Topology: -" in render_markdown(report)
    console = Console(record=True, width=160)
    print_report(report, console, show_inventory=True, report_path=None)
    assert "H100 80GB HBM3" in console.export_text()
    assert "H100 80GB HBM3" in render_html(report)


def test_a_rerun_in_a_directory_clears_a_first_reading_an_earlier_drain_kept(tmp_path: Path) -> None:
    """`health --drain --output DIR` keeps its first reading in DIR/first-reading/; a later run there that passed
    at once left it, an older run's report beside the new one."""
    kept = tmp_path / store.FIRST_READING
    kept.mkdir()
    (kept / "report.json").write_text("{}")
    (tmp_path / "report.json").write_text("{}")
    removed = store.clear_earlier_run(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in removed) == ["first-reading/report.json", "report.json"]
    assert not kept.exists()
    (kept).mkdir()
    (kept / "notes.txt").write_text("mine")  # not gpucert's: left, and so is the directory
    store.clear_earlier_run(tmp_path)
    assert (kept / "notes.txt").exists()
