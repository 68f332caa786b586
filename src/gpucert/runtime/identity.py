"""How a rank, a node and a GPU are named in every message and result of a multi-node run.

A node's label is its Slurm node name or hostname; when two node ranks share one (two torchrun agents on one
host, containers), each becomes `host[n<node rank>]`, so no two nodes of a report collide. A GPU is named
`<node label> GPU <NVML index>`, with its UUID beside it: the index `nvidia-smi` shows on that node, whatever
CUDA_VISIBLE_DEVICES made of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankIdentity:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    # The label every result of this node carries (unique within the job, see node_labels).
    node: str
    host: str
    device: str
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    pid: int = 0

    @property
    def subject(self) -> str:
        """What this rank measures: `node-b GPU 3`, or `node-b rank 1 (cpu)` on a CPU machine."""
        if self.gpu_index is not None:
            return gpu_subject(self.node, self.gpu_index)
        return f"{self.node} rank {self.local_rank} ({self.device})"

    def describe(self) -> str:
        """For messages about a rank: `rank 3 (node-b GPU 3, host gpu-b)`; on a CPU machine `rank 1 (node-b, cpu)`,
        with its local rank where that differs (the subject's own parentheses would nest here)."""
        host = f", host {self.host}" if self.host != self.node else ""
        if self.gpu_index is not None:
            return f"rank {self.rank} ({self.subject}{host})"
        local = f" local rank {self.local_rank}" if self.local_rank != self.rank else ""
        return f"rank {self.rank} ({self.node}, {self.device}{local}{host})"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankIdentity:
        return cls(**data)


def gpu_subject(node: str, gpu_index: int) -> str:
    return f"{node} GPU {gpu_index}"


def node_labels(names: dict[int, str]) -> dict[int, str]:
    """Node rank -> unique label; `names` maps node rank -> Slurm node name or hostname."""
    counts: dict[str, int] = {}
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1
    return {rank: name if counts[name] == 1 else f"{name}[n{rank}]" for rank, name in names.items()}


def relabel(identities: Iterable[RankIdentity]) -> list[RankIdentity]:
    """Every rank's identity with its node's unique label (ranks report their raw name before they meet)."""
    ranks = list(identities)
    labels = node_labels({i.node_rank: i.node for i in ranks})
    return [dataclasses.replace(i, node=labels[i.node_rank]) for i in ranks]


def pack_roster(identities: Iterable[RankIdentity]) -> dict[str, Any]:
    """Every rank's identity, compact (the one key rank 0 publishes and every rank reads, group._meet): per node
    the fields all its ranks share, once (node, host, world sizes; the device type on a CPU machine), and per rank
    only the fields that differ (rank, local rank, device, GPU UUID and index, pid), as rows under column names.
    About 80 bytes a rank with GPUs instead of 250."""
    by_node: dict[int, list[dict[str, Any]]] = {}
    for ident in identities:
        by_node.setdefault(ident.node_rank, []).append(ident.to_dict())
    nodes = []
    for rows in by_node.values():
        shared = {k: v for k, v in rows[0].items() if all(row[k] == v for row in rows)}
        columns = [k for k in rows[0] if k not in shared]
        nodes.append({"shared": shared, "columns": columns, "rows": [[row[k] for k in columns] for row in rows]})
    return {"nodes": nodes}


def unpack_roster(roster: dict[str, Any]) -> list[RankIdentity]:
    """pack_roster's identities, by rank."""
    found = [
        RankIdentity.from_dict({**node["shared"], **dict(zip(node["columns"], row, strict=True))})
        for node in roster["nodes"]
        for row in node["rows"]
    ]
    return sorted(found, key=lambda ident: ident.rank)


def row_identity(row: dict[str, Any]) -> tuple[str, int | None, str | None]:
    """(subject, NVML index, node) of a benchmark's per-rank row; rows from before node identity (a replayed
    result of an old version) name the local rank as before."""
    if "subject" in row:
        return row["subject"], row.get("gpu_index"), row.get("node")
    gpu = row["local_rank"]
    subject = f"GPU {gpu} ({row['device']})" if row.get("device", "cpu") != "cpu" else f"rank {gpu} (cpu)"
    return subject, gpu, None
