"""Parse an NVML snapshot (see nvml.py) into typed GPU records and the GPU-to-GPU topology.

Pure functions only: everything here runs on a CPU machine against captured snapshots. A field NVML could
not answer is None and its reason is kept in `GpuInfo.unreadable`, so a check can tell "not supported on
this GPU" from "the driver failed" and never mistakes a missing answer for a healthy one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpucert.hardware.nvml import (
    CLOCK_MEM,
    CLOCK_SM,
    CPU_AFFINITY_WORDS,
    ECC_AGGREGATE,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ECC_VOLATILE,
    NVLINK_LINKS_QUERIED,
    TEMPERATURE_GPU,
    TEMPERATURE_THRESHOLD_SHUTDOWN,
    TEMPERATURE_THRESHOLD_SLOWDOWN,
    Query,
    is_error,
)

GIB = 1 << 30

# nvmlClocksEventReason* bits (nvml.h), named as nvidia-smi -q prints them.
CLOCK_EVENT_REASONS = {
    0x1: "Idle",
    0x2: "Applications Clocks Setting",
    0x4: "SW Power Cap",
    0x8: "HW Slowdown",
    0x10: "Sync Boost",
    0x20: "SW Thermal Slowdown",
    0x40: "HW Thermal Slowdown",
    0x80: "HW Power Brake Slowdown",
    0x100: "Display Clock Setting",
}

# nvmlNvlinkVersion_t -> NVLink generation.
NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0"}
NVLINK_REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch"}

# nvmlGpuTopologyLevel_t -> the labels of `nvidia-smi topo -m`.
TOPOLOGY_LABELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool
    version: str | None
    remote_type: str | None
    remote_bus_id: str | None


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    serial: str | None
    bus_id: str | None
    compute_capability: str | None
    memory_total_gib: float | None
    memory_used_gib: float | None
    vbios: str | None
    inforom: str | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    numa_node: int | None
    cpu_affinity: str | None
    mig_enabled: bool | None
    mig_pending: bool | None
    ecc_enabled: bool | None
    ecc_pending: bool | None
    persistence_mode: bool | None
    power_limit_w: float | None
    power_default_limit_w: float | None
    power_enforced_limit_w: float | None
    power_draw_w: float | None
    sm_clock_max_mhz: int | None
    mem_clock_max_mhz: int | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    temperature_c: float | None
    temperature_slowdown_c: float | None
    temperature_shutdown_c: float | None
    clock_event_reasons: list[str] | None
    # P-state: 0 is full performance; idle GPUs drop to P8, and their PCIe link may drop a generation with it.
    performance_state: int | None
    utilization_pct: int | None
    process_count: int | None
    ecc_uncorrected_volatile: int | None
    ecc_uncorrected_aggregate: int | None
    ecc_corrected_volatile: int | None
    ecc_corrected_aggregate: int | None
    remapped_rows_correctable: int | None
    remapped_rows_uncorrectable: int | None
    row_remap_pending: bool | None
    row_remap_failure: bool | None
    nvlinks: list[NvLink]
    # PIDs NVML reports on the GPU (host PIDs), so a run can leave its own ranks out of the idle check.
    process_pids: list[int] = field(default_factory=list)
    # query -> NVML's reason, for every answer that is None above.
    unreadable: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.bus_id or self.uuid})"

    @property
    def active_nvlinks(self) -> int:
        return sum(link.active for link in self.nvlinks)


@dataclass(frozen=True)
class GpuTopology:
    """What `nvidia-smi topo -m` shows: per ordered pair "NV<n>" or the PCIe path label."""

    matrix: list[list[str]]
    nvlink_counts: list[list[int]]
    summary: str


@dataclass(frozen=True)
class GpuInventory:
    driver_version: str | None
    cuda_driver_version: str | None
    nvml_version: str | None
    gpus: list[GpuInfo]
    topology: GpuTopology
    # Why NVML gave nothing at all (no driver, no library); None when it answered.
    nvml_error: str | None = None
    # A system query that did not answer, or answered a value of the wrong type: its key -> why.
    system_unreadable: dict[str, str] = field(default_factory=dict)


class _Answers:
    """Reads one device's recorded answers, noting every query that did not answer."""

    def __init__(self, table: dict[str, Any]):
        self.table = table
        self.unreadable: dict[str, str] = {}
        # A GPU whose handle NVML refused answered nothing: every field carries that reason.
        lost = table.get("nvmlDeviceGetHandleByIndex")
        self.missing = (
            lost if lost is not None and is_error(lost) else {"nvml_error": "NotRecorded", "message": "not in snapshot"}
        )

    def get(self, fn: str, *args: int) -> Any:
        key = Query(fn, args).key
        value = self.table.get(key, self.missing)
        if is_error(value):
            self.unreadable[key] = f"{value.get('nvml_error')}: {value.get('message', '')}".strip()
            return None
        problem = shape_problem(fn, value)
        if problem is not None:
            # A hand-edited or damaged snapshot (or a binding that changed its types): the field is unknown, said
            # as such by every check that needs it, rather than a traceback from deep inside one.
            self.unreadable[key] = f"BadValue: {problem}"
            return None
        return value


# What parse_device reads from each answer beyond a number: a dict's keys and their types, a list's least length.
_DICT_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "nvmlDeviceGetPciInfo": {"busId": str},
    "nvmlDeviceGetNvLinkRemotePciInfo": {"busId": str},
    "nvmlDeviceGetMemoryInfo": {"total": (int, float), "used": (int, float)},
    "nvmlDeviceGetUtilizationRates": {"gpu": (int, float)},
}
_LIST_LENGTHS = {
    "nvmlDeviceGetCudaComputeCapability": 2,
    "nvmlDeviceGetMigMode": 2,
    "nvmlDeviceGetEccMode": 2,
    "nvmlDeviceGetRemappedRows": 4,
    "nvmlDeviceGetCpuAffinity": 0,
    "nvmlDeviceGetComputeRunningProcesses": 0,
}
_TEXT = {
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetInforomImageVersion",
}


def shape_problem(fn: str, value: Any) -> str | None:
    """What is wrong with the type of NVML answer `fn`'s recorded value, or None."""

    def kind(v: Any) -> str:
        return "null" if v is None else type(v).__name__

    if fn in _DICT_FIELDS:
        if not isinstance(value, dict):
            return f"expected an object, found a {kind(value)}"
        for name, types in _DICT_FIELDS[fn].items():
            if name in value and value[name] is not None and not isinstance(value[name], types):
                return f"{name}: expected a {'number' if types is not str else 'string'}, found a {kind(value[name])}"
        return None
    if fn in _LIST_LENGTHS:
        if not isinstance(value, list) or len(value) < _LIST_LENGTHS[fn]:
            least = _LIST_LENGTHS[fn]
            return f"expected a list{f' of {least} or more' if least else ''}, found {kind(value)} {value!r}"[:160]
        if fn != "nvmlDeviceGetComputeRunningProcesses" and not all(isinstance(v, int) for v in value):
            return f"expected a list of integers, found {value!r}"[:160]
        return None
    if fn in _TEXT:
        return None if isinstance(value, str) else f"expected a string, found a {kind(value)}"
    # Every other answer parse_device reads is a number (a count, a clock, a limit, a mask, a state).
    return None if isinstance(value, (int, float)) else f"expected a number, found a {kind(value)}"


def _num(value: Any, scale: float = 1.0, digits: int = 2) -> float | None:
    return None if value is None else round(float(value) / scale, digits)


def _flag(value: Any, position: int | None = None) -> bool | None:
    if value is None:
        return None
    return bool(value[position] if position is not None else value)


def cpulist_from_mask(words: list[int] | None) -> str | None:
    """NVML's CPU affinity bitmask (64-bit words, lowest first) as a cpulist like '0-15,32-47'."""
    if not words:
        return None
    cpus = [w * 64 + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1]
    ranges: list[str] = []
    for cpu in cpus:
        if ranges and cpu == _range_end(ranges[-1]) + 1:
            start = ranges[-1].split("-")[0]
            ranges[-1] = f"{start}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges) or None


def _range_end(text: str) -> int:
    return int(text.split("-")[-1])


def parse_device(index: int, table: dict[str, Any]) -> GpuInfo:
    a = _Answers(table)
    pci = a.get("nvmlDeviceGetPciInfo") or {}
    memory = a.get("nvmlDeviceGetMemoryInfo") or {}
    cc = a.get("nvmlDeviceGetCudaComputeCapability")
    mig = a.get("nvmlDeviceGetMigMode")
    ecc = a.get("nvmlDeviceGetEccMode")
    reasons = a.get("nvmlDeviceGetCurrentClocksEventReasons")
    utilization = a.get("nvmlDeviceGetUtilizationRates")
    processes = a.get("nvmlDeviceGetComputeRunningProcesses")
    remap = a.get("nvmlDeviceGetRemappedRows")
    nvlinks = []
    for link in range(NVLINK_LINKS_QUERIED):
        state = a.get("nvmlDeviceGetNvLinkState", link)
        if state is None:
            continue
        remote = a.get("nvmlDeviceGetNvLinkRemotePciInfo", link) or {}
        version = a.get("nvmlDeviceGetNvLinkVersion", link)
        remote_type = a.get("nvmlDeviceGetNvLinkRemoteDeviceType", link)
        nvlinks.append(
            NvLink(
                link=link,
                active=bool(state),
                version=NVLINK_VERSIONS.get(version, str(version)) if version is not None else None,
                remote_type=NVLINK_REMOTE_TYPES.get(remote_type) if remote_type is not None else None,
                remote_bus_id=remote.get("busId"),
            )
        )
    # Links NVML does not report at all are expected on GPUs without NVLink; keep one note, not 72.
    missing_links = [k for k in a.unreadable if k.startswith("nvmlDeviceGetNvLink")]
    if missing_links and not nvlinks:
        reason = a.unreadable[missing_links[0]]
        for key in missing_links:
            del a.unreadable[key]
        a.unreadable["nvlink"] = reason
    return GpuInfo(
        index=index,
        name=a.get("nvmlDeviceGetName") or "unknown",
        uuid=a.get("nvmlDeviceGetUUID") or f"unknown-{index}",
        serial=a.get("nvmlDeviceGetSerial"),
        bus_id=pci.get("busId"),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        memory_total_gib=_num(memory.get("total"), GIB),
        memory_used_gib=_num(memory.get("used"), GIB),
        vbios=a.get("nvmlDeviceGetVbiosVersion"),
        inforom=a.get("nvmlDeviceGetInforomImageVersion"),
        pcie_gen_current=a.get("nvmlDeviceGetCurrPcieLinkGeneration"),
        pcie_gen_max=a.get("nvmlDeviceGetMaxPcieLinkGeneration"),
        pcie_width_current=a.get("nvmlDeviceGetCurrPcieLinkWidth"),
        pcie_width_max=a.get("nvmlDeviceGetMaxPcieLinkWidth"),
        numa_node=a.get("nvmlDeviceGetNumaNodeId"),
        cpu_affinity=cpulist_from_mask(a.get("nvmlDeviceGetCpuAffinity", CPU_AFFINITY_WORDS)),
        mig_enabled=_flag(mig, 0),
        mig_pending=_flag(mig, 1),
        ecc_enabled=_flag(ecc, 0),
        ecc_pending=_flag(ecc, 1),
        persistence_mode=_flag(a.get("nvmlDeviceGetPersistenceMode")),
        power_limit_w=_num(a.get("nvmlDeviceGetPowerManagementLimit"), 1000),
        power_default_limit_w=_num(a.get("nvmlDeviceGetPowerManagementDefaultLimit"), 1000),
        power_enforced_limit_w=_num(a.get("nvmlDeviceGetEnforcedPowerLimit"), 1000),
        power_draw_w=_num(a.get("nvmlDeviceGetPowerUsage"), 1000),
        sm_clock_max_mhz=a.get("nvmlDeviceGetMaxClockInfo", CLOCK_SM),
        mem_clock_max_mhz=a.get("nvmlDeviceGetMaxClockInfo", CLOCK_MEM),
        sm_clock_mhz=a.get("nvmlDeviceGetClockInfo", CLOCK_SM),
        mem_clock_mhz=a.get("nvmlDeviceGetClockInfo", CLOCK_MEM),
        temperature_c=_num(a.get("nvmlDeviceGetTemperature", TEMPERATURE_GPU)),
        temperature_slowdown_c=_num(a.get("nvmlDeviceGetTemperatureThreshold", TEMPERATURE_THRESHOLD_SLOWDOWN)),
        temperature_shutdown_c=_num(a.get("nvmlDeviceGetTemperatureThreshold", TEMPERATURE_THRESHOLD_SHUTDOWN)),
        clock_event_reasons=None if reasons is None else clock_event_names(int(reasons)),
        performance_state=a.get("nvmlDeviceGetPerformanceState"),
        utilization_pct=None if utilization is None else utilization.get("gpu"),
        process_count=None if processes is None else len(processes),
        process_pids=[p["pid"] for p in processes or [] if isinstance(p, dict) and "pid" in p],
        ecc_uncorrected_volatile=a.get("nvmlDeviceGetTotalEccErrors", ECC_UNCORRECTED, ECC_VOLATILE),
        ecc_uncorrected_aggregate=a.get("nvmlDeviceGetTotalEccErrors", ECC_UNCORRECTED, ECC_AGGREGATE),
        ecc_corrected_volatile=a.get("nvmlDeviceGetTotalEccErrors", ECC_CORRECTED, ECC_VOLATILE),
        ecc_corrected_aggregate=a.get("nvmlDeviceGetTotalEccErrors", ECC_CORRECTED, ECC_AGGREGATE),
        # nvmlDeviceGetRemappedRows -> (correctable rows, uncorrectable rows, pending, failure)
        remapped_rows_correctable=None if remap is None else int(remap[0]),
        remapped_rows_uncorrectable=None if remap is None else int(remap[1]),
        row_remap_pending=None if remap is None else bool(remap[2]),
        row_remap_failure=None if remap is None else bool(remap[3]),
        nvlinks=nvlinks,
        unreadable=a.unreadable,
    )


def clock_event_names(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]


# The reasons that mean the hardware itself slows the GPU (not a setting, not idling): health and the
# benchmark telemetry FAIL on any of them.
HW_SLOWDOWN_BITS = 0x8 | 0x40 | 0x80
HW_SLOWDOWN_REASONS = frozenset(clock_event_names(HW_SLOWDOWN_BITS))


def nvlink_count(a: GpuInfo, b: GpuInfo) -> int:
    """Active NVLinks joining two GPUs, as nvidia-smi counts them.

    Direct links are counted by the peer's PCI bus id. Behind NVSwitch every link of a GPU reaches every
    other GPU, so two switch-attached GPUs share min(their active switch links): NV18 on HGX H100/H200.
    """
    direct = sum(link.active and link.remote_bus_id == b.bus_id for link in a.nvlinks)
    switched_a = sum(link.active and link.remote_type == "switch" for link in a.nvlinks)
    switched_b = sum(link.active and link.remote_type == "switch" for link in b.nvlinks)
    return direct + min(switched_a, switched_b)


def build_topology(gpus: list[GpuInfo], pairs: dict[str, dict[str, Any]]) -> GpuTopology:
    n = len(gpus)
    counts = [[0 if i == j else nvlink_count(gpus[i], gpus[j]) for j in range(n)] for i in range(n)]
    matrix: list[list[str]] = []
    for i in range(n):
        row = []
        for j in range(n):
            if i == j:
                row.append("X")
            elif counts[i][j]:
                row.append(f"NV{counts[i][j]}")
            else:
                level = pairs.get(f"{i},{j}", {}).get("nvmlDeviceGetTopologyCommonAncestor")
                row.append(TOPOLOGY_LABELS.get(level, "?") if isinstance(level, int) else "?")
        matrix.append(row)
    return GpuTopology(matrix=matrix, nvlink_counts=counts, summary=summarize_topology(matrix))


def summarize_topology(matrix: list[list[str]]) -> str:
    n = len(matrix)
    if n == 0:
        return "no GPUs"
    if n == 1:
        return "single GPU"
    links = {matrix[i][j] for i in range(n) for j in range(n) if i != j}
    if len(links) == 1:
        (link,) = links
        return f"{link} all-to-all" if link.startswith("NV") else f"PCIe only ({link})"
    return "mixed: " + ", ".join(sorted(links))


def parse_nvml_snapshot(snapshot: dict[str, Any]) -> GpuInventory:
    system = snapshot.get("system", {})
    unreadable: dict[str, str] = {}

    def system_value(key: str, kind: type) -> Any:
        value = system.get(key)
        if value is None:
            unreadable[key] = "NotRecorded: not in snapshot"
        elif is_error(value):
            unreadable[key] = f"{value.get('nvml_error')}: {value.get('message', '')}".strip()
        elif not isinstance(value, kind) or isinstance(value, bool):
            # A damaged or hand-edited capture: the version unknown, said by software.* as ERROR, not a traceback.
            unreadable[key] = f"BadValue: expected a {'string' if kind is str else 'number'}, found {value!r}"[:160]
        else:
            return value
        return None

    cuda = system_value("nvmlSystemGetCudaDriverVersion_v2", int)
    gpus = [parse_device(i, table) for i, table in enumerate(snapshot.get("devices", []))]
    return GpuInventory(
        driver_version=system_value("nvmlSystemGetDriverVersion", str),
        # NVML encodes CUDA 13.0 as 13000.
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda is not None else None,
        nvml_version=system_value("nvmlSystemGetNVMLVersion", str),
        gpus=gpus,
        topology=build_topology(gpus, snapshot.get("pairs", {})),
        system_unreadable=unreadable,
    )


def no_gpu_inventory(reason: str) -> GpuInventory:
    return GpuInventory(None, None, None, [], build_topology([], {}), nvml_error=reason)


def parse_topo_matrix(text: str) -> list[list[str]]:
    """The GPU block of `nvidia-smi topo -m` (ANSI codes stripped), for comparing with build_topology."""
    rows = []
    for line in text.splitlines():
        line = line.replace("\x1b[4m", "").replace("\x1b[0m", "")
        cells = line.split("\t")
        if cells and cells[0].startswith("GPU") and cells[0][3:].isdigit():
            rows.append([c.strip() for c in cells[1:] if c.strip()])
    n = len(rows)
    return [row[:n] for row in rows]


def cuda_driver_version_tuple(version: str | None) -> tuple[int, ...] | None:
    return None if version is None else tuple(int(p) for p in version.split("."))
