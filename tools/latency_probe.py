"""Where the small-message time of a torch.distributed all_reduce goes (a diagnostic for the lent machines).

Run under torchrun on 2+ GPUs. Per size, the time of one all_reduce in a batch of back-to-back calls timed with
one pair of CUDA events (nccl-tests' method), through several paths:
  torch      dist.all_reduce on the current (default) stream
  torch-side dist.all_reduce on a non-blocking side stream (nccl-tests creates its stream non-blocking)
  nccl       ncclAllReduce called directly (ctypes) on torch's own communicator, default stream
  nccl-side  the same on the side stream
  *-graph    the batch captured as one CUDA graph
and `host_us`, the host time to issue one call (perf_counter around the issuing loop). One JSON line per row.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

NCCL_BF16, NCCL_SUM = 9, 0  # nccl.h: ncclBfloat16, ncclSum


def libnccl() -> ctypes.CDLL:
    """The libnccl torch loaded (from /proc/self/maps), so the call uses the same library as the communicator."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libnccl" in line:
                return ctypes.CDLL(line.split()[-1])
    raise RuntimeError("libnccl is not loaded in this process")


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    warm = torch.ones(1024, device=dev)
    dist.all_reduce(warm)
    torch.cuda.synchronize()
    lib = libnccl()
    backend = dist.group.WORLD._get_backend(dev)  # type: ignore[union-attr]
    comm = ctypes.c_void_p(backend._comm_ptr())
    lib.ncclAllReduce.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    side = torch.cuda.Stream(dev)  # torch creates its pool streams non-blocking

    sizes = [8, 1024, 65536, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20]
    for size in sizes:
        buf = torch.ones(max(size // 2, 1), dtype=torch.bfloat16, device=dev)
        count = buf.numel()

        def torch_call(buf: torch.Tensor = buf) -> None:
            dist.all_reduce(buf)

        def nccl_call(buf: torch.Tensor = buf, count: int = count) -> None:
            stream = torch.cuda.current_stream().cuda_stream
            rc = lib.ncclAllReduce(
                buf.data_ptr(), buf.data_ptr(), count, NCCL_BF16, NCCL_SUM, comm, ctypes.c_void_p(stream)
            )
            if rc != 0:
                raise RuntimeError(f"ncclAllReduce returned {rc}")

        for name, fn in (("torch", torch_call), ("nccl", nccl_call)):
            for stream_name, stream in (("", None), ("-side", side)):
                ctx = (
                    torch.cuda.stream(stream) if stream is not None else torch.cuda.stream(torch.cuda.current_stream())
                )
                with ctx:
                    for _ in range(20):
                        fn()
                    torch.cuda.synchronize()
                    # Size the batch to ~5 ms from a probe of 20 calls.
                    t0 = torch.cuda.Event(enable_timing=True)
                    t1 = torch.cuda.Event(enable_timing=True)
                    t0.record()
                    for _ in range(20):
                        fn()
                    t1.record()
                    torch.cuda.synchronize()
                    probe = torch.tensor([t0.elapsed_time(t1) / 20], device=dev)
                    dist.all_reduce(probe, op=dist.ReduceOp.MAX)
                    iters = max(1, min(2000, int(5.0 / float(probe.item()))))
                    samples, hosts = [], []
                    for _ in range(10):
                        s = torch.cuda.Event(enable_timing=True)
                        e = torch.cuda.Event(enable_timing=True)
                        s.record()
                        h0 = time.perf_counter()
                        for _ in range(iters):
                            fn()
                        hosts.append((time.perf_counter() - h0) / iters)
                        e.record()
                        torch.cuda.synchronize()
                        samples.append(s.elapsed_time(e) / iters * 1e3)
                    row = {
                        "path": name + stream_name,
                        "size": size,
                        "iters": iters,
                        "us": statistics.median(samples),
                        "host_us": statistics.median(hosts) * 1e6,
                    }
                    # The same batch as one CUDA graph (capture runs on a side stream of its own).
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        for _ in range(iters):
                            fn()
                    graph.replay()
                    torch.cuda.synchronize()
                    gs = []
                    for _ in range(10):
                        s = torch.cuda.Event(enable_timing=True)
                        e = torch.cuda.Event(enable_timing=True)
                        s.record()
                        graph.replay()
                        e.record()
                        torch.cuda.synchronize()
                        gs.append(s.elapsed_time(e) / iters * 1e3)
                    row["graph_us"] = statistics.median(gs)
                    del graph
                    dist.barrier()
                    if rank == 0:
                        print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
