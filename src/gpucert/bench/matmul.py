"""Matmul throughput per GPU: fixed seed sizes per dtype and a bounded max-achievable (MAMF) shape sweep.

Every GPU runs at once (one process each), as in production, so power and cooling limits show. Inputs are
normal random numbers (predictable data draws less power and flatters the result), buffers rotate so no
shape is served from L2, and the GPU is kept busy for `warmup_s` first: a cold H100 reports clocks it
cannot sustain (ml-engineering#59). TFLOP/s = 2*M*N*K / median time.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import torch

from gpucert.bench.timing import time_repeats
from gpucert.config.profiles import Profile
from gpucert.config.run import MatmulBenchConfig
from gpucert.report.numbers import sig
from gpucert.report.schema import Result
from gpucert.runtime.group import Runtime, gather_to_main, rank_row
from gpucert.runtime.identity import row_identity
from gpucert.status import Status

# Dense tensor-core peak of a dtype relative to the profile's BF16 peak (Hopper datasheet ratios).
PEAK_RATIO = {"bf16": 1.0, "fp16": 1.0, "tf32": 0.5, "fp8": 2.0, "fp32": None}
# Rotate through enough buffers that the working set is > 3x a 60 MB L2.
L2_FLUSH_BYTES = 192 << 20
# MAMF-style sweep: dimensions that are multiples of 256 around the shapes that peak on Hopper
# (stas00/ml-engineering mamf-finder: best H100 shape 2048x2048x13312).
SWEEP_DIMS = (1024, 2048, 3072, 4096, 6144, 8192, 12288, 13312, 16384)
SWEEP_REPEATS = 10
# Fixed sizes below this are too short to fill an H100 (launch and tail effects dominate): no share-of-peak floor.
PEAK_SHARE_MIN_SIZE = 4096


def _dtype_support(dtype: str, device: torch.device) -> str | None:
    """None when this device can run dtype, else why not."""
    if device.type != "cuda":
        return None if dtype == "fp32" else f"{dtype} matmul is a GPU measurement (CPU runs fp32)"
    major, minor = torch.cuda.get_device_capability(device)
    if dtype == "fp8" and (major, minor) < (8, 9):
        return f"fp8 needs compute capability 8.9+, this GPU is {major}.{minor}"
    if dtype == "fp8" and not hasattr(torch, "_scaled_mm"):
        return "this torch has no _scaled_mm for fp8"
    return None


def operand_count(dtype: str, m: int, n: int, k: int) -> int:
    """How many operand pairs to rotate through so their working set is bigger than L2."""
    element = 1 if dtype == "fp8" else 2 if dtype in ("bf16", "fp16") else 4
    return max(2, min(8, -(-L2_FLUSH_BYTES // ((m * k + n * k) * element))))


def make_operands(dtype: str, m: int, n: int, k: int, device: torch.device, count: int) -> list[tuple[Any, ...]]:
    """count (A, B) pairs of N(0,1) numbers, the same on every GPU (one seed): identical inputs, identical bits."""
    gen = torch.Generator(device=device).manual_seed(1234)
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    operands: list[tuple[Any, ...]] = []
    for _ in range(count):
        a = torch.randn(m, k, device=device, generator=gen, dtype=torch.float32)
        b = torch.randn(n, k, device=device, generator=gen, dtype=torch.float32)
        if dtype == "fp8":
            # _scaled_mm wants A row-major and B column-major; unit scales keep N(0,1) data in e4m3 range.
            scale = torch.ones((), device=device)
            operands.append((a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t(), scale, scale))
        else:
            operands.append((a.to(torch_dtype), b.to(torch_dtype).t()))
    return operands


def matmul_fn(dtype: str, operands: list[tuple[Any, ...]]) -> Callable[[int], Any]:
    """fn(i) multiplies operand pair i (mod their count) and returns the product."""
    if dtype == "fp8":

        def fp8(i: int) -> Any:
            a, b, sa, sb = operands[i % len(operands)]
            return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

        return fp8

    def mm(i: int) -> Any:
        a, b = operands[i % len(operands)]
        return a @ b

    return mm


@contextlib.contextmanager
def float32_math(dtype: str) -> Iterator[None]:
    """fp32 matmuls run as TF32 only when "tf32" was asked for: an "fp32" row is true fp32 (before method 2 every
    fp32 row ran as TF32). The flag is torch's global, so the previous setting comes back afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def time_matmul(dtype: str, m: int, n: int, k: int, device: torch.device, warmup: int, repeats: int) -> dict:
    operands = make_operands(dtype, m, n, k, device, operand_count(dtype, m, n, k))
    with float32_math(dtype):
        timing = time_repeats(matmul_fn(dtype, operands), device, warmup, repeats)
    del operands
    return {
        "dtype": dtype,
        "m": m,
        "n": n,
        "k": k,
        "tflops": 2 * m * n * k / timing.median_s / 1e12,
        "timing": timing.summary(),
    }


def _keep_busy(device: torch.device, seconds: float) -> None:
    if seconds <= 0:
        return
    size = 8192 if device.type == "cuda" else 256
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a @ a
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def sweep_max(device: torch.device, budget_s: float, dtype: str) -> dict | None:
    """Best TFLOP/s over shapes tried within budget_s, in a seeded order so reruns try the same shapes."""
    if budget_s <= 0:
        return None
    dims = SWEEP_DIMS if device.type == "cuda" else (64, 128, 256)
    shapes = list(itertools.product(dims, repeat=3))
    random.Random(0).shuffle(shapes)
    end = time.monotonic() + budget_s
    tried = []
    for m, n, k in shapes:
        if time.monotonic() > end:
            break
        point = time_matmul(dtype, m, n, k, device, warmup=3, repeats=SWEEP_REPEATS)
        tried.append({"m": m, "n": n, "k": k, "tflops": point["tflops"]})
    if not tried:
        return None
    best = max(tried, key=lambda p: p["tflops"])
    return {"dtype": dtype, "best": best, "shapes_tried": len(tried), "of": len(shapes), "sweep": tried}


def measure(env: Runtime, cfg: dict[str, Any]) -> dict[str, Any] | None:
    config = MatmulBenchConfig(**cfg)
    device = env.device
    _keep_busy(device, config.warmup_s)
    points, skipped = [], {}
    for dtype in config.dtypes:
        why = _dtype_support(dtype, device)
        if why:
            skipped[dtype] = why
            continue
        for size in config.sizes:
            points.append(time_matmul(dtype, size, size, size, device, warmup=5, repeats=config.repeats))
    sweep_dtype = "bf16" if device.type == "cuda" else "fp32"
    sweep = sweep_max(device, config.sweep_budget_s, sweep_dtype)
    mine = {
        **rank_row(env),
        "points": points,
        "skipped": skipped,
        "sweep": sweep,
    }
    ranks = gather_to_main(env, mine)
    return None if ranks is None else {"ranks": ranks, "config": asdict(config)}


def _peak(profile: Profile, dtype: str) -> float | None:
    ratio = PEAK_RATIO.get(dtype)
    return None if ratio is None or profile.bf16_peak_tflops is None else ratio * profile.bf16_peak_tflops


def judge(data: dict[str, Any], profile: Profile, cfg: MatmulBenchConfig) -> list[Result]:
    floors = profile.benchmarks
    results: list[Result] = []
    # A GPU's max-achievable is its best figure anywhere: the sweep's best shape or a seed size that beat it.
    best_by_rank: dict[int, dict[str, Any]] = {}
    for rank in data["ranks"]:
        sweep = rank["sweep"]
        candidates = [
            {k: p[k] for k in ("m", "n", "k", "tflops")}
            for p in rank["points"]
            if sweep and p["dtype"] == sweep["dtype"]
        ]
        if sweep:
            candidates.append(sweep["best"])
        if candidates:
            # Keyed by global rank: under srun every node has a local rank 0.
            best_by_rank[rank["rank"]] = max(candidates, key=lambda c: c["tflops"])
    # Node medians are per node: GPUs of another node are judged against the cluster in report/cluster.py. A
    # median of one GPU is that GPU: it judges nothing, so it is left out.
    node_of = {rank["rank"]: row_identity(rank)[2] for rank in data["ranks"]}
    best_by_node: dict[str | None, list[float]] = {}
    for r, c in best_by_rank.items():
        best_by_node.setdefault(node_of[r], []).append(c["tflops"])
    medians = _medians_of_many(best_by_node)
    by_point: dict[tuple[str | None, str, int], list[float]] = {}
    for rank in data["ranks"]:
        for p in rank["points"]:
            by_point.setdefault((node_of[rank["rank"]], p["dtype"], p["m"]), []).append(p["tflops"])
    point_medians = _medians_of_many(by_point)
    for rank in data["ranks"]:
        subject, gpu, node = row_identity(rank)
        for p in rank["points"]:
            node_median = point_medians.get((node, p["dtype"], p["m"]))
            results.append(_judge_point(p, subject, gpu, node, profile, node_median))
        for dtype, why in rank["skipped"].items():
            results.append(
                Result(
                    name=f"matmul.{dtype}",
                    subject=subject,
                    status=Status.SKIP,
                    category="benchmark",
                    gpu_index=gpu,
                    node=node,
                    message=why,
                )
            )
        sweep = rank["sweep"]
        if sweep:
            best = best_by_rank[rank["rank"]]
            results.append(_judge_max(best, sweep, subject, gpu, node, profile, medians.get(node)))
        elif floors.matmul_bf16_tflops_min is not None:
            # Turned off by the config (localize's pair jobs, which time one size only): SKIP, naming the key.
            # Asked for and not run: ERROR, never a pass.
            off = cfg.sweep_budget_s == 0
            results.append(
                Result(
                    name="matmul.bf16.max",
                    subject=subject,
                    status=Status.SKIP if off else Status.ERROR,
                    category="benchmark",
                    gpu_index=gpu,
                    node=node,
                    message=(
                        "not run: bench.matmul.sweep_budget_s is 0"
                        if off
                        else "the max-achievable sweep did not run (bench.matmul.sweep_budget_s "
                        f"{cfg.sweep_budget_s:g})"
                    )
                    + f", so the {floors.matmul_bf16_tflops_min:g} TFLOP/s floor was not checked",
                )
            )
    return results


def _medians_of_many(values: dict[Any, list[float]]) -> dict[Any, float]:
    """The median of each key's values where there are 2 or more (one GPU's median is itself: it judges nothing)."""
    return {key: statistics.median(v) for key, v in values.items() if len(v) >= 2}


def _hold_to_node_median(
    tflops: float,
    node_median: float,
    profile: Profile,
    subject: str,
    where: str,
    expected: list[str],
    sources: list[str],
    problems: list[str],
) -> None:
    """gpu-fryer's rule, shared by the fixed sizes and the max: a GPU more than matmul_node_deviation_pct below
    its node's median FAILs. Appends what it held the figure to, and the problem if there is one."""
    pct = profile.benchmarks.matmul_node_deviation_pct
    assert pct is not None
    expected.append(f"within {pct:g} % of node median {sig(node_median)}")
    sources.append(f"profile {profile.name}: benchmarks.matmul_node_deviation_pct")
    if tflops < node_median * (1 - pct / 100):
        problems.append(
            f"{subject} is {sig(100 * (1 - tflops / node_median))} % below the node median {sig(node_median)} "
            f"TFLOP/s{where}"
        )


def _verdict(problems: list[str], expected: list[str], measured: str, unjudged: str) -> tuple[Status, str]:
    """FAIL naming the problems, PASS when something held the figure, else INFO saying why nothing did."""
    if problems:
        return Status.FAIL, "; ".join(problems)
    if expected:
        return Status.PASS, measured
    return Status.INFO, f"{measured}; not judged: {unjudged}"


def _judge_point(
    p: dict[str, Any], subject: str, gpu: int | None, node: str | None, profile: Profile, node_median: float | None
) -> Result:
    """A fixed-size point against its node's median of the same dtype and size and, from 4096 up, a share of
    the dtype's peak where the profile sets one; INFO, saying why, when neither applies."""
    floors = profile.benchmarks
    dtype, size, tflops = p["dtype"], p["m"], p["tflops"]
    peak = _peak(profile, dtype)
    share = f", {sig(100 * tflops / peak)} % of the {peak:g} TFLOP/s peak" if peak else ""
    measured = f"{size}^3 {dtype}: {sig(tflops)} TFLOP/s{share} (cv {sig(p['timing']['cv'])})"
    problems, expected, sources, unjudged = [], [], [], []
    share_min = floors.matmul_peak_share_min.get(dtype)
    if share_min is None or peak is None:
        unjudged.append(f"profile {profile.name} sets no matmul_peak_share_min for {dtype}")
    elif size < PEAK_SHARE_MIN_SIZE:
        unjudged.append(f"{size}^3 is below {PEAK_SHARE_MIN_SIZE}^3, too small to be held to a share of the peak")
    else:
        floor = share_min * peak
        expected.append(f">= {sig(floor)} ({100 * share_min:g} % of the {peak:g} peak)")
        sources.append(f"profile {profile.name}: benchmarks.matmul_peak_share_min.{dtype}")
        if tflops < floor:
            problems.append(
                f"expected >= {sig(floor)} TFLOP/s ({100 * share_min:g} % of the {peak:g} peak) at {size}^3 {dtype}, "
                f"found {sig(tflops)} on {subject}"
            )
    if floors.matmul_node_deviation_pct is None:
        unjudged.append(f"profile {profile.name} turns the node rule off (matmul_node_deviation_pct: null)")
    elif node_median is None:
        unjudged.append(f"no other GPU of {node or 'this node'} to compare with")
    else:
        where = f" at {size}^3 {dtype}"
        _hold_to_node_median(tflops, node_median, profile, subject, where, expected, sources, problems)
    status, message = _verdict(problems, expected, measured, "; ".join(unjudged))
    return Result(
        name=f"matmul.{dtype}.{size}",
        subject=subject,
        status=status,
        category="benchmark",
        value=tflops,
        unit="TFLOP/s",
        gpu_index=gpu,
        node=node,
        expected="; ".join(expected) or None,
        threshold_source="; ".join(sources) or None,
        message=message,
        remediation="check clocks, power and other processes on this GPU; reseat or RMA a GPU slower than its peers"
        if problems
        else None,
        details=p,
    )


def _judge_max(
    best: dict,
    sweep: dict,
    subject: str,
    gpu: int | None,
    node: str | None,
    profile: Profile,
    node_median: float | None,
) -> Result:
    floors = profile.benchmarks
    floor = floors.matmul_bf16_tflops_min if sweep["dtype"] == "bf16" else None
    shape = f"{best['m']}x{best['n']}x{best['k']}"
    problems, sources, expected = [], [], []
    if floor is not None:
        expected.append(f">= {floor:g}")
        sources.append(f"profile {profile.name}: benchmarks.matmul_bf16_tflops_min")
        if best["tflops"] < floor:
            problems.append(f"expected >= {floor:g} TFLOP/s, found {sig(best['tflops'])} on {subject}")
    if node_median and floors.matmul_node_deviation_pct is not None:
        _hold_to_node_median(best["tflops"], node_median, profile, subject, "", expected, sources, problems)
    measured = (
        f"max achievable {sig(best['tflops'])} TFLOP/s at {shape} "
        f"({sweep['shapes_tried']} of {sweep['of']} sweep shapes tried, seed sizes included)"
    )
    # Unjudged: no floor for this dtype and no peer on the node (or the rule off, as on CPU); report/cluster.py
    # still holds it to the other nodes' GPUs.
    status, message = _verdict(
        problems,
        expected,
        measured,
        f"no floor for {sweep['dtype']} in profile "
        + (
            f"{profile.name} and no other GPU on {node or 'this node'} to compare with"
            if floors.matmul_node_deviation_pct is not None
            else f"{profile.name}, which turns the node rule off (matmul_node_deviation_pct: null)"
        ),
    )
    return Result(
        name=f"matmul.{sweep['dtype']}.max",
        subject=subject,
        status=status,
        category="benchmark",
        value=best["tflops"],
        unit="TFLOP/s",
        gpu_index=gpu,
        node=node,
        expected="; ".join(expected) or None,
        threshold_source="; ".join(sources) or None,
        message=message,
        remediation="check clocks and power in the telemetry; reseat or RMA a GPU slower than its peers"
        if problems
        else None,
        details=sweep,
    )
