"""Collect everything gpucert reads from NVML into one JSON-able snapshot.

Collect and parse are split on purpose: `collect_nvml_snapshot` runs a fixed list of NVML queries and records
each answer (or its NVML error) under the query's name; `gpus.py` parses that snapshot without touching
hardware. A snapshot captured on a real node (`gpucert capture`) can therefore be replayed anywhere through
`SnapshotNvml`, which answers the same calls from the recorded data: that is how the tests run on CPU
machines, and how a support engineer re-reads a customer's node offline (`--nvml-snapshot`).
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

SNAPSHOT_FORMAT = "gpucert-nvml-snapshot/1"

# NVML constants, spelled out so parsing needs no pynvml import (values from nvml.h).
TEMPERATURE_GPU = 0
TEMPERATURE_THRESHOLD_SHUTDOWN = 0
TEMPERATURE_THRESHOLD_SLOWDOWN = 1
CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM = 0, 1, 2
ECC_CORRECTED, ECC_UNCORRECTED = 0, 1
ECC_VOLATILE, ECC_AGGREGATE = 0, 1
P2P_CAPS_NVLINK = 2
# H100/H200 expose 18 NVLink 4 links; NVML answers InvalidArgument past a device's last link.
NVLINK_LINKS_QUERIED = 18
# CPU affinity bitmask words of 64 bits: enough for 1,024 logical CPUs.
CPU_AFFINITY_WORDS = 16


@dataclass(frozen=True)
class Query:
    fn: str
    args: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.fn}({','.join(map(str, self.args))})" if self.args else self.fn


SYSTEM_QUERIES = (
    Query("nvmlSystemGetDriverVersion"),
    Query("nvmlSystemGetCudaDriverVersion_v2"),
    Query("nvmlSystemGetNVMLVersion"),
)

DEVICE_QUERIES = (
    Query("nvmlDeviceGetName"),
    Query("nvmlDeviceGetUUID"),
    Query("nvmlDeviceGetSerial"),
    Query("nvmlDeviceGetPciInfo"),
    Query("nvmlDeviceGetMemoryInfo"),
    Query("nvmlDeviceGetVbiosVersion"),
    Query("nvmlDeviceGetInforomImageVersion"),
    Query("nvmlDeviceGetCudaComputeCapability"),
    Query("nvmlDeviceGetCurrPcieLinkGeneration"),
    Query("nvmlDeviceGetCurrPcieLinkWidth"),
    Query("nvmlDeviceGetMaxPcieLinkGeneration"),
    Query("nvmlDeviceGetMaxPcieLinkWidth"),
    Query("nvmlDeviceGetGpuMaxPcieLinkGeneration"),
    Query("nvmlDeviceGetNumaNodeId"),
    Query("nvmlDeviceGetCpuAffinity", (CPU_AFFINITY_WORDS,)),
    Query("nvmlDeviceGetMigMode"),
    Query("nvmlDeviceGetEccMode"),
    Query("nvmlDeviceGetPersistenceMode"),
    Query("nvmlDeviceGetComputeMode"),
    Query("nvmlDeviceGetPowerManagementLimit"),
    Query("nvmlDeviceGetPowerManagementDefaultLimit"),
    Query("nvmlDeviceGetEnforcedPowerLimit"),
    Query("nvmlDeviceGetPowerUsage"),
    Query("nvmlDeviceGetMaxClockInfo", (CLOCK_SM,)),
    Query("nvmlDeviceGetMaxClockInfo", (CLOCK_MEM,)),
    Query("nvmlDeviceGetClockInfo", (CLOCK_SM,)),
    Query("nvmlDeviceGetClockInfo", (CLOCK_MEM,)),
    Query("nvmlDeviceGetTemperature", (TEMPERATURE_GPU,)),
    Query("nvmlDeviceGetTemperatureThreshold", (TEMPERATURE_THRESHOLD_SLOWDOWN,)),
    Query("nvmlDeviceGetTemperatureThreshold", (TEMPERATURE_THRESHOLD_SHUTDOWN,)),
    Query("nvmlDeviceGetCurrentClocksEventReasons"),
    Query("nvmlDeviceGetPerformanceState"),
    Query("nvmlDeviceGetUtilizationRates"),
    Query("nvmlDeviceGetComputeRunningProcesses"),
    Query("nvmlDeviceGetTotalEccErrors", (ECC_UNCORRECTED, ECC_VOLATILE)),
    Query("nvmlDeviceGetTotalEccErrors", (ECC_UNCORRECTED, ECC_AGGREGATE)),
    Query("nvmlDeviceGetTotalEccErrors", (ECC_CORRECTED, ECC_VOLATILE)),
    Query("nvmlDeviceGetTotalEccErrors", (ECC_CORRECTED, ECC_AGGREGATE)),
    Query("nvmlDeviceGetRemappedRows"),
    Query("nvmlDeviceGetRetiredPagesPendingStatus"),
    *(Query("nvmlDeviceGetNvLinkState", (link,)) for link in range(NVLINK_LINKS_QUERIED)),
    *(Query("nvmlDeviceGetNvLinkVersion", (link,)) for link in range(NVLINK_LINKS_QUERIED)),
    *(Query("nvmlDeviceGetNvLinkRemotePciInfo", (link,)) for link in range(NVLINK_LINKS_QUERIED)),
    *(Query("nvmlDeviceGetNvLinkRemoteDeviceType", (link,)) for link in range(NVLINK_LINKS_QUERIED)),
)

# Asked for every ordered pair of GPUs (handle_a, handle_b, *args).
PAIR_QUERIES = (
    Query("nvmlDeviceGetTopologyCommonAncestor"),
    Query("nvmlDeviceGetP2PStatus", (P2P_CAPS_NVLINK,)),
)


class NvmlApi(Protocol):
    """The part of `pynvml` the collector calls by name; `pynvml` itself and `SnapshotNvml` satisfy it."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...


def is_error(answer: Any) -> bool:
    return isinstance(answer, dict) and "nvml_error" in answer


def _jsonable(value: Any) -> Any:
    """NVML answers are ints, bytes, ctypes structs and arrays; turn them into plain JSON values."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, ctypes.Structure):
        return {name: _jsonable(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, list | tuple | ctypes.Array):
        return [_jsonable(v) for v in value]
    if hasattr(value, "__dict__"):
        return {k: _jsonable(v) for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)


def _ask(api: Any, query: Query, *handles: Any) -> Any:
    fn = getattr(api, query.fn, None)
    if fn is None:
        return {"nvml_error": "FunctionNotInBindings", "message": f"{query.fn} not in this nvidia-ml-py"}
    try:
        return _jsonable(fn(*handles, *query.args))
    except Exception as exc:  # NVMLError or a binding bug: record it, the parser decides what it means
        return {"nvml_error": type(exc).__name__, "code": getattr(exc, "value", None), "message": str(exc)}


def collect_nvml_snapshot(api: Any) -> dict[str, Any]:
    """Run every query against NVML. Raises only when NVML cannot start at all (no driver, no library)."""
    api.nvmlInit()
    try:
        count = api.nvmlDeviceGetCount()
        handles: list[Any] = []
        devices: list[dict[str, Any]] = []
        for index in range(count):
            # One lost GPU must not hide the others: its handle error is recorded and every query of it
            # then reads as unanswered, which the checks turn into ERROR for that GPU alone.
            handle = _ask(api, Query("nvmlDeviceGetHandleByIndex"), index)
            if is_error(handle):
                handles.append(None)
                devices.append({"nvmlDeviceGetHandleByIndex": handle})
            else:
                handle = api.nvmlDeviceGetHandleByIndex(index)
                handles.append(handle)
                devices.append({q.key: _ask(api, q, handle) for q in DEVICE_QUERIES})
        pairs = {
            f"{a},{b}": {q.key: _ask(api, q, handles[a], handles[b]) for q in PAIR_QUERIES}
            for a in range(count)
            for b in range(count)
            if a != b and handles[a] is not None and handles[b] is not None
        }
        return {
            "format": SNAPSHOT_FORMAT,
            "system": {q.key: _ask(api, q) for q in SYSTEM_QUERIES},
            "device_count": count,
            "devices": devices,
            "pairs": pairs,
        }
    finally:
        api.nvmlShutdown()


class SnapshotNvml:
    """Answers NVML calls from a recorded snapshot: the fake beside the real `pynvml`.

    Errors recorded in the snapshot are raised again as `pynvml.NVMLError` with the same code, so code that
    handles NVML errors behaves as it would on the node the snapshot came from.
    """

    def __init__(self, snapshot: dict[str, Any]):
        if not isinstance(snapshot, dict):
            raise ValueError(f"expected a JSON object (a gpucert NVML snapshot), found a {type(snapshot).__name__}")
        if snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"not a gpucert NVML snapshot (format {snapshot.get('format')!r})")
        problem = snapshot_shape_problem(snapshot)
        if problem is not None:
            raise ValueError(f"not a gpucert NVML snapshot: {problem}")
        self.snapshot = snapshot

    @classmethod
    def from_file(cls, path: Path) -> SnapshotNvml:
        try:
            return cls(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read NVML snapshot: {exc}") from exc

    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None

    def nvmlDeviceGetCount(self) -> int:
        return int(self.snapshot["device_count"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < self.snapshot["device_count"]:
            raise IndexError(index)
        lost = self.snapshot["devices"][index].get("nvmlDeviceGetHandleByIndex")
        if lost is not None and is_error(lost):
            raise _nvml_error(lost.get("code"), lost.get("message", ""))
        return index

    def __getattr__(self, fn: str) -> Any:
        if not fn.startswith("nvml"):
            raise AttributeError(fn)

        def answer(*args: Any) -> Any:
            return self._answer(fn, args)

        return answer

    def _answer(self, fn: str, args: Sequence[Any]) -> Any:
        if fn.startswith("nvmlSystem"):
            table, rest = self.snapshot["system"], args
        elif any(q.fn == fn for q in PAIR_QUERIES):
            table, rest = self.snapshot["pairs"][f"{args[0]},{args[1]}"], args[2:]
        else:
            table, rest = self.snapshot["devices"][args[0]], args[1:]
        key = Query(fn, tuple(rest)).key
        if key not in table:
            raise _nvml_error(None, f"{key} was not recorded in this snapshot")
        value = table[key]
        if is_error(value):
            raise _nvml_error(value.get("code"), value.get("message", ""))
        return value


def snapshot_shape_problem(snapshot: dict[str, Any]) -> str | None:
    """The first key of a snapshot whose type is not what take_snapshot writes, or None. A single answer's value
    of the wrong type is left to the parser (gpus.py), which calls that one field unreadable."""
    count = snapshot.get("device_count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return f"device_count: expected a count of GPUs, found {count!r}"
    devices = snapshot.get("devices")
    if not isinstance(devices, list) or len(devices) != count:
        found = f"{len(devices)} entries" if isinstance(devices, list) else repr(devices)[:60]
        return f"devices: expected a list of {count} (device_count), found {found}"
    for key in ("system", "pairs"):
        if not isinstance(snapshot.get(key, {}), dict):
            return f"{key}: expected an object, found a {type(snapshot[key]).__name__}"
    for where, tables in (("devices", enumerate(devices)), ("pairs", snapshot.get("pairs", {}).items())):
        for name, table in tables:
            if not isinstance(table, dict):
                return f"{where}[{name!r}]: expected an object of NVML answers, found a {type(table).__name__}"
    return None


def _nvml_error(code: int | None, message: str) -> Exception:
    try:
        import pynvml

        # Code 999 is NVML_ERROR_UNKNOWN: used when the snapshot recorded no code.
        return pynvml.NVMLError(code if code is not None else 999)
    except ImportError:  # replay must work without nvidia-ml-py installed
        return RuntimeError(message)


def load_pynvml() -> Any:
    """The real NVML bindings; ImportError when nvidia-ml-py is missing."""
    import pynvml

    return pynvml
