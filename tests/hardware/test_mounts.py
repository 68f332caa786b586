from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from gpucert.hardware.mounts import Mount, collect_mounts, parse_mounts


def test_hgx_keeps_real_filesystems(hgx_root: Path) -> None:
    mounts = collect_mounts(hgx_root)
    assert [(m.target, m.fstype, m.shared_candidate) for m in mounts] == [
        ("/", "ext4", False),
        ("/boot/efi", "vfat", False),
        ("/raid", "xfs", False),
        ("/home", "nfs4", True),
        ("/lustre/scratch", "lustre", True),
    ]


def test_hgx_shared_mount_details(hgx_root: Path) -> None:
    mounts = {m.target: m for m in collect_mounts(hgx_root)}
    assert mounts["/lustre/scratch"] == Mount(
        source="172.16.0.10@o2ib:172.16.0.11@o2ib:/scratch",
        target="/lustre/scratch",
        fstype="lustre",
        options=("rw", "flock", "lazystatfs", "encrypt"),
        shared_candidate=True,
    )
    assert mounts["/home"].source == "10.10.0.5:/export/home"
    assert "vers=4.2" in mounts["/home"].options
    # Options are split, so "errors=remount-ro" does not read as read-only.
    assert "ro" not in mounts["/boot/efi"].options
    assert "errors=remount-ro" in mounts["/boot/efi"].options


def test_include_pseudo_keeps_dev_shm(hgx_root: Path) -> None:
    targets = [m.target for m in collect_mounts(hgx_root, include_pseudo=True)]
    assert "/dev/shm" in targets and "/proc" in targets
    assert len(targets) == 25


def test_real_vm_mounts(docker_vm_root: Path) -> None:
    assert collect_mounts(docker_vm_root) == [
        Mount(
            source="/dev/vda",
            target="/",
            fstype="ext4",
            options=("rw", "relatime", "discard", "resv_strict", "resuid=65534", "resgid=65534"),
            shared_candidate=False,
        )
    ]


def test_octal_escapes_are_decoded() -> None:
    (mount,) = parse_mounts("/dev/sdb1 /mnt/team\\040data\\011x ext4 rw,relatime 0 0\n")
    assert mount.target == "/mnt/team data\tx"


def test_fstype_classification() -> None:
    text = "\n".join(
        [
            "overlay / overlay rw,relatime,lowerdir=/var/lib/docker/overlay2/l/A,upperdir=/u,workdir=/w 0 0",
            "myfs /data virtiofs rw,relatime 0 0",
            "JuiceFS:ckpt /ckpt fuse.juicefs rw,relatime,user_id=0,group_id=0,allow_other 0 0",
            "weka01/default /mnt/weka wekafs rw,relatime,writecache,inode_bits=auto 0 0",
            "10.0.0.2:6789:/ /mnt/ceph ceph rw,relatime,name=admin,acl 0 0",
            "lxcfs /proc/cpuinfo fuse.lxcfs rw,nosuid,nodev,relatime,user_id=0,group_id=0 0 0",
            "nsfs /run/netns/blue nsfs rw 0 0",
        ]
    )
    assert [(m.target, m.shared_candidate) for m in parse_mounts(text)] == [
        ("/", False),
        ("/data", False),
        ("/ckpt", True),
        ("/mnt/weka", True),
        ("/mnt/ceph", True),
    ]


def test_malformed_lines_are_skipped() -> None:
    assert parse_mounts("garbage\n\n/dev/sda1 /\n") == []


def test_missing_tree_yields_empty_list(tmp_path: Path) -> None:
    assert collect_mounts(tmp_path) == []


def test_results_are_json_serialisable(hgx_root: Path) -> None:
    data = json.loads(json.dumps([asdict(m) for m in collect_mounts(hgx_root)]))
    assert data[4]["options"] == ["rw", "flock", "lazystatfs", "encrypt"]
