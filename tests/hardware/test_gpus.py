"""NVML snapshot collection, replay and parsing, checked against nvidia-smi output captured on the same nodes."""

from __future__ import annotations

import json
import re

import pynvml
import pytest
from tests.conftest import NODE_BUNDLES

from gpucert.hardware.gpus import (
    clock_event_names,
    cpulist_from_mask,
    parse_nvml_snapshot,
    parse_topo_matrix,
    summarize_topology,
)
from gpucert.hardware.nvml import SNAPSHOT_FORMAT, SnapshotNvml, collect_nvml_snapshot

NODES = ["h100", "h200x4"]


def load_snapshot(node: str) -> dict:
    return json.loads((NODE_BUNDLES / node / "nvml-snapshot.json").read_text())


def smi_fields(node: str) -> list[dict[str, str]]:
    """Per-GPU `key : value` pairs of `nvidia-smi -q`, first occurrence of each key."""
    gpus: list[dict[str, str]] = []
    for line in (NODE_BUNDLES / node / "nvidia-smi-q.txt").read_text().splitlines():
        if re.match(r"^GPU [0-9A-Fa-f:.]+$", line):
            gpus.append({"bus": line.split()[1]})
        elif gpus and ":" in line:
            key, _, value = line.partition(":")
            gpus[-1].setdefault(key.strip(), value.strip())
    return gpus


@pytest.mark.parametrize("node", NODES)
def test_replay_answers_exactly_what_was_recorded(node: str) -> None:
    snapshot = load_snapshot(node)
    assert collect_nvml_snapshot(SnapshotNvml(snapshot)) == snapshot


def test_replay_raises_recorded_nvml_errors_with_their_code() -> None:
    nvml = SnapshotNvml(load_snapshot("h100"))
    with pytest.raises(pynvml.NVMLError) as info:
        nvml.nvmlDeviceGetNvLinkState(0, 0)
    assert info.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(pynvml.NVMLError):
        nvml.nvmlDeviceGetBoardId(0)  # never recorded: the fake must not invent answers


def test_snapshot_format_is_checked() -> None:
    with pytest.raises(ValueError, match="not a gpucert NVML snapshot"):
        SnapshotNvml({"format": "something-else"})
    assert load_snapshot("h100")["format"] == SNAPSHOT_FORMAT


@pytest.mark.parametrize("node", NODES)
def test_parsed_gpus_agree_with_nvidia_smi(node: str) -> None:
    inventory = parse_nvml_snapshot(load_snapshot(node))
    smi = smi_fields(node)
    assert len(inventory.gpus) == len(smi)
    for gpu, fields in zip(inventory.gpus, smi, strict=True):
        assert gpu.bus_id == fields["bus"]
        assert gpu.uuid == fields["GPU UUID"]
        assert gpu.serial == fields["Serial Number"]
        assert gpu.vbios == fields["VBIOS Version"]
        assert gpu.name == fields["Product Name"]
        # nvidia-smi prints MiB; we keep GiB with two decimals.
        assert gpu.memory_total_gib == pytest.approx(int(fields["Total"].split()[0]) / 1024, abs=0.01)
        assert gpu.persistence_mode is (fields["Persistence Mode"] == "Enabled")


@pytest.mark.parametrize("node", NODES)
def test_topology_matches_nvidia_smi_topo_m(node: str) -> None:
    inventory = parse_nvml_snapshot(load_snapshot(node))
    expected = parse_topo_matrix((NODE_BUNDLES / node / "nvidia-smi-topo-m.txt").read_text())
    assert inventory.topology.matrix == expected


def test_h200x4_values() -> None:
    inventory = parse_nvml_snapshot(load_snapshot("h200x4"))
    assert inventory.driver_version == "580.159.04"
    assert inventory.cuda_driver_version == "13.0"
    assert inventory.topology.summary == "NV18 all-to-all"
    gpu = inventory.gpus[2]
    assert (gpu.index, gpu.name, gpu.compute_capability) == (2, "NVIDIA H200", "9.0")
    assert gpu.memory_total_gib == 140.4
    assert (gpu.pcie_gen_current, gpu.pcie_width_current, gpu.pcie_gen_max, gpu.pcie_width_max) == (5, 16, 5, 16)
    assert gpu.active_nvlinks == 18
    assert {link.version for link in gpu.nvlinks} == {"4.0"}
    assert {link.remote_type for link in gpu.nvlinks} == {"switch"}
    assert gpu.ecc_enabled is True and gpu.mig_enabled is False
    assert gpu.power_enforced_limit_w == 700.0
    assert gpu.cpu_affinity == "0-63"
    assert gpu.clock_event_reasons == ["Idle"]
    # NUMA node id is not exposed in this VM: None, with NVML's reason kept.
    assert gpu.numa_node is None
    assert "NotSupported" in gpu.unreadable["nvmlDeviceGetNumaNodeId"]


def test_h100_without_nvlink_keeps_one_reason() -> None:
    gpu = parse_nvml_snapshot(load_snapshot("h100")).gpus[0]
    assert gpu.nvlinks == []
    assert gpu.unreadable["nvlink"] == "NVMLError_NotSupported: Not Supported"
    assert not any(key.startswith("nvmlDeviceGetNvLink") for key in gpu.unreadable)


def test_cpulist_from_mask() -> None:
    assert cpulist_from_mask([0xFFFF] + [0] * 15) == "0-15"
    assert cpulist_from_mask([0b1011, 1]) == "0-1,3,64"
    assert cpulist_from_mask([0, 0]) is None
    assert cpulist_from_mask(None) is None


def test_clock_event_names_and_topology_summary() -> None:
    assert clock_event_names(0x48) == ["HW Slowdown", "HW Thermal Slowdown"]
    assert clock_event_names(0) == []
    assert summarize_topology([["X", "PHB"], ["PHB", "X"]]) == "PCIe only (PHB)"
    assert summarize_topology([["X", "NV4", "SYS"], ["NV4", "X", "SYS"], ["SYS", "SYS", "X"]]) == "mixed: NV4, SYS"
    assert summarize_topology([["X"]]) == "single GPU"
