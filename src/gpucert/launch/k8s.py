"""`gpucert launch k8s VERB`: an indexed Job (one pod per node) with a headless Service, as YAML.

Each pod's node rank is its JOB_COMPLETION_INDEX; the Service gives pod 0 a stable name
(`<job>-0.<service>`), which every pod gets as MASTER_ADDR. GPUs are requested as `nvidia.com/gpu`, the run
directory is a shared PersistentVolumeClaim mounted at the same path on every pod, and /dev/shm is a memory
emptyDir (NCCL and the data loaders need more than the container default of 64 MB).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from gpucert.config.loader import ConfigError
from gpucert.launch.slurm import VERB_ARGV, VERBS, refuse_once_verb, rendezvous_set


def render_manifests(
    verb: str,
    args: tuple[str, ...],
    nodes: int,
    gpus_per_node: int,
    image: str,
    name: str,
    port: int,
    env: dict[str, str],
    pvc: str | None,
    mount: str,
    rendezvous_timeout_s: float | None,
) -> str:
    if verb not in VERBS:
        raise ConfigError(f"verb {verb!r}: expected one of {', '.join(VERBS)}")
    refuse_once_verb(verb, "k8s")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?", name):
        raise ConfigError(f"--name {name!r}: a Kubernetes name is lower-case letters, digits and '-' (max 42)")
    if nodes < 1:
        raise ConfigError(f"--nodes must be >= 1, found {nodes}")
    service = f"{name}-rdzv"
    head = f"{name}-0.{service}"
    # Every verb the same way: one gpucert a pod, its node rank from JOB_COMPLETION_INDEX (launch_env.py).
    command = [*VERB_ARGV[verb], *rendezvous_set(rendezvous_timeout_s), *args]
    if verb == "finetune" and gpus_per_node:
        command += ["--nproc", str(gpus_per_node)]
    variables = {"GPUCERT_NNODES": str(nodes), "MASTER_ADDR": head, "MASTER_PORT": str(port), **env}
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": gpus_per_node}} if gpus_per_node else {}
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if pvc:
        mounts.append({"name": "shared", "mountPath": mount})
        volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": pvc}})
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service, "labels": {"app.kubernetes.io/name": "gpucert"}},
        "spec": {"clusterIP": "None", "selector": {"job-name": name}, "ports": [{"name": "rdzv", "port": port}]},
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpucert"}},
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            # A failed node fails the run: gpucert names it; a silent retry would hide it.
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "gpucert"}},
                "spec": {
                    "subdomain": service,
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "gpucert",
                            "image": image,
                            "command": command,
                            "env": [{"name": k, "value": v} for k, v in variables.items()],
                            "ports": [{"containerPort": port, "name": "rdzv"}],
                            "resources": resources,
                            "volumeMounts": mounts,
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }
    return yaml.safe_dump_all([svc, job], sort_keys=False)
