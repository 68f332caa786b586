"""Where ranks come from (torchrun, Slurm, nothing) and a lone process leaving the environment alone."""

from __future__ import annotations

import os

import pytest

from gpucert.bench.distributed import cleanup, first_host, init_distributed, ranks_from_env


def test_torchrun_variables_win() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "SLURM_PROCID": "0", "SLURM_NTASKS": "16"}
    assert ranks_from_env(env) == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}


def test_slurm_tasks_become_ranks() -> None:
    env = {
        "SLURM_PROCID": "9",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS_PER_NODE": "8(x2)",
        "SLURM_JOB_NODELIST": "gpu[007-008]",
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_ID": "0",
    }
    assert ranks_from_env(env) == {
        "RANK": "9",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "gpu007",
        "MASTER_PORT": str(20000 + 123456 % 20000),
    }


def test_the_batch_script_itself_is_not_a_rank() -> None:
    """`sbatch --ntasks-per-node=8` then a plain `gpucert accept`: it must launch its own workers, not wait."""
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "gpu001", "SLURM_JOB_ID": "7"}
    assert ranks_from_env(batch) is None
    assert ranks_from_env({**batch, "SLURM_STEP_ID": "4294967294"}) is None


def test_a_single_slurm_task_or_no_launcher_is_standalone() -> None:
    assert ranks_from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None
    assert ranks_from_env({}) is None


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("gpu[003-010,012],cpu1", "gpu003"), ("node17", "node17"), ("a-b[1,4]", "a-b1"), ("x[09-12]", "x09")],
)
def test_first_host(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


def test_a_lone_process_does_not_pretend_to_be_a_launched_rank(monkeypatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    env = init_distributed()
    try:
        assert (env.rank, env.world_size, env.backend) == (0, 1, "gloo")
    finally:
        cleanup()
    # Were RANK/WORLD_SIZE left behind, the next `gpucert bench` in this process would run as one rank.
    assert "RANK" not in os.environ and "WORLD_SIZE" not in os.environ
