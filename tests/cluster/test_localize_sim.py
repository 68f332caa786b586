"""The localize planner and judges at scale, on the simulator's model of a cluster (gpucert.cluster.localize_sim):
64 nodes in 4 racks with faults injected, what is named checked exactly; then the rack labels and Slurm's
topology that make rack-aware planning possible."""

from __future__ import annotations

import math

import pytest

from gpucert.cluster import localize_sim
from gpucert.cluster.localize import NodeSpec, parse_hosts, screen_pairs, slurm_nodes
from gpucert.cluster.localize_sim import build, simulate
from gpucert.config.loader import ConfigError


def expected(n: int, kinds: tuple[str, ...], seed: int, racks_known: bool = True) -> list[str]:
    """What a perfect search names: each faulty node, and the rack of a failing uplink."""
    cluster = build(n, kinds, seed, racks_known)
    return sorted(f"localize.rack rack {f.where}" if f.kind == "link" else f"localize.node {f.where}"
                  for f in cluster.faults)  # fmt: skip


@pytest.mark.parametrize("seed", range(8))
def test_64_nodes_with_a_bad_node_a_slow_gpu_and_a_bad_uplink_are_named_and_nothing_else(seed: int) -> None:
    kinds = ("node", "gpu", "link")
    found = simulate(64, kinds, seed)
    assert sorted(found.named) == expected(64, kinds, seed)
    assert not found.false and not found.wrong_warns
    assert found.rounds <= 1 + math.ceil(math.log2(64))  # O(log N) rounds at most


@pytest.mark.parametrize("seed", range(4))
def test_two_bad_nodes_and_a_dead_one_are_named_without_rack_labels(seed: int) -> None:
    kinds = ("node", "node", "dead")
    found = simulate(64, kinds, seed, racks_known=False)
    assert sorted(found.named) == expected(64, kinds, seed, racks_known=False)
    assert not found.false


def test_a_node_that_crashes_one_pair_job_in_three_is_never_taken_for_its_partners() -> None:
    for seed in range(6):
        found = simulate(64, ("flaky",), seed)
        assert not found.false and set(found.named) <= set(expected(64, ("flaky",), seed))


@pytest.mark.parametrize(("n", "kinds", "seed", "racks_known"), [(6, ("dead",), 14, False), (16, ("link",), 20, True)])
def test_a_link_is_not_named_on_one_noisy_run(n: int, kinds: tuple[str, ...], seed: int, racks_known: bool) -> None:
    """Two clusters where a healthy pair failed once by noise and the rounds gave its link no rerun (the rerun's
    two nodes were taken as partners for re-pairs first): both named the link FAIL."""
    found = simulate(n, kinds, seed, racks_known=racks_known)
    assert not found.false


def test_rack_labels_parse_and_must_be_on_every_node_or_none() -> None:
    nodes = parse_hosts(["gpu01@r1", "gpu02:0-1@r1", "gpu03@r2"])
    assert [(n.name, n.host, n.gpus, n.rack) for n in nodes] == [
        ("gpu01", "gpu01", None, "r1"),
        ("gpu02:0-1", "gpu02", "0,1", "r1"),
        ("gpu03", "gpu03", None, "r2"),
    ]
    with pytest.raises(ConfigError, match="no @RACK where others do"):
        parse_hosts(["gpu01@r1", "gpu02"])
    with pytest.raises(ConfigError, match="expected host@RACK"):
        parse_hosts(["gpu01@", "gpu02@r1"])


def test_slurm_allocations_take_their_racks_from_the_leaf_switches_of_slurms_topology() -> None:
    """`scontrol show topology` as Slurm prints it for a tree topology.conf (topology/tree)."""
    said = {
        "show hostnames gpu[01-04]": "gpu01\ngpu02\ngpu03\ngpu04\n",
        "show topology": "SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu[01-02]\n"
        "SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=gpu[03-04]\n"
        "SwitchName=spine Level=1 LinkSpeed=1 Nodes=gpu[01-04] Switches=leaf[1-2]\n",
        "show hostnames gpu[01-02]": "gpu01\ngpu02\n",
        "show hostnames gpu[03-04]": "gpu03\ngpu04\n",
    }
    nodes = slurm_nodes({"SLURM_JOB_NODELIST": "gpu[01-04]"}, lambda argv: said[" ".join(argv[1:])])
    assert [n.rack for n in nodes] == ["leaf1", "leaf1", "leaf2", "leaf2"]
    said["show topology"] = ""  # topology/none: racks unknown, planned at random
    nodes = slurm_nodes({"SLURM_JOB_NODELIST": "gpu[01-04]"}, lambda argv: said[" ".join(argv[1:])])
    assert [n.rack for n in nodes] == [None] * 4


def test_screens_pair_within_racks_first_then_each_rack_with_many_others() -> None:
    nodes = [NodeSpec(f"n{i:02d}", f"n{i:02d}", rack=f"r{i // 8}") for i in range(32)]
    within, left = screen_pairs(nodes, seed=3, round_no=1, across=False)
    assert not left and all(p.head.rack == p.other.rack for p in within)
    across, left = screen_pairs(nodes, seed=3, round_no=2, across=True)
    assert not left and all(p.head.rack != p.other.rack for p in across)
    met = {rack: {n.rack for p in across if rack in (p.head.rack, p.other.rack) for n in p.nodes} - {rack}
           for rack in ("r0", "r1", "r2", "r3")}  # fmt: skip
    assert all(len(others) >= 2 for others in met.values()), met  # an uplink's failures point at one rack


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--nodes", "1"], "--nodes 1: localize pairs nodes"),
        (["--nodes", "2", "--faults", "node,gpu,flaky"], "3 node fault(s) need a node each: give >= 3"),
        (["--seeds", "0"], "--seeds must be >= 1, found 0"),
        (["--screens", "-1"], "--screens must be >= 0, found -1"),
    ],
)
def test_the_simulator_refuses_what_it_cannot_simulate_in_one_line(argv: list[str], said: str, capsys) -> None:
    """They were tracebacks from inside the sweep (max() of nothing, a mean of no seeds)."""
    with pytest.raises(SystemExit) as stopped:
        localize_sim.main(argv)
    assert stopped.value.code == 2
    assert said in capsys.readouterr().err
