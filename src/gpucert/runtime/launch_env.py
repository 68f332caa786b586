"""Where this process sits in the job, read from the launcher's environment (pure: tests pass a dict).

Two shapes of job:
- **one process per GPU** (`RankEnv`): torchrun's workers, `srun` with one task per GPU, or the workers
  gpucert's own node agent starts. The launcher says RANK/WORLD_SIZE (or SLURM_PROCID/SLURM_NTASKS).
- **one process per node** (`NodeEnv`): `srun --ntasks-per-node=1`, a Kubernetes indexed Job, or
  `gpucert accept --nnodes N --node-rank R --master-addr A`; that process starts its node's GPU workers itself.

Node identity: torchrun's GROUP_RANK, Slurm's SLURM_NODEID / SLURMD_NODENAME, the indexed Job's
JOB_COMPLETION_INDEX. Hostnames alone are not trusted: several "nodes" can share one (containers, several
slurmd on a host).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpucert.config.loader import ConfigError

# Set in every worker gpucert's node process starts (runtime/launcher.py): where local rank 0 writes the node's
# verdict. Here, not there, so a light check (the CLI's argument types) can ask without importing torch.
VERDICT_FILE = "GPUCERT_VERDICT_FILE"


def launched_by_gpucert() -> bool:
    """This process is a rank that gpucert's node process started: that process checked the command line and
    writes what is written once a node (the metrics file), so the rank does neither."""
    return VERDICT_FILE in os.environ


# Variables a launcher sets for its workers; a launch from inside a worker must not inherit them.
RANK_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RUN_ID",
    "GPUCERT_AGENT_STORE",
    "GPUCERT_STORE_PREFIX",
    "GPUCERT_NODE_LABEL",
    "GPUCERT_AGENT_PID",
)


@dataclass(frozen=True)
class RankEnv:
    """One rank of a job with one process per GPU."""

    launcher: str  # torchrun | srun | gpucert
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    # The job's store is served by a launcher agent (torchrun's or gpucert's, on node 0), not by rank 0.
    agent_store: bool = False
    # gpucert's agent runs several jobs (one per benchmark) over one store: each has its own key prefix.
    store_prefix: str = "job"
    # The node's name as the launcher knows it (SLURMD_NODENAME, or the label gpucert's agent chose).
    node_name: str | None = None
    # False where the launcher set RANK and WORLD_SIZE but not LOCAL_WORLD_SIZE (a Kubeflow PyTorchJob): the
    # local figures above are then guesses (the whole job on one node).
    local_said: bool = True


@dataclass(frozen=True)
class NodeEnv:
    """One task per node that starts a process per GPU itself."""

    launcher: str  # srun | k8s | flags
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    node_name: str | None = None


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError as exc:
        raise ConfigError(f"environment variable {key}={env[key]!r} is not an integer") from exc


def slurm_port(env: Mapping[str, str]) -> int:
    """One port per job, below Linux's ephemeral range (32768 up), so two jobs on one node do not collide."""
    return 20000 + int(env.get("SLURM_JOB_ID", "0") or 0) % 10000


def _in_slurm_step(env: Mapping[str, str]) -> bool:
    # The batch script also sees SLURM_PROCID=0 and SLURM_NTASKS=N: taking it for rank 0 would wait for N-1
    # ranks that never come. Only srun's tasks have a numeric SLURM_STEP_ID ("batch" = 4294967294).
    step = env.get("SLURM_STEP_ID")
    return step is not None and step not in ("batch", "4294967294", "extern", "4294967295")


def _slurm_nodes(env: Mapping[str, str]) -> int:
    for key in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        if key in env:
            return _int(env, key)
    return 1


def read_rank_env(env: Mapping[str, str]) -> RankEnv | None:
    """The rank this process is, when a launcher started one process per GPU; None otherwise."""
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        local_rank = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank % max(local_world, 1)
        node_rank = _int(env, "GROUP_RANK") if "GROUP_RANK" in env else rank // max(local_world, 1)
        nodes = _int(env, "GROUP_WORLD_SIZE") if "GROUP_WORLD_SIZE" in env else -(-world // max(local_world, 1))
        ours = env.get("GPUCERT_AGENT_STORE") == "1"
        return RankEnv(
            launcher="gpucert" if ours else "torchrun",
            rank=rank,
            world_size=world,
            local_rank=local_rank,
            local_world_size=local_world,
            node_rank=node_rank,
            num_nodes=nodes,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500,
            agent_store=ours or env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            # torchrun keeps its store across restarts: a restarted job must not meet its previous keys.
            store_prefix=env.get("GPUCERT_STORE_PREFIX")
            or f"{env.get('TORCHELASTIC_RUN_ID', 'job')}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}",
            node_name=env.get("GPUCERT_NODE_LABEL") or env.get("SLURMD_NODENAME"),
            local_said="LOCAL_WORLD_SIZE" in env,
        )
    if not _in_slurm_step(env) or "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return None
    tasks, nodes = _int(env, "SLURM_NTASKS"), _slurm_nodes(env)
    if tasks <= 1 or tasks == nodes:
        return None  # a lone task, or one task per node: see read_node_env
    node_rank = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "", nodes)
    return RankEnv(
        launcher="srun",
        rank=_int(env, "SLURM_PROCID"),
        world_size=tasks,
        local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
        local_world_size=per_node[node_rank] if node_rank < len(per_node) else tasks // max(nodes, 1),
        node_rank=node_rank,
        num_nodes=nodes,
        master_addr=env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]),
        master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else slurm_port(env),
        store_prefix=f"slurm-{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}",
        node_name=env.get("SLURMD_NODENAME"),
    )


def read_node_env(env: Mapping[str, str]) -> NodeEnv | None:
    """One task per node (srun --ntasks-per-node=1, a Kubernetes indexed Job); None otherwise.

    An indexed Job says its node rank in JOB_COMPLETION_INDEX; the manifest gpucert renders also sets
    GPUCERT_NNODES and MASTER_ADDR (the headless Service name of pod 0).
    """
    if read_rank_env(env) is not None:
        return None
    if _in_slurm_step(env) and "SLURM_NTASKS" in env:
        nodes = _slurm_nodes(env)
        if nodes > 1 and _int(env, "SLURM_NTASKS") == nodes:
            return NodeEnv(
                launcher="srun",
                node_rank=_int(env, "SLURM_NODEID"),
                num_nodes=nodes,
                master_addr=env.get("MASTER_ADDR")
                or first_host(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]),
                master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else slurm_port(env),
                node_name=env.get("SLURMD_NODENAME"),
            )
    if "GPUCERT_NNODES" in env and _int(env, "GPUCERT_NNODES") > 1:
        rank_key = "GPUCERT_NODE_RANK" if "GPUCERT_NODE_RANK" in env else "JOB_COMPLETION_INDEX"
        if rank_key not in env:
            raise ConfigError(
                "GPUCERT_NNODES is set but neither GPUCERT_NODE_RANK nor JOB_COMPLETION_INDEX says this node's rank"
            )
        if "MASTER_ADDR" not in env:
            raise ConfigError("GPUCERT_NNODES is set but MASTER_ADDR (node rank 0's address) is not")
        node_rank, nodes = _int(env, rank_key), _int(env, "GPUCERT_NNODES")
        # Node 0 would wait for a rank that never comes, and blame itself when its store timed out.
        if not 0 <= node_rank < nodes:
            raise ConfigError(
                f"environment variable {rank_key}={node_rank} is outside 0..{nodes - 1} (GPUCERT_NNODES={nodes})"
            )
        return NodeEnv(
            launcher="k8s" if rank_key == "JOB_COMPLETION_INDEX" else "env",
            node_rank=node_rank,
            num_nodes=nodes,
            master_addr=env["MASTER_ADDR"],
            master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500,
        )
    return None


def node_env_from_flags(
    nnodes: int, node_rank: int | None, master_addr: str | None, master_port: int, node_name: str | None = None
) -> NodeEnv:
    """`--nnodes N --node-rank R --master-addr A [--master-port P] [--node-name NAME]`, checked before any work."""
    if nnodes < 1:
        raise ConfigError(f"--nnodes must be >= 1, found {nnodes}")
    if node_name is not None and not re.fullmatch(r"[A-Za-z0-9_.:@+=-]+", node_name):
        raise ConfigError(f"--node-name {node_name!r}: use letters, digits and _.:@+=- (it names files and results)")
    # Out of range is said as such, before what else is missing (`--node-rank 3` of one node ran as rank 0).
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank must be in 0..{nnodes - 1} for --nnodes {nnodes}, found {node_rank}")
    if nnodes == 1:
        return NodeEnv("flags", 0, 1, master_addr or "127.0.0.1", master_port, node_name)
    if node_rank is None or master_addr is None:
        raise ConfigError(
            f"--nnodes {nnodes} needs --node-rank (0..{nnodes - 1}) and --master-addr (node rank 0's address)"
        )
    if not 0 < master_port < 65536:
        raise ConfigError(f"--master-port must be in 1..65535, found {master_port}")
    return NodeEnv("flags", node_rank, nnodes, master_addr, master_port, node_name)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm nodelist: 'gpu[003-010,012],cpu1' -> 'gpu003'; text after a bracket and
    several brackets kept ('gpu[01-04]-ib' -> 'gpu01-ib', 'r[1-2]n[01-08]' -> 'r1n01')."""
    match = re.match(r"(?:[^,\[\]]+|\[[^\]]+\])+", nodelist.strip())
    if not match:
        raise ConfigError(f"cannot read a host from Slurm nodelist {nodelist!r}")
    return re.sub(r"\[([^\]]+)\]", lambda m: m.group(1).split(",")[0].split("-")[0], match.group(0))


def tasks_per_node(spec: str, nodes: int) -> list[int]:
    """Slurm's SLURM_STEP_TASKS_PER_NODE ('8(x2),4' -> [8, 8, 4]); empty when unset."""
    counts: list[int] = []
    for part in filter(None, spec.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ConfigError(f"cannot read Slurm tasks per node {spec!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[:nodes] if nodes else counts
