"""Who a process is in its job, read from each launcher's environment; which GPU it binds; how nodes are named."""

from __future__ import annotations

import pytest

from gpucert.acceptance import place_on_node
from gpucert.config.loader import ConfigError
from gpucert.report.schema import Result
from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.device import pick_ordinal
from gpucert.runtime.group import unsaid_node_layout
from gpucert.runtime.identity import RankIdentity, node_labels, relabel
from gpucert.runtime.launch_env import (
    NodeEnv,
    RankEnv,
    first_host,
    node_env_from_flags,
    read_node_env,
    read_rank_env,
    tasks_per_node,
)
from gpucert.status import Status

TORCHRUN = {
    "RANK": "9",
    "WORLD_SIZE": "16",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "8",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "gpu007",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCHELASTIC_RUN_ID": "abc",
}

SRUN = {
    "SLURM_PROCID": "9",
    "SLURM_NTASKS": "16",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NNODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
    "SLURM_JOB_NODELIST": "gpu[007-008]",
    "SLURM_JOB_ID": "123456",
    "SLURM_STEP_ID": "0",
    "SLURMD_NODENAME": "gpu008",
}


def test_torchrun_workers_name_their_node_by_group_rank() -> None:
    env = read_rank_env(TORCHRUN)
    assert env == RankEnv("torchrun", 9, 16, 1, 8, 1, 2, "gpu007", 29500, True, "abc.0", None)


def test_torchrun_variables_win_over_slurm() -> None:
    env = read_rank_env({**SRUN, **TORCHRUN})
    assert env is not None and env.launcher == "torchrun" and env.node_name == "gpu008"


def test_srun_one_task_per_gpu_is_a_rank_with_its_node() -> None:
    env = read_rank_env(SRUN)
    assert env == RankEnv(
        "srun", 9, 16, 1, 8, 1, 2, "gpu007", 20000 + 123456 % 10000, False, "slurm-123456.0", "gpu008"
    )


def test_the_batch_script_itself_is_not_a_rank() -> None:
    """`sbatch --ntasks-per-node=8` then a plain `gpucert accept`: it must launch its own workers, not wait."""
    batch = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"}
    assert read_rank_env(batch) is None and read_node_env(batch) is None
    assert read_rank_env({**batch, "SLURM_STEP_ID": "4294967294"}) is None


def test_srun_one_task_per_node_is_a_node_agent() -> None:
    step = {**SRUN, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}
    assert read_rank_env(step) is None
    assert read_node_env(step) == NodeEnv("srun", 1, 2, "gpu007", 20000 + 123456 % 10000, "gpu008")


def test_a_kubernetes_indexed_job_is_a_node_agent() -> None:
    pod = {"JOB_COMPLETION_INDEX": "3", "GPUCERT_NNODES": "4", "MASTER_ADDR": "accept-0.accept", "MASTER_PORT": "29400"}
    assert read_node_env(pod) == NodeEnv("k8s", 3, 4, "accept-0.accept", 29400)
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        read_node_env({"JOB_COMPLETION_INDEX": "3", "GPUCERT_NNODES": "4"})


def test_a_pods_node_rank_outside_the_job_is_refused_naming_the_variable() -> None:
    """JOB_COMPLETION_INDEX 5 of 2 nodes: node 0 waited for rank 1, which never came, and blamed itself."""
    pod = {"JOB_COMPLETION_INDEX": "5", "GPUCERT_NNODES": "2", "MASTER_ADDR": "accept-0.accept"}
    with pytest.raises(ConfigError, match=r"JOB_COMPLETION_INDEX=5 is outside 0\.\.1 \(GPUCERT_NNODES=2\)"):
        read_node_env(pod)


def test_ranks_whose_launcher_said_no_node_layout_are_told_so_before_any_gpu_binding() -> None:
    """RANK and WORLD_SIZE only, 2 nodes of 8: the error said "local rank 3 of 16 sees 8 CUDA device(s) ... give
    every task one GPU", sending the user after GPU binding."""
    env = read_rank_env({"RANK": "3", "WORLD_SIZE": "16"})
    assert env is not None and not env.local_said
    with pytest.raises(ConfigError, match="set RANK and WORLD_SIZE but not LOCAL_WORLD_SIZE or GROUP_RANK"):
        unsaid_node_layout(env, 8)
    unsaid_node_layout(env, 16)  # one node of 16 GPUs: the guess is right
    unsaid_node_layout(env, 1)  # one GPU a process (CUDA_VISIBLE_DEVICES per rank) on one host: as before
    said = read_rank_env({"RANK": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "0"})
    assert said is not None and said.local_said
    unsaid_node_layout(said, 8)


def test_a_lone_task_or_no_launcher_is_standalone() -> None:
    assert read_rank_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}) is None
    assert read_rank_env({}) is None and read_node_env({}) is None


def test_a_garbled_variable_is_named() -> None:
    with pytest.raises(ConfigError, match=r"RANK='x' is not an integer"):
        read_rank_env({"RANK": "x", "WORLD_SIZE": "2"})


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ((2, None, "10.0.0.1", 29500), "needs --node-rank"),
        ((2, 2, "10.0.0.1", 29500), "--node-rank must be in 0..1"),
        ((2, 1, None, 29500), "--master-addr"),
        ((0, None, None, 29500), "--nnodes must be >= 1"),
        ((2, 0, "h", 70000), "--master-port must be in 1..65535"),
    ],
)
def test_bad_node_flags_are_refused_before_any_work(argv: tuple, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        node_env_from_flags(*argv)


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("gpu[003-010,012],cpu1", "gpu003"),
        ("node17", "node17"),
        ("a-b[1,4]", "a-b1"),
        ("x[09-12]", "x09"),
        # Text after the bracket, and several brackets: 'gpu[01-04]-ib' was read as gpu01, a host not there.
        ("gpu[01-04]-ib", "gpu01-ib"),
        ("r[1-2]n[01-08],x", "r1n01"),
    ],
)
def test_first_host(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


def test_tasks_per_node() -> None:
    assert tasks_per_node("8(x2),4", 3) == [8, 8, 4]
    assert tasks_per_node("", 2) == []


@pytest.mark.parametrize(
    ("local_rank", "local_world", "visible", "ordinal"),
    [(3, 8, 8, 3), (0, 2, 8, 0), (5, 8, 1, 0), (0, 1, 1, 0)],
)
def test_device_ordinal(local_rank: int, local_world: int, visible: int, ordinal: int) -> None:
    """torchrun shows every GPU (LOCAL_RANK picks one); --gpus-per-task=1 shows one, as device 0."""
    assert pick_ordinal(local_rank, local_world, visible, "0") == ordinal


def test_an_ambiguous_binding_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigError) as info:
        pick_ordinal(5, 8, 2, "4,5")
    assert "local rank 5 of 8 sees 2 CUDA device(s) (CUDA_VISIBLE_DEVICES '4,5')" in str(info.value)
    assert "--gpus-per-task=1" in str(info.value)


def test_nodes_sharing_a_hostname_get_unique_labels() -> None:
    assert node_labels({0: "box", 1: "box", 2: "other"}) == {0: "box[n0]", 1: "box[n1]", 2: "other"}
    ranks = [RankIdentity(r, 2, 0, 1, r, 2, "box", "box", "cuda:0", f"GPU-{r}", 0) for r in (0, 1)]
    named = relabel(ranks)
    assert [i.subject for i in named] == ["box[n0] GPU 0", "box[n1] GPU 0"]
    assert named[1].describe() == "rank 1 (box[n1] GPU 0, host box)"


def test_results_are_placed_on_their_node() -> None:
    gpu = Result("gpu.ecc", "GPU 2 (0000:1b:00.0)", Status.FAIL, "found 3 on GPU 2 (0000:1b:00.0)", gpu_index=2)
    node = Result("node.xid", "box", Status.PASS, "no XID events on box", expected="no XID")
    port = Result("ib.port", "mlx5_1 port 1", Status.FAIL, "expected ACTIVE, found DOWN on mlx5_1 port 1")
    placed = place_on_node([gpu, node, port], "box[n1]", "box")
    assert [(r.node, r.subject) for r in placed] == [
        ("box[n1]", "box[n1] GPU 2 (0000:1b:00.0)"),
        ("box[n1]", "box[n1]"),
        ("box[n1]", "box[n1] mlx5_1 port 1"),
    ]
    assert placed[0].message == "found 3 on box[n1] GPU 2 (0000:1b:00.0)"
    assert placed[1].message == "no XID events on box[n1]"
    assert placed[2].message == "expected ACTIVE, found DOWN on box[n1] mlx5_1 port 1"


def test_runtime_timeouts_must_bound_every_wait() -> None:
    assert RuntimeConfig().problems() == []
    assert RuntimeConfig(rendezvous_timeout_s=0, heartbeat_timeout_s=2, heartbeat_interval_s=1).problems() == [
        "runtime.rendezvous_timeout_s must be > 0, found 0",
        "runtime.heartbeat_timeout_s (2) must be at least 3 x runtime.heartbeat_interval_s (1), "
        "or one late beat kills the job",
    ]
    # inf was taken: a traceback from timedelta (collective, rendezvous), int() (kill grace), or no hang detection.
    inf = float("inf")
    assert RuntimeConfig(collective_timeout_s=inf, kill_grace_s=inf, heartbeat_timeout_s=inf).problems() == [
        "runtime.collective_timeout_s must be at most 30 days (2.592e+06 s), found inf",
        "runtime.heartbeat_timeout_s must be at most 30 days (2.592e+06 s), found inf",
        "runtime.kill_grace_s must be >= 0 and at most 2.592e+06 s, found inf",
    ]
    assert RuntimeConfig(heartbeat_interval_s=0.0001, heartbeat_timeout_s=0.001).problems() == [
        "runtime.heartbeat_interval_s must be >= 0.1 s, found 0.0001: beats that often load the job's store with beats",
        "runtime.heartbeat_timeout_s must be >= 1 s, found 0.001: a healthy rank busy for a moment would be taken "
        "for a dead one",
    ]


def test_every_gpu_result_carries_its_gpus_uuid() -> None:
    from gpucert.acceptance import with_gpu_uuids

    nodes = {"a": {"gpus": [{"index": 0, "uuid": "GPU-a0"}]}, "b": {"gpus": [{"index": 0, "uuid": "GPU-b0"}]}}
    mm = Result("matmul.bf16.max", "b GPU 0", Status.PASS, "ok", expected="x", gpu_index=0, node="b")
    known = Result(
        "gpu.ecc", "a GPU 0", Status.PASS, "ok", expected="x", gpu_index=0, node="a", details={"uuid": "GPU-x"}
    )
    node = Result("node.xid", "a", Status.PASS, "ok", expected="x", node="a")
    placed = with_gpu_uuids([mm, known, node], nodes)
    assert [r.details.get("uuid") for r in placed] == ["GPU-b0", "GPU-x", None]
