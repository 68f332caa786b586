"""GPU-to-GPU copy bandwidth for every ordered pair: the matrix that names a weak NVLink.

Each node's local rank 0 measures with every GPU it sees (torchrun leaves CUDA_VISIBLE_DEVICES alone, so that is
the whole node); the other ranks wait on the host (group.host_barrier), with nothing running on their GPUs: a
spinning NCCL collective there cut the copies into those GPUs by 40 % on 4 H200s (5.5 % on 2). For each ordered
pair (src, dst) it copies size_mib of random bytes with `dst.copy_(src)` (a copy-engine peer copy when peer access
is on, as nvbandwidth's CE tests do), timed with CUDA events on the source GPU's stream, and checks the last copy
byte for byte.

Reading the output: `matrix_gbps[src][dst]` is a unidirectional copy rate in GB/s (1e9 B/s, bytes copied, not
read + write); NVLink 4 reads 371-377 (NVIDIA/nccl#1264). A pair well below the others names the link; a GPU
slow in its whole row and column is the GPU itself. GPU numbers are CUDA indices; `uuids` maps them.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import torch

from gpucert.bench.timing import time_repeats
from gpucert.config.profiles import Profile
from gpucert.config.run import P2pBenchConfig
from gpucert.report.schema import Result
from gpucert.runtime.group import Runtime, gather_to_main, host_barrier
from gpucert.status import Status

# Bytes compared at once when checking a copy (bounds the temporary buffers on the source GPU).
_CHECK_CHUNK_BYTES = 256 << 20


def measure(env: Runtime, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """Each node's local rank 0 measures its node's matrix (p2p never crosses nodes); rank 0 gets them all."""
    data = None
    if env.local_rank == 0:
        if env.device.type != "cuda":
            data = {"applicable": False, "reason": "no GPUs"}
        elif env.local_world_size > 1 and torch.cuda.device_count() < env.local_world_size:
            data = {
                "applicable": False,
                "reason": f"each rank sees {torch.cuda.device_count()} GPU(s) (srun --gpus-per-task?): p2p needs "
                "a process that sees every GPU of the node; run one task per node",
            }
        else:
            data = measure_matrix(cfg["size_mib"] << 20, cfg["warmup"], cfg["repeats"])
        data["node"] = env.me.node
    # The gather below is a collective: its kernels start once every copy is done.
    host_barrier(env, "after the p2p matrix")
    nodes = gather_to_main(env, data)
    return None if nodes is None else {"nodes": [d for d in nodes if d is not None]}


def measure_matrix(size_bytes: int, warmup: int, repeats: int) -> dict[str, Any]:
    """Copy rate, repeat spread and wrong bytes of every ordered pair of the visible GPUs."""
    n = torch.cuda.device_count()
    devices = [torch.device("cuda", i) for i in range(n)]
    sources = [torch.randint(0, 256, (size_bytes,), dtype=torch.uint8, device=d) for d in devices]
    targets = [torch.empty(size_bytes, dtype=torch.uint8, device=d) for d in devices]
    matrix: list[list[float | None]] = [[None] * n for _ in range(n)]
    cv: list[list[float | None]] = [[None] * n for _ in range(n)]
    wrong: list[list[int | None]] = [[None] * n for _ in range(n)]
    peer = [[i != j and torch.cuda.can_device_access_peer(i, j) for j in range(n)] for i in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            src, dst = sources[i], targets[j]
            dst.zero_()

            def copy(_k: int, src: torch.Tensor = src, dst: torch.Tensor = dst) -> None:
                dst.copy_(src, non_blocking=True)

            # The copy runs on the source GPU's current stream; the events must be recorded there too.
            with torch.cuda.device(devices[i]):
                timing = time_repeats(copy, devices[i], warmup, repeats)
                wrong[i][j] = _count_wrong_bytes(src, dst)
            matrix[i][j] = size_bytes / timing.median_s / 1e9
            cv[i][j] = timing.cv
    return {
        "applicable": True,
        "gpus": n,
        "size_bytes": size_bytes,
        "matrix_gbps": matrix,
        "cv": cv,
        "wrong": wrong,
        "peer_access": peer,
        "uuids": [f"GPU-{torch.cuda.get_device_properties(i).uuid}" for i in range(n)],
        "warmup": warmup,
        "repeats": repeats,
    }


def _count_wrong_bytes(src: torch.Tensor, dst: torch.Tensor) -> int:
    wrong = 0
    for start in range(0, src.numel(), _CHECK_CHUNK_BYTES):
        stop = start + _CHECK_CHUNK_BYTES
        wrong += int((dst[start:stop].to(src.device) != src[start:stop]).sum().item())
    return wrong


def judge(data: dict[str, Any], profile: Profile, cfg: P2pBenchConfig) -> list[Result]:
    """Per node: `p2p.matrix`, and one FAIL `p2p.pair` per ordered pair that is slow or copied wrongly."""
    del cfg  # the size is in the data; nothing else of the config is judged
    if "nodes" not in data:  # one node's matrix, as before node identity
        return judge_node(data, profile)
    return [
        dataclasses.replace(
            r, node=node["node"], subject=node["node"] if r.subject == "node" else f"{node['node']} {r.subject}"
        )
        for node in data["nodes"]
        for r in judge_node(node, profile)
    ]


def judge_node(data: dict[str, Any], profile: Profile) -> list[Result]:
    base: dict[str, Any] = dict(name="p2p.matrix", unit="GB/s", category="benchmark")
    if not data.get("applicable", False):
        reason = data.get("reason", "not applicable")
        return [Result(**base, subject="node", status=Status.SKIP, message=f"p2p not measured: {reason}")]
    n = data["gpus"]
    matrix = data["matrix_gbps"]
    subject = f"{n} GPUs"
    details = {"matrix_gbps": matrix, "size_bytes": data["size_bytes"], **{k: data[k] for k in _DETAIL_KEYS}}
    if n < 2:
        return [Result(**base, subject=subject, status=Status.SKIP, message="one GPU: no peer to copy to")]
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    median = statistics.median(matrix[i][j] for i, j in pairs)
    floor = profile.benchmarks.p2p_gbps_min
    deviation_pct = profile.benchmarks.p2p_pair_deviation_pct
    limit = median * (1 - deviation_pct / 100)
    expected = f">= {limit:.1f} GB/s per pair ({deviation_pct:g} % below the median {median:.1f})"
    sources = [f"profile {profile.name}: benchmarks.p2p_pair_deviation_pct"]
    if floor is not None:
        expected = f">= {floor:g} GB/s per pair and {expected}"
        sources.insert(0, f"profile {profile.name}: benchmarks.p2p_gbps_min")
    threshold_source = "; ".join(sources)
    failing = [
        _judge_pair(data, i, j, floor, limit, median, deviation_pct, expected, threshold_source) for i, j in pairs
    ]
    failed = [r for r in failing if r is not None]
    lowest = min(matrix[i][j] for i, j in pairs)
    if failed:
        named = ", ".join(f"{r.subject} {r.value:.1f} GB/s" for r in failed[:5]) + (", ..." if len(failed) > 5 else "")
        message = f"expected {expected}, found {len(failed)} of {len(pairs)} pairs short: {named}, on {subject}"
    else:
        message = f"lowest pair {lowest:.1f} GB/s, median {median:.1f} GB/s over {len(pairs)} pairs"
        if floor is None:
            message += f"; no floor set in profile {profile.name} (benchmarks.p2p_gbps_min)"
    summary = Result(
        **base,
        subject=subject,
        status=Status.FAIL if failed else Status.PASS,
        value=lowest,
        expected=expected,
        threshold_source=threshold_source,
        details=details,
        message=message,
        remediation=_REMEDIATION if failed else None,
    )
    return [summary, *failed]


_DETAIL_KEYS = ("cv", "wrong", "peer_access", "uuids")
_REMEDIATION = (
    "a single slow pair names a link: check `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e` on both GPUs and "
    "`nvidia-smi topo -m`; a GPU slow in its whole row and column is the GPU itself (clocks, degraded NVLink or "
    "PCIe): reset it, rerun, then RMA; wrong bytes are data corruption: drain the node"
)


def _judge_pair(
    data: dict[str, Any],
    i: int,
    j: int,
    floor: float | None,
    limit: float,
    median: float,
    deviation_pct: float,
    expected: str,
    threshold_source: str,
) -> Result | None:
    """A FAIL for the pair src -> dst, or None when it is within the floor and the deviation."""
    gbps = data["matrix_gbps"][i][j]
    wrong = data["wrong"][i][j] or 0
    found = []
    if wrong:
        found.append(f"{wrong} wrong bytes of {data['size_bytes']}")
    if floor is not None and gbps < floor:
        found.append(f"{gbps:.1f} GB/s, below the floor {floor:g}")
    if gbps < limit:
        found.append(f"{gbps:.1f} GB/s, {100 * (1 - gbps / median):.0f} % below the median {median:.1f}")
    if not found:
        return None
    if not data["peer_access"][i][j]:
        found.append("no peer access (the copy goes through host memory)")
    pair = f"GPU {i} -> GPU {j}"
    return Result(
        name="p2p.pair",
        subject=pair,
        status=Status.FAIL,
        value=gbps,
        unit="GB/s",
        expected=expected if not wrong else f"0 wrong bytes; {expected}",
        threshold_source=threshold_source,
        message=f"expected {expected} and an exact copy, found {'; '.join(found)}, on {pair}",
        remediation=_REMEDIATION,
        category="benchmark",
        details={
            "src": i,
            "dst": j,
            "gbps": gbps,
            "median_gbps": median,
            "floor_gbps": floor,
            "deviation_pct": deviation_pct,
            "wrong": wrong,
            "uuids": [data["uuids"][i], data["uuids"][j]],
        },
    )
