"""Issue 31 part 5: do the bf16 step's GEMMs lose time to their adapter-extended width?

With `model.adapters_in_gemm` and `model.fuse_mlp` every large GEMM of a Qwen2-7B layer has 3,584 plus the adapters'
ranks in one dimension (in_gemm.py, WIDTHS): K in the forward of q/k/v (3,632), gate and up (3,616) and in the
backward of o_proj and down_proj (3,600); the output width in the forward of o_proj and down_proj and in the
backward of q/k/v, gate and up. None is a multiple of cuBLAS's tiles (64 deep, 128 or 256 wide), so each such GEMM
may pay a partial tile, or get another kernel from cuBLAS's heuristics, for under 1.5 % more arithmetic. This times
every one of those shapes, as the step runs it (the same operand layouts), as run, at the unextended 3,584, and
padded to 3,648 and 3,712, with each one's TFLOP/s at its own shape.

Run on the GPU: python tools/bench_step_gemms.py [TOKENS] (default 16,384: micro-batch 4 of 4,096); with --mlp,
the MLP input side's GEMMs in five arrangements instead (mlp_arrangements). Not part of gpucert.
"""

from __future__ import annotations

import json
import sys

import torch

H, INTER, QKV, R = 3584, 18944, 4608, 16
TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 16384


def timed(fn, repeats: int = 20, warm: int = 5) -> float:
    """Median milliseconds of fn over repeats calls, after warm calls."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


# Each GEMM's extended width as the step has it (fused.py): q/k/v one A for the three (3 x 16 columns), gate and
# up one A for the two (2 x 16), o_proj and down_proj their own A as 16 rows.
WIDTHS = {"q/k/v": H + 3 * R, "o": H + R, "gate/up": H + 2 * R, "down": H + R, "dh": H + R}


def shapes(d: dict[str, int]) -> dict[str, tuple[tuple[int, int], tuple[int, int], bool]]:
    """name -> (left operand shape, stored weight shape, whether the weight is used transposed), at widths d."""
    n = TOKENS
    return {
        "fwd q/k/v   [N,d]@[4608,d]^T": ((n, d["q/k/v"]), (QKV, d["q/k/v"]), True),
        "fwd o       [N,H]@[d,H]^T": ((n, H), (d["o"], H), True),
        "fwd gate/up [N,d]@[18944,d]^T (x2)": ((n, d["gate/up"]), (INTER, d["gate/up"]), True),
        "fwd down    [N,18944]@[d,18944]^T": ((n, INTER), (d["down"], INTER), True),
        "bwd q/k/v   [N,4608]@[4608,d]": ((n, QKV), (QKV, d["q/k/v"]), False),
        "bwd o       [N,d]@[d,H]": ((n, d["o"]), (d["o"], H), False),
        "bwd dh      [N,d]@[d,18944]": ((n, d["dh"]), (d["dh"], INTER), False),
        "bwd gate/up [N,18944]@[18944,d] (x2)": ((n, INTER), (INTER, d["gate/up"]), False),
    }


def main() -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    rows = []
    columns = {
        "3584": dict.fromkeys(WIDTHS, H),
        "as run": WIDTHS,
        "3648": dict.fromkeys(WIDTHS, H + 64),
        "3712": dict.fromkeys(WIDTHS, H + 128),
    }
    for name in shapes(WIDTHS):
        line: dict = {"gemm": name}
        for label, widths in columns.items():
            (m2, k2), (wr2, wc2), transposed = shapes(widths)[name]
            flops = 2 * m2 * k2 * (wr2 if transposed else wc2)
            x = torch.randn(m2, k2, device=dev, dtype=torch.bfloat16)
            w = torch.randn(wr2, wc2, device=dev, dtype=torch.bfloat16) * 0.02
            ms = timed((lambda x=x, w=w: x @ w.t()) if transposed else (lambda x=x, w=w: x @ w))
            line[label] = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1)}
            del x, w
        rows.append(line)
        cells = "  ".join(f"{d}: {v['ms']:.3f} ms {v['tflops']:.0f}" for d, v in line.items() if d != "gemm")
        print(f"{name:40s} {cells}", flush=True)
    print(json.dumps({"tokens": TOKENS, "device": torch.cuda.get_device_name(), "widths": WIDTHS, "rows": rows}))


def mlp_arrangements(n: int) -> dict[str, float]:
    """The MLP input side's GEMMs (gate and up, forward and input gradient, with the sums the backward does) in
    five arrangements, each timed alternately over three rounds (median ms of each round's median), since the
    GEMMs alone differ by a few per cent from one minute to the next at the card's power cap."""
    dev, bf = torch.device("cuda"), torch.bfloat16
    w, run = H, WIDTHS["gate/up"]
    x_ext = {d: torch.randn(n, d, device=dev, dtype=bf) for d in (run, H + 64)}
    wgu = {d: torch.randn(2 * INTER, d, device=dev, dtype=bf) * 0.02 for d in (run, H + 64)}
    dgu = torch.randn(n, 2 * INTER, device=dev, dtype=bf)
    dg, du = dgu[:, :INTER].contiguous(), dgu[:, INTER:].contiguous()

    def separate(d: int) -> None:  # today: gate and up each its GEMM, slices summed
        wg, wu = wgu[d][:INTER], wgu[d][INTER:]
        x_ext[d] @ wg.t(), x_ext[d] @ wu.t()
        fg, fu = dg @ wg, du @ wu
        fg[:, :w] + fu[:, :w], fg[:, w:] + fu[:, w:]

    def split(d: int) -> None:  # the input gradient's aligned 3,584 columns apart from the adapter's 16
        wg, wu = wgu[d][:INTER], wgu[d][INTER:]
        x_ext[d] @ wg.t(), x_ext[d] @ wu.t()
        (dg @ wg[:, :w]) + (du @ wu[:, :w]), (dg @ wg[:, w:]) + (du @ wu[:, w:])

    def stacked(d: int) -> None:  # gate and up one GEMM each way: [N, 37,888] out, K = 37,888 back
        x_ext[d] @ wgu[d].t()
        dgu @ wgu[d]

    variants = {
        f"separate {run} (today)": lambda: separate(run),
        "separate 3648 (zero-padded)": lambda: separate(H + 64),
        f"split backward {run}": lambda: split(run),
        f"stacked {run}": lambda: stacked(run),
        "stacked 3648": lambda: stacked(H + 64),
    }
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(3):
        for name, fn in variants.items():
            rounds[name].append(timed(fn, repeats=15, warm=3))
    return {name: round(sorted(t)[1], 3) for name, t in rounds.items()}


if __name__ == "__main__":
    if "--mlp" in sys.argv:
        for n in (16384, 12288):
            print(n, json.dumps(mlp_arrangements(n)), flush=True)
    else:
        main()
