"""Heartbeats per node (runtime/watchdog.py) with real ranks: two "nodes" of two ranks on localhost (gloo, a TCP
store served by rank 0), started as a launcher starts them but with no launcher around them, so nothing but the
watchdogs can end the job. Heartbeats every 0.5 s, silent 3 s is dead (scaled by the machine's pace).

Each node's local rank 0 keeps the node's counter and watches its other rank by pid; rank 0 watches node 1's
counter, node 1's keeper watches node 0's. Whichever rank is stopped or killed, every rank still running names
it (rank, node, phase) and exits ABORTED_EXIT within the heartbeat timeout and a few intervals.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from tests.conftest import free_port, within
from tests.finetune.test_job_failures import worker_env

from gpucert.runtime.group import ABORTED_EXIT

pytestmark = pytest.mark.slow

RANK = textwrap.dedent(
    """
    import sys, time
    from gpucert.runtime.config import RuntimeConfig
    from gpucert.runtime.group import start_runtime

    timeout_s = float(sys.argv[1])
    rt = start_runtime(RuntimeConfig(heartbeat_interval_s=timeout_s / 6, heartbeat_timeout_s=timeout_s,
                                     rendezvous_timeout_s=120))
    rt.set_phase(f"step {rt.rank}")
    print("ready", flush=True)
    time.sleep(600)  # at work, until a watchdog ends it
    """
)


def start_job(timeout_s: float) -> list[subprocess.Popen[str]]:
    base = {**worker_env(), "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(timeout_s)],
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r % 2), "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(r // 2)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(4)
    ]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", line + proc.stdout.read()
    time.sleep(3 * timeout_s / 6)  # a few beats: every watcher has seen every counter move
    return procs


def fault(victim: int, sig: signal.Signals) -> tuple[float, dict[int, tuple[int, str]]]:
    """Signal rank `victim` of a fresh job; seconds until every other rank exited, and their codes and output."""
    timeout_s = within(3.0)
    procs = start_job(timeout_s)
    try:
        os.kill(procs[victim].pid, sig)
        t0 = time.monotonic()
        done = {}
        for r, proc in enumerate(procs):
            if r != victim:
                out = proc.communicate(timeout=timeout_s + within(30))[0]
                done[r] = (proc.returncode, out)
        return time.monotonic() - t0, done
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.communicate()


def assert_named(done: dict[int, tuple[int, str]], victim: int, how: str) -> None:
    node = f"[n{victim // 2}]"
    for r, (code, out) in done.items():
        assert code == ABORTED_EXIT, (r, out)
        local = "" if victim % 2 == victim else f" local rank {victim % 2}"  # RankIdentity.describe
        who = rf"rank {victim} \(.*{re.escape(node)}, cpu{local}(, host [^)]*)?\)"
        cause = rf"no heartbeat for \d+ s \(runtime.heartbeat_timeout_s [\d.]+\){how}"
        assert re.search(rf"stops: {who} failed during step {victim}: {cause}", out), (r, out)


def test_a_stopped_rank_is_named_by_its_nodes_keeper_on_every_node() -> None:
    took, done = fault(3, signal.SIGSTOP)  # node 1's second rank: watched by pid, by rank 2
    assert took < within(3.0) + within(10), took
    assert_named(done, 3, r": its process \(pid \d+\) is stopped")


def test_a_killed_rank_is_named_by_its_nodes_keeper_on_every_node() -> None:
    took, done = fault(1, signal.SIGKILL)  # node 0's second rank: watched by pid, by rank 0
    assert took < within(3.0) + within(10), took
    assert_named(done, 1, r": its process \(pid \d+\) has ended")


def test_a_killed_keeper_is_named_by_rank_0_from_its_nodes_counter() -> None:
    """Rank 2 keeps node 1's counter: rank 0 sees it stop and names rank 2; rank 3, waiting, reads the record."""
    took, done = fault(2, signal.SIGKILL)
    assert took < within(3.0) + within(10), took
    assert_named(done, 2, "")


def test_a_stopped_rank_0_is_named_by_node_1s_keeper_and_by_its_own_nodes_rank() -> None:
    """Rank 0 serves the store and keeps node 0: stopped, its store answers nothing. Rank 1 (its node, by pid)
    and node 1's ranks all end within the timeout and a few intervals, saying the store stopped answering."""
    took, done = fault(0, signal.SIGSTOP)
    assert took < 2 * within(3.0) + within(15), took
    for r, (code, out) in done.items():
        assert code == ABORTED_EXIT, (r, out)
        assert "the job's store at 127.0.0.1:" in out and "has not answered" in out, (r, out)
