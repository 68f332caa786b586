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

SCHEMA_VERSION = "1.0"

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


@dataclass(frozen=True)
class Report:
    meta: RunMeta
    inventory: dict[str, Any]
    results: list[Result]
    schema_version: str = SCHEMA_VERSION

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
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        major = str(data.get("schema_version", "")).split(".")[0]
        if major != SCHEMA_VERSION.split(".")[0]:
            raise ValueError(
                f"report schema {data.get('schema_version')!r} is not readable by this gpucert "
                f"(reads {SCHEMA_VERSION.split('.')[0]}.x)"
            )
        return cls(
            meta=RunMeta(**data["meta"]),
            inventory=data["inventory"],
            results=[Result.from_dict(r) for r in data["results"]],
            schema_version=data["schema_version"],
        )
