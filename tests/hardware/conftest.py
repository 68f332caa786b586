"""Fake filesystem trees for the host collectors.

`docker_vm_root` is a capture of a real machine (tests/fixtures/host/docker-vm, see its README). `hgx_files`
describes an 8-GPU HGX H100 node as {path relative to root: text}; `make_tree` writes such a dict (plus
symlinks) under tmp_path, so a test can change one file before the collectors read the tree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "host"

# Sapphire Rapids flags as the kernel prints them on bare metal: no "hypervisor".
_SPR_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr sse "
    "sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon pebs bts rep_good nopl "
    "xtopology nonstop_tsc cpuid aperfmperf tsc_known_freq pni pclmulqdq dtes64 monitor ds_cpl vmx smx est "
    "tm2 ssse3 sdbg fma cx16 xtpr pdcm pcid dca sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes "
    "xsave avx f16c rdrand lahf_lm abm 3dnowprefetch cpuid_fault epb cat_l3 cat_l2 cdp_l3 intel_ppin "
    "cdp_l2 ssbd mba ibrs ibpb stibp ibrs_enhanced tpr_shadow flexpriority ept vpid ept_ad fsgsbase "
    "tsc_adjust bmi1 avx2 smep bmi2 erms invpcid cqm rdt_a avx512f avx512dq rdseed adx smap avx512ifma "
    "clflushopt clwb intel_pt avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves cqm_llc "
    "cqm_occup_llc cqm_mbm_total cqm_mbm_local split_lock_detect avx_vnni avx512_bf16 wbnoinvd dtherm ida "
    "arat pln pts hfi vnmi avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq "
    "avx512_vnni avx512_bitalg tme avx512_vpopcntdq la57 rdpid bus_lock_detect cldemote movdiri "
    "movdir64b enqcmd fsrm md_clear serialize tsxldtrk pconfig arch_lbr ibt amx_bf16 avx512_fp16 amx_tile "
    "amx_int8 flush_l1d arch_capabilities"
)


def hgx_cpuinfo() -> str:
    """2 x Xeon Platinum 8480+ with SMT: Linux numbers the first thread of every core (socket 0, then
    socket 1) before the second threads, so CPUs 0-55 and 112-167 share socket 0."""
    blocks = []
    for cpu in range(224):
        thread, rest = divmod(cpu, 112)
        socket, core = divmod(rest, 56)
        apicid = socket * 128 + core * 2 + thread
        blocks.append(
            f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
            "model name\t: Intel(R) Xeon(R) Platinum 8480+\nstepping\t: 8\nmicrocode\t: 0x2b000590\n"
            f"cpu MHz\t\t: 2000.000\ncache size\t: 107520 KB\nphysical id\t: {socket}\nsiblings\t: 112\n"
            f"core id\t\t: {core}\ncpu cores\t: 56\napicid\t\t: {apicid}\ninitial apicid\t: {apicid}\n"
            "fpu\t\t: yes\nfpu_exception\t: yes\ncpuid level\t: 32\nwp\t\t: yes\n"
            f"flags\t\t: {_SPR_FLAGS}\n"
            "vmx flags\t: vnmi preemption_timer posted_intr invvpid ept_x_only ept_ad ept_1gb flexpriority\n"
            "bugs\t\t: spectre_v1 spectre_v2 spec_store_bypass swapgs eibrs_pbrsb\nbogomips\t: 4000.00\n"
            "clflush size\t: 64\ncache_alignment\t: 64\naddress sizes\t: 52 bits physical, 57 bits virtual\n"
            "power management:\n"
        )
    return "\n".join(blocks) + "\n"


def _node_meminfo(node: int, total_kib: int, free_kib: int) -> str:
    return (
        f"Node {node} MemTotal:       {total_kib} kB\n"
        f"Node {node} MemFree:        {free_kib} kB\n"
        f"Node {node} MemUsed:        {total_kib - free_kib} kB\n"
        f"Node {node} HugePages_Total:     0\n"
        f"Node {node} HugePages_Free:      0\n"
    )


HGX_MEMINFO = """\
MemTotal:       2113399112 kB
MemFree:        2039712244 kB
MemAvailable:   2051234816 kB
Buffers:          1348120 kB
Cached:          15673304 kB
SwapCached:            0 kB
Active:           9217680 kB
Inactive:        12453976 kB
SwapTotal:             0 kB
SwapFree:              0 kB
AnonHugePages:    2015232 kB
HugePages_Total:       0
HugePages_Free:        0
HugePages_Rsvd:        0
HugePages_Surp:        0
Hugepagesize:       2048 kB
Hugetlb:               0 kB
"""

HGX_MOUNTS = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
udev /dev devtmpfs rw,nosuid,relatime,size=1056637572k,nr_inodes=264159393,mode=755,inode64 0 0
devpts /dev/pts devpts rw,nosuid,noexec,relatime,gid=5,mode=620,ptmxmode=000 0 0
tmpfs /run tmpfs rw,nosuid,nodev,noexec,relatime,size=211339912k,mode=755,inode64 0 0
/dev/nvme0n1p2 / ext4 rw,relatime 0 0
securityfs /sys/kernel/security securityfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev,inode64 0 0
cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot 0 0
pstore /sys/fs/pstore pstore rw,nosuid,nodev,noexec,relatime 0 0
efivarfs /sys/firmware/efi/efivars efivarfs rw,nosuid,nodev,noexec,relatime 0 0
bpf /sys/fs/bpf bpf rw,nosuid,nodev,noexec,relatime,mode=700 0 0
systemd-1 /proc/sys/fs/binfmt_misc autofs rw,relatime,fd=29,pgrp=1,timeout=0,minproto=5,maxproto=5,direct 0 0
hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0
mqueue /dev/mqueue mqueue rw,nosuid,nodev,noexec,relatime 0 0
debugfs /sys/kernel/debug debugfs rw,nosuid,nodev,noexec,relatime 0 0
tracefs /sys/kernel/tracing tracefs rw,nosuid,nodev,noexec,relatime 0 0
fusectl /sys/fs/fuse/connections fusectl rw,nosuid,nodev,noexec,relatime 0 0
configfs /sys/kernel/config configfs rw,nosuid,nodev,noexec,relatime 0 0
/dev/nvme0n1p1 /boot/efi vfat rw,relatime,fmask=0077,dmask=0077,codepage=437,iocharset=iso8859-1,\
shortname=mixed,errors=remount-ro 0 0
/dev/md0 /raid xfs rw,relatime,attr2,inode64,logbufs=8,logbsize=32k,sunit=1024,swidth=8192,noquota 0 0
binfmt_misc /proc/sys/fs/binfmt_misc binfmt_misc rw,nosuid,nodev,noexec,relatime 0 0
10.10.0.5:/export/home /home nfs4 rw,relatime,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,\
proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.10.1.21,local_lock=none,addr=10.10.0.5 0 0
172.16.0.10@o2ib:172.16.0.11@o2ib:/scratch /lustre/scratch lustre rw,flock,lazystatfs,encrypt 0 0
tmpfs /run/user/1000 tmpfs rw,nosuid,nodev,relatime,size=211339908k,mode=700,uid=1000,gid=1000,inode64 0 0
"""

HGX_OS_RELEASE = """\
PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.4 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
UBUNTU_CODENAME=jammy
"""

# mlx5_0..7: the eight ConnectX-7 compute HCAs, one per GPU, with their IPoIB interfaces.
HGX_IB_NETDEVS = ("ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0", "ibp154s0", "ibp192s0", "ibp206s0", "ibp220s0")
HGX_ROCE_NETDEVS = ("enp13s0f0np0", "enp13s0f1np1")


def _ib_device(name: str, guid: str, netdev: str, link_layer: str, rate: str, lid: str) -> dict[str, str]:
    base = f"sys/class/infiniband/{name}"
    return {
        f"{base}/fw_ver": "28.39.1002\n",
        f"{base}/board_id": "MT_0000000838\n",
        f"{base}/hca_type": "MT4129\n",
        f"{base}/node_guid": f"{guid}\n",
        f"{base}/ports/1/state": "4: ACTIVE\n",
        f"{base}/ports/1/phys_state": "5: LinkUp\n",
        f"{base}/ports/1/rate": f"{rate}\n",
        f"{base}/ports/1/link_layer": f"{link_layer}\n",
        f"{base}/ports/1/lid": f"{lid}\n",
        f"{base}/device/net/{netdev}/operstate": "up\n",
    }


def _net_interface(name: str, operstate: str, mtu: int, mac: str, speed: str | None) -> dict[str, str]:
    files = {
        f"sys/class/net/{name}/operstate": f"{operstate}\n",
        f"sys/class/net/{name}/mtu": f"{mtu}\n",
        f"sys/class/net/{name}/address": f"{mac}\n",
    }
    if speed is not None:  # reading speed of a down or virtual link fails with EINVAL: no file here
        files[f"sys/class/net/{name}/speed"] = f"{speed}\n"
    return files


def hgx_h100_files() -> dict[str, str]:
    files: dict[str, str] = {
        "proc/cpuinfo": hgx_cpuinfo(),
        "proc/meminfo": HGX_MEMINFO,
        "proc/self/mounts": HGX_MOUNTS,
        "proc/1/cgroup": "0::/init.scope\n",
        "proc/sys/kernel/osrelease": "5.15.0-105-generic\n",
        "etc/os-release": HGX_OS_RELEASE,
        "sys/class/dmi/id/sys_vendor": "Supermicro\n",
        "sys/class/dmi/id/product_name": "SYS-821GE-TNHR\n",
        "sys/devices/system/node/node0/cpulist": "0-55,112-167\n",
        "sys/devices/system/node/node0/meminfo": _node_meminfo(0, 1056451940, 1019781200),
        "sys/devices/system/node/node1/cpulist": "56-111,168-223\n",
        "sys/devices/system/node/node1/meminfo": _node_meminfo(1, 1056947172, 1019931044),
        "sys/devices/system/node/online": "0-1\n",
        "sys/class/net/bonding_masters": "\n",
        "sys/class/net/lo/operstate": "unknown\n",
        "sys/class/net/lo/mtu": "65536\n",
        "sys/class/net/lo/address": "00:00:00:00:00:00\n",
    }
    for i, netdev in enumerate(HGX_IB_NETDEVS):
        files.update(
            _ib_device(
                f"mlx5_{i}",
                f"a088:c203:00b1:2c{i:02x}",
                netdev,
                "InfiniBand",
                "400 Gb/sec (4X NDR)",
                hex(0x1A + i),
            )
        )
        files.update(
            _net_interface(
                netdev,
                "up",
                4092,
                f"00:00:10:29:fe:80:00:00:00:00:00:00:a0:88:c2:03:00:b1:2c:{i:02x}",
                "400000",
            )
        )
    for i, netdev in enumerate(HGX_ROCE_NETDEVS):
        files.update(
            _ib_device(f"mlx5_{8 + i}", f"946d:ae03:00f2:8a{i:02x}", netdev, "Ethernet", "200 Gb/sec (2X NDR)", "0x0")
        )
        files.update(_net_interface(netdev, "up", 9000, f"94:6d:ae:f2:8a:{i:02x}", "200000"))
    files.update(_net_interface("eno1", "up", 1500, "3c:ec:ef:a1:b2:c4", "10000"))
    files.update(_net_interface("docker0", "down", 1500, "02:42:8e:5f:11:07", None))
    return files


def hgx_h100_links() -> dict[str, str]:
    """Symlinks as sysfs has them: physical interfaces have `device`, whose `driver` names the driver."""
    links = {}
    pci = {"eno1": ("0000:0c:00.0", "i40e")}
    pci.update({n: (f"0000:{int(n[4:-2]):02x}:00.0", "mlx5_core") for n in HGX_IB_NETDEVS})
    pci.update({n: (f"0000:0d:00.{i}", "mlx5_core") for i, n in enumerate(HGX_ROCE_NETDEVS)})
    for name, (address, driver) in pci.items():
        links[f"sys/class/net/{name}/device"] = f"../../../devices/pci0000:00/{address}"
        links[f"sys/devices/pci0000:00/{address}/driver"] = f"../../../bus/pci/drivers/{driver}"
    return links


def write_tree(root: Path, files: Mapping[str, str], links: Mapping[str, str] | None = None) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for rel, target in (links or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    return root


@pytest.fixture
def make_tree(tmp_path: Path) -> Callable[..., Path]:
    def make(files: Mapping[str, str], links: Mapping[str, str] | None = None) -> Path:
        return write_tree(tmp_path / "root", files, links)

    return make


@pytest.fixture
def hgx_files() -> dict[str, str]:
    return hgx_h100_files()


@pytest.fixture
def hgx_root(make_tree: Callable[..., Path], hgx_files: dict[str, str]) -> Path:
    return make_tree(hgx_files, hgx_h100_links())


@pytest.fixture
def docker_vm_root() -> Path:
    return FIXTURES / "docker-vm"
