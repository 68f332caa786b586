"""`gpucert capture`: save a node's raw hardware answers as a support bundle.

The bundle holds exactly what the parsers read (the NVML snapshot, nvidia-smi text, the /proc and /sys files
behind the host inventory, the kernel log's NVIDIA lines), so `gpucert discover --replay DIR` and the tests
can re-read the node anywhere. Our test fixtures are bundles captured this way on the lent H100 and H200s.

A bundle is written whole or not at all: into a hidden directory beside DIR, renamed to DIR at the end. DIR must
not exist or be empty; a non-empty one (an earlier bundle, or anything else) is refused before anything is read,
as `git clone` refuses one: two captures mixed in one bundle would replay as a node that never existed.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

from gpucert.config.loader import ConfigError
from gpucert.hardware.nvml import collect_nvml_snapshot, load_pynvml
from gpucert.hardware.software import collect_software

# The commands whose text output the parsers and the fixture tests compare against.
COMMANDS = {
    "nvidia-smi-q.txt": ["nvidia-smi", "-q"],
    "nvidia-smi-topo-m.txt": ["nvidia-smi", "topo", "-m"],
    "nvidia-smi-nvlink-s.txt": ["nvidia-smi", "nvlink", "-s"],
    "dmesg.txt": ["dmesg", "--time-format", "iso"],
}

# Exactly the files the host collectors read (glob patterns relative to the root): a bundle stays small
# (sysfs trees hold thousands of counters and GIDs) and holds nothing the parsers would not look at.
HOST_PATHS = (
    "proc/cpuinfo",
    "proc/meminfo",
    "proc/self/mounts",
    "proc/1/cgroup",
    "proc/sys/kernel/osrelease",
    "etc/os-release",
    "usr/lib/os-release",
    ".dockerenv",
    "run/.containerenv",
    "var/run/secrets/kubernetes.io/serviceaccount/namespace",
    "sys/class/dmi/id/sys_vendor",
    "sys/class/dmi/id/product_name",
    "sys/devices/system/node/online",
    "sys/devices/system/node/node*/cpulist",
    "sys/devices/system/node/node*/meminfo",
    "sys/devices/system/node/node*/distance",
    "sys/devices/system/cpu/cpu*/topology/physical_package_id",
    "sys/devices/system/cpu/cpu*/topology/core_id",
    *(f"sys/class/infiniband/*/{name}" for name in ("fw_ver", "board_id", "hca_type", "node_guid")),
    *(f"sys/class/infiniband/*/ports/*/{name}" for name in ("state", "phys_state", "rate", "link_layer", "lid")),
    "sys/class/infiniband/*/device/net/*/operstate",
    *(f"sys/class/net/*/{name}" for name in ("operstate", "mtu", "speed", "address", "type", "carrier")),
    "sys/class/net/*/device/driver",
    "sys/bus/pci/devices/*/vendor",
    "sys/bus/pci/devices/*/class",
)


def capture_node(out_dir: Path, timeout_s: float = 60.0) -> list[str]:
    """Write the bundle as out_dir (refused where out_dir holds anything); returns what could not be captured
    (never raises for one item)."""
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise ConfigError(
            f"--output {out_dir} is not empty ({', '.join(sorted(p.name for p in out_dir.iterdir())[:5])}"
            f"{', ...' if len(list(out_dir.iterdir())) > 5 else ''}): a capture writes a new bundle; choose a new "
            f"directory, or remove {out_dir} first"
        )
    if out_dir.parent.exists() and not out_dir.parent.is_dir():  # mkdir would say "File exists" of the parent
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(out_dir))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # mkdir, not mkdtemp (0700): the bundle gets the umask's mode, shared like any directory.
    partial = out_dir.parent / f".{out_dir.name}.capturing-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    partial.mkdir()
    try:
        problems = _capture_into(partial, timeout_s)
        if out_dir.is_dir():
            out_dir.rmdir()  # empty (checked above); a file put there meanwhile makes this fail, naming it
        partial.rename(out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return problems


def _capture_into(out_dir: Path, timeout_s: float) -> list[str]:
    problems: list[str] = []
    try:
        snapshot = collect_nvml_snapshot(load_pynvml())
        (out_dir / "nvml-snapshot.json").write_text(json.dumps(snapshot, indent=1) + "\n")
    except Exception as exc:
        problems.append(f"NVML: {exc}")
    for name, argv in COMMANDS.items():
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
            (out_dir / name).write_text(done.stdout + (f"\n# stderr:\n{done.stderr}" if done.stderr else ""))
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append(f"{' '.join(argv)}: {exc}")
    for pattern in HOST_PATHS:
        for src in sorted(Path("/").glob(pattern)):
            _copy_readable(src, out_dir / "root" / src.relative_to("/"), problems)
    software = collect_software(Path("/"))
    (out_dir / "software.json").write_text(json.dumps(dataclasses.asdict(software), indent=1) + "\n")
    (out_dir / "hostname.txt").write_text(socket.gethostname() + "\n")
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("SLURM_", "NCCL_", "CUDA_", "KUBERNETES_", "POD_"))
        or k in ("HOSTNAME", "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "container")
    }
    (out_dir / "environment.json").write_text(json.dumps(env, indent=1, sort_keys=True) + "\n")
    (out_dir / "problems.txt").write_text("".join(f"{p}\n" for p in problems))
    return problems


def _copy_readable(src: Path, dst: Path, problems: list[str]) -> None:
    """Copy one file; a symlink (a NIC's `device/driver`) is kept as a link, since its target names the driver."""
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink() and src.is_dir():
            dst.symlink_to(os.readlink(src))
        elif src.is_file():
            with open(src, "rb") as fh:
                dst.write_bytes(fh.read(1 << 20))
    except OSError as exc:
        # Some sysfs attributes refuse reads (speed of a down link gives EINVAL): the parsers expect gaps.
        if exc.errno not in (errno.EINVAL, errno.ENODEV, errno.EACCES, errno.EPERM):
            problems.append(f"{src}: {exc.strerror}")
