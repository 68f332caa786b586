from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from gpucert.hardware.network import (
    NetInterface,
    collect_net_interfaces,
    parse_net_interface,
    parse_speed_mbps,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("400000\n", 400000), ("-1\n", None), ("4294967295", None), ("", None), (None, None), ("fast", None)],
)
def test_parse_speed_mbps(text: str | None, expected: int | None) -> None:
    assert parse_speed_mbps(text) == expected


def test_hgx_interfaces(hgx_root: Path) -> None:
    interfaces = {i.name: i for i in collect_net_interfaces(hgx_root)}
    assert "lo" not in interfaces
    assert "bonding_masters" not in interfaces
    assert len(interfaces) == 12
    assert interfaces["eno1"] == NetInterface(
        name="eno1",
        operstate="up",
        mtu=1500,
        speed_mbps=10000,
        mac="3c:ec:ef:a1:b2:c4",
        driver="i40e",
        is_virtual=False,
    )
    roce = interfaces["enp13s0f1np1"]
    assert (roce.mtu, roce.speed_mbps, roce.driver, roce.is_virtual) == (9000, 200000, "mlx5_core", False)
    ipoib = interfaces["ibp154s0"]
    assert (ipoib.speed_mbps, ipoib.mtu, ipoib.driver) == (400000, 4092, "mlx5_core")
    assert ipoib.mac is not None and ipoib.mac.endswith(":2c:04")


def test_virtual_interface_without_speed(hgx_root: Path) -> None:
    docker0 = next(i for i in collect_net_interfaces(hgx_root) if i.name == "docker0")
    assert docker0 == NetInterface("docker0", "down", 1500, None, "02:42:8e:5f:11:07", None, True)


def test_real_vm_interfaces_from_capture_bundle(docker_vm_root: Path) -> None:
    interfaces = collect_net_interfaces(docker_vm_root)
    assert [i.name for i in interfaces] == ["eth0", "ifb0", "ifb1"]
    eth0, ifb0, _ = interfaces
    assert eth0 == NetInterface("eth0", "up", 1400, None, "02:fc:00:00:00:01", "virtio_net", False)
    assert (ifb0.operstate, ifb0.speed_mbps, ifb0.driver, ifb0.is_virtual) == ("down", None, None, True)


def test_parse_interface_with_unbound_device() -> None:
    # A PCI function with no driver bound is still hardware, not a virtual interface.
    iface = parse_net_interface("enp1s0", {"device": "../../../0000:01:00.0", "mtu": "1500\n"})
    assert (iface.is_virtual, iface.driver, iface.operstate, iface.mtu) == (False, None, None, 1500)


def test_missing_tree_yields_empty_list(tmp_path: Path) -> None:
    assert collect_net_interfaces(tmp_path) == []


def test_results_are_json_serialisable(hgx_root: Path) -> None:
    data = json.loads(json.dumps([asdict(i) for i in collect_net_interfaces(hgx_root)]))
    assert {d["name"]: d["speed_mbps"] for d in data}["enp13s0f0np0"] == 200000
