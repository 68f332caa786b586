from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest

from gpucert.hardware.infiniband import (
    IbDevice,
    IbPort,
    collect_ib_devices,
    parse_ib_device,
    parse_port_state,
    parse_rate_gbps,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4: ACTIVE\n", "ACTIVE"),
        ("1: DOWN", "DOWN"),
        ("2: INIT", "INIT"),
        ("3: ARMED", "ARMED"),
        ("5: LinkUp", "LinkUp"),
        ("3: Disabled", "Disabled"),
        ("", None),
        (None, None),
    ],
)
def test_parse_port_state(text: str | None, expected: str | None) -> None:
    assert parse_port_state(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)\n", 400.0),
        ("200 Gb/sec (2X NDR)", 200.0),
        ("100 Gb/sec (4X EDR)", 100.0),
        ("25 Gb/sec (1X EDR)", 25.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("invalid", None),
        (None, None),
    ],
)
def test_parse_rate_gbps(text: str | None, expected: float | None) -> None:
    assert parse_rate_gbps(text) == expected


def test_hgx_compute_hcas(hgx_root: Path) -> None:
    devices = collect_ib_devices(hgx_root)
    assert [d.name for d in devices] == [f"mlx5_{i}" for i in range(10)]
    assert devices[0] == IbDevice(
        name="mlx5_0",
        hca_type="MT4129",
        fw_ver="28.39.1002",
        board_id="MT_0000000838",
        node_guid="a088:c203:00b1:2c00",
        ports=(IbPort(1, "ACTIVE", "LinkUp", 400.0, "400 Gb/sec (4X NDR)", "InfiniBand", 0x1A),),
        netdevs=("ibp24s0",),
    )
    for device in devices[:8]:
        (port,) = device.ports
        assert (port.state, port.rate_gbps, port.link_layer) == ("ACTIVE", 400.0, "InfiniBand")
    assert devices[7].netdevs == ("ibp220s0",)
    assert devices[7].ports[0].lid == 0x21


def test_hgx_roce_ports(hgx_root: Path) -> None:
    roce = collect_ib_devices(hgx_root)[8:]
    assert [(d.name, d.netdevs) for d in roce] == [
        ("mlx5_8", ("enp13s0f0np0",)),
        ("mlx5_9", ("enp13s0f1np1",)),
    ]
    for device in roce:
        (port,) = device.ports
        assert (port.link_layer, port.rate_gbps, port.lid) == ("Ethernet", 200.0, 0)


def test_down_port_and_degraded_rate(make_tree: Callable[..., Path], hgx_files: dict[str, str]) -> None:
    hgx_files["sys/class/infiniband/mlx5_3/ports/1/state"] = "1: DOWN\n"
    hgx_files["sys/class/infiniband/mlx5_3/ports/1/phys_state"] = "3: Disabled\n"
    hgx_files["sys/class/infiniband/mlx5_3/ports/1/rate"] = "10 Gb/sec (4X SDR)\n"
    hgx_files["sys/class/infiniband/mlx5_5/ports/1/rate"] = "200 Gb/sec (4X HDR)\n"
    devices = {d.name: d for d in collect_ib_devices(make_tree(hgx_files))}
    down = devices["mlx5_3"].ports[0]
    assert (down.state, down.phys_state, down.rate_gbps) == ("DOWN", "Disabled", 10.0)
    slow = devices["mlx5_5"].ports[0]
    assert (slow.state, slow.rate_gbps, slow.rate_text) == ("ACTIVE", 200.0, "200 Gb/sec (4X HDR)")
    assert devices["mlx5_4"].ports[0].rate_gbps == 400.0


def test_parse_two_port_device_with_gaps() -> None:
    device = parse_ib_device(
        "mlx5_2",
        {
            "fw_ver": "20.31.1014\n",
            "hca_type": "MT4123\n",
            "ports/1/state": "4: ACTIVE\n",
            "ports/1/rate": "200 Gb/sec (4X HDR)\n",
            "ports/2/state": "1: DOWN\n",
            "ports/2/lid": "garbage\n",
            "device/net/ib1": "",
            "device/net/ib0/operstate": "up\n",
        },
    )
    assert device.board_id is None and device.node_guid is None
    assert device.fw_ver == "20.31.1014"
    assert device.ports == (
        IbPort(1, "ACTIVE", None, 200.0, "200 Gb/sec (4X HDR)", None, None),
        IbPort(2, "DOWN", None, None, None, None, None),
    )
    assert device.netdevs == ("ib0", "ib1")


def test_devices_sort_naturally(make_tree: Callable[..., Path]) -> None:
    files = {f"sys/class/infiniband/mlx5_{i}/fw_ver": "28.39.1002\n" for i in (10, 2, 1)}
    assert [d.name for d in collect_ib_devices(make_tree(files))] == ["mlx5_1", "mlx5_2", "mlx5_10"]


def test_missing_tree_yields_empty_list(tmp_path: Path) -> None:
    assert collect_ib_devices(tmp_path) == []


def test_results_are_json_serialisable(hgx_root: Path) -> None:
    data = json.loads(json.dumps([asdict(d) for d in collect_ib_devices(hgx_root)]))
    assert data[9]["ports"][0]["rate_text"] == "200 Gb/sec (2X NDR)"
    assert data[0]["netdevs"] == ["ibp24s0"]
