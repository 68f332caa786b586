"""The store's open-file limit (runtime/open_files.py): the soft limit is raised to the hard one where that is
short, and a hard limit too low for the job fails before the rendezvous, saying the limit, the number and what
to do. Limits are changed in child processes (a lowered hard limit cannot be raised back)."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
import time

import pytest
from tests.conftest import free_port, within
from tests.finetune.test_job_failures import worker_env

from gpucert.runtime.open_files import MARGIN, plan_open_files, store_connections

UNLIMITED = resource.RLIM_INFINITY


def test_a_soft_limit_short_of_the_job_is_raised_to_the_hard_one() -> None:
    assert plan_open_files(2048, 4096, 8192) == (4096, None)  # enough: left as it is
    assert plan_open_files(2048, 1024, 8192) == (8192, None)
    assert plan_open_files(2048, 1024, UNLIMITED) == (UNLIMITED, None)
    assert plan_open_files(2048, UNLIMITED, UNLIMITED) == (UNLIMITED, None)


def test_a_hard_limit_short_of_the_job_is_named_with_the_number_needed() -> None:
    target, problem = plan_open_files(16_448, 1024, 4096)
    assert target == 4096  # as far as it goes: raised anyway
    expected = "expected an open-file limit (RLIMIT_NOFILE) of at least 16448, found 4096 (hard limit; soft 1024)"
    assert problem == expected


def test_two_sockets_a_rank_and_two_a_node() -> None:
    assert store_connections(8192, 1024) == 18_432


RAISE = textwrap.dedent(
    """
    import resource, sys
    from gpucert.runtime.open_files import fit_open_files

    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
    print(fit_open_files(int(sys.argv[3]), int(sys.argv[4]), "rank 0 (node rank 0, host h)"))
    print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    """
)


def test_the_serving_process_raises_its_soft_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hard = 4096 if hard == UNLIMITED or hard > 4096 else hard
    if hard < 400 + MARGIN:
        pytest.skip(f"this machine's hard open-file limit ({hard}) is below what the case needs")
    done = subprocess.run(
        [sys.executable, "-c", RAISE, "256", str(hard), "192", "8"], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == [str(hard), str(hard)]


SERVE = textwrap.dedent(
    """
    import resource
    from gpucert.runtime.errors import RendezvousError
    from gpucert.runtime.group import start_runtime

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    try:
        start_runtime()
    except RendezvousError as exc:
        print(exc)
    """
)


@pytest.mark.slow
def test_rank_0_refuses_to_serve_a_job_its_limit_cannot_hold_before_anyone_waits() -> None:
    """Rank 0 of a 1,000-rank job (8 a node) with a hard limit of 256: one line, at once, not a rendezvous that
    waits for ranks whose connections its store could never accept."""
    env = {**worker_env(), "RANK": "0", "WORLD_SIZE": "1000", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SERVE], env=env, capture_output=True, text=True, timeout=within(60))
    assert time.monotonic() - t0 < within(20)  # the rendezvous timeout is 120 s: it never started
    said = done.stdout.strip()
    assert said.startswith("rank 0 (node rank 0, host "), done.stdout + done.stderr
    needed = 2 * 1000 + 2 * 125 + MARGIN
    assert f"for 1000 ranks on 125 nodes: expected an open-file limit (RLIMIT_NOFILE) of at least {needed}" in said
    assert "found 256 (hard limit; soft 256)" in said
    assert f"`ulimit -n {needed}`" in said and "PropagateResourceLimits" in said
