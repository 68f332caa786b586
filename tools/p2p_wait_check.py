"""Does what the other ranks do while local rank 0 measures the p2p matrix change the matrix? Run under torchrun on
one multi-GPU node: `torchrun --nproc-per-node N tools/p2p_wait_check.py --out DIR`.

On a 4 x H200 node (2026-11-29) `gpucert accept` measured every copy into GPUs 1-3 at 239 GB/s and every copy into
GPU 0 at 395, while ranks 1-3 waited in an NCCL collective; on 2026-11-21 (another runtime) every pair gave 395.
This measures the matrix three times in one job, the other ranks waiting (a) in dist.barrier() on NCCL, (b) on
the host through the store (gpucert's host_barrier), (c) in dist.barrier() again, so that an order effect shows.
Writes p2p-wait.json under --out (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from gpucert.bench.p2p import measure_matrix

SIZE = 1 << 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    dist.all_reduce(torch.ones(1, device="cuda"))  # the communicator exists before the first measurement
    torch.cuda.synchronize()
    found = {}
    for n, how in enumerate(("nccl barrier", "host wait", "nccl barrier again")):
        if rank == 0:
            t0 = time.monotonic()
            data = measure_matrix(SIZE, 2, 5)
            found[how] = {"matrix_gbps": data["matrix_gbps"], "seconds": round(time.monotonic() - t0, 1)}
            print(how, [[round(v) if v else None for v in row] for row in data["matrix_gbps"]], flush=True)
            store.set(f"done/{n}", "1")
        if how == "host wait":
            store.wait([f"done/{n}"], timedelta(seconds=600))
        else:
            dist.barrier()
        dist.barrier()
    if rank == 0:
        found["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        found["world_size"] = world
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "p2p-wait.json").write_text(json.dumps(found, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
