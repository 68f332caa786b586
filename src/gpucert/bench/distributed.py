"""The one place that reads RANK/WORLD_SIZE/LOCAL_RANK, starts process groups and launches workers.

A benchmark runs in one process per GPU (per gloo rank on CPU). Three ways to get there:
- `gpucert bench X` on a node launches them itself: torchrun's `--standalone` rendezvous on localhost with a
  free port the OS picks (no port races), `--nproc N` processes, and collects rank 0's JSON output;
- under an outside `torchrun`, the environment already says RANK/WORLD_SIZE: we are one of the workers;
- under `srun`, SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID stand in, with MASTER_ADDR the job's first node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def ranks_from_env(env: Mapping[str, str]) -> dict[str, str] | None:
    """torchrun's variables, or Slurm's translated into them; None outside any launcher."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE") if k in env}
    # Only inside an srun step: the batch script itself also sees SLURM_PROCID=0 and SLURM_NTASKS=N, and taking
    # it for rank 0 would wait for N-1 ranks that never come. srun sets SLURM_STEP_ID for its tasks.
    in_step = "SLURM_STEP_ID" in env and env["SLURM_STEP_ID"] not in ("batch", "4294967294")
    if in_step and "SLURM_PROCID" in env and "SLURM_NTASKS" in env and int(env["SLURM_NTASKS"]) > 1:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
        return {
            "RANK": env["SLURM_PROCID"],
            "WORLD_SIZE": env["SLURM_NTASKS"],
            "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
            "LOCAL_WORLD_SIZE": env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0],
            "MASTER_ADDR": env.get("MASTER_ADDR") or first_host(nodelist),
            # One port per job, away from the ephemeral range, so two jobs on a node do not collide.
            "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000),
        }
    return None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm nodelist: 'gpu[003-010,012],cpu1' -> 'gpu003'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not match:
        raise ValueError(f"cannot read a host from Slurm nodelist {nodelist!r}")
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def init_distributed(timeout_s: float = 600.0) -> DistEnv:
    """Join (or create, for a single process) the default process group; NCCL on GPUs, gloo on CPUs."""
    launched = ranks_from_env(os.environ)
    if launched:
        # env:// rendezvous reads these; under srun they are the translation of SLURM_*, not yet in the env.
        os.environ.update(launched)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # A lone process writes nothing into os.environ: a later launch from this process must not mistake it
    # for a rank of an outside torchrun.
    ranks = launched or {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    rank, world = int(ranks["RANK"]), int(ranks["WORLD_SIZE"])
    local_rank = int(ranks.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if world == 1 and "MASTER_PORT" not in os.environ:
            # A lone process needs no rendezvous: an in-memory store avoids binding any port.
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=timeout_s)
            )
        else:
            kwargs: dict[str, Any] = {"device_id": device} if use_cuda else {}
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    return DistEnv(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=int(ranks.get("LOCAL_WORLD_SIZE", world)),
        backend=backend,
        device=device,
    )


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def gather_to_main(env: DistEnv, payload: Any) -> list[Any] | None:
    """Every rank's JSON-able payload on rank 0 (None elsewhere)."""
    if env.world_size == 1:
        return [payload]
    out: list[Any] | None = [None] * env.world_size if env.is_main else None
    dist.gather_object(payload, out, dst=0)
    return out


def default_nproc() -> int:
    """One process per visible GPU; two gloo processes on a CPU machine, so collectives have a peer."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def launch_local(
    nproc: int,
    spec: dict[str, Any],
    workdir: Path,
    timeout_s: float,
    env_overrides: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run `gpucert.bench.worker` in nproc processes under torchrun --standalone; rank 0's result back.

    env_overrides reach the workers before their process group exists (NCCL reads NCCL_ALGO at init).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = workdir / "spec.json", workdir / "result.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--module",
        "gpucert.bench.worker",
        str(spec_path),
        str(out_path),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(env_overrides or {})
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LaunchError(f"{spec['benchmark']}: no result within {timeout_s:.0f} s (hung collective?)") from exc
    if done.returncode != 0 or not out_path.exists():
        tail = (done.stderr or done.stdout).strip()[-1500:]
        raise LaunchError(f"{spec['benchmark']}: workers exited {done.returncode}: {tail}")
    return json.loads(out_path.read_text())


class LaunchError(RuntimeError):
    """The benchmark's workers failed or hung: the benchmark is ERROR, the GPUs were not judged."""
