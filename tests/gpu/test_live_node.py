"""On a real GPU node (the lent H100 / H200 machines): the live path agrees with nvidia-smi and replays exactly.

Run there with `python -m pytest -m gpu tests/gpu`; elsewhere these tests are skipped.
"""

from __future__ import annotations

import json
import subprocess

import pynvml
import pytest

from gpucert.cli import main
from gpucert.hardware.gpus import parse_nvml_snapshot, parse_topo_matrix
from gpucert.hardware.nvml import SnapshotNvml, collect_nvml_snapshot
from gpucert.health.liveness import SubprocessLivenessProbe

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def live_snapshot() -> dict:
    return collect_nvml_snapshot(pynvml)


def test_topology_matches_nvidia_smi(live_snapshot: dict) -> None:
    text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=True).stdout
    assert parse_nvml_snapshot(live_snapshot).topology.matrix == parse_topo_matrix(text)


def test_replay_of_a_live_snapshot_is_exact(live_snapshot: dict) -> None:
    replayed = collect_nvml_snapshot(SnapshotNvml(json.loads(json.dumps(live_snapshot))))
    # Power draw, clocks and temperature move between two reads; everything else must be identical.
    moving = ("PowerUsage", "ClockInfo", "Temperature(0)", "UtilizationRates", "MemoryInfo")
    for live, again in zip(live_snapshot["devices"], replayed["devices"], strict=True):
        for key, value in live.items():
            if not any(m in key for m in moving):
                assert again[key] == value, key


def test_liveness_passes_and_gpus_agree_bit_for_bit() -> None:
    results = SubprocessLivenessProbe().run(timeout_s=120)
    assert results and all(r.ok for r in results), results
    assert len({r.digest for r in results}) == 1


def test_health_on_this_node_has_no_fail_or_error(live_snapshot: dict, tmp_path, capsys) -> None:
    count = live_snapshot["device_count"]
    exit_code = main(["health", "--set", f"health.expected_gpus={count}", "-o", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    bad = [(r["name"], r["subject"], r["message"]) for r in report["results"] if r["status"] in ("FAIL", "ERROR")]
    assert not bad
    assert exit_code in (0, 1)
    liveness = [r for r in report["results"] if r["name"] == "gpu.liveness"]
    assert len(liveness) == count and all(r["status"] == "PASS" for r in liveness)
