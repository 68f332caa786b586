"""`gpucert.finetune.train` with knobs for speed work on the lent GPU (issue 13), without touching the loop.

    PROFILE_STEP=8 PROFILE_OUT=$OUT/prof.txt SDPA_BACKEND=cudnn \
      torchrun --standalone --nproc-per-node=1 tools/profile_finetune.py CONFIG --set ...

PROFILE_STEP: profile that step (counted in this process) with torch.profiler and write the kernels sorted by
device time, plus their share per kind (GEMM, attention, elementwise/fused, NCCL, other), to PROFILE_OUT; then
where the GPU sat idle inside the step: the step's wall time against the union of its kernels, each idle gap of
more than GAP_US (default 50) microseconds named by the host code that launched the kernel after it (the
innermost gpucert/transformers/peft frame and torch op), summed by that name, and the host's synchronisations.
SDPA_BACKEND (flash | efficient | cudnn | math): leave only that SDPA backend enabled, to measure one
attention kernel against another on the same step. READ_AHEAD=0: every step reads its rows at its start, with
the GPU idle, as the trainer did before it read them ahead (to measure that lever in one call). PROFILE_STACK=0:
profile without Python stacks. PROFILE_SHAPES=1: record the ops' input shapes and add a table of each matmul
shape's device time and TFLOP/s. TORCHINDUCTOR_CUDAGRAPHS=1 (inductor's own switch for CUDA graphs over the
compiled layers): each step is first marked as a new iteration of inductor's cudagraph trees, which they need to
know when last step's graph outputs may be overwritten. GC=off: Python's cyclic garbage collector disabled for
the run (to measure what its pauses cost a step); GC_STATS=1: each step's collections (count and milliseconds by
generation) printed after it. HOST_LAYOUT=0: the step as before round eight (docs/OPTIMIZATION.md), to measure
that lever in one call: each micro-batch's row layout read back from the GPU where it is needed (the fused
loss's supervised positions after the forward, flash attention's documents before it), and the adapters in the
frozen GEMMs copied by the forward's pre-hook at every forward, not right after the optimizer step.
LOSS_KERNEL=compiled: the fused loss's chunks run the compiled function, not the Triton kernel (round nine; FP8's head too).
LOSS_CHUNK=2048: the fused loss's chunk in tokens (1,024 in gpucert). ACT_BUDGET=0.9: torch's
activation_memory_budget for the compiled layers' partitioner (1.0, its default, in gpucert); below 1 it recomputes
cheap activations in the backward instead of keeping them (SwiGLU's output, 12 GiB at micro-batch 3 of the 7B).
All are read here, never by gpucert itself.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gpucert.finetune.model.lora as model_module
import gpucert.finetune.model.loss as loss_module
import gpucert.finetune.train.loop as loop_module
import gpucert.finetune.train.run as run_module
import gpucert.finetune.train.step as step_module
from gpucert.finetune.data.packing import RowLayout

KINDS = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn.*(sdp|mha)|flex", re.I)),
    ("gemm", re.compile(r"gemm|sm90_xmma|cutlass|nvjet|matmul|_mm_|cublas", re.I)),
    ("nccl", re.compile(r"nccl", re.I)),
    ("triton (compiled elementwise, norms, loss)", re.compile(r"triton", re.I)),
    ("optimizer", re.compile(r"multi_tensor|adam", re.I)),
)


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def write_profile(prof: Any, path: Path) -> None:
    events = [e for e in prof.key_averages() if e.device_time_total > 0 and e.device_type.name == "CUDA"]
    total = sum(e.device_time_total for e in events) or 1.0
    by_kind: dict[str, float] = defaultdict(float)
    for e in events:
        by_kind[kind_of(e.key)] += e.device_time_total
    lines = [f"device time in kernels: {total / 1e3:.1f} ms", ""]
    for kind, t in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"{kind:45s} {t / 1e3:9.1f} ms {100 * t / total:5.1f} %")
    lines += ["", f"{'ms':>9} {'%':>5} {'calls':>6}  kernel"]
    for e in sorted(events, key=lambda e: -e.device_time_total)[:60]:
        share = 100 * e.device_time_total / total
        lines.append(f"{e.device_time_total / 1e3:9.2f} {share:5.1f} {e.count:6d}  {e.key[:160]}")
    if os.environ.get("PROFILE_SHAPES") == "1":
        lines += ["", *gemm_shapes(prof)]
    path.write_text("\n".join(lines) + "\n")


MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_mm"}


def gemm_shapes(prof: Any) -> list[str]:
    """Each matmul op by its input shapes: device time, calls and the TFLOP/s it reached (2 M N K per call)."""
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key not in MATMULS or e.device_time_total <= 0:
            continue
        shapes = [s for s in e.input_shapes if s]
        a, b = shapes[1:3] if e.key == "aten::addmm" else shapes[:2]  # addmm: (bias, mat1, mat2[, out])
        flops = 2.0 * a[-2] * a[-1] * b[-1] * (a[0] if e.key == "aten::bmm" else 1) * e.count
        rows.append((e.device_time_total, e.key, e.count, shapes, flops / (e.device_time_total * 1e-6) / 1e12))
    lines = [f"{'ms':>9} {'calls':>6} {'TFLOP/s':>8}  op, input shapes (by device time)"]
    for t, key, n, shapes, tflops in sorted(rows, key=lambda r: -r[0]):
        lines.append(f"{t / 1e3:9.2f} {n:6d} {tflops:8.0f}  {key} {shapes}")
    return lines


BUSY_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
# Calls that make the host wait for the GPU (cudaStreamWaitEvent makes a stream wait, not the host).
SYNC_CALLS = re.compile(r"Synchronize|cudaMemcpy(?!.*Async)", re.I)
OUR_FRAMES = re.compile(r"gpucert|transformers|peft|torch/(nn|optim|autograd)/")
STEP_MARK = "gpucert.train_step"


def _intervals_union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


class _HostEvents:
    """One thread's host events (sorted by start), searchable for those that contain a time."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.start = np.array([e["ts"] for e in events], dtype=np.float64)
        self.end = self.start + np.array([e.get("dur", 0) for e in events], dtype=np.float64)

    def enclosing(self, ts: float) -> list[dict[str, Any]]:
        """Outermost first (sorted by start)."""
        return [self.events[i] for i in np.nonzero((self.start <= ts) & (self.end >= ts))[0]]


def _our_frame(stack: list[dict[str, Any]]) -> str:
    """The innermost gpucert/transformers/peft/torch.nn frame of a host stack, without its site-packages prefix."""
    ours = [e["name"] for e in stack if e.get("cat") == "python_function" and OUR_FRAMES.search(e["name"])]
    return re.sub(r"^.*/site-packages/", "", ours[-1]) if ours else "?"


def idle_report(trace_path: Path, gap_us: float) -> list[str]:
    """Where the GPU sat idle inside the profiled step (module docstring), from the profiler's chrome trace."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    mark = next((e for e in events if e.get("name") == STEP_MARK and e.get("cat") == "user_annotation"), None)
    if mark is None:
        return ["idle: no step annotation in the trace"]
    t0, t1 = mark["ts"], mark["ts"] + mark["dur"]
    gpu = sorted(
        (e for e in events if e.get("cat") in BUSY_CATEGORIES and t0 <= e["ts"] <= t1 and "dur" in e),
        key=lambda e: e["ts"],
    )
    host = sorted(
        (e for e in events if e.get("cat") in ("cpu_op", "python_function", "user_annotation") and "dur" in e),
        key=lambda e: e["ts"],
    )
    grouped: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in host:
        grouped[e.get("tid")].append(e)
    by_tid = {tid: _HostEvents(evs) for tid, evs in grouped.items()}
    nothing = _HostEvents([])
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") == "cuda_runtime" and isinstance(e.get("args"), dict) and "correlation" in e["args"]
    }
    busy = _intervals_union([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    wall = t1 - t0
    lines = [
        "",
        f"step wall {wall / 1e3:.1f} ms, GPU busy {busy / 1e3:.1f} ms, idle {(wall - busy) / 1e3:.1f} ms "
        f"({100 * (wall - busy) / wall:.1f} %)",
    ]

    def label(kernel: dict[str, Any] | None) -> str:
        if kernel is None:
            return "(after the last kernel: host work to the end of the step)"
        launch = launches.get(kernel.get("args", {}).get("correlation"))
        if launch is None:
            return f"(no launch record) {kernel['name'][:60]}"
        stack = by_tid.get(launch.get("tid"), nothing).enclosing(launch["ts"])
        ops = [e["name"] for e in stack if e.get("cat") == "cpu_op"]
        return f"{_our_frame(stack)} | {ops[0] if ops else launch['name']}"

    gaps: dict[str, list[float]] = defaultdict(list)
    end = t0
    for k in gpu:
        if k["ts"] - end > gap_us:
            gaps[label(k)].append(k["ts"] - end)
        end = max(end, k["ts"] + k["dur"])
    if t1 - end > gap_us:
        gaps[label(None)].append(t1 - end)
    total = sum(sum(v) for v in gaps.values())
    lines.append(f"idle gaps over {gap_us:.0f} us: {sum(len(v) for v in gaps.values())}, {total / 1e3:.1f} ms")
    lines.append(f"{'ms':>8} {'gaps':>5} {'max ms':>7}  launched next by (innermost frame | outermost torch op)")
    for name, v in sorted(gaps.items(), key=lambda kv: -sum(kv[1]))[:40]:
        lines.append(f"{sum(v) / 1e3:8.2f} {len(v):5d} {max(v) / 1e3:7.2f}  {name[:150]}")
    syncs: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cuda_runtime" and t0 <= e.get("ts", -1) <= t1 and SYNC_CALLS.search(e.get("name", "")):
            where = _our_frame(by_tid.get(e.get("tid"), nothing).enclosing(e["ts"]))
            syncs[f"{e['name']} in {where}"].append(e.get("dur", 0))
    lines += ["", f"host synchronisations in the step: {sum(len(v) for v in syncs.values())}"]
    for name, v in sorted(syncs.items(), key=lambda kv: -sum(kv[1]))[:20]:
        lines.append(f"{sum(v) / 1e3:8.2f} ms {len(v):5d}x  {name[:150]}")
    return lines


def choose_sdpa_backend(name: str) -> None:
    flags = {
        "flash": torch.backends.cuda.enable_flash_sdp,
        "efficient": torch.backends.cuda.enable_mem_efficient_sdp,
        "cudnn": torch.backends.cuda.enable_cudnn_sdp,
        "math": torch.backends.cuda.enable_math_sdp,
    }
    if name not in flags:
        raise SystemExit(f"SDPA_BACKEND: expected one of {', '.join(flags)}, found {name!r}")
    for backend, enable in flags.items():
        enable(backend == name)


def before_round_eight() -> None:
    """HOST_LAYOUT=0 (module docstring)."""
    forward_loss, forward_plan = step_module.forward_loss, step_module.forward_plan

    def forward_loss_reading_back(model: Any, batch: Any, attn_impl: str, layout: Any = None) -> Any:
        return forward_loss(model, batch, attn_impl)

    def plan_without_refresh(model: Any) -> Any:
        return dataclasses.replace(forward_plan(model), refresh_adapters=None)

    def no_layout(batch: Any) -> RowLayout:
        # Nothing worked out on the host either: the forward above ignores the layout.
        return RowLayout(False, {}, torch.zeros(0, dtype=torch.long))

    step_module.forward_loss = forward_loss_reading_back
    step_module.forward_plan = plan_without_refresh
    step_module.row_layout = no_layout


def main() -> int:
    if os.environ.get("SDPA_BACKEND"):
        choose_sdpa_backend(os.environ["SDPA_BACKEND"])
    at = int(os.environ.get("PROFILE_STEP", "0"))
    out = Path(os.environ.get("PROFILE_OUT", "profile.txt"))
    plain_step = loop_module.train_step
    calls = {"n": 0}

    if os.environ.get("HOST_LAYOUT") == "0":
        before_round_eight()
    if os.environ.get("LOSS_KERNEL", "triton") not in ("triton", "compiled"):
        raise SystemExit(f"LOSS_KERNEL: expected triton or compiled, found {os.environ['LOSS_KERNEL']!r}")
    if os.environ.get("LOSS_KERNEL") == "compiled":
        loss_module.TRITON_CHUNK = False
    if os.environ.get("ACT_BUDGET"):
        import torch._functorch.config as functorch_config

        functorch_config.activation_memory_budget = float(os.environ["ACT_BUDGET"])
    if os.environ.get("LOSS_CHUNK"):
        model_module.linear_cross_entropy = functools.partial(
            loss_module.linear_cross_entropy, chunk=int(os.environ["LOSS_CHUNK"])
        )
    if os.environ.get("GC") == "off":
        gc.disable()
    gc_stats = os.environ.get("GC_STATS") == "1"
    collections: list[tuple[int, float]] = []
    started: dict[str, float] = {}

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        else:
            collections.append((info["generation"], 1e3 * (time.perf_counter() - started["t"])))

    if gc_stats:
        gc.callbacks.append(on_gc)

    def step(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        result = one_step(*args, **kwargs)
        if gc_stats:
            by_gen = {g: [ms for gen, ms in collections if gen == g] for g in (0, 1, 2)}
            summary = ", ".join(f"gen{g} {len(v)}x {sum(v):.2f} ms" for g, v in by_gen.items() if v)
            print(f"gc in step {calls['n']}: {summary}", flush=True)
            collections.clear()
        return result

    def one_step(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get("TORCHINDUCTOR_CUDAGRAPHS") == "1":
            torch.compiler.cudagraph_mark_step_begin()
        if os.environ.get("READ_AHEAD") == "0":
            # Each step reads its own rows at its start, as before the read-ahead: host None, read_ahead None.
            args = (*args[:3], None, *args[4:9], None)
        if calls["n"] != at:
            return plain_step(*args, **kwargs)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        # with_stack: the idle report names the Python frame that launched the kernel after each gap.
        # PROFILE_STACK=0: no stacks (the host runs nearer its own speed; gaps are named by torch op only).
        stack = os.environ.get("PROFILE_STACK", "1") != "0"
        shapes = os.environ.get("PROFILE_SHAPES") == "1"
        with torch.profiler.profile(activities=activities, with_stack=stack, record_shapes=shapes) as prof:
            with torch.profiler.record_function(STEP_MARK):
                stats = plain_step(*args, **kwargs)
            torch.cuda.synchronize()
        if int(os.environ.get("RANK", "0")) == 0:
            write_profile(prof, out)
            with tempfile.TemporaryDirectory() as tmp:
                trace = Path(tmp) / "trace.json"
                prof.export_chrome_trace(str(trace))
                idle = idle_report(trace, float(os.environ.get("GAP_US", "50")))
            with out.open("a") as f:
                f.write("\n".join(idle) + "\n")
        return stats

    loop_module.train_step = step  # type: ignore[assignment]
    return run_module.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
