"""The heartbeat watchdog (runtime/watchdog.py) with two real ranks on localhost (gloo, a TCP store), started as
a launcher starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT), heartbeats tightened to every 0.5 s, 2 s silent on a
quiet machine (both scaled by its pace: on a loaded one a thread may wait seconds for a core).

A rank that finished its part and left (stop_runtime) goes silent: that is not a death. Rank 0 still at work
alone past the heartbeat timeout (merging the adapter of a fine-tuning run takes minutes) must not take it
for one and abort.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from tests.conftest import free_port, within
from tests.finetune.test_job_failures import worker_env

from gpucert.runtime.group import ABORTED_EXIT

pytestmark = pytest.mark.slow  # two processes and their rendezvous: seconds

RANK = textwrap.dedent(
    """
    import sys, time
    from gpucert.runtime.config import RuntimeConfig
    from gpucert.runtime.group import start_runtime, stop_runtime

    beats = dict(heartbeat_interval_s=float(sys.argv[2]), heartbeat_timeout_s=float(sys.argv[3]))
    rt = start_runtime(RuntimeConfig(**beats, rendezvous_timeout_s=60))
    if rt.rank == 0:
        time.sleep(float(sys.argv[1]))  # alone at work: rank 1 has left
    stop_runtime(rt)
    print(f"rank {rt.rank} done", flush=True)
    """
)


def run_two_ranks(rank0_work_s: float, interval_s: float, timeout_s: float) -> list[subprocess.CompletedProcess[str]]:
    base = {**worker_env(), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank0_work_s), str(interval_s), str(timeout_s)],
            env={**base, "RANK": str(rank), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    done = []
    for proc in procs:
        out, _ = proc.communicate(timeout=within(120))
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out))
    return done


def test_a_rank_that_left_is_not_named_dead_while_rank_0_works_on() -> None:
    # 3 x the heartbeat timeout alone: before stop_runtime said it left, rank 0's watchdog named rank 1 ("no
    # heartbeat for 2 s") and ended rank 0 with ABORTED_EXIT.
    timeout_s = within(2.0)
    rank0, rank1 = run_two_ranks(3 * timeout_s, timeout_s / 4, timeout_s)
    assert rank1.returncode == 0, rank1.stdout
    assert rank0.returncode == 0, (rank0.returncode == ABORTED_EXIT, rank0.stdout)
    assert "no heartbeat" not in rank0.stdout and "rank 0 done" in rank0.stdout
