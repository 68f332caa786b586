"""Mounted filesystems from /proc/self/mounts, with a flag for those that other nodes may share.

``parse_mounts`` is pure; ``collect_mounts`` reads the file under ``root`` and returns [] if it cannot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Kernel and runtime filesystems: they say nothing about storage. overlay is not here because it is the
# root filesystem of most containers.
PSEUDO_FSTYPES = frozenset(
    {
        "autofs", "binfmt_misc", "bpf", "cgroup", "cgroup2", "configfs", "debugfs", "devpts", "devtmpfs",
        "efivarfs", "fusectl", "hugetlbfs", "mqueue", "nfsd", "nsfs", "proc", "pstore", "ramfs",
        "rpc_pipefs", "securityfs", "selinuxfs", "sysfs", "tmpfs", "tracefs",
        # lxcfs fakes /proc files inside containers; gvfs and the portal are desktop helpers.
        "fuse.lxcfs", "fuse.gvfsd-fuse", "fuse.portal",
    }
)  # fmt: skip

# Filesystems whose contents other nodes can see: the candidates for datasets, checkpoints and a shared
# software tree. virtiofs and 9p are absent: they export a directory of one hypervisor host to its guests.
# Most fuse.* mounts are local helpers, so only object-store and cluster clients are listed.
SHARED_FSTYPES = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "beegfs", "ceph", "cephfs", "wekafs", "glusterfs", "cifs", "smb3",
        "fuse.glusterfs", "fuse.ceph-fuse", "fuse.juicefs", "fuse.s3fs", "fuse.gcsfuse", "fuse.sshfs",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    fstype: str
    # A tuple, not the raw string, so that checking for "ro" does not match "errors=remount-ro".
    options: tuple[str, ...]
    shared_candidate: bool


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in paths as octal escapes (\040, \011, \012, \134).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str, include_pseudo: bool = False) -> list[Mount]:
    """Parse /proc/self/mounts. ``include_pseudo`` keeps tmpfs and friends, e.g. to size /dev/shm."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        source, target, fstype, options = (_unescape(f) for f in fields[:4])
        if fstype in PSEUDO_FSTYPES and not include_pseudo:
            continue
        mounts.append(
            Mount(
                source=source,
                target=target,
                fstype=fstype,
                options=tuple(options.split(",")),
                shared_candidate=fstype in SHARED_FSTYPES,
            )
        )
    return mounts


def collect_mounts(root: Path = Path("/"), include_pseudo: bool = False) -> list[Mount]:
    try:
        text = (root / "proc/self/mounts").read_text()
    except (OSError, UnicodeDecodeError):
        return []
    return parse_mounts(text, include_pseudo)
