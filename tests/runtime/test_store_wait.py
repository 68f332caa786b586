"""A node's wait for the job's store (group.connect_store), with a real TCPStore on localhost: it ends at its
limit by our own deadline (TCPStore's own connect timeout ran 1.5-2.5x past it), says what it waits for along the
way, says an address that does not resolve at once, and joins a store that comes up late within a retry. And the
ranks' wait for each other on the host through the store (group.host_barrier), and node 0's wait for the other
nodes to read how the job ended before its store goes (launcher.NodeRendezvous.linger)."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from tests.conftest import free_port, within
from torch.distributed.elastic.rendezvous import RendezvousParameters

from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.errors import RendezvousError
from gpucert.runtime.group import RETRY_S, Runtime, connect_store, host_barrier
from gpucert.runtime.identity import RankIdentity
from gpucert.runtime.launcher import NODES_PREFIX, NodeRendezvous

WHO = "node rank 1 (host h)"


@pytest.mark.slow
def test_the_wait_ends_at_its_limit_and_says_what_it_waits_for_meanwhile(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(RendezvousError) as raised:
        connect_store("127.0.0.1", port, False, 3.0, WHO, say_after_s=1.0, every_s=1.0)
    took = time.monotonic() - t0
    assert 3.0 <= took < 3.0 + 2 * RETRY_S + within(0.5), f"waited {took:.2f} s for a 3 s limit"
    assert str(raised.value) == (
        f"{WHO}: could not reach the job's store at 127.0.0.1:{port} within 3 s (runtime.rendezvous_timeout_s): "
        "connection refused; is node rank 0 running gpucert, and is that address reachable from this host?"
    )
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        f"gpucert: {WHO}: waiting for the job's store at 127.0.0.1:{port} (served by node rank 0's gpucert): "
        "connection refused; waited 1 s, gives up after 3 s (runtime.rendezvous_timeout_s)"
    )
    assert lines[1].startswith(f"gpucert: {WHO}: still waiting for the job's store at 127.0.0.1:{port}"), lines
    assert len(lines) == 2, lines  # one a second, from the first second on: none after the limit


def test_an_address_that_does_not_resolve_is_said_at_once_and_named_at_the_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    t0 = time.monotonic()
    with pytest.raises(RendezvousError) as raised:
        # .invalid never resolves (RFC 2606). Retried all the same: a Kubernetes Service name resolves only once
        # its pod is up.
        connect_store("node-a.invalid", free_port(), False, 1.5, WHO)
    assert time.monotonic() - t0 < 1.5 + 2 * RETRY_S + within(0.5)
    message = str(raised.value)
    assert "'node-a.invalid' does not resolve on this host" in message
    assert "check --master-addr / MASTER_ADDR" in message and "within 1.5 s (runtime.rendezvous_timeout_s)" in message
    [line] = capsys.readouterr().err.splitlines()  # said at once, not after the usual 10 s, and once
    assert "'node-a.invalid' does not resolve on this host" in line and "a typo in --master-addr" in line


def test_a_node_started_before_the_store_joins_once_it_comes_up() -> None:
    port = free_port()
    up: list[float] = []
    served: list[dist.TCPStore] = []

    def serve_late() -> None:
        time.sleep(1.5)
        served.append(dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False))
        up.append(time.monotonic())

    server = threading.Thread(target=serve_late)
    server.start()
    try:
        store = connect_store("127.0.0.1", port, False, 30.0, WHO)
        joined = time.monotonic()
    finally:
        server.join()
    assert joined - up[0] < 2 * RETRY_S + within(0.5), f"joined {joined - up[0]:.2f} s after the store came up"
    store.set("said", "by the late joiner")
    assert served[0].get("said") == b"by the late joiner"
    # The connect's short timeout is not left as every request's default: the configured one is.
    assert store.timeout == timedelta(seconds=30)


def _two_ranks(store: dist.Store, timeout_s: float) -> list[Runtime]:
    peers = [RankIdentity(r, 2, r, 2, 0, 1, "node-0", "host", "cpu", pid=1000 + r) for r in (0, 1)]
    config = RuntimeConfig(collective_timeout_s=timeout_s)
    cpu = torch.device("cpu")
    return [Runtime(me=me, peers=peers, device=cpu, backend="gloo", config=config, store=store) for me in peers]


def test_the_host_barrier_holds_each_rank_until_all_came_and_names_how_many_did() -> None:
    """What p2p's other ranks wait on while local rank 0 copies between GPUs (no kernel spinning on theirs)."""
    rank0, rank1 = _two_ranks(dist.HashStore(), 10.0)
    order: list[str] = []

    def late() -> None:
        time.sleep(0.5)
        order.append("rank 1 came")
        host_barrier(rank1, "p2p")

    thread = threading.Thread(target=late)
    thread.start()
    host_barrier(rank0, "p2p")
    order.append("rank 0 went on")
    thread.join()
    assert order == ["rank 1 came", "rank 0 went on"]
    # The next barrier is its own: the first one's count does not let rank 0 through alone.
    rank0.config = RuntimeConfig(collective_timeout_s=0.5)
    with pytest.raises(RuntimeError) as raised:
        host_barrier(rank0, "memory")
    assert "1 of 2 ranks reached the barrier (memory) within 0.5 s (runtime.collective_timeout_s)" in str(raised.value)


@pytest.mark.slow
def test_node_0_lingers_until_this_rounds_ack_not_an_earlier_rounds() -> None:
    """After the job ended, node 0 keeps the store up until every other node read how (NodeRendezvous.linger), at
    most two heartbeat intervals. An ack of round 0's failure once let round 1's Ctrl-C end node 0 at once, and
    node 1 then said only "rank 1 on this node ended: exit code 3"."""
    port = free_port()

    def node(rank: int) -> NodeRendezvous:
        runtime = json.dumps({"heartbeat_interval_s": 2.0})
        params = RendezvousParameters("gpucert", f"127.0.0.1:{port}", "gpucert", 2, 2, node_rank=rank, runtime=runtime)
        return NodeRendezvous(params)

    node0, node1 = node(0), node(1)
    node0.store = dist.TCPStore("127.0.0.1", port, 2, True, wait_for_workers=False)
    node1.store = dist.TCPStore("127.0.0.1", port, 2, False)
    for n in (node0, node1):
        n.labels, n.round = {0: "a", 1: "b"}, 0
    node1._ack(node1.store)  # round 0 ended; node 1 read how
    node0.linger()  # returns at once: the ack is there
    for n in (node0, node1):
        n.round, n._acked = 1, False  # as next_rendezvous leaves them
    t0 = time.monotonic()
    node0.linger()  # round 1 ended and node 1 has not read it: the whole bound
    assert time.monotonic() - t0 >= 4.0
    threading.Timer(0.5, node1._ack, [node1.store]).start()
    t0 = time.monotonic()
    node0.linger()
    assert time.monotonic() - t0 < 4.0  # ended by the ack, not the bound


def test_node_rank_0_says_at_once_that_its_own_address_does_not_resolve(capsys: pytest.CaptureFixture[str]) -> None:
    """The server connects to itself by --master-addr: a name that does not resolve held TCPStore's constructor
    (deaf to Ctrl-C) for 211 s on one machine, then was blamed on the port."""
    t0 = time.monotonic()
    with pytest.raises(RendezvousError) as raised:
        connect_store("node-a.invalid", free_port(), True, 1.5, "node rank 0 (host h)")
    assert time.monotonic() - t0 < 1.5 + 2 * RETRY_S + within(0.5)
    message = str(raised.value)
    assert message.startswith("node rank 0 (host h): 'node-a.invalid' does not resolve on this host"), message
    assert "within 1.5 s (runtime.rendezvous_timeout_s)" in message and "port" not in message
    [line] = capsys.readouterr().err.splitlines()  # said at once, then retried quietly until the limit
    assert "'node-a.invalid' does not resolve on this host" in line and "a typo in --master-addr" in line


def _meeting(port: int, rank: int, nodes: int, timeout_s: float = 4.0) -> NodeRendezvous:
    runtime = json.dumps({"rendezvous_timeout_s": timeout_s, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 2.0})
    params = RendezvousParameters(
        "gpucert", f"127.0.0.1:{port}", "gpucert", nodes, nodes, node_rank=rank, runtime=runtime, host=f"h{rank}"
    )
    return NodeRendezvous(params)


def _meet_all(handlers: list[NodeRendezvous], stagger_s: float = 0.3) -> list[object]:
    """Each handler's next_rendezvous in a thread, node 0's first; what each returned or raised."""
    out: list[object] = [None] * len(handlers)

    def go(i: int) -> None:
        try:
            out[i] = handlers[i].next_rendezvous()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(len(handlers))]
    for t in threads:
        t.start()
        time.sleep(stagger_s)
    for t in threads:
        t.join(30)
    return out


@pytest.mark.slow
def test_a_node_rank_given_twice_is_named_by_the_second_node_and_in_node_0s_message() -> None:
    """Node ranks 0, 1, 1 of three nodes: node 0 counted arrivals, met "three" nodes and waited for rank 2 until
    its store timed out, then blamed itself; of two nodes, two agents ran as node rank 1."""
    port = free_port()
    out = _meet_all([_meeting(port, r, 3) for r in (0, 1, 1)])
    assert isinstance(out[2], RendezvousError)
    assert "node rank 1 is already taken by host h1: give every node its own --node-rank (0..2)" in str(out[2])
    assert isinstance(out[0], RendezvousError)
    assert "missing node rank(s) 2. Given twice: node rank 1 on hosts h1 and h1." in str(out[0])
    port = free_port()
    out = _meet_all([_meeting(port, r, 2) for r in (0, 1, 1)])
    assert not isinstance(out[0], Exception) and not isinstance(out[1], Exception)
    assert isinstance(out[2], RendezvousError) and "already taken" in str(out[2])


@pytest.mark.slow
def test_the_stores_silence_is_counted_from_the_meeting_not_from_the_agents_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nodes that started 5 s apart (heartbeat timeout 2 s): the first failed look at the store killed every worker
    of the early node, "has not answered for 5 s"."""
    import gpucert.runtime.launcher as launcher

    killed: list[object] = []
    monkeypatch.setattr(launcher, "kill_children", lambda sig=None: killed.append(sig))
    port = free_port()
    early = _meeting(port, 1, 2, timeout_s=30.0)
    time.sleep(3.0)
    late = _meeting(port, 0, 2, timeout_s=30.0)
    out = _meet_all([late, early], stagger_s=0.2)
    assert not any(isinstance(o, Exception) for o in out), out

    def refused() -> object:
        raise RuntimeError("connection refused")

    monkeypatch.setattr(early, "_short_connection", refused)
    early.num_nodes_waiting()
    assert killed == [] and early.cause is None


@pytest.mark.slow
def test_a_node_agent_started_again_on_its_host_takes_its_own_place() -> None:
    """Node rank 1's gpucert killed after it joined and started again with the same command: its claim of rank 1
    stayed, and it was refused as "already taken by host h1", naming itself, while node 0 waited for a gone one."""
    import subprocess
    import sys

    port = free_port()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # a process of this host that has ended
    node0 = _meeting(port, 0, 2)
    store = dist.TCPStore("127.0.0.1", port, 2, True, wait_for_workers=False)
    node0.store = store
    prefix = dist.PrefixStore(f"{NODES_PREFIX}0/", store)  # round 0
    prefix.add("claim/1", 1)
    prefix.set("1", json.dumps({"name": "h1", "host": "h1", "pid": dead_pid}))
    again = _meeting(port, 1, 2)
    out = _meet_all([node0, again])
    assert not any(isinstance(o, Exception) for o in out), out
