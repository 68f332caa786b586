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


# What a report must carry to be read; a key of a newer minor version is left unread (a 2.x reader reads 2.y).
REQUIRED_RESULT = ("name", "subject", "status", "message")
STATUS_NAMES = ", ".join(s.value for s in Status)


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _checked_result(data: Any, index: int) -> Result:
    """results[index] as a Result; ValueError naming the index, the key and what was expected."""
    where = f"results[{index}]"
    if not isinstance(data, dict):
        raise ValueError(f"{where} is a JSON {_json_kind(data)}, expected an object with {', '.join(REQUIRED_RESULT)}")
    missing = [k for k in REQUIRED_RESULT if k not in data]
    if missing:
        named = f" (name {data['name']!r})" if "name" in data else ""
        raise ValueError(f"{where}{named} has no {', '.join(missing)}: every result names its check, subject, "
                         "status and message")  # fmt: skip
    if data["status"] not in {s.value for s in Status}:
        raise ValueError(f"{where} ({data['name']}): status {data['status']!r} is not one of {STATUS_NAMES}")
    return Result.from_dict(_known(Result, data))


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _before_info(schema_version: str) -> bool:
    """A report written before schema 2.1, when a figure held to nothing could read PASS."""
    try:
        major, minor = (int(part) for part in schema_version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < (2, 1)


def _read_result(data: Any, index: int, schema_version: str) -> Result:
    result = _checked_result(data, index)
    return _unjudged_as_info(result, schema_version) if _before_info(schema_version) else result


def _unjudged_as_info(result: Result, schema_version: str) -> Result:
    """A PASS with no threshold in a report from before 2.1 is read as what it was: shown, not judged (INFO), so
    no view, comparison or history counts it as passed or regressed."""
    if result.status is not Status.PASS or result.expected:
        return result
    return dataclasses.replace(
        result,
        status=Status.INFO,
        message=f"shown, not judged (PASS with no threshold in a schema {schema_version} report): {result.message}",
    )


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


# The fields a report's meta must have (those with no default).
REQUIRED_META = tuple(
    f.name
    for f in dataclasses.fields(RunMeta)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)


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
    def from_dict(cls, data: Any) -> Report:
        """A report from its JSON; ValueError naming the key that is missing or wrong, and what was expected."""
        if not isinstance(data, dict):
            raise ValueError(f"the file holds a JSON {_json_kind(data)}; a gpucert report is an object")
        if data.get("schema_version") is None:
            raise ValueError("no schema_version: not a gpucert report (every report.json gpucert writes has one)")
        version = str(data["schema_version"])
        if version.split(".")[0] not in READABLE_MAJORS:
            raise ValueError(
                f"report schema {version!r} is not readable by this gpucert "
                f"(reads {', '.join(m + '.x' for m in READABLE_MAJORS)})"
            )
        meta = data.get("meta")
        if not isinstance(meta, dict):
            raise ValueError(
                f"meta is {'missing' if meta is None else 'a JSON ' + _json_kind(meta)}, expected an object"
            )
        missing = [k for k in REQUIRED_META if k not in meta]
        if missing:
            raise ValueError(f"meta has no {', '.join(missing)}")
        results = data.get("results")
        if not isinstance(results, list):
            raise ValueError(
                f"results is {'missing' if results is None else 'a JSON ' + _json_kind(results)}, expected a list"
            )
        if not results and meta["verb"] != "discover":  # discover lists the node and judges nothing
            raise ValueError(
                f"results is empty: this `gpucert {meta['verb']}` report judged nothing (a run stopped before its "
                "first check?)"
            )
        inventory = data.get("inventory", {})
        if not isinstance(inventory, dict):
            raise ValueError(f"inventory is a JSON {_json_kind(inventory)}, expected an object")
        return cls(
            meta=RunMeta(**_known(RunMeta, meta)),
            inventory=inventory,
            results=[_read_result(r, i, version) for i, r in enumerate(results)],
            schema_version=version,
            nodes=data.get("nodes") or {},
        )
