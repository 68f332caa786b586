"""The versioned report schema: run metadata, inventory and judged results.

Every verb that judges something writes one of these; the terminal table and Markdown are renderings of it,
never separate sources of truth. `report.schema.json` beside this file is the same schema for other tools;
the tests validate every report the CLI writes against it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
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

    def __post_init__(self) -> None:
        # Every PASS names what it was held to (schema 2.1): a figure held to nothing is INFO. Checked here so a
        # check that forgets its threshold fails in its first test rather than in a user's report.
        if self.status is Status.PASS and not self.expected:
            raise ValueError(f"{self.name} on {self.subject}: a PASS must name what it was held to (expected)")
        if self.status is Status.PASS and isinstance(self.value, float) and not math.isfinite(self.value):
            # A measurement that came out nan or inf (a zero-length timing, a corrupt file) compares False with
            # every threshold, so `value < floor` let it through: it is no pass, and the run is not crashed for it.
            object.__setattr__(self, "status", Status.ERROR)
            object.__setattr__(self, "message", f"measured {self.value}, not a number to judge: {self.message}")

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


def _checked_result(data: Any, index: int, schema_version: str) -> Result:
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
    _check_types(data, RESULT_TYPES, f"{where} ({data['name']})" if isinstance(data["name"], str) else where)
    known = _unjudged_as_info(_known(Result, data), schema_version)
    try:
        return Result.from_dict(known)
    except ValueError as exc:  # Result's own rules (a PASS names its threshold): said with where it is
        raise ValueError(f"{where}: {exc}") from None


# The JSON types of each field a view reads (a number is int or float; bool is no number). A field of a wrong
# type is refused on load, naming it, where it would otherwise break a renderer later with a bare TypeError.
def _json_types(hint: Any) -> tuple[type, ...]:
    """The JSON value types a field annotated `hint` may hold: a float field takes an integer too (JSON writes 3.0
    as 3), `list[str]` is a list, `X | None` adds null."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(hint) for t in _json_types(arg))
    if typing.get_origin(hint) is not None:
        return (typing.get_origin(hint),)
    return (float, int) if hint is float else (hint,)


def _field_types(cls: type) -> dict[str, tuple[type, ...]]:
    """Each field of the dataclass `cls` as _check_types takes it: the types its annotation allows (status aside,
    checked against the Status names on its own)."""
    return {name: _json_types(hint) for name, hint in typing.get_type_hints(cls).items() if name != "status"}


RESULT_TYPES = _field_types(Result)

_TEXT_OR_NULL = (str, type(None))
_INT_OR_NULL = (int, type(None))
_NUMBER_OR_NULL = (float, int, type(None))
# An inventory's GPU as the views read it (NodeInventory.to_dict): index and name always; the rest where present.
GPU_TYPES: dict[str, tuple[type, ...]] = {
    "index": (int,),
    "name": (str,),
    "bus_id": _TEXT_OR_NULL,
    "memory_total_gib": _NUMBER_OR_NULL,
    "pcie_gen_current": _INT_OR_NULL,
    "pcie_gen_max": _INT_OR_NULL,
    "pcie_width_current": _INT_OR_NULL,
    "pcie_width_max": _INT_OR_NULL,
    "nvlinks": (list, type(None)),
    "ecc_enabled": (bool, type(None)),
    "mig_enabled": (bool, type(None)),
    "power_enforced_limit_w": _NUMBER_OR_NULL,
    "temperature_c": _NUMBER_OR_NULL,
    "vbios": _TEXT_OR_NULL,
    "serial": _TEXT_OR_NULL,
}
_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object",
               list: "a list", type(None): "null"}  # fmt: skip


def _check_types(data: dict[str, Any], types: dict[str, tuple[type, ...]], where: str) -> None:
    for key, allowed in types.items():
        if key not in data:
            continue
        value = data[key]
        bad_bool = isinstance(value, bool) and bool not in allowed  # True is an int to Python, not to JSON
        if bad_bool or not isinstance(value, allowed):
            named = (_KIND_NAMES[t] for t in allowed if not (t is int and float in allowed))
            wanted = " or ".join(dict.fromkeys(named))
            raise ValueError(f"{where}: {key} is {_article(_json_kind(value))}, expected {wanted}")


def _check_inventory(inventory: dict[str, Any], where: str) -> None:
    """The GPUs of one node's inventory as the views read them; ValueError naming the GPU entry and key."""
    gpus = inventory.get("gpus")
    if gpus is None:
        return
    if not isinstance(gpus, list):
        raise ValueError(f"{where}.gpus is {_article(_json_kind(gpus))}, expected a list")
    for i, gpu in enumerate(gpus):
        here = f"{where}.gpus[{i}]"
        if not isinstance(gpu, dict):
            raise ValueError(f"{here} is {_article(_json_kind(gpu))}, expected an object")
        missing = [key for key in ("index", "name") if key not in gpu]
        if missing:
            raise ValueError(f"{here} has no {', '.join(missing)}: every GPU of an inventory has its index and name")
        _check_types(gpu, GPU_TYPES, here)


def _article(kind: str) -> str:
    return "null" if kind == "null" else f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _json_kind(value: Any) -> str:
    kinds = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return {**kinds, type(None): "null"}.get(type(value), type(value).__name__)


def _before_info(schema_version: str) -> bool:
    """A report written before schema 2.1, when a figure held to nothing could read PASS."""
    try:
        major, minor = (int(part) for part in schema_version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < (2, 1)


def _unjudged_as_info(result: dict[str, Any], schema_version: str) -> dict[str, Any]:
    """A PASS with no threshold is read as what it was: shown, not judged (INFO), so no view, comparison or
    history counts it as passed or regressed. Before 2.1 a figure held to nothing could read PASS; from 2.1 the
    schema refuses one, and a file that has one anyway (hand-edited, another tool's) is read the same way rather
    than refused whole."""
    if result["status"] != Status.PASS.value or result.get("expected"):
        return result
    why = f"in a schema {schema_version} report" if _before_info(schema_version) else "against the schema"
    return {
        **result,
        "status": Status.INFO.value,
        "message": f"shown, not judged (PASS with no threshold {why}): {result['message']}",
    }


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


META_TYPES = _field_types(RunMeta)


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
        _check_types(meta, META_TYPES, "meta")
        for key, what in (("nodes", "a node label"), ("command", "an argument")):
            for i, item in enumerate(meta.get(key, [])):
                if not isinstance(item, str):
                    raise ValueError(f"meta.{key}[{i}] is {_article(_json_kind(item))}, expected a string ({what})")
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
        _check_inventory(inventory, "inventory")
        nodes = data.get("nodes") or {}
        if not isinstance(nodes, dict):
            raise ValueError(f"nodes is a JSON {_json_kind(nodes)}, expected an object (node label -> inventory)")
        for label, node_inventory in nodes.items():
            if not isinstance(node_inventory, dict):
                raise ValueError(f"nodes.{label} is a JSON {_json_kind(node_inventory)}, expected an object")
            _check_inventory(node_inventory, f"nodes.{label}")
        return cls(
            meta=RunMeta(**_known(RunMeta, meta)),
            inventory=inventory,
            results=[_checked_result(r, i, version) for i, r in enumerate(results)],
            schema_version=version,
            nodes=nodes,
        )
