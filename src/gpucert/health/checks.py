"""Health judges: pure functions of the inventory (and probe results) against a profile.

Each returns Results whose message reads "expected X, found Y, on Z" and whose remediation says what to do.
Thresholds come from the profile or the run config and are named in `threshold_source`. A value NVML could
not read is ERROR with NVML's reason (never a silent PASS); a check that does not apply is SKIP with why.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from gpucert.config.profiles import Profile
from gpucert.config.run import HealthConfig
from gpucert.hardware.gpus import HW_SLOWDOWN_REASONS, GpuInfo
from gpucert.hardware.infiniband import IbDevice
from gpucert.hardware.inventory import NodeInventory
from gpucert.health.liveness import LivenessResult
from gpucert.health.xid import HARD_FAIL_XIDS, events_within, parse_xid_events
from gpucert.report.schema import Result
from gpucert.status import Status
from gpucert.vote import majority_vote


def _src(profile: Profile, key: str) -> str:
    return f"profile {profile.name}: {key}"


def _unreadable(gpu: GpuInfo, name: str, what: str, *queries: str) -> Result:
    reasons = "; ".join(f"{q}: {gpu.unreadable[q]}" for q in queries if q in gpu.unreadable) or "no answer"
    return Result(
        name=name,
        subject=gpu.label,
        status=Status.ERROR,
        message=f"could not read {what} on {gpu.label}: {reasons}",
        remediation="check the driver with `nvidia-smi -q`; a GPU that stops answering NVML needs a reset",
    )


# Where an expected GPU count can come from, most specific first (expected_gpu_count).
SLURM_GPUS_SOURCE = "Slurm: this job's GPUs on the node (SLURM_GPUS_ON_NODE, else SLURM_JOB_GPUS)"


def expected_gpu_count(inv: NodeInventory, profile: Profile, config: HealthConfig) -> tuple[int | None, str]:
    """(GPUs this node must show, where that number came from): what the operator said (health.expected_gpus),
    else what Slurm gave the job on this node, else the profile's gpus_per_node (a site profile's included)."""
    if config.expected_gpus is not None:
        return config.expected_gpus, "config: health.expected_gpus"
    slurm = inv.environment.slurm
    if slurm is not None and slurm.gpus_on_node:
        return slurm.gpus_on_node, SLURM_GPUS_SOURCE
    return profile.gpu.gpus_per_node, _src(profile, "gpu.gpus_per_node")


def _how_to_set_count(found: int) -> str:
    return (
        f"if this node has {found} GPU{'s' if found != 1 else ''} by design (a cloud VM, a partial board), say so: "
        f"--set health.expected_gpus={found}, or gpu.gpus_per_node in a site profile (--profile site.yaml)"
    )


def check_gpu_count(inv: NodeInventory, profile: Profile, config: HealthConfig) -> list[Result]:
    found = len(inv.gpu.gpus)
    expected, source = expected_gpu_count(inv, profile, config)
    error = inv.gpu.nvml_error
    # The inventory's reason may name NVML already ("NVML: NVML Shared Library Not Found"): not twice.
    nvml_note = "" if not error else f" ({error})" if error.startswith("NVML") else f" (NVML: {error})"
    if found < inv.nvidia_pci_devices:
        # Whatever the profile expects: GPUs on the bus that NVML cannot see are broken GPUs or a broken driver.
        return [
            Result(
                name="gpu.count",
                subject=inv.hostname,
                status=Status.FAIL,
                value=found,
                unit="GPUs",
                expected=f"== {inv.nvidia_pci_devices} (NVIDIA GPUs on the PCI bus)",
                threshold_source="/sys/bus/pci/devices",
                message=f"expected NVML to see the {inv.nvidia_pci_devices} NVIDIA GPUs on the PCI bus, "
                f"found {found} on {inv.hostname}{nvml_note}",
                remediation="load the NVIDIA driver (nvidia-smi must list every GPU); check dmesg for NVRM errors",
            )
        ]
    base: dict[str, Any] = dict(
        name="gpu.count", subject=inv.hostname, value=found, unit="GPUs", threshold_source=source
    )
    if expected is None:
        return [
            Result(
                **base,
                status=Status.SKIP,
                message=f"found {found} GPUs; no expected count set (--set health.expected_gpus=N, or "
                "gpu.gpus_per_node in the profile)",
            )
        ]
    if expected == 0 and found == 0:
        message = f"no NVIDIA GPU found{nvml_note}; none expected ({source})"
        return [Result(**base, status=Status.SKIP, expected="== 0", message=message)]
    if found == expected:
        return [Result(**base, status=Status.PASS, expected=f"== {expected}", message=f"{found} GPUs found")]
    if source == SLURM_GPUS_SOURCE and found > expected:
        # More GPUs visible than the job was given: no GPU is missing, but the job is not fenced to its own.
        return [
            Result(
                **base,
                status=Status.WARN,
                expected=f"== {expected}",
                message=f"expected the {expected} GPUs Slurm gave this job, found {found} visible on {inv.hostname}",
                remediation="fence jobs to their GPUs: ConstrainDevices=yes in Slurm's cgroup.conf",
            )
        ]
    if found > expected:
        # No GPU is missing: the count this node was held to is wrong for it (the cpu profile on a GPU node).
        return [
            Result(
                **base,
                status=Status.FAIL,
                expected=f"== {expected}",
                message=f"expected {expected} GPUs ({source}), found {found} on {inv.hostname}",
                remediation=(
                    f"{found} GPUs are visible where the operator set {expected}: fence the job to its GPUs "
                    "(CUDA_VISIBLE_DEVICES, cgroups) or correct health.expected_gpus"
                    if source.startswith("config:")
                    else "judge the node by its own GPUs' profile (leave --profile out to detect it) or give the "
                    f"count it should have; {_how_to_set_count(found)}"
                ),
            )
        ]
    return [
        Result(
            **base,
            status=Status.FAIL,
            expected=f"== {expected}",
            message=f"expected {expected} GPUs, found {found} on {inv.hostname}{nvml_note}"
            + ("" if source.startswith("config:") else f" (the count from {source})"),
            remediation="a GPU missing from NVML has usually fallen off the bus: check dmesg for XID 79, "
            "reseat or RMA; without the driver loaded, load it and re-run"
            + ("" if source.startswith("config:") else f"; {_how_to_set_count(found)}"),
        )
    ]


def check_memory(gpu: GpuInfo, profile: Profile) -> list[Result]:
    minimum = profile.gpu.memory_gib_min
    if minimum is None:
        return []
    if gpu.memory_total_gib is None:
        return [_unreadable(gpu, "gpu.memory", "memory size", "nvmlDeviceGetMemoryInfo")]
    ok = gpu.memory_total_gib >= minimum
    return [
        Result(
            name="gpu.memory",
            subject=gpu.label,
            status=Status.PASS if ok else Status.FAIL,
            value=gpu.memory_total_gib,
            unit="GiB",
            expected=f">= {minimum:g}",
            threshold_source=_src(profile, "gpu.memory_gib_min"),
            message=f"{gpu.memory_total_gib:g} GiB"
            if ok
            else f"expected >= {minimum:g} GiB of GPU memory, found {gpu.memory_total_gib:g} GiB on {gpu.label}",
            remediation=None
            if ok
            else "less memory than the model has means a wrong SKU or disabled memory "
            "(row remap exhaustion): compare with nvidia-smi -q and RMA",
        )
    ]


def check_ecc(gpu: GpuInfo, profile: Profile) -> list[Result]:
    results = []
    if gpu.ecc_enabled is None:
        results.append(_unreadable(gpu, "gpu.ecc_mode", "ECC mode", "nvmlDeviceGetEccMode"))
    else:
        want = profile.gpu.ecc_enabled
        status = Status.PASS if gpu.ecc_enabled == want else Status.FAIL
        message = f"ECC {'on' if gpu.ecc_enabled else 'off'}"
        if status is Status.FAIL:
            message = f"expected ECC {'on' if want else 'off'}, found {message.split()[1]} on {gpu.label}"
        elif gpu.ecc_pending is not None and gpu.ecc_pending != gpu.ecc_enabled:
            status, message = (
                Status.WARN,
                f"{message}, but a change to {'on' if gpu.ecc_pending else 'off'} is pending",
            )
        results.append(
            Result(
                name="gpu.ecc_mode",
                subject=gpu.label,
                status=status,
                value=gpu.ecc_enabled,
                expected="on" if want else "off",
                threshold_source=_src(profile, "gpu.ecc_enabled"),
                message=message,
                remediation=None if status is Status.PASS else "nvidia-smi -i <gpu> -e 1, then reset the GPU or reboot",
            )
        )
    volatile, aggregate = gpu.ecc_uncorrected_volatile, gpu.ecc_uncorrected_aggregate
    if volatile is None and aggregate is None:
        if gpu.ecc_enabled:
            results.append(
                _unreadable(
                    gpu,
                    "gpu.ecc_uncorrectable",
                    "uncorrectable ECC counters",
                    "nvmlDeviceGetTotalEccErrors(1,0)",
                    "nvmlDeviceGetTotalEccErrors(1,1)",
                )
            )
        return results
    if volatile:
        status = Status.FAIL
        message = f"expected 0 uncorrectable ECC errors since boot, found {volatile} on {gpu.label}"
        remediation = "drain the node; reset the GPU to trigger row remapping, RMA if errors recur"
    elif volatile is None:
        # The lifetime count alone cannot clear the GPU: errors since boot are the ones that fail it.
        if gpu.ecc_enabled:
            since_boot = "uncorrectable ECC errors since boot"
            results.append(_unreadable(gpu, "gpu.ecc_uncorrectable", since_boot, "nvmlDeviceGetTotalEccErrors(1,0)"))
        return results
    elif aggregate:
        # Lifetime errors already handled by row remapping: the GPU is usable, but the history matters.
        status = Status.WARN
        message = f"0 uncorrectable ECC errors since boot, but {aggregate} over the GPU's life on {gpu.label}"
        remediation = "watch remapped rows; RMA if uncorrectable errors keep appearing"
    elif aggregate is None:
        lifetime = gpu.unreadable.get("nvmlDeviceGetTotalEccErrors(1,1)", "no answer")
        status, remediation = Status.PASS, None
        message = f"0 uncorrectable ECC errors since boot (the lifetime count could not be read: {lifetime})"
    else:
        status, message, remediation = Status.PASS, "0 uncorrectable ECC errors (volatile and lifetime)", None
    results.append(
        Result(
            name="gpu.ecc_uncorrectable",
            subject=gpu.label,
            status=status,
            value=volatile if volatile is not None else aggregate,
            unit="errors",
            expected="== 0",
            message=message,
            remediation=remediation,
            details={"volatile": volatile, "aggregate": aggregate},
        )
    )
    return results


def check_row_remapping(gpu: GpuInfo, profile: Profile) -> list[Result]:
    if gpu.row_remap_pending is None:
        reason = gpu.unreadable.get("nvmlDeviceGetRemappedRows", "")
        if "NotSupported" in reason:
            return [
                Result(
                    name="gpu.row_remap",
                    subject=gpu.label,
                    status=Status.SKIP,
                    message=f"row remapping not supported on {gpu.name}",
                )
            ]
        return [_unreadable(gpu, "gpu.row_remap", "row remapping state", "nvmlDeviceGetRemappedRows")]
    corr, unc = gpu.remapped_rows_correctable or 0, gpu.remapped_rows_uncorrectable or 0
    base: dict[str, Any] = dict(
        name="gpu.row_remap",
        subject=gpu.label,
        value=unc,
        unit="rows",
        details={
            "correctable_rows": corr,
            "uncorrectable_rows": unc,
            "pending": gpu.row_remap_pending,
            "failure": gpu.row_remap_failure,
        },
    )
    if gpu.row_remap_failure:
        return [
            Result(
                **base,
                status=Status.FAIL,
                expected="no remap failure",
                message=f"expected no row-remap failure, found one on {gpu.label}: its spare rows are exhausted",
                remediation="drain the node and RMA the GPU",
            )
        ]
    if gpu.row_remap_pending:
        return [
            Result(
                **base,
                status=Status.FAIL,
                expected="no remap pending",
                message=f"expected no pending row remap, found one on {gpu.label}",
                remediation="reset the GPU (nvidia-smi -r) or reboot to apply the remap, then re-test",
            )
        ]
    limits = profile.gpu
    if unc >= limits.remapped_rows_uncorrectable_warn or corr >= limits.remapped_rows_correctable_warn:
        return [
            Result(
                **base,
                status=Status.WARN,
                expected=f"< {limits.remapped_rows_uncorrectable_warn} uncorrectable, "
                f"< {limits.remapped_rows_correctable_warn} correctable",
                threshold_source=_src(profile, "gpu.remapped_rows_*_warn"),
                message=f"{unc} rows remapped for uncorrectable and {corr} for correctable errors on {gpu.label}",
                remediation="the GPU works; track the counts and plan an RMA if they grow",
            )
        ]
    return [
        Result(
            **base,
            status=Status.PASS,
            expected=f"no failure, none pending, < {limits.remapped_rows_uncorrectable_warn} uncorrectable and "
            f"< {limits.remapped_rows_correctable_warn} correctable rows",
            threshold_source=_src(profile, "gpu.remapped_rows_*_warn"),
            message=f"no pending remap, {unc} + {corr} rows remapped",
        )
    ]


def check_clock_events(gpu: GpuInfo) -> list[Result]:
    reasons = gpu.clock_event_reasons
    if reasons is None:
        return [_unreadable(gpu, "gpu.clock_events", "clock event reasons", "nvmlDeviceGetCurrentClocksEventReasons")]
    hardware = sorted(HW_SLOWDOWN_REASONS & set(reasons))
    base: dict[str, Any] = dict(
        name="gpu.clock_events",
        subject=gpu.label,
        value=", ".join(reasons) or "none",
        expected="no HW slowdown, no thermal slowdown",
    )
    if hardware:
        return [
            Result(
                **base,
                status=Status.FAIL,
                message=f"expected no hardware clock slowdown, found {', '.join(hardware)} on {gpu.label}",
                remediation="check cooling, power supplies and the baseboard (HW Slowdown is also raised by "
                "an external power-brake signal); drain until explained",
            )
        ]
    if "SW Thermal Slowdown" in reasons:
        return [
            Result(
                **base,
                status=Status.WARN,
                message=f"SW thermal slowdown active on {gpu.label}",
                remediation="the GPU runs hot: check airflow and the temperature below",
            )
        ]
    return [Result(**base, status=Status.PASS, message=f"clock events: {', '.join(reasons) or 'none'}")]


def check_temperature(gpu: GpuInfo, profile: Profile) -> list[Result]:
    if gpu.temperature_c is None:
        return [_unreadable(gpu, "gpu.temperature", "temperature", "nvmlDeviceGetTemperature(0)")]
    warn, fail = profile.gpu.temperature_c_warn, profile.gpu.temperature_c_fail
    headroom = None if gpu.temperature_slowdown_c is None else gpu.temperature_slowdown_c - gpu.temperature_c
    status = Status.FAIL if gpu.temperature_c >= fail else Status.WARN if gpu.temperature_c >= warn else Status.PASS
    slow = (
        ""
        if headroom is None
        else f", {headroom:g} C below slowdown at {gpu.temperature_slowdown_c:g} C"
        if headroom >= 0
        else f", {-headroom:g} C above slowdown at {gpu.temperature_slowdown_c:g} C"
    )
    message = (
        f"{gpu.temperature_c:g} C{slow}"
        if status is Status.PASS
        else f"expected < {warn:g} C, found {gpu.temperature_c:g} C on {gpu.label}{slow}"
    )
    return [
        Result(
            name="gpu.temperature",
            subject=gpu.label,
            status=status,
            value=gpu.temperature_c,
            unit="C",
            expected=f"< {warn:g} (FAIL at {fail:g})",
            threshold_source=_src(profile, "gpu.temperature_c_warn / temperature_c_fail"),
            message=message,
            details={"slowdown_c": gpu.temperature_slowdown_c, "headroom_c": headroom},
            remediation=None if status is Status.PASS else "check fans, airflow and inlet temperature",
        )
    ]


def check_power_limit(gpu: GpuInfo, profile: Profile) -> list[Result]:
    minimum = profile.gpu.power_limit_w_min
    if minimum is None:
        return []
    if gpu.power_enforced_limit_w is None:
        return [_unreadable(gpu, "gpu.power_limit", "enforced power limit", "nvmlDeviceGetEnforcedPowerLimit")]
    ok = gpu.power_enforced_limit_w >= minimum
    draw = f"; drawing {gpu.power_draw_w:g} W" if gpu.power_draw_w is not None else ""
    return [
        Result(
            name="gpu.power_limit",
            subject=gpu.label,
            status=Status.PASS if ok else Status.WARN,
            value=gpu.power_enforced_limit_w,
            unit="W",
            expected=f">= {minimum:g}",
            threshold_source=_src(profile, "gpu.power_limit_w_min"),
            message=f"enforced limit {gpu.power_enforced_limit_w:g} W{draw}"
            if ok
            else f"expected an enforced power limit >= {minimum:g} W, found {gpu.power_enforced_limit_w:g} W "
            f"on {gpu.label}{draw}",
            remediation=None
            if ok
            else f"someone capped the GPU: nvidia-smi -i <gpu> -pl <default> (default {gpu.power_default_limit_w} W)",
        )
    ]


def check_pcie_link(gpu: GpuInfo, profile: Profile) -> list[Result]:
    if None in (gpu.pcie_gen_current, gpu.pcie_width_current, gpu.pcie_gen_max, gpu.pcie_width_max):
        return [
            _unreadable(
                gpu,
                "gpu.pcie_link",
                "PCIe link state",
                "nvmlDeviceGetCurrPcieLinkGeneration",
                "nvmlDeviceGetCurrPcieLinkWidth",
            )
        ]
    assert gpu.pcie_gen_current is not None and gpu.pcie_width_current is not None
    want_gen = profile.gpu.pcie_gen or gpu.pcie_gen_max
    want_width = profile.gpu.pcie_width or gpu.pcie_width_max
    found = f"Gen{gpu.pcie_gen_current} x{gpu.pcie_width_current}"
    base: dict[str, Any] = dict(
        name="gpu.pcie_link",
        subject=gpu.label,
        value=found,
        expected=f"Gen{want_gen} x{want_width}",
        threshold_source=_src(profile, "gpu.pcie_gen / pcie_width")
        if profile.gpu.pcie_gen
        else "the link's own maximum",
        details={"max_gen": gpu.pcie_gen_max, "max_width": gpu.pcie_width_max},
    )
    assert want_gen is not None and want_width is not None
    if gpu.pcie_width_current < want_width:
        return [
            Result(
                **base,
                status=Status.FAIL,
                message=f"expected PCIe x{want_width}, found x{gpu.pcie_width_current} on {gpu.label}",
                remediation="a narrow link cuts host<->GPU bandwidth: reseat the GPU or riser, check "
                "the slot; DCGM diag -r 2 measures it",
            )
        ]
    if gpu.pcie_gen_current < want_gen:
        # Idle GPUs (P8 and deeper) train their link down to save power; only a loaded GPU proves a fault.
        idle = gpu.performance_state is not None and gpu.performance_state >= 8
        return [
            Result(
                **base,
                status=Status.WARN if idle else Status.FAIL,
                message=f"expected PCIe Gen{want_gen}, found Gen{gpu.pcie_gen_current} on {gpu.label}"
                + (f" (idle in P{gpu.performance_state}: re-check under load)" if idle else ""),
                remediation="check BIOS PCIe settings and the slot; `gpucert bench memory` measures H2D",
            )
        ]
    return [Result(**base, status=Status.PASS, message=found)]


def check_nvlink(gpu: GpuInfo, profile: Profile, gpu_count: int) -> list[Result]:
    expected = profile.gpu.nvlink_links
    if expected is None:
        return []
    base: dict[str, Any] = dict(
        name="gpu.nvlink",
        subject=gpu.label,
        unit="links",
        expected=f"== {expected} active",
        threshold_source=_src(profile, "gpu.nvlink_links"),
    )
    if gpu_count == 1 and gpu.active_nvlinks < expected:
        # NVLink joins GPUs of one node: with one GPU there is no peer, and nothing to judge (a one-GPU VM shows
        # no links or only inactive ones). Too few GPUs is gpu.count's verdict, not this one's.
        seen = "none visible" if not gpu.nvlinks else f"{gpu.active_nvlinks} of {len(gpu.nvlinks)} active"
        return [
            Result(
                **base,
                status=Status.SKIP,
                value=None,
                message=f"does not apply: {gpu.label} is the only GPU of this node, no peer to link to "
                f"(NVLink links {seen}; a full board expects {expected})",
            )
        ]
    if not gpu.nvlinks:
        reason = gpu.unreadable.get("nvlink", "no links reported")
        return [
            Result(
                **base,
                status=Status.FAIL,
                value=0,
                message=f"expected {expected} active NVLinks, found none visible on {gpu.label} ({reason})",
                remediation="start nvidia-fabricmanager; check `nvidia-smi nvlink -s`",
            )
        ]
    inactive = [link.link for link in gpu.nvlinks if not link.active]
    active = gpu.active_nvlinks
    if active < expected:
        return [
            Result(
                **base,
                status=Status.FAIL,
                value=active,
                message=f"expected {expected} active NVLinks, found {active} on {gpu.label}"
                + (f" (links {', '.join(map(str, inactive))} down)" if inactive else ""),
                remediation="drain: a GPU with NVLinks down slows every collective; reset the GPU, "
                "then check the baseboard and NVSwitch trays",
            )
        ]
    versions = sorted({link.version for link in gpu.nvlinks if link.version})
    return [
        Result(
            **base,
            status=Status.PASS,
            value=active,
            message=f"{active} links active (NVLink {', '.join(versions) or '?'})",
        )
    ]


def check_mig(gpu: GpuInfo, profile: Profile) -> list[Result]:
    if gpu.mig_enabled is None:
        if "NotSupported" in gpu.unreadable.get("nvmlDeviceGetMigMode", ""):
            return [
                Result(
                    name="gpu.mig",
                    subject=gpu.label,
                    status=Status.SKIP,
                    message=f"MIG not supported on {gpu.name}",
                )
            ]
        return [_unreadable(gpu, "gpu.mig", "MIG mode", "nvmlDeviceGetMigMode")]
    want = profile.gpu.mig_enabled
    text = "on" if gpu.mig_enabled else "off"
    if gpu.mig_enabled != want:
        status, message = Status.FAIL, f"expected MIG {'on' if want else 'off'}, found {text} on {gpu.label}"
    elif gpu.mig_pending is not None and gpu.mig_pending != gpu.mig_enabled:
        status, message = Status.WARN, f"MIG {text}, but a change is pending a GPU reset on {gpu.label}"
    else:
        status, message = Status.PASS, f"MIG {text}"
    return [
        Result(
            name="gpu.mig",
            subject=gpu.label,
            status=status,
            value=gpu.mig_enabled,
            expected="on" if want else "off",
            threshold_source=_src(profile, "gpu.mig_enabled"),
            message=message,
            remediation=None if status is Status.PASS else f"nvidia-smi -i <gpu> -mig {int(want)}, then reset the GPU",
        )
    ]


def check_persistence(gpu: GpuInfo, profile: Profile) -> list[Result]:
    if gpu.persistence_mode is None:
        return [_unreadable(gpu, "gpu.persistence_mode", "persistence mode", "nvmlDeviceGetPersistenceMode")]
    want = profile.gpu.persistence_mode
    ok = gpu.persistence_mode == want
    text = "on" if gpu.persistence_mode else "off"
    return [
        Result(
            name="gpu.persistence_mode",
            subject=gpu.label,
            status=Status.PASS if ok else Status.WARN,
            value=gpu.persistence_mode,
            expected="on" if want else "off",
            threshold_source=_src(profile, "gpu.persistence_mode"),
            message=f"persistence mode {text}"
            if ok
            else f"expected persistence mode {'on' if want else 'off'}, found {text} on {gpu.label}",
            remediation=None
            if ok
            else "run nvidia-persistenced: without it every job pays driver "
            "initialisation and clocks reset between jobs",
        )
    ]


def check_idle(gpu: GpuInfo) -> list[Result]:
    """A GPU already busy would skew every benchmark and may belong to someone else's job."""
    if gpu.process_count is None and gpu.utilization_pct is None:
        return []
    busy = (gpu.process_count or 0) > 0 or (gpu.utilization_pct or 0) > 10
    return [
        Result(
            name="gpu.idle",
            subject=gpu.label,
            status=Status.WARN if busy else Status.PASS,
            value=gpu.utilization_pct,
            unit="%",
            expected="no compute processes, utilization <= 10 %",
            message=f"{gpu.process_count} compute processes, {gpu.utilization_pct} % utilization on {gpu.label}"
            if busy
            else "idle",
            remediation="find the processes with nvidia-smi; test on idle GPUs" if busy else None,
        )
    ]


def check_uniform_firmware(inv: NodeInventory) -> list[Result]:
    """All GPUs of a node should run the same VBIOS and InfoROM (Imbue's golden-config diff)."""
    gpus = inv.gpu.gpus
    if len(gpus) < 2:
        return []
    results = []
    for field, label in (("vbios", "VBIOS"), ("inforom", "InfoROM image")):
        unread = [gpu.index for gpu in gpus if getattr(gpu, field) is None]
        if unread:
            results.append(
                Result(
                    name=f"node.{field}_uniform",
                    subject=inv.hostname,
                    status=Status.ERROR,
                    message=f"could not read the {label} of GPUs {unread}, so uniformity is not known",
                    remediation="see the GPU's other ERROR results: it stopped answering NVML",
                )
            )
            continue
        versions: dict[str, list[int]] = {}
        for gpu in gpus:
            versions.setdefault(str(getattr(gpu, field)), []).append(gpu.index)
        ok = len(versions) == 1
        results.append(
            Result(
                name=f"node.{field}_uniform",
                subject=inv.hostname,
                status=Status.PASS if ok else Status.WARN,
                value=next(iter(versions)) if ok else f"{len(versions)} versions",
                expected=f"one {label} version on every GPU",
                message=f"{label} {next(iter(versions))} on all {len(gpus)} GPUs"
                if ok
                else f"expected one {label} version, found "
                + "; ".join(f"{v} on GPUs {ids}" for v, ids in versions.items()),
                remediation=None if ok else f"flash every GPU to the same {label} (nvidia firmware update tools)",
            )
        )
    return results


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.replace("-", ".").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_software(inv: NodeInventory, profile: Profile) -> list[Result]:
    wants = profile.software
    found = {
        "driver": (inv.gpu.driver_version, wants.driver_min, "software.driver_min"),
        "cuda_driver": (inv.gpu.cuda_driver_version, wants.cuda_driver_min, "software.cuda_driver_min"),
        "nccl": (inv.software.nccl, wants.nccl_min, "software.nccl_min"),
    }
    results = []
    for what, (version, minimum, key) in found.items():
        if minimum is None:
            continue
        base: dict[str, Any] = dict(
            name=f"software.{what}",
            subject=inv.hostname,
            value=version,
            expected=f">= {minimum}",
            threshold_source=_src(profile, key),
        )
        if what == "nccl" and version is None and inv.software.torch is None:
            results.append(
                Result(
                    **base,
                    status=Status.SKIP,
                    message="NCCL comes with torch, which is not installed here (a light `pip install gpucert`); "
                    "install gpucert[bench] to check it",
                )
            )
            continue
        if version is None:
            query = {"driver": "nvmlSystemGetDriverVersion", "cuda_driver": "nvmlSystemGetCudaDriverVersion_v2"}
            why = (
                inv.gpu.nvml_error or inv.gpu.system_unreadable.get(query[what], "NVML did not say")
                if what != "nccl"
                else "torch has no NCCL (CPU build?)"
            )
            results.append(
                Result(
                    **base,
                    status=Status.ERROR,
                    message=f"could not read the {what.replace('_', ' ')} version ({why})",
                )
            )
        elif _version_tuple(version) < _version_tuple(minimum):
            results.append(
                Result(
                    **base,
                    status=Status.FAIL,
                    message=f"expected {what.replace('_', ' ')} >= {minimum}, found {version}",
                    remediation=f"upgrade the {what.replace('_', ' ')}",
                )
            )
        else:
            results.append(Result(**base, status=Status.PASS, message=f"{what.replace('_', ' ')} {version}"))
    return results


def check_infiniband(devices: list[IbDevice], profile: Profile, hostname: str) -> list[Result]:
    want_ports, want_rate = profile.network.ib_ports, profile.network.ib_rate_gbps
    ports = [(d, p) for d in devices for p in d.ports if p.link_layer == "InfiniBand"]
    if not ports:
        status = Status.FAIL if want_ports else Status.SKIP
        return [
            Result(
                name="ib.ports",
                subject=hostname,
                status=status,
                value=0,
                unit="ports",
                expected=f">= {want_ports} active" if want_ports else None,
                threshold_source=_src(profile, "network.ib_ports") if want_ports else None,
                message=f"expected {want_ports} active InfiniBand ports, found none on {hostname}"
                if want_ports
                else "no InfiniBand ports on this node",
                remediation="check that the HCA driver (mlx5_core, ib_core) is loaded" if want_ports else None,
            )
        ]
    # Without a profile rate, the fastest port on the node is what every port should run at.
    best = max((p.rate_gbps or 0) for _, p in ports)
    rate = want_rate or best
    want = f"ACTIVE at {rate:g} Gb/s" if rate else "ACTIVE"
    results = []
    for device, port in ports:
        subject = f"{device.name} port {port.port}"
        problems = []
        if port.state != "ACTIVE":
            problems.append(f"state {port.state} ({port.phys_state})")
        if port.rate_gbps is not None and port.rate_gbps < rate:
            problems.append(f"rate {port.rate_text}")
        strict = want_ports is not None or want_rate is not None
        status = Status.PASS if not problems else Status.FAIL if strict else Status.WARN
        message = (
            f"{port.state} at {port.rate_text}"
            if not problems
            else f"expected {want}, found {', '.join(problems)} on {subject}"
        )
        remediation = (
            None
            if not problems
            else "check the cable and switch port (ibstat, mlxlink); "
            "a port at a lower rate has a bad cable or a mis-set switch"
        )
        if status is Status.PASS and port.rate_gbps is None:
            # Active, but its rate was not read: nothing says it runs at the rate it is held to.
            status = Status.ERROR
            message = f"expected {want}, found {port.state} at a rate that could not be read on {subject}"
            remediation = f"read /sys/class/infiniband/{device.name}/ports/{port.port}/rate (or `ibstat`) by hand"
        results.append(
            Result(
                name="ib.port",
                subject=subject,
                status=status,
                value=port.rate_gbps,
                unit="Gb/s",
                expected=want,
                threshold_source=_src(profile, "network.ib_rate_gbps") if want_rate else "fastest port on this node",
                message=message,
                remediation=remediation,
            )
        )
    if want_ports is not None:
        active = sum(p.state == "ACTIVE" for _, p in ports)
        ok = active >= want_ports
        results.append(
            Result(
                name="ib.ports",
                subject=hostname,
                status=Status.PASS if ok else Status.FAIL,
                value=active,
                unit="ports",
                expected=f">= {want_ports} active",
                threshold_source=_src(profile, "network.ib_ports"),
                message=f"{active} active InfiniBand ports"
                if ok
                else f"expected {want_ports} active InfiniBand ports, found {active} on {hostname}",
                remediation=None
                if ok
                else "see the failing ib.port results: reseat or replace the cable, check "
                "the switch port, and `ibstat` for the port's physical state",
            )
        )
    return results


def check_xid(
    kernel_log: str | None, log_error: str | None, inv: NodeInventory, window_h: float, now: datetime
) -> list[Result]:
    if kernel_log is None:
        return [
            Result(
                name="node.xid",
                subject=inv.hostname,
                status=Status.SKIP,
                message=f"kernel log not readable, XID events not checked ({log_error})",
                remediation="run as root or allow dmesg (kernel.dmesg_restrict=0) to check XIDs",
            )
        ]
    events = events_within(parse_xid_events(kernel_log), now, timedelta(hours=window_h))
    hard = [e for e in events if e.code in HARD_FAIL_XIDS]
    base: dict[str, Any] = dict(
        name="node.xid",
        subject=inv.hostname,
        value=len(events),
        unit="events",
        expected=f"no XID {sorted(HARD_FAIL_XIDS)} in {window_h:g} h",
        threshold_source="config: health.xid_window_h; hard-fail set of Azure NHC, Imbue, gcm",
        details={"events": [e.__dict__ for e in events[:50]]},
    )
    if hard:
        listed = ", ".join(f"XID {e.code} on PCI {e.pci_bus}" for e in hard[:5])
        return [
            Result(
                **base,
                status=Status.FAIL,
                message=f"expected no critical XID events, found {listed}",
                remediation="look the codes up in NVIDIA's XID catalogue; drain and reset or RMA the GPU",
            )
        ]
    if events:
        codes = sorted({e.code for e in events})
        return [
            Result(
                **base,
                status=Status.WARN,
                message=f"{len(events)} non-critical XID events: codes {codes}",
                remediation="XID 13/31/43 usually point at application faults; check the jobs",
            )
        ]
    return [Result(**base, status=Status.PASS, message=f"no XID events in the last {window_h:g} h")]


def judge_liveness(inv: NodeInventory, results: list[LivenessResult]) -> list[Result]:
    by_uuid = {r.uuid: r for r in results}
    # Only correct results vote: a GPU that computed wrong already FAILs on its own error.
    vote = majority_vote({r.uuid: r.digest for r in results if r.ok and r.digest})
    label_of = {gpu.uuid: gpu.label for gpu in inv.gpu.gpus}
    out = []
    for gpu in inv.gpu.gpus:
        result = by_uuid.get(gpu.uuid)
        base: dict[str, Any] = dict(
            name="gpu.liveness",
            subject=gpu.label,
            gpu_index=gpu.index,
            expected="max relative error < 1e-3, bits equal across GPUs",
            unit="relative error",
        )
        if result is None:
            out.append(
                Result(
                    **base,
                    status=Status.SKIP,
                    message=f"{gpu.label} not visible to CUDA in this process (CUDA_VISIBLE_DEVICES?)",
                )
            )
        elif not result.ok:
            error = result.error or f"max relative error {result.max_relative_error:.2e}"
            out.append(
                Result(
                    **base,
                    status=Status.FAIL,
                    value=result.max_relative_error,
                    message=f"expected a correct 1024^3 fp32 matmul, got {error} on {gpu.label}",
                    remediation="drain; reset the GPU and re-run; RMA if it fails again",
                )
            )
        elif gpu.uuid in vote.odd:
            if vote.undecided:
                others = ", ".join(label_of.get(u, u) for u in vote.odd if u != gpu.uuid)
                why = (
                    f"{gpu.label} computed different bits (digest {result.digest}) from {others} for the same "
                    f"inputs, and no result has a majority of the {vote.voters} GPUs: cannot tell which is wrong"
                )
            else:
                agreeing = vote.voters - len(vote.odd)
                which = f"the other {agreeing}" if len(vote.odd) == 1 else f"{agreeing} of the {vote.voters}"
                why = (
                    f"{gpu.label} computed different bits (digest {result.digest}) from {which} GPUs "
                    f"(digest {vote.majority}) for the same inputs"
                )
            out.append(
                Result(
                    **base,
                    status=Status.FAIL,
                    value=result.max_relative_error,
                    message=f"{why}: possible silent data corruption",
                    remediation="re-run; a GPU that disagrees twice should be drained and tested with dcgmi diag -r 3",
                    details={"digest": result.digest, "majority_digest": vote.majority},
                )
            )
        else:
            out.append(
                Result(
                    **base,
                    status=Status.PASS,
                    value=result.max_relative_error,
                    message=f"matmul correct (error {result.max_relative_error:.1e}) in {result.duration_ms} ms"
                    + (f", same bits as {vote.voters - len(vote.odd) - 1} other GPUs" if vote.voters > 1 else ""),
                    details={"digest": result.digest},
                )
            )
    return out


GpuCheck = Callable[[GpuInfo, Profile], list[Result]]
PER_GPU_CHECKS: tuple[GpuCheck, ...] = (
    check_memory,
    check_ecc,
    check_row_remapping,
    lambda gpu, profile: check_clock_events(gpu),
    check_temperature,
    check_power_limit,
    check_pcie_link,
    check_mig,
    check_persistence,
    lambda gpu, profile: check_idle(gpu),
)
