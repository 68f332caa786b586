from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from gpucert.hardware.environment import (
    UNKNOWN_HYPERVISOR,
    KubernetesContext,
    SlurmContext,
    collect_environment,
    parse_kubernetes_env,
    parse_slurm_env,
    parse_virtualization,
)

# What srun gives task 9 of a 2-node, 16-task job (names as Slurm 23.x sets them).
SLURM_ENV = {
    "SLURM_JOB_ID": "418233",
    "SLURM_JOB_NAME": "gpucert-accept",
    "SLURM_JOB_NODELIST": "hgx-[017-018]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NTASKS": "16",
    "SLURM_PROCID": "9",
    "SLURM_LOCALID": "1",
    "SLURM_GPUS_ON_NODE": "8",
    "SLURM_JOB_PARTITION": "h100",
}
X86_VM_CPUINFO = "processor\t: 0\nflags\t\t: fpu vme sse2 ht hypervisor lahf_lm\n"
X86_METAL_CPUINFO = "processor\t: 0\nflags\t\t: fpu vme sse2 ht lahf_lm\n"


def test_parse_slurm_env() -> None:
    assert parse_slurm_env(SLURM_ENV) == SlurmContext(
        job_id="418233",
        job_name="gpucert-accept",
        nodelist="hgx-[017-018]",
        nnodes=2,
        ntasks=16,
        procid=9,
        localid=1,
        gpus_on_node=8,
        partition="h100",
    )


def test_slurm_legacy_names_and_prolog_context() -> None:
    # A prolog sees the job but no task; older releases only set SLURM_NNODES / SLURM_NPROCS / SLURM_NODELIST.
    env = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "4", "SLURM_NPROCS": "x", "SLURM_NODELIST": "gpu[1-4]"}
    slurm = parse_slurm_env(env)
    assert slurm is not None
    assert (slurm.nnodes, slurm.ntasks, slurm.nodelist, slurm.procid) == (4, None, "gpu[1-4]", None)


def test_no_slurm_without_job_id() -> None:
    assert parse_slurm_env({"SLURM_CONF": "/etc/slurm/slurm.conf"}) is None


def test_parse_kubernetes_env() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": "gpucert-node-check-7x2kq"}
    assert parse_kubernetes_env(env, "gpu-burnin\n") == KubernetesContext("gpu-burnin", "gpucert-node-check-7x2kq")
    env |= {"POD_NAME": "gpucert-0", "POD_NAMESPACE": "acceptance"}
    assert parse_kubernetes_env(env, "gpu-burnin\n") == KubernetesContext("acceptance", "gpucert-0")
    assert parse_kubernetes_env({"HOSTNAME": "hgx-017"}) is None


def test_real_vm_is_docker_in_firecracker(docker_vm_root: Path) -> None:
    hints = collect_environment(docker_vm_root, env={}).virtualization
    assert hints.container == "docker"
    # Firecracker exposes no DMI; only the CPU flag gives the VM away.
    assert hints.hypervisor == UNKNOWN_HYPERVISOR
    assert hints.notes == ("/.dockerenv exists", "no DMI information", "hypervisor cpu flag present")


def test_hgx_bare_metal_in_slurm(hgx_root: Path) -> None:
    environment = collect_environment(hgx_root, env=SLURM_ENV)
    assert environment.slurm is not None and environment.slurm.job_id == "418233"
    assert environment.kubernetes is None
    hints = environment.virtualization
    assert (hints.container, hints.hypervisor) == (None, None)
    assert hints.notes == ("DMI: Supermicro SYS-821GE-TNHR", "hypervisor cpu flag absent")


@pytest.mark.parametrize(
    ("vendor", "product", "cpuinfo", "expected"),
    [
        ("QEMU", "Standard PC (Q35 + ICH9, 2009)", X86_VM_CPUINFO, "QEMU"),
        # Some GPU VMs hide the flag (-cpu host,-hypervisor); QEMU's DMI still gives them away.
        ("QEMU", "Standard PC (i440FX + PIIX, 1996)", X86_METAL_CPUINFO, "QEMU"),
        ("Amazon EC2", "p5.48xlarge", X86_VM_CPUINFO, "Amazon EC2"),
        ("Amazon EC2", "i4i.metal", X86_METAL_CPUINFO, None),
        ("Microsoft Corporation", "Virtual Machine", X86_VM_CPUINFO, "Microsoft Corporation Virtual Machine"),
        ("Google", "Google Compute Engine", X86_VM_CPUINFO, "Google Compute Engine"),
        ("Dell Inc.", "PowerEdge XE9680", X86_VM_CPUINFO, UNKNOWN_HYPERVISOR),
        ("NVIDIA", "P3880", "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n", None),
    ],
)
def test_hypervisor_from_dmi_and_cpu_flag(vendor: str, product: str, cpuinfo: str, expected: str | None) -> None:
    files = {
        "sys/class/dmi/id/sys_vendor": f"{vendor}\n",
        "sys/class/dmi/id/product_name": f"{product}\n",
        "proc/cpuinfo": cpuinfo,
    }
    assert parse_virtualization(files, {}).hypervisor == expected


def test_bare_metal_cloud_instance_is_noted() -> None:
    files = {"sys/class/dmi/id/sys_vendor": "Amazon EC2\n", "sys/class/dmi/id/product_name": "i4i.metal\n"}
    notes = parse_virtualization({**files, "proc/cpuinfo": X86_METAL_CPUINFO}, {}).notes
    assert "Amazon EC2 DMI without the hypervisor flag: a bare-metal instance" in notes


@pytest.mark.parametrize(
    ("files", "env", "expected"),
    [
        ({"proc/1/cgroup": "12:memory:/kubepods/besteffort/pod3f1c/0a1b2c\n"}, {}, "kubernetes"),
        ({".dockerenv": ""}, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "kubernetes"),
        ({"run/.containerenv": 'engine="podman-4.9.3"\n'}, {}, "podman"),
        ({"proc/1/cgroup": "0::/system.slice/docker-4c5d.scope\n"}, {}, "docker"),
        ({"proc/1/cgroup": "1:name=systemd:/lxc/ci-runner\n"}, {}, "lxc"),
        ({}, {"APPTAINER_CONTAINER": "/scratch/pytorch.sif"}, "apptainer"),
        ({}, {"container": "systemd-nspawn"}, "systemd-nspawn"),
        ({"proc/1/cgroup": "0::/init.scope\n"}, {}, None),
    ],
)
def test_container_detection(files: dict[str, str], env: dict[str, str], expected: str | None) -> None:
    assert parse_virtualization(files, env).container == expected


def test_missing_tree_yields_empty_context(tmp_path: Path) -> None:
    environment = collect_environment(tmp_path, env={})
    assert (environment.slurm, environment.kubernetes) == (None, None)
    assert environment.virtualization.container is None
    assert environment.virtualization.hypervisor is None
    assert environment.virtualization.notes == ("no DMI information",)


def test_results_are_json_serialisable(hgx_root: Path) -> None:
    data = json.loads(json.dumps(asdict(collect_environment(hgx_root, env=SLURM_ENV))))
    assert data["slurm"]["gpus_on_node"] == 8
    assert data["virtualization"]["notes"][0] == "DMI: Supermicro SYS-821GE-TNHR"
