"""CPU, NUMA and memory inventory of the host, from /proc and /sys.

``parse_*`` functions are pure (text in, dataclasses out); ``collect_*`` functions read a live tree under
``root`` so tests can point them at a fake one, and return None or empty values instead of raising.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpucert.hardware.sysfs import read_text

_KIB_PER_GIB = 1024 * 1024

# aarch64 /proc/cpuinfo has no "model name"; lscpu names the core from implementer and part
# (util-linux sys-utils/lscpu-arm.c). Only server cores found beside NVIDIA GPUs are listed.
_ARM_IMPLEMENTERS = {0x41: "ARM", 0x4E: "NVIDIA", 0xC0: "Ampere"}
_ARM_PARTS = {
    (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD40): "Neoverse-V1",
    (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4F): "Neoverse-V2",
    (0x41, 0xD84): "Neoverse-V3",
}


@dataclass(frozen=True)
class NumaNode:
    node_id: int
    cpulist: str
    cpu_count: int
    memory_gib: float | None


@dataclass(frozen=True)
class CpuInfo:
    model: str | None
    vendor: str | None
    # Topology fields are None when neither /proc/cpuinfo nor sysfs says which package a CPU sits in.
    sockets: int | None
    cores_per_socket: int | None
    threads_per_core: int | None
    logical_cpus: int
    smt_enabled: bool | None
    numa_nodes: tuple[NumaNode, ...]


@dataclass(frozen=True)
class MemoryInfo:
    total_gib: float | None
    available_gib: float | None
    hugepages_total: int | None
    swap_total_gib: float | None


def parse_cpulist(text: str) -> list[int]:
    """Expand a kernel cpulist such as ``"0-3,8-11"`` (an empty string means no CPUs)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in [*text.splitlines(), ""]:
        key, sep, value = line.partition(":")
        if sep:
            current[key.strip()] = value.strip()
        elif not line.strip() and current:
            blocks.append(current)
            current = {}
    return blocks


def _arm_names(block: Mapping[str, str]) -> tuple[str | None, str | None]:
    try:
        implementer = int(block["CPU implementer"], 16)
        part = int(block["CPU part"], 16)
    except (KeyError, ValueError):
        return None, None
    return _ARM_PARTS.get((implementer, part)), _ARM_IMPLEMENTERS.get(implementer)


def _package_and_core(block: Mapping[str, str], topology: Mapping[int, tuple[int, int]]) -> tuple[int, int] | None:
    try:
        if "physical id" in block and "core id" in block:
            return int(block["physical id"]), int(block["core id"])
        return topology.get(int(block["processor"]))
    except ValueError:
        return None


def parse_cpuinfo(
    text: str,
    topology: Mapping[int, tuple[int, int]] | None = None,
    numa_nodes: tuple[NumaNode, ...] = (),
) -> CpuInfo:
    """Summarise /proc/cpuinfo.

    ``topology`` maps a logical CPU to ``(package_id, core_id)`` as sysfs reports them; it is used where
    /proc/cpuinfo has no "physical id" (aarch64, some VMs).
    """
    processors = [b for b in _cpuinfo_blocks(text) if "processor" in b]
    first = processors[0] if processors else {}
    model = first.get("model name") or first.get("Processor")
    vendor = first.get("vendor_id")
    if model is None and vendor is None:
        model, vendor = _arm_names(first)

    logical = len(processors)
    cores = {_package_and_core(block, topology or {}) for block in processors}
    if not processors or None in cores:
        # Guessing from a partial picture would misreport SMT, so the topology stays unknown.
        return CpuInfo(model, vendor, None, None, None, logical, None, numa_nodes)
    known = {core for core in cores if core is not None}
    sockets = len({package for package, _ in known})
    threads_per_core = logical // len(known)
    return CpuInfo(
        model=model,
        vendor=vendor,
        sockets=sockets,
        cores_per_socket=len(known) // sockets,
        threads_per_core=threads_per_core,
        logical_cpus=logical,
        smt_enabled=threads_per_core > 1,
        numa_nodes=numa_nodes,
    )


def _meminfo_kib(text: str) -> dict[str, int]:
    """Map meminfo keys to integers; per-node files prefix each line with "Node <n> "."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"(?:Node \d+ )?([\w()]+):\s+(\d+)", line)
        if match:
            values[match.group(1)] = int(match.group(2))
    return values


def _gib(kib: int | None) -> float | None:
    return None if kib is None else round(kib / _KIB_PER_GIB, 3)


def parse_numa_node(node_id: int, cpulist: str, meminfo: str | None) -> NumaNode:
    # Memory-only nodes (Grace Hopper exposes HBM this way) have an empty cpulist.
    memory = _meminfo_kib(meminfo).get("MemTotal") if meminfo is not None else None
    return NumaNode(node_id, cpulist.strip(), len(parse_cpulist(cpulist)), _gib(memory))


def parse_meminfo(text: str) -> MemoryInfo:
    values = _meminfo_kib(text)
    return MemoryInfo(
        total_gib=_gib(values.get("MemTotal")),
        # MemAvailable is missing before Linux 3.14.
        available_gib=_gib(values.get("MemAvailable")),
        hugepages_total=values.get("HugePages_Total"),
        swap_total_gib=_gib(values.get("SwapTotal")),
    )


def _numbered_dirs(parent: Path, prefix: str) -> list[tuple[int, Path]]:
    try:
        entries = list(parent.iterdir())
    except OSError:
        return []
    numbered = [
        (int(p.name[len(prefix) :]), p)
        for p in entries
        if p.name.startswith(prefix) and p.name[len(prefix) :].isdigit()
    ]
    return sorted(numbered)


def collect_numa_nodes(root: Path = Path("/")) -> tuple[NumaNode, ...]:
    nodes = []
    for node_id, path in _numbered_dirs(root / "sys/devices/system/node", "node"):
        cpulist = read_text(path / "cpulist")
        if cpulist is None:
            continue
        try:
            nodes.append(parse_numa_node(node_id, cpulist, read_text(path / "meminfo")))
        except ValueError:
            continue
    return tuple(nodes)


def _collect_topology(root: Path) -> dict[int, tuple[int, int]]:
    topology = {}
    for cpu, path in _numbered_dirs(root / "sys/devices/system/cpu", "cpu"):
        package = read_text(path / "topology/physical_package_id")
        core = read_text(path / "topology/core_id")
        if package is not None and core is not None:
            try:
                topology[cpu] = (int(package), int(core))
            except ValueError:
                continue
    return topology


def collect_cpu(root: Path = Path("/")) -> CpuInfo | None:
    text = read_text(root / "proc/cpuinfo")
    if text is None:
        return None
    return parse_cpuinfo(text, _collect_topology(root), collect_numa_nodes(root))


def collect_memory(root: Path = Path("/")) -> MemoryInfo | None:
    text = read_text(root / "proc/meminfo")
    return None if text is None else parse_meminfo(text)
