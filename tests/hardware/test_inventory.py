"""Reading a captured node bundle (--replay): files of the wrong shape are named, never a traceback."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpucert.cli import main


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("software.json", '{"foo": 1}', None),  # a newer capture's extra name: left unread
        ("software.json", "[1]", "software.json: expected a JSON object, found a list"),
        ("environment.json", "not json", "environment.json: not readable as JSON: Expecting value"),
        ("nvml-snapshot.json", "[]", "cannot read NVML snapshot: expected a JSON object (a gpucert NVML snapshot)"),
    ],
)
def test_a_bundle_file_of_the_wrong_shape_is_named_not_a_traceback(
    bundle_copy: Any, name: str, text: str, said: str | None, capsys: Any
) -> None:
    """An extra key in software.json was a TypeError traceback; a list as nvml-snapshot.json an AttributeError."""
    bundle = bundle_copy("h100")
    (bundle / name).write_text(text)
    code = main(["discover", "--replay", str(bundle), "-o", str(bundle.parent / "run")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if said is None:
        assert code == 0, err
    else:
        assert code == 3 and said in err and str(bundle / name) in err, err


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda s: s.update(devices="x"), "devices: expected a list of 1 (device_count), found 'x'"),
        (lambda s: s.update(device_count="1"), "device_count: expected a count of GPUs, found '1'"),
        (lambda s: s.update(device_count=3), "devices: expected a list of 3 (device_count), found 1 entries"),
        (lambda s: s["devices"].__setitem__(0, [1]), "devices[0]: expected an object of NVML answers, found a list"),
        (lambda s: s.update(system=[]), "system: expected an object, found a list"),
    ],
)
def test_a_snapshot_of_the_wrong_structure_is_refused_naming_the_key(
    bundle_copy: Any, edit: Any, said: str, capsys: Any
) -> None:
    """A string for the device list or a list for one device was an AttributeError or TypeError traceback."""
    bundle = bundle_copy("h100")
    path = bundle / "nvml-snapshot.json"
    snapshot = json.loads(path.read_text())
    snapshot["devices"] = snapshot["devices"][:1]
    snapshot["device_count"] = 1
    snapshot["pairs"] = {}
    edit(snapshot)
    path.write_text(json.dumps(snapshot))
    code = main(["discover", "--replay", str(bundle), "-o", str(bundle.parent / "run")])
    err = capsys.readouterr().err
    assert code == 3 and said in err and str(path) in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("key", "value", "check", "said"),
    [
        ("nvmlDeviceGetMemoryInfo", {"total": "80GB", "used": 0}, "gpu.memory", "total: expected a number"),
        ("nvmlDeviceGetEccMode", 1, "gpu.ecc_mode", "expected a list of 2 or more, found int 1"),
        ("nvmlDeviceGetTemperature(0)", "hot", "gpu.temperature", "expected a number, found a str"),
    ],
)
def test_a_wrong_typed_answer_is_an_unreadable_field_said_by_its_check(
    bundle_copy: Any, key: str, value: Any, check: str, said: str, tmp_path: Any, capsys: Any
) -> None:
    """One answer of the wrong type (a damaged or hand-edited capture) was a traceback from inside the parser. It is
    that field unknown now: the check that needs it says ERROR with the reason; every other check still runs."""
    bundle = bundle_copy("h200x4")
    path = bundle / "nvml-snapshot.json"
    snapshot = json.loads(path.read_text())
    snapshot["devices"][3][key] = value
    path.write_text(json.dumps(snapshot))
    out = tmp_path / "run"
    main(["health", "--replay", str(bundle), "-o", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    results = json.loads((out / "report.json").read_text())["results"]
    mine = [r for r in results if r["name"] == check and "GPU 3 " in r.get("subject", "")]
    assert mine and mine[0]["status"] == "ERROR" and said in json.dumps(mine[0]), mine
    others = [r for r in results if r["name"] == check and "GPU 3 " not in r.get("subject", "")]
    assert others and all(r["status"] != "ERROR" for r in others)


def test_a_wrong_typed_system_answer_is_an_unknown_version_said_by_its_check(
    bundle_copy: Any, tmp_path: Any, capsys: Any
) -> None:
    """The driver version recorded as a number was an AttributeError from the version comparison, and no report."""
    bundle = bundle_copy("h200x4")
    path = bundle / "nvml-snapshot.json"
    snapshot = json.loads(path.read_text())
    snapshot["system"]["nvmlSystemGetDriverVersion"] = 550
    path.write_text(json.dumps(snapshot))
    out = tmp_path / "run"
    main(["health", "--replay", str(bundle), "-o", str(out)])
    assert "Traceback" not in capsys.readouterr().err
    results = json.loads((out / "report.json").read_text())["results"]
    (driver,) = [r for r in results if r["name"] == "software.driver"]
    assert driver["status"] == "ERROR" and "BadValue: expected a string, found 550" in driver["message"], driver
