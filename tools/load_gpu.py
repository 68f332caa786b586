"""Keep one GPU busy with bf16 matmuls from a process of its own, to see `gpucert bench burn` (and the matmul
benchmark's fixed sizes) name a GPU that shares its time with another job.

    python tools/load_gpu.py --gpu 1 --seconds 120 &
    gpucert bench burn --duration 30s          # GPU 1 FAILs: its median is far below the node's best

--gpu is the CUDA index (as CUDA_VISIBLE_DEVICES numbers them). Prints one line when the load has started.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--size", type=int, default=8192)
    args = parser.parse_args()
    device = torch.device("cuda", args.gpu)
    a = torch.randn(args.size, args.size, device=device, dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device=device, dtype=torch.bfloat16)
    a @ b
    torch.cuda.synchronize(device)
    print(f"loading GPU {args.gpu} for {args.seconds:g} s", flush=True)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        for _ in range(50):
            a @ b
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()
