"""The rendezvous (group._meet): rank 0 publishes one compact roster that every rank reads, the wait for the last
rank is a store wait, and a timeout still names the missing ranks and nodes on every rank that came, rank 0
among the missing included. Ranks are real processes on localhost (gloo, a TCP store), started as a launcher
starts them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from tests.conftest import free_port, within
from tests.finetune.test_job_failures import worker_env

from gpucert.runtime.identity import RankIdentity, pack_roster, relabel, unpack_roster


def gpus(node_rank: int, host: str, per_node: int, nodes: int) -> list[RankIdentity]:
    return [
        RankIdentity(
            node_rank * per_node + g, per_node * nodes, g, per_node, node_rank, nodes, host, host, f"cuda:{g}",
            f"GPU-{node_rank:08x}-0c65-5ac2-fdcb-cc5b3871a0{g:02x}", g, 40_000 + node_rank * per_node + g,
        )
        for g in range(per_node)
    ]  # fmt: skip


def test_the_roster_gives_back_every_identity_in_rank_order() -> None:
    peers = relabel([*gpus(1, "gpu-b", 8, 2), *gpus(0, "gpu-a", 8, 2)])
    assert unpack_roster(json.loads(json.dumps(pack_roster(peers)))) == sorted(peers, key=lambda p: p.rank)
    cpu = relabel([RankIdentity(r, 3, r, 3, 0, 1, "vm", "vm", "cpu", None, None, 100 + r) for r in range(3)])
    assert unpack_roster(pack_roster(cpu)) == cpu


def test_the_roster_is_a_third_of_the_identities_it_replaces() -> None:
    """Per node the shared fields once: at 8 GPUs a node, under 100 bytes a rank against about 250 for every
    identity in full (store-scale.md: the roster is what every rank reads)."""
    peers = [ident for n in range(16) for ident in gpus(n, f"gpu-node-{n:04d}", 8, 16)]
    roster = len(json.dumps(pack_roster(peers), separators=(",", ":")))
    full = sum(len(json.dumps(p.to_dict(), separators=(",", ":"))) for p in peers)
    assert roster / len(peers) < 100 and roster < full / 2.5, (roster / len(peers), full / len(peers))


RANK = textwrap.dedent(
    """
    import json, sys
    from gpucert.runtime.config import RuntimeConfig
    from gpucert.runtime.errors import RendezvousError
    from gpucert.runtime.group import start_runtime, stop_runtime

    try:
        rt = start_runtime(RuntimeConfig(rendezvous_timeout_s=float(sys.argv[1]), heartbeat_interval_s=0.5,
                                         heartbeat_timeout_s=3))
    except RendezvousError as exc:
        print(f"RendezvousError: {exc}", flush=True)
        sys.exit(3)
    print(json.dumps([p.to_dict() for p in rt.peers]), flush=True)
    stop_runtime(rt)
    """
)


def start_ranks(ranks: list[int], world: int, per_node: int, port: int, timeout_s: float, **extra: str) -> list[
        subprocess.Popen[str]]:  # fmt: skip
    base = {**worker_env(), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **extra}
    return [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(timeout_s)],
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r % per_node), "LOCAL_WORLD_SIZE": str(per_node),
                 "GROUP_RANK": str(r // per_node)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in ranks
    ]  # fmt: skip


def outputs(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    said = [p.communicate(timeout=within(120))[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, said, strict=True)]


@pytest.mark.slow
def test_every_rank_reads_the_same_roster_with_node_labels() -> None:
    done = outputs(start_ranks([0, 1, 2, 3], 4, 2, free_port(), 60))
    for code, out in done:
        assert code == 0, out
    rosters = [json.loads(out.strip().splitlines()[-1]) for _, out in done]
    assert all(roster == rosters[0] for roster in rosters)
    assert [(p["rank"], p["local_rank"], p["node_rank"]) for p in rosters[0]] == [
        (0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1),
    ]  # fmt: skip
    host = rosters[0][0]["host"]
    assert [p["node"] for p in rosters[0]] == [f"{host}[n0]", f"{host}[n0]", f"{host}[n1]", f"{host}[n1]"]
    assert len({p["pid"] for p in rosters[0]}) == 4


@pytest.mark.slow
def test_a_rank_that_never_comes_is_named_by_every_rank_that_did() -> None:
    """World of 4 (2 a node), rank 3 never starts: rank 0 publishes who is missing when its wait times out, and
    every rank that came says it, each naming itself, within the timeout."""
    t0 = time.monotonic()
    done = outputs(start_ranks([0, 1, 2], 4, 2, free_port(), 4))
    assert time.monotonic() - t0 < 4 + within(20)
    host = None
    for rank, (code, out) in enumerate(done):
        assert code == 3, out
        line = out.strip().splitlines()[-1]
        assert line.startswith(f"RendezvousError: rank {rank} (node rank {rank // 2}, host "), line
        host = host or line.split("host ", 1)[1].split(")", 1)[0]
        assert f"timed out after 4 s (runtime.rendezvous_timeout_s): 3 of 4 ranks joined (hosts {host})" in line
        assert "missing rank(s) 3 (on nodes that did join)" in line


@pytest.mark.slow
def test_rank_0_missing_is_named_by_the_others_themselves() -> None:
    """Nobody publishes a roster when rank 0 never comes: past the timeout (and one heartbeat interval) every rank
    works out who is missing from the identities in the store. The store is served apart, as a launcher's agent
    serves it."""
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    agent = {"GPUCERT_AGENT_STORE": "1", "GPUCERT_STORE_PREFIX": "job"}
    done = outputs(start_ranks([1, 2, 3], 4, 1, server.port, 3, **agent))
    for rank, (code, out) in zip([1, 2, 3], done, strict=True):
        assert code == 3, out
        line = out.strip().splitlines()[-1]
        assert line.startswith(f"RendezvousError: rank {rank} (node rank {rank}, host "), line
        assert "3 of 4 ranks joined" in line and "missing rank(s) 0 = node rank(s) 0." in line, line
