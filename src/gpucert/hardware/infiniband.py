"""RDMA devices (InfiniBand and RoCE) from /sys/class/infiniband.

``parse_ib_device`` is pure: it takes the device's sysfs files as ``{relative path: text}``.
``collect_ib_devices`` reads them under ``root`` and returns an empty list on hosts without RDMA.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpucert.hardware.sysfs import read_text

_DEVICE_FILES = ("fw_ver", "board_id", "hca_type", "node_guid")
_PORT_FILES = ("state", "phys_state", "rate", "link_layer", "lid")


@dataclass(frozen=True)
class IbPort:
    port: int
    state: str | None  # "ACTIVE", "DOWN", "INIT", "ARMED"
    phys_state: str | None  # "LinkUp", "Disabled", "Polling"
    rate_gbps: float | None
    rate_text: str | None  # as the kernel prints it, e.g. "400 Gb/sec (4X NDR)"
    link_layer: str | None  # "InfiniBand", or "Ethernet" for RoCE
    lid: int | None


@dataclass(frozen=True)
class IbDevice:
    name: str
    hca_type: str | None
    fw_ver: str | None
    board_id: str | None
    node_guid: str | None
    ports: tuple[IbPort, ...]
    netdevs: tuple[str, ...]


def parse_port_state(text: str | None) -> str | None:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; ``"5: LinkUp"`` -> ``"LinkUp"``."""
    if text is None or not text.strip():
        return None
    return text.partition(":")[2].strip() or text.strip()


def parse_rate_gbps(text: str | None) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> 400.0; SDR ports print fractions such as ``"2.5 Gb/sec (1X SDR)"``."""
    match = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", text or "")
    return float(match.group(1)) if match else None


def _parse_lid(text: str | None) -> int | None:
    # sysfs prints the LID in hex ("0x1a"); RoCE ports report 0x0.
    try:
        return int(text.strip(), 16) if text else None
    except ValueError:
        return None


def _natural_key(name: str) -> list[int | str]:
    # mlx5_10 belongs after mlx5_9, not after mlx5_1.
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def parse_ib_device(name: str, files: Mapping[str, str]) -> IbDevice:
    """Build an IbDevice from ``{path relative to /sys/class/infiniband/<name>: text}``.

    Keys include ``fw_ver``, ``ports/1/state`` and, for each network interface,
    ``device/net/<iface>`` (its value is ignored: only the directory's existence matters).
    """

    def text(key: str) -> str | None:
        value = files.get(key)
        return value.strip() if value is not None else None

    port_numbers = sorted({int(m.group(1)) for key in files if (m := re.fullmatch(r"ports/(\d+)/\w+", key))})
    ports = tuple(
        IbPort(
            port=n,
            state=parse_port_state(text(f"ports/{n}/state")),
            phys_state=parse_port_state(text(f"ports/{n}/phys_state")),
            rate_gbps=parse_rate_gbps(text(f"ports/{n}/rate")),
            rate_text=text(f"ports/{n}/rate"),
            link_layer=text(f"ports/{n}/link_layer"),
            lid=_parse_lid(text(f"ports/{n}/lid")),
        )
        for n in port_numbers
    )
    netdevs = {key.split("/")[2] for key in files if key.startswith("device/net/") and key.count("/") >= 2}
    return IbDevice(
        name=name,
        hca_type=text("hca_type"),
        fw_ver=text("fw_ver"),
        board_id=text("board_id"),
        node_guid=text("node_guid"),
        ports=ports,
        netdevs=tuple(sorted(netdevs, key=_natural_key)),
    )


def _list_dir(path: Path) -> list[str]:
    try:
        return sorted((p.name for p in path.iterdir()), key=_natural_key)
    except OSError:
        return []


def _read_device_files(path: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    keys = list(_DEVICE_FILES)
    for port in _list_dir(path / "ports"):
        keys.extend(f"ports/{port}/{leaf}" for leaf in _PORT_FILES)
    for key in keys:
        value = read_text(path / key)
        if value is not None:
            files[key] = value
    for iface in _list_dir(path / "device/net"):
        files[f"device/net/{iface}"] = ""
    return files


def collect_ib_devices(root: Path = Path("/")) -> list[IbDevice]:
    base = root / "sys/class/infiniband"
    return [parse_ib_device(name, _read_device_files(base / name)) for name in _list_dir(base)]
