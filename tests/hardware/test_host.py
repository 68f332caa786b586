from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest

from gpucert.hardware.host import (
    CpuInfo,
    MemoryInfo,
    NumaNode,
    collect_cpu,
    collect_memory,
    collect_numa_nodes,
    parse_cpuinfo,
    parse_cpulist,
    parse_meminfo,
    parse_numa_node,
)

GRACE_BLOCK = """\
processor\t: {cpu}
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 0
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-3,8-11", [0, 1, 2, 3, 8, 9, 10, 11]),
        ("5\n", [5]),
        ("0,2,4-5", [0, 2, 4, 5]),
        ("\n", []),
    ],
)
def test_parse_cpulist(text: str, expected: list[int]) -> None:
    assert parse_cpulist(text) == expected


def test_hgx_cpu_topology_and_numa(hgx_root: Path) -> None:
    cpu = collect_cpu(hgx_root)
    assert cpu == CpuInfo(
        model="Intel(R) Xeon(R) Platinum 8480+",
        vendor="GenuineIntel",
        sockets=2,
        cores_per_socket=56,
        threads_per_core=2,
        logical_cpus=224,
        smt_enabled=True,
        numa_nodes=(
            NumaNode(0, "0-55,112-167", 112, 1007.511),
            NumaNode(1, "56-111,168-223", 112, 1007.983),
        ),
    )


def test_smt_off_when_second_threads_are_absent(hgx_files: dict[str, str]) -> None:
    # With nosmt the kernel lists only the first thread of each core: CPUs 0-111.
    blocks = hgx_files["proc/cpuinfo"].split("\n\n")[:112]
    cpu = parse_cpuinfo("\n\n".join(blocks))
    assert (cpu.sockets, cpu.cores_per_socket, cpu.threads_per_core) == (2, 56, 1)
    assert cpu.logical_cpus == 112
    assert cpu.smt_enabled is False


def test_real_vm_cpu(docker_vm_root: Path) -> None:
    cpu = collect_cpu(docker_vm_root)
    assert cpu is not None
    assert (cpu.model, cpu.vendor) == ("AMD EPYC", "AuthenticAMD")
    assert (cpu.sockets, cpu.cores_per_socket, cpu.threads_per_core, cpu.logical_cpus) == (1, 2, 1, 2)
    assert cpu.smt_enabled is False
    assert cpu.numa_nodes == (NumaNode(0, "0-1", 2, 4.963),)


def test_aarch64_topology_comes_from_sysfs(make_tree: Callable[..., Path]) -> None:
    # Grace has no "physical id" or "model name" in /proc/cpuinfo.
    files = {"proc/cpuinfo": "\n".join(GRACE_BLOCK.format(cpu=c) for c in range(72))}
    for c in range(72):
        files[f"sys/devices/system/cpu/cpu{c}/topology/physical_package_id"] = "0\n"
        files[f"sys/devices/system/cpu/cpu{c}/topology/core_id"] = f"{c}\n"
    cpu = collect_cpu(make_tree(files))
    assert cpu is not None
    assert (cpu.model, cpu.vendor) == ("Neoverse-V2", "ARM")
    assert (cpu.sockets, cpu.cores_per_socket, cpu.threads_per_core, cpu.smt_enabled) == (1, 72, 1, False)


def test_topology_unknown_without_physical_id_or_sysfs() -> None:
    cpu = parse_cpuinfo("\n".join(GRACE_BLOCK.format(cpu=c) for c in range(4)))
    assert cpu.logical_cpus == 4
    assert (cpu.sockets, cpu.cores_per_socket, cpu.threads_per_core, cpu.smt_enabled) == (None,) * 4


def test_memory_only_numa_node() -> None:
    # Grace Hopper exposes GPU HBM as NUMA nodes without CPUs.
    node = parse_numa_node(4, "\n", "Node 4 MemTotal:       100663296 kB\n")
    assert node == NumaNode(node_id=4, cpulist="", cpu_count=0, memory_gib=96.0)


def test_hgx_memory(hgx_root: Path) -> None:
    assert collect_memory(hgx_root) == MemoryInfo(
        total_gib=2015.494, available_gib=1956.21, hugepages_total=0, swap_total_gib=0.0
    )


def test_real_vm_memory(docker_vm_root: Path) -> None:
    memory = collect_memory(docker_vm_root)
    assert memory is not None
    assert memory.total_gib == 23.541
    assert memory.available_gib == 23.14
    assert memory.hugepages_total == 0


def test_meminfo_without_available_or_hugepages() -> None:
    memory = parse_meminfo("MemTotal:       16384000 kB\nSwapTotal:     2097152 kB\n")
    assert memory == MemoryInfo(total_gib=15.625, available_gib=None, hugepages_total=None, swap_total_gib=2.0)


def test_missing_tree_yields_none(tmp_path: Path) -> None:
    assert collect_cpu(tmp_path) is None
    assert collect_memory(tmp_path) is None
    assert collect_numa_nodes(tmp_path) == ()


def test_results_are_json_serialisable(hgx_root: Path) -> None:
    cpu = collect_cpu(hgx_root)
    assert cpu is not None
    data = json.loads(json.dumps(asdict(cpu)))
    assert data["numa_nodes"][1]["cpulist"] == "56-111,168-223"
    memory = collect_memory(hgx_root)
    assert memory is not None
    assert json.loads(json.dumps(asdict(memory)))["total_gib"] == 2015.494
