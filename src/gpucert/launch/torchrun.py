"""`gpucert launch torchrun VERB`: the exact command for every node of a cluster without a scheduler.

Start them in any order: node rank 0 serves the rendezvous; the others wait for it, and every wait is bounded
by runtime.rendezvous_timeout_s, so a node that never comes is named instead of waited for. Every verb starts
the same way (gpucert on every node, its ranks on torchrun's engine: runtime/launcher.py).
"""

from __future__ import annotations

import shlex

from gpucert.config.loader import ConfigError
from gpucert.launch.slurm import VERB_ARGV, VERBS, refuse_once_verb, rendezvous_set


def node_commands(
    verb: str,
    args: tuple[str, ...],
    nodes: int,
    head: str,
    port: int,
    gpus_per_node: int | None,
    env: dict[str, str],
    rendezvous_timeout_s: float | None,
) -> list[str]:
    """One shell command per node rank, quoted. gpus_per_node None: finetune gets no --nproc, so each node runs
    one rank per GPU it has (as accept does)."""
    if verb not in VERBS:
        raise ConfigError(f"verb {verb!r}: expected one of {', '.join(VERBS)}")
    if nodes < 1:
        raise ConfigError(f"--nodes must be >= 1, found {nodes}")
    refuse_once_verb(verb, "torchrun")
    prefix = ["env", *(f"{k}={v}" for k, v in env.items())] if env else []
    commands = []
    for rank in range(nodes):
        # Every verb the same way: gpucert on every node, meeting at the head (runtime/launcher.py).
        argv = [*prefix, *VERB_ARGV[verb], "--nnodes", str(nodes), "--node-rank", str(rank)]
        argv += ["--master-addr", head, "--master-port", str(port)]
        argv += rendezvous_set(rendezvous_timeout_s)
        if verb == "finetune" and gpus_per_node:
            argv += ["--nproc", str(gpus_per_node)]
        argv += args
        commands.append(shlex.join(argv))
    return commands


def render_commands(commands: list[str], head: str) -> str:
    lines = [f"# {len(commands)} node(s); node rank 0 runs on {head}. Start them in any order."]
    for rank, command in enumerate(commands):
        lines += [f"# node rank {rank}", command]
    return "\n".join(lines) + "\n"
