"""`gpucert capture`: save a node's raw hardware answers as a support bundle.

The bundle holds exactly what the parsers read (the NVML snapshot, nvidia-smi text, the /proc and /sys files
behind the host inventory, the kernel log's NVIDIA lines), so `gpucert discover --replay DIR` and the tests
can re-read the node anywhere. Our test fixtures are bundles captured this way on the lent H100 and H200s.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
from pathlib import Path

from gpucert.hardware.nvml import collect_nvml_snapshot, load_pynvml
from gpucert.hardware.software import collect_software

# The commands whose text output the parsers and the fixture tests compare against.
COMMANDS = {
    "nvidia-smi-q.txt": ["nvidia-smi", "-q"],
    "nvidia-smi-topo-m.txt": ["nvidia-smi", "topo", "-m"],
    "nvidia-smi-nvlink-s.txt": ["nvidia-smi", "nvlink", "-s"],
    "dmesg.txt": ["dmesg", "--time-format", "iso"],
}

# Files and trees (glob patterns) the host collectors read, copied relative to the root.
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
    "sys/class/infiniband",
    "sys/class/net",
    "sys/devices/system/node/online",
    "sys/devices/system/node/node*/cpulist",
    "sys/devices/system/node/node*/meminfo",
    "sys/devices/system/node/node*/distance",
    "sys/devices/system/cpu/cpu*/topology/physical_package_id",
    "sys/devices/system/cpu/cpu*/topology/core_id",
    "sys/class/dmi/id/sys_vendor",
    "sys/class/dmi/id/product_name",
)


def capture_node(out_dir: Path, timeout_s: float = 60.0) -> list[str]:
    """Write the bundle into out_dir; returns what could not be captured (never raises for one item)."""
    out_dir.mkdir(parents=True, exist_ok=True)
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


def _copy_readable(src: Path, dst: Path, problems: list[str], depth: int = 0) -> None:
    """Copy a file or a sysfs tree as plain text, following sysfs' symlinked device dirs a few levels."""
    try:
        if src.is_dir():
            if depth > 4:
                return
            dst.mkdir(parents=True, exist_ok=True)
            for child in sorted(src.iterdir()):
                if child.is_symlink() and child.is_dir() and depth >= 1 and child.name not in ("device", "net"):
                    # Keep the link itself (a driver is known by its target's name) without walking the tree
                    # behind it; in the bundle it dangles, which is all the parsers need.
                    (dst / child.name).symlink_to(os.readlink(child))
                    continue
                _copy_readable(child, dst / child.name, problems, depth + 1)
        elif src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            with open(src, "rb") as fh:
                data = fh.read(1 << 20)
            dst.write_bytes(data)
    except OSError:
        # sysfs has many write-only or EINVAL-on-read attributes; skipping them is the norm, not a problem.
        if depth == 0:
            problems.append(f"{src}: not readable")
