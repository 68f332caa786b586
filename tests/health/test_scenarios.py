"""Scenario fixtures: real node bundles (captured on the lent H100 and 4xH200) altered one fault at a time.

Each tests/fixtures/scenarios/<name>.yaml names its base bundle, the NVML answers, files or kernel log lines
it changes, and the verdict `gpucert health --replay` must reach: exit code and the named results' status,
value and message fragments. Every result not named must be PASS or SKIP, so a scenario also proves that
one fault does not spill into unrelated checks.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.conftest import FIXTURES

from gpucert.cli import main

SCENARIOS = sorted(p for p in (FIXTURES / "scenarios").glob("*.yaml") if "expect" in yaml.safe_load(p.read_text()))


def apply_scenario(bundle: Path, scenario: dict[str, Any]) -> None:
    snapshot_path = bundle / "nvml-snapshot.json"
    snapshot = json.loads(snapshot_path.read_text())
    for index, answers in (scenario.get("nvml") or {}).items():
        for key, value in answers.items():
            assert key in snapshot["devices"][int(index)], f"scenario sets {key}, which the snapshot never recorded"
            snapshot["devices"][int(index)][key] = value
    for index in scenario.get("lose_gpus") or []:
        # As collect_nvml_snapshot records a GPU whose handle NVML refuses (NVML_ERROR_GPU_IS_LOST = 15).
        lost = {"nvml_error": "NVMLError_GpuIsLost", "code": 15, "message": "GPU is lost"}
        snapshot["devices"][index] = {"nvmlDeviceGetHandleByIndex": lost}
        snapshot["pairs"] = {k: v for k, v in snapshot["pairs"].items() if str(index) not in k.split(",")}
    removed = set(scenario.get("remove_gpus") or [])
    if removed:
        keep = [i for i in range(snapshot["device_count"]) if i not in removed]
        renumber = {old: new for new, old in enumerate(keep)}
        snapshot["devices"] = [snapshot["devices"][i] for i in keep]
        snapshot["pairs"] = {
            f"{renumber[a]},{renumber[b]}": v
            for k, v in snapshot["pairs"].items()
            for a, b in [map(int, k.split(","))]
            if a in renumber and b in renumber
        }
        snapshot["device_count"] = len(keep)
    snapshot_path.write_text(json.dumps(snapshot))
    if scenario.get("no_nvml"):
        snapshot_path.unlink()  # as a bundle captured where NVML could not start
    for rel, text in (scenario.get("files") or {}).items():
        path = bundle / "root" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{text}\n")
    if scenario.get("env"):
        # The environment the node was judged in (a Slurm job's variables), over the captured one.
        env_path = bundle / "environment.json"
        env = json.loads(env_path.read_text()) if env_path.exists() else {}
        env_path.write_text(json.dumps({**env, **scenario["env"]}))
    if "kernel_log_append" in scenario:
        stamp = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S,000000+00:00")
        with open(bundle / "dmesg.txt", "a") as fh:
            fh.write(scenario["kernel_log_append"].format(one_hour_ago=stamp) + "\n")


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path, bundle_copy, tmp_path: Path, capsys) -> None:
    scenario = yaml.safe_load(path.read_text())
    bundle = bundle_copy(scenario["base"])
    apply_scenario(bundle, scenario)
    argv = ["health", "--replay", str(bundle), "--output", str(tmp_path / "run"), "--json"]
    for item in scenario.get("set", []):
        argv += ["--set", item]
    if "profile" in scenario:
        argv += ["--profile", str(path.parent / scenario["profile"])]

    exit_code = main(argv)
    report = json.loads(capsys.readouterr().out)
    expect = scenario["expect"]

    assert exit_code == expect["exit_code"], [(r["name"], r["status"], r["message"]) for r in report["results"]]
    assert report["exit_code"] == exit_code
    if "topology_summary" in expect:
        assert report["inventory"]["topology"]["summary"] == expect["topology_summary"]
    named = []
    for want in expect["results"]:
        keys = {k: want[k] for k in ("name", "gpu_index", "subject") if k in want}
        matches = [r for r in report["results"] if all(r.get(k) == v for k, v in keys.items())]
        assert len(matches) == 1, f"expected one result matching {keys}, found {len(matches)}"
        result = matches[0]
        named.append(result)
        assert result["status"] == want["status"], result
        if "value" in want:
            assert result["value"] == want["value"], result
        if "threshold_source" in want:
            assert result["threshold_source"] == want["threshold_source"]
        for fragment in want.get("message", []):
            assert fragment in result["message"], result["message"]
        if want["status"] in ("WARN", "FAIL", "ERROR"):
            assert result["remediation"], f"{result['name']} says what is wrong but not what to do"
    # A scenario may declare GPUs whose every check is expected to go bad (a GPU NVML lost).
    spoiled = set(expect.get("bad_gpus", []))
    others = [
        r
        for r in report["results"]
        if r not in named and r["status"] not in ("PASS", "SKIP") and r["gpu_index"] not in spoiled
    ]
    assert not others, f"unrelated checks changed status: {[(r['name'], r['status'], r['message']) for r in others]}"
