"""One node's inventory, read from the live node or replayed from a capture bundle.

`NodeSources` is the seam between hardware and everything else: `live_sources()` reaches NVML, /proc, /sys
and dmesg; `bundle_sources(dir)` answers the same questions from a `gpucert capture` bundle. Discovery,
health and the tests all go through `collect_inventory(sources)`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucert.hardware.environment import RuntimeEnvironment, collect_environment
from gpucert.hardware.gpus import GpuInventory, no_gpu_inventory, parse_nvml_snapshot
from gpucert.hardware.host import CpuInfo, MemoryInfo, collect_cpu, collect_memory
from gpucert.hardware.infiniband import IbDevice, collect_ib_devices
from gpucert.hardware.mounts import Mount, collect_mounts
from gpucert.hardware.network import NetInterface, collect_net_interfaces
from gpucert.hardware.nvml import SnapshotNvml, collect_nvml_snapshot, load_pynvml
from gpucert.hardware.software import SoftwareVersions, collect_software
from gpucert.hardware.sysfs import read_text


@dataclass(frozen=True)
class NodeSources:
    """Where a node's facts come from. `nvml` is None when NVML cannot be loaded (`nvml_error` says why)."""

    hostname: str
    root: Path
    env: dict[str, str]
    nvml: Any | None
    nvml_error: str | None
    software: SoftwareVersions | None  # None: read from this Python environment
    kernel_log: str | None  # None: read with dmesg when a check needs it
    replayed_from: str | None = None


# What `gpucert capture` writes (hardware/capture.py) and a replay reads.
BUNDLE_MARKERS = ("nvml-snapshot.json", "software.json", "environment.json", "hostname.txt", "dmesg.txt", "root")


def live_sources() -> NodeSources:
    try:
        nvml, error = load_pynvml(), None
    except ImportError as exc:
        nvml, error = None, f"nvidia-ml-py not installed ({exc})"
    return NodeSources(
        hostname=socket.gethostname(),
        root=Path("/"),
        env=dict(os.environ),
        nvml=nvml,
        nvml_error=error,
        software=None,
        kernel_log=None,
    )


def bundle_sources(bundle: Path) -> NodeSources:
    """Replay a `gpucert capture` bundle; a missing piece reads as absent, as it would on a bare node."""
    if not bundle.is_dir():
        raise ValueError(f"{bundle}: not a capture bundle directory")
    # Any one of these makes a (partial) bundle; with none, a run directory or a typo would replay as a bare node.
    if not any((bundle / name).exists() for name in BUNDLE_MARKERS):
        raise ValueError(
            f"{bundle}: not a capture bundle: it has none of {', '.join(BUNDLE_MARKERS)} "
            "(`gpucert capture -o DIR` writes one)"
        )
    snapshot_path = bundle / "nvml-snapshot.json"
    nvml = SnapshotNvml.from_file(snapshot_path) if snapshot_path.exists() else None
    software_path = bundle / "software.json"
    env_path = bundle / "environment.json"
    log_path = bundle / "dmesg.txt"
    hostname_path = bundle / "hostname.txt"
    software = _bundle_object(software_path) if software_path.exists() else None
    return NodeSources(
        hostname=hostname_path.read_text().strip() if hostname_path.exists() else bundle.name,
        root=bundle / "root",
        env=_bundle_object(env_path) if env_path.exists() else {},
        nvml=nvml,
        nvml_error=None if nvml else f"{snapshot_path} missing: NVML was not available when captured",
        # A newer capture's extra names are left unread, a missing one is unknown (None), as reports' keys are.
        software=SoftwareVersions(**{f.name: software.get(f.name) for f in dataclasses.fields(SoftwareVersions)})
        if software is not None
        else None,
        kernel_log=log_path.read_text() if log_path.exists() else None,
        replayed_from=str(bundle),
    )


def _bundle_object(path: Path) -> dict[str, Any]:
    """A bundle's JSON object file, or a ValueError naming the file and what is wrong (a bare JSON error named
    none, and a list or a number failed later as a traceback)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{path}: not readable as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, found a {type(data).__name__}")
    return data


@dataclass(frozen=True)
class NodeInventory:
    hostname: str
    gpu: GpuInventory
    cpu: CpuInfo | None
    memory: MemoryInfo | None
    infiniband: list[IbDevice]
    network: list[NetInterface]
    mounts: list[Mount]
    software: SoftwareVersions
    environment: RuntimeEnvironment
    # NVIDIA display/3D controllers on the PCI bus, whatever NVML says: a GPU the driver cannot see is
    # still here, and a node with no working driver must not pass as a CPU node.
    nvidia_pci_devices: int = 0
    replayed_from: str | None = None

    @property
    def summary(self) -> str:
        return summarize(self)

    def to_dict(self) -> dict[str, Any]:
        gpu = dataclasses.asdict(self.gpu)
        return {
            "hostname": self.hostname,
            "summary": self.summary,
            "replayed_from": self.replayed_from,
            "driver_version": gpu["driver_version"],
            "cuda_driver_version": gpu["cuda_driver_version"],
            "nvml_version": gpu["nvml_version"],
            "nvml_error": gpu["nvml_error"],
            "gpus": gpu["gpus"],
            "topology": gpu["topology"],
            "cpu": _asdict(self.cpu),
            "memory": _asdict(self.memory),
            "infiniband": [dataclasses.asdict(d) for d in self.infiniband],
            "network": [dataclasses.asdict(n) for n in self.network],
            "mounts": [dataclasses.asdict(m) for m in self.mounts],
            "software": dataclasses.asdict(self.software),
            "environment": dataclasses.asdict(self.environment),
            "nvidia_pci_devices": self.nvidia_pci_devices,
        }


def _asdict(value: Any) -> Any:
    return None if value is None else dataclasses.asdict(value)


def collect_gpu_inventory(sources: NodeSources) -> GpuInventory:
    if sources.nvml is None:
        return no_gpu_inventory(sources.nvml_error or "NVML not available")
    try:
        snapshot = collect_nvml_snapshot(sources.nvml)
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded...: no GPUs can be seen
        return no_gpu_inventory(f"NVML: {exc}")
    return parse_nvml_snapshot(snapshot)


def collect_inventory(sources: NodeSources, probe_torch: bool = True) -> NodeInventory:
    return NodeInventory(
        hostname=sources.hostname,
        gpu=collect_gpu_inventory(sources),
        cpu=collect_cpu(sources.root),
        memory=collect_memory(sources.root),
        infiniband=collect_ib_devices(sources.root),
        network=collect_net_interfaces(sources.root),
        mounts=collect_mounts(sources.root),
        software=sources.software or collect_software(sources.root, probe_torch=probe_torch),
        environment=collect_environment(sources.root, sources.env),
        nvidia_pci_devices=count_nvidia_pci_gpus(sources.root),
        replayed_from=sources.replayed_from,
    )


def count_nvidia_pci_gpus(root: Path) -> int:
    """PCI functions with NVIDIA's vendor id (0x10de) and a display class (0x03xxxx: VGA or 3D controller)."""
    count = 0
    for device in sorted((root / "sys/bus/pci/devices").glob("*")):
        vendor, klass = read_text(device / "vendor"), read_text(device / "class")
        if vendor and klass and vendor.strip() == "0x10de" and klass.strip().startswith("0x03"):
            count += 1
    return count


def summarize(inv: NodeInventory) -> str:
    """One line a person can compare across nodes: '4x NVIDIA H200 | 562 GiB HBM | NV18 all-to-all | ...'."""
    parts = []
    gpus = inv.gpu.gpus
    if gpus:
        names = Counter(g.name for g in gpus)
        parts.append(" + ".join(f"{n}x {name}" for name, n in names.items()))
        parts.append(f"{sum(g.memory_total_gib or 0 for g in gpus):.0f} GiB GPU memory")
        parts.append(inv.gpu.topology.summary)
    else:
        parts.append("no NVIDIA GPU")
    fabric = Counter(
        ("IB" if port.link_layer == "InfiniBand" else "RoCE", port.rate_gbps)
        for device in inv.infiniband
        for port in device.ports
        if port.state == "ACTIVE"
    )
    for (kind, rate), n in sorted(fabric.items(), key=lambda kv: (kv[0][0], -(kv[0][1] or 0))):
        parts.append(f"{n}x {kind} {rate:g} Gb/s" if rate else f"{n}x {kind}")
    if inv.cpu:
        sockets = f"{inv.cpu.sockets}x " if inv.cpu.sockets else ""
        parts.append(f"{sockets}{inv.cpu.model or 'unknown CPU'} ({inv.cpu.logical_cpus} CPUs)")
    if inv.memory and inv.memory.total_gib:
        parts.append(f"{inv.memory.total_gib:.0f} GiB RAM")
    return " | ".join(parts)
