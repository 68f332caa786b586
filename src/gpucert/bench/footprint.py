"""What each benchmark holds in memory at once, checked against what the node has before any worker starts.

A 1 TiB collective once ran 230 s into the host's OOM killer, and a buffer larger than a GPU's free memory
failed only inside a worker. `footprints` says, per benchmark, which config key sets a size and how many bytes
one rank then holds at once on its GPU and in host memory; `fit_problems` (pure) compares them with the node's
MemAvailable and each GPU's free memory and names the key, the size and what is there.

The figures are lower bounds: the benchmark's own buffers, not the CUDA context, NCCL's buffers or the
allocator's slack. A size refused here can never run; one let through may still fail in a worker, which then
names its exception. The train proxy is not counted: its memory follows the model, not a size key.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpucert.config.run import BenchConfig

GIB = 1 << 30
MIB = 1 << 20
# Bytes per element of each matmul dtype's operands, and of its output (fp8's _scaled_mm writes bf16).
MATMUL_BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4, "fp8": 1}
MATMUL_OUT_BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4, "fp8": 2}
# Collectives with a separate output buffer as large as the input (all_gather and reduce_scatter hold one
# buffer of the message size and one of 1/n of it; all_reduce and broadcast work in place).
TWO_BUFFER_OPS = ("all_to_all", "send_recv")


@dataclass(frozen=True)
class Footprint:
    key: str  # the config key that sets the size, e.g. bench.memory.size_mib
    value: int  # its value, in the key's unit
    what: str  # the buffers, in words
    gpu_bytes: int  # held at once on each GPU the benchmark uses
    host_bytes: int  # held at once in host memory by each rank of the node
    every_gpu: bool = False  # one process fills every GPU of the node (p2p), whatever the rank count


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def footprints(name: str, bench: BenchConfig, on_gpu: bool) -> list[Footprint]:
    """The sized buffers of one benchmark on this node: on a GPU node device buffers are GPU memory, on a CPU
    run (gloo) everything is host memory. A benchmark without a size key has none."""

    def held(key: str, value: int, what: str, device: int, pinned: int = 0) -> Footprint:
        return Footprint(key, value, what, device if on_gpu else 0, pinned if on_gpu else device + pinned)

    if name == "memory":
        size, pcie = bench.memory.size_mib * MIB, bench.memory.pcie_size_mib * MIB
        found = [
            held("bench.memory.size_mib", bench.memory.size_mib, f"STREAM's a, b and c (3 x {gib(size)})", 3 * size)
        ]
        if on_gpu:  # the PCIe rows run on GPUs only
            what = f"a pinned host buffer and its device copy ({gib(pcie)} each)"
            found.append(held("bench.memory.pcie_size_mib", bench.memory.pcie_size_mib, what, pcie, pcie))
        return found
    if name == "collectives":
        coll = bench.collectives
        two = [op for op in coll.ops if op in TWO_BUFFER_OPS]
        buffers = 2 if two else 1
        what = (
            f"{two[0]}'s input and output ({gib(coll.max_bytes)} each)" if two else f"a {gib(coll.max_bytes)} message"
        )
        return [held("bench.collectives.max_bytes", coll.max_bytes, what, buffers * coll.max_bytes)]
    if name == "p2p":
        if not on_gpu:
            return []  # not applicable without GPUs
        size = bench.p2p.size_mib * MIB
        what = f"a source and a target ({gib(size)} each)"
        return [Footprint("bench.p2p.size_mib", bench.p2p.size_mib, what, 2 * size, 0, every_gpu=True)]
    if name == "matmul":
        return _matmuls("bench.matmul.sizes", max(bench.matmul.sizes), bench.matmul.dtypes, on_gpu)
    if name == "burn":
        return _matmuls("bench.burn.size", bench.burn.size, [bench.burn.dtype], on_gpu)
    return []


def _matmuls(key: str, n: int, dtypes: list[str], on_gpu: bool) -> list[Footprint]:
    """Square n x n matmuls: at least two rotating (A, B) pairs and the output C, in the widest dtype run."""
    run = [d for d in dtypes if on_gpu or d == "fp32"]  # a CPU rank runs fp32 only
    if not run:
        return []
    dtype = max(run, key=lambda d: 4 * MATMUL_BYTES[d] + MATMUL_OUT_BYTES[d])
    total = (4 * MATMUL_BYTES[dtype] + MATMUL_OUT_BYTES[dtype]) * n * n
    what = f"two {dtype} (A, B) pairs and C of {n}x{n}"
    return [Footprint(key, n, what, total if on_gpu else 0, 0 if on_gpu else total)]


def fit_problems(needs: list[Footprint], nproc: int, host_available: int | None, gpu_free: dict[int, int]) -> list[str]:
    """Each size the node cannot hold, naming the key, the bytes it asks for and what is available.

    host_available: MemAvailable in bytes (None: unknown, not judged). gpu_free: free bytes by NVML index
    (empty: no GPU or unknown). nproc ranks run on this node at once, each on its own GPU."""
    problems = []
    for need in needs:
        setting = f"{need.key}={need.value}"
        if need.host_bytes and host_available is not None and need.host_bytes * nproc > host_available:
            ranks = f"{nproc} ranks hold {nproc} x " if nproc > 1 else "one rank holds "
            problems.append(
                f"{setting}: {ranks}{need.what} = {gib(need.host_bytes * nproc)} of host memory; this node has "
                f"{gib(host_available)} available (MemAvailable): lower {need.key}"
                + (" or run fewer processes (--nproc)" if nproc > 1 else "")
            )
        if need.gpu_bytes and gpu_free:
            wanted = len(gpu_free) if need.every_gpu else min(nproc, len(gpu_free))
            short = {i: free for i, free in gpu_free.items() if free < need.gpu_bytes}
            if len(gpu_free) - len(short) < wanted:
                where = ", ".join(f"GPU {i} has {gib(free)} free" for i, free in sorted(short.items()))
                problems.append(
                    f"{setting}: each GPU holds {need.what} = {gib(need.gpu_bytes)}; {where}: lower {need.key}, "
                    "or free what other processes hold there (nvidia-smi lists them)"
                )
    return problems
