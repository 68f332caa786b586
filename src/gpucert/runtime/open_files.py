"""The open-file limit of the process that serves the job's store: one socket per connection, checked at start.

Node 0's store holds two connections per rank (its main thread's and its watchdog's) and two per node (its
gpucert agent's), 16,384 sockets at 8,192 ranks: past RLIMIT_NOFILE's soft limit (1,024 on many distributions)
the store's accept fails and ranks see connection errors much later. `fit_open_files` raises the soft limit to
the hard one (any process may) and, when even that is too low, fails before the rendezvous with what to do.
"""

from __future__ import annotations

import resource

from gpucert.runtime.errors import RendezvousError

# What the serving process holds open besides its clients' sockets: its listening socket, the event loop's,
# log files, torch's own.
MARGIN = 64


def store_connections(ranks: int, nodes: int) -> int:
    """Sockets the store's server holds for a job: two per rank, two per node's gpucert agent."""
    return 2 * ranks + 2 * nodes


def plan_open_files(needed: int, soft: int, hard: int) -> tuple[int, str | None]:
    """The soft limit to set (the hard one, when the soft is short) and, when even the hard limit is short, why
    the store cannot serve (pure: the limits are arguments; resource.RLIM_INFINITY is -1)."""
    unlimited = resource.RLIM_INFINITY
    if soft == unlimited or soft >= needed:
        return soft, None
    if hard == unlimited or hard >= needed:
        return hard, None
    return hard, (
        f"expected an open-file limit (RLIMIT_NOFILE) of at least {needed}, found {hard} (hard limit; soft {soft})"
    )


def fit_open_files(ranks: int, nodes: int, who: str) -> int:
    """Raise this process's soft RLIMIT_NOFILE for a store of `ranks` ranks on `nodes` nodes; the limit now in
    force. RendezvousError when the hard limit is too low, naming the limit, the number and what to do."""
    needed = store_connections(ranks, nodes) + MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target, problem = plan_open_files(needed, soft, hard)
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if problem is not None:
        raise RendezvousError(
            f"{who}: cannot serve the job's store for {ranks} ranks on {nodes} nodes: {problem}, 2 per rank and 2 "
            f"per node plus {MARGIN}. Raise it on node rank 0 before gpucert starts: `ulimit -n {needed}` (the "
            "hard limit: /etc/security/limits.conf, or LimitNOFILE= of the service that starts jobs); under Slurm, "
            "PropagateResourceLimits (slurm.conf) carries the submitting shell's limit into the job"
        )
    return target
