"""Network interfaces from /sys/class/net.

``parse_net_interface`` is pure: it takes the interface's sysfs files as ``{relative path: text}``, where the
symlinks ``device`` and ``device/driver`` appear as their link targets. ``collect_net_interfaces`` reads a
live tree or a capture bundle under ``root`` and returns an empty list when there is none.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gpucert.hardware.sysfs import read_text

_ATTRIBUTE_FILES = ("operstate", "mtu", "speed", "address")
# Kernels before 4.x printed SPEED_UNKNOWN as an unsigned 32-bit -1.
_SPEED_UNKNOWN = {-1, 0xFFFFFFFF}


@dataclass(frozen=True)
class NetInterface:
    name: str
    operstate: str | None  # "up", "down", "unknown" (the kernel's word, lower case)
    mtu: int | None
    speed_mbps: int | None  # None when the link is down or the driver does not say
    mac: str | None
    driver: str | None
    is_virtual: bool  # no backing device: bridges, veth, bonds, tunnels


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text else None
    except ValueError:
        return None


def parse_speed_mbps(text: str | None) -> int | None:
    speed = _int_or_none(text)
    return None if speed is None or speed in _SPEED_UNKNOWN or speed < 0 else speed


def parse_net_interface(name: str, files: Mapping[str, str]) -> NetInterface:
    def text(key: str) -> str | None:
        value = files.get(key)
        return (value.strip() or None) if value is not None else None

    driver_link = text("device/driver")
    return NetInterface(
        name=name,
        operstate=text("operstate"),
        mtu=_int_or_none(text("mtu")),
        speed_mbps=parse_speed_mbps(text("speed")),
        mac=text("address"),
        driver=PurePosixPath(driver_link).name if driver_link else None,
        is_virtual="device" not in files,
    )


def _read_link(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        pass
    try:
        # `gpucert capture` bundles copy `device` as a plain directory: it still shows the device exists.
        return "" if path.is_dir() else None
    except OSError:
        return None


def _read_interface_files(path: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for key in _ATTRIBUTE_FILES:
        value = read_text(path / key)
        if value is not None:
            files[key] = value
    for key in ("device", "device/driver"):
        target = _read_link(path / key)
        if target is not None:
            files[key] = target
    return files


def collect_net_interfaces(root: Path = Path("/")) -> list[NetInterface]:
    base = root / "sys/class/net"
    try:
        # /sys/class/net also holds plain files such as bonding_masters.
        paths = sorted(p for p in base.iterdir() if p.is_dir() and p.name != "lo")
    except OSError:
        return []
    return [parse_net_interface(p.name, _read_interface_files(p)) for p in paths]
