"""Where gpucert runs: Slurm job, Kubernetes pod, container runtime, hypervisor.

The ``parse_*`` functions are pure: environment variables and ``{path relative to root: text}`` in.
``collect_environment`` reads the live system under ``root`` and never raises on missing files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpucert.hardware.sysfs import read_text

_VIRTUALIZATION_FILES = (
    ".dockerenv",
    "run/.containerenv",
    "proc/1/cgroup",
    "proc/cpuinfo",
    "sys/class/dmi/id/sys_vendor",
    "sys/class/dmi/id/product_name",
)
_K8S_NAMESPACE_FILE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"

# (DMI sys_vendor prefix, product_name substring, label, only_virtual). Cloud vendors also sell bare-metal
# instances under the same DMI strings (EC2 *.metal), so for them the CPU's hypervisor flag decides.
_DMI_HYPERVISORS = (
    ("QEMU", "", "QEMU", True),
    ("", "KVM", "KVM", True),
    ("VMware", "", "VMware", True),
    ("Xen", "", "Xen", True),
    ("innotek GmbH", "VirtualBox", "VirtualBox", True),
    ("Microsoft Corporation", "Virtual Machine", "Microsoft Corporation Virtual Machine", True),
    ("OpenStack Foundation", "", "OpenStack", True),
    ("Amazon EC2", "", "Amazon EC2", False),
    ("Google", "Google Compute Engine", "Google Compute Engine", False),
    ("Alibaba Cloud", "", "Alibaba Cloud ECS", False),
)
UNKNOWN_HYPERVISOR = "unknown hypervisor (cpu flag)"


@dataclass(frozen=True)
class SlurmContext:
    job_id: str
    job_name: str | None
    nodelist: str | None
    nnodes: int | None
    ntasks: int | None
    procid: int | None  # absent in prologs and epilogs, which run outside any task
    localid: int | None
    gpus_on_node: int | None
    partition: str | None


@dataclass(frozen=True)
class KubernetesContext:
    namespace: str | None
    pod_name: str | None


@dataclass(frozen=True)
class VirtualizationHints:
    container: str | None  # "docker", "podman", "kubernetes", "containerd", "lxc", "apptainer", ...
    hypervisor: str | None  # None on bare metal, or when nothing gives a virtual machine away
    notes: tuple[str, ...]  # the evidence behind both answers


@dataclass(frozen=True)
class NetworkSettings:
    """How NCCL and gloo were told to talk: `gpucert launch --preset` names and every variable in effect."""

    presets: tuple[str, ...]
    variables: dict[str, str]


# Variables that change which transport, interface or algorithm a collective takes.
_NETWORK_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_DEBUG", "UCX_", "FI_")


def parse_network_env(env: Mapping[str, str]) -> NetworkSettings:
    presets = tuple(p for p in env.get("GPUCERT_NETWORK_PRESETS", "").split(",") if p)
    variables = {k: v for k, v in sorted(env.items()) if k.startswith(_NETWORK_PREFIXES)}
    return NetworkSettings(presets, variables)


@dataclass(frozen=True)
class RuntimeEnvironment:
    slurm: SlurmContext | None
    kubernetes: KubernetesContext | None
    virtualization: VirtualizationHints
    network: NetworkSettings = NetworkSettings((), {})


def _first(env: Mapping[str, str], *names: str) -> str | None:
    return next((env[n] for n in names if env.get(n)), None)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _count_list(value: str | None) -> int | None:
    """GPUs in a list like SLURM_JOB_GPUS's "0,1,2,3" (set in a prolog, where SLURM_GPUS_ON_NODE is not)."""
    items = [item for item in (value or "").split(",") if item.strip()]
    return len(items) or None


def parse_slurm_env(env: Mapping[str, str]) -> SlurmContext | None:
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    # Each pair lists the current name first and the one older Slurm releases set.
    return SlurmContext(
        job_id=job_id,
        job_name=_first(env, "SLURM_JOB_NAME"),
        nodelist=_first(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
        nnodes=_int(_first(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")),
        ntasks=_int(_first(env, "SLURM_NTASKS", "SLURM_NPROCS")),
        procid=_int(_first(env, "SLURM_PROCID")),
        localid=_int(_first(env, "SLURM_LOCALID")),
        gpus_on_node=_int(_first(env, "SLURM_GPUS_ON_NODE")) or _count_list(_first(env, "SLURM_JOB_GPUS")),
        partition=_first(env, "SLURM_JOB_PARTITION"),
    )


def parse_kubernetes_env(env: Mapping[str, str], namespace_file: str | None = None) -> KubernetesContext | None:
    """``namespace_file`` is the service-account namespace file, used when the pod spec does not pass
    POD_NAMESPACE through the downward API."""
    if not env.get("KUBERNETES_SERVICE_HOST"):
        return None
    namespace = _first(env, "POD_NAMESPACE") or (namespace_file.strip() if namespace_file else None)
    # A pod's hostname is its name unless the spec sets hostname.
    return KubernetesContext(namespace=namespace or None, pod_name=_first(env, "POD_NAME", "HOSTNAME"))


def _detect_container(files: Mapping[str, str], env: Mapping[str, str]) -> tuple[str | None, list[str]]:
    cgroup = files.get("proc/1/cgroup", "")
    checks = (
        ("kubernetes", "kubepods" in cgroup, "/proc/1/cgroup mentions kubepods"),
        ("kubernetes", bool(env.get("KUBERNETES_SERVICE_HOST")), "KUBERNETES_SERVICE_HOST is set"),
        ("podman", "run/.containerenv" in files, "/run/.containerenv exists"),
        ("podman", "libpod" in cgroup, "/proc/1/cgroup mentions libpod"),
        ("docker", ".dockerenv" in files, "/.dockerenv exists"),
        ("docker", "docker" in cgroup, "/proc/1/cgroup mentions docker"),
        ("containerd", "containerd" in cgroup, "/proc/1/cgroup mentions containerd"),
        ("lxc", "/lxc" in cgroup, "/proc/1/cgroup mentions lxc"),
        (
            "apptainer",
            bool(_first(env, "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")),
            "$APPTAINER_CONTAINER is set",
        ),
    )
    hits = [(name, note) for name, matched, note in checks if matched]
    if hits:
        return hits[0][0], [note for _, note in hits]
    # systemd's convention: container managers set $container in the payload (systemd-nspawn, podman, lxc).
    if env.get("container"):
        return env["container"], [f"$container is {env['container']!r}"]
    return None, []


def _cpu_hypervisor_flag(cpuinfo: str | None) -> bool | None:
    """Whether x86 "flags" list ``hypervisor``; None when unknown (no cpuinfo, or aarch64 without "flags")."""
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return "hypervisor" in value.split()
    return None


def _detect_hypervisor(files: Mapping[str, str]) -> tuple[str | None, list[str]]:
    vendor = files.get("sys/class/dmi/id/sys_vendor", "").strip()
    product = files.get("sys/class/dmi/id/product_name", "").strip()
    flag = _cpu_hypervisor_flag(files.get("proc/cpuinfo"))
    notes = [f"DMI: {vendor} {product}".strip()] if vendor or product else ["no DMI information"]
    if flag is not None:
        notes.append(f"hypervisor cpu flag {'present' if flag else 'absent'}")
    known = next(
        (
            (label, only_virtual)
            for prefix, part, label, only_virtual in _DMI_HYPERVISORS
            if vendor.startswith(prefix) and part in product
        ),
        None,
    )
    if known is not None:
        label, only_virtual = known
        if flag is False and not only_virtual:
            notes.append(f"{label} DMI without the hypervisor flag: a bare-metal instance")
            return None, notes
        return label, notes
    return (UNKNOWN_HYPERVISOR if flag else None), notes


def parse_virtualization(files: Mapping[str, str], env: Mapping[str, str]) -> VirtualizationHints:
    """``files`` maps paths relative to root (``.dockerenv``, ``proc/1/cgroup``, ``sys/class/dmi/id/...``,
    ``proc/cpuinfo``) to their text; a key that is present means the file exists."""
    container, container_notes = _detect_container(files, env)
    hypervisor, hypervisor_notes = _detect_hypervisor(files)
    return VirtualizationHints(container, hypervisor, tuple(container_notes + hypervisor_notes))


def collect_environment(root: Path = Path("/"), env: Mapping[str, str] | None = None) -> RuntimeEnvironment:
    """``env`` defaults to os.environ; pass a mapping to describe another process."""
    env = os.environ if env is None else env
    files = {rel: text for rel in _VIRTUALIZATION_FILES if (text := read_text(root / rel)) is not None}
    return RuntimeEnvironment(
        slurm=parse_slurm_env(env),
        kubernetes=parse_kubernetes_env(env, read_text(root / _K8S_NAMESPACE_FILE)),
        virtualization=parse_virtualization(files, env),
        network=parse_network_env(env),
    )
