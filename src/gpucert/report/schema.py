"""The versioned report schema: run metadata, inventory and judged results.

Every verb that judges something writes one of these; the terminal table and Markdown are renderings of it,
never separate sources of truth. `report.schema.json` beside this file is the same schema for other tools;
the tests validate every report the CLI writes against it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gpucert.status import Status, worst

# 2.0: every result may name its node (`node`), and a cluster run carries every node's inventory (`nodes`).
# Reports of 1.x are still read: their results simply name no node.
# 2.1: the INFO status (shown, not judged) and its count.
SCHEMA_VERSION = "2.1"
READABLE_MAJORS = ("1", "2")

Value = float | int | str | bool | None


@dataclass(frozen=True)
class Result:
    """One judged measurement or check.

    `message` follows "expected X, found Y, on Z"; `expected` and `threshold_source` say which number it was
    held to and where that number came from (a profile field, a config key, the node median).
    """

    name: str
    subject: str
    status: Status
    message: str
    value: Value = None
    unit: str | None = None
    expected: str | None = None
    threshold_source: str | None = None
    remediation: str | None = None
    category: str = "health"
    # Set when the subject is one GPU: NVML's index, so consumers can find the bad GPU without parsing text.
    gpu_index: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    # The node label (see gpucert.runtime.identity): set on every result of a node, None for results about
    # the whole job (a collective across nodes, the golden-config diff).
    node: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        return cls(**{**data, "status": Status(data["status"])})


@dataclass(frozen=True)
class RunMeta:
    tool_version: str
    method_version: str
    verb: str
    command: list[str]
    host: str
    started_at: str
    finished_at: str
    duration_s: float
    profile: str
    config: dict[str, Any]
    software: dict[str, Any]
    tool: str = "gpucert"
    # Node labels in node-rank order; one entry for a one-node run, empty in 1.x reports.
    nodes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Report:
    meta: RunMeta
    inventory: dict[str, Any]
    results: list[Result]
    schema_version: str = SCHEMA_VERSION
    # Every node's inventory, keyed by node label, in a run of more than one node (`inventory` is then the
    # head node's); empty for one node, whose inventory is `inventory`.
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def status(self) -> Status:
        return worst(r.status for r in self.results)

    def counts(self) -> dict[str, int]:
        return {s.value: sum(r.status is s for r in self.results) for s in Status}

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "status": self.status.value,
            "exit_code": self.status.exit_code,
            "counts": self.counts(),
            "meta": dataclasses.asdict(self.meta),
            "inventory": self.inventory,
            "results": [r.to_dict() for r in self.results],
            "nodes": self.nodes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        major = str(data.get("schema_version", "")).split(".")[0]
        if major not in READABLE_MAJORS:
            raise ValueError(
                f"report schema {data.get('schema_version')!r} is not readable by this gpucert "
                f"(reads {', '.join(m + '.x' for m in READABLE_MAJORS)})"
            )
        return cls(
            meta=RunMeta(**data["meta"]),
            inventory=data["inventory"],
            results=[Result.from_dict(r) for r in data["results"]],
            schema_version=data["schema_version"],
            nodes=data.get("nodes", {}),
        )
