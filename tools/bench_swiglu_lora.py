"""Issue 13 lever, measured before it is built: the MLP's LoRA reductions inside the SwiGLU backward.

In the bf16 step with the adapters in the frozen GEMMs (Qwen2-7B, 8,192 tokens, r16), the backward of one MLP
still reads three 8,192 x 18,944 tensors a second time, each only to reduce it to a rank-16 result:
dB_gate = s dg^T xa_g and dB_up = s du^T xa_u read the SwiGLU backward's outputs dg and du, and down_proj's
dA = d(ha)^T h reads the saved h = silu(g) u (profiled: 9.4 ms of a 467 ms step, ~2.75 TB/s). One Triton kernel
can compute dg and du from (g, u, dh) as inductor's fused kernel does and, while each tile is in registers,
add its share of the three rank-16 reductions (tl.dot with the tile), so none of the three is read again and h
need not be kept (recomputed in registers: 310 MB a layer at 8,192 tokens).

Times, over 20 calls after 5:
- today: inductor's compiled SwiGLU backward (dg, du from g, u, dh) and the three skinny GEMMs (h saved);
- fused: the Triton kernel (partial sums over row blocks, then summed).
Prints both, and how far the fused results are from today's. Run on the GPU: python tools/bench_swiglu_lora.py.
Not part of gpucert.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

T, N, R, SCALE = 8192, 18944, 16, 2.0


@triton.jit
def _swiglu_lora_bwd(
    g_ptr,
    u_ptr,
    dh_ptr,
    xa_ptr,
    dxad_ptr,  # inputs: [T, N] x 3, [T, 2R], [T, R]
    dg_ptr,
    du_ptr,  # outputs [T, N]
    pbg_ptr,
    pbu_ptr,
    pad_ptr,  # partial sums [SPLIT, N, R], [SPLIT, N, R], [SPLIT, R, N] (fp32)
    T_ROWS,
    N_COLS,
    ROWS_PER_SPLIT,
    R_: tl.constexpr,
    BT: tl.constexpr,
    BN: tl.constexpr,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    cols = pid_n * BN + tl.arange(0, BN)
    col_ok = cols < N_COLS
    rr = tl.arange(0, R_)
    acc_bg = tl.zeros((BN, R_), dtype=tl.float32)
    acc_bu = tl.zeros((BN, R_), dtype=tl.float32)
    acc_ad = tl.zeros((R_, BN), dtype=tl.float32)
    t0 = split * ROWS_PER_SPLIT
    for t in range(t0, t0 + ROWS_PER_SPLIT, BT):
        rows = t + tl.arange(0, BT)
        row_ok = rows < T_ROWS
        mask = row_ok[:, None] & col_ok[None, :]
        offs = rows[:, None] * N_COLS + cols[None, :]
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dh = tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(g)
        silu = g * sig
        h = (silu * u).to(tl.bfloat16)
        du = (dh * silu).to(tl.bfloat16)
        dg = (dh * u * sig * (1.0 + g * (1.0 - sig))).to(tl.bfloat16)
        tl.store(dg_ptr + offs, dg, mask=mask)
        tl.store(du_ptr + offs, du, mask=mask)
        xa_offs = rows[:, None] * (2 * R_) + rr[None, :]
        xa_g = tl.load(xa_ptr + xa_offs, mask=row_ok[:, None], other=0.0)
        xa_u = tl.load(xa_ptr + xa_offs + R_, mask=row_ok[:, None], other=0.0)
        dxad = tl.load(dxad_ptr + rows[:, None] * R_ + rr[None, :], mask=row_ok[:, None], other=0.0)
        acc_bg += tl.dot(tl.trans(dg), xa_g)
        acc_bu += tl.dot(tl.trans(du), xa_u)
        acc_ad += tl.dot(tl.trans(dxad), h)
    nr = split * N_COLS * R_ + cols[:, None] * R_ + rr[None, :]
    tl.store(pbg_ptr + nr, acc_bg, mask=col_ok[:, None])
    tl.store(pbu_ptr + nr, acc_bu, mask=col_ok[:, None])
    rn = split * R_ * N_COLS + rr[:, None] * N_COLS + cols[None, :]
    tl.store(pad_ptr + rn, acc_ad, mask=col_ok[None, :])


def fused(g, u, dh, xa, dxad, split: int, bt: int, bn: int, warps: int):
    dg, du = torch.empty_like(g), torch.empty_like(u)
    pbg = torch.empty(split, N, R, device=g.device, dtype=torch.float32)
    pbu = torch.empty_like(pbg)
    pad = torch.empty(split, R, N, device=g.device, dtype=torch.float32)
    rows = triton.cdiv(triton.cdiv(T, split), bt) * bt
    grid = (triton.cdiv(N, bn), split)
    _swiglu_lora_bwd[grid](g, u, dh, xa, dxad, dg, du, pbg, pbu, pad, T, N, rows, R_=R, BT=bt, BN=bn, num_warps=warps)
    return dg, du, pbg.sum(0) * SCALE, pbu.sum(0) * SCALE, pad.sum(0)


@torch.compile
def swiglu_bwd(g, u, dh):
    gf, uf, dhf = g.float(), u.float(), dh.float()
    sig = torch.sigmoid(gf)
    silu = gf * sig
    return (dhf * uf * sig * (1 + gf * (1 - sig))).to(g.dtype), (dhf * silu).to(u.dtype)


def today(g, u, dh, xa, dxad, h):
    dg, du = swiglu_bwd(g, u, dh)
    dbg = (dg.t() @ xa[:, :R]).float() * SCALE
    dbu = (du.t() @ xa[:, R:]).float() * SCALE
    dad = (dxad.t() @ h).float()
    return dg, du, dbg, dbu, dad


def timed(fn, *args) -> float:
    for _ in range(5):
        fn(*args)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    g = torch.randn(T, N, device=dev, dtype=bf)
    u = torch.randn(T, N, device=dev, dtype=bf)
    dh = torch.randn(T, N, device=dev, dtype=bf) * 1e-2
    xa = torch.randn(T, 2 * R, device=dev, dtype=bf)
    dxad = torch.randn(T, R, device=dev, dtype=bf) * 1e-2
    h = (torch.nn.functional.silu(g.float()) * u.float()).to(bf)
    ref = today(g, u, dh, xa, dxad, h)
    t_today = timed(today, g, u, dh, xa, dxad, h)
    print(f"today (compiled SwiGLU backward + 3 skinny GEMMs, h saved): {t_today:.3f} ms a layer")
    configs = [(s, bt, bn, w) for s in (8, 16) for bt, bn in ((64, 128), (32, 128), (64, 64)) for w in (4, 8)]
    best = None
    for cfg in configs:
        try:
            out = fused(g, u, dh, xa, dxad, *cfg)
            t = timed(fused, g, u, dh, xa, dxad, *cfg)
        except Exception as exc:  # a tile configuration Triton refuses: say so, try the next
            print(f"  split {cfg[0]} BT {cfg[1]} BN {cfg[2]} warps {cfg[3]}: {type(exc).__name__}: {exc}"[:200])
            continue
        errs = [float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(out, ref, strict=True)]
        print(
            f"  split {cfg[0]:2d} BT {cfg[1]:3d} BN {cfg[2]:3d} warps {cfg[3]}: {t:.3f} ms; "
            f"off today's (dg du dBg dBu dAd): {' '.join(f'{e:.1e}' for e in errs)}"
        )
        if best is None or t < best[0]:
            best = (t, cfg)
    if best:
        print(
            f"fused best {best[0]:.3f} ms a layer {best[1]}; "
            f"x 28 layers: saves {(t_today - best[0]) * 28:.1f} ms a step"
        )


if __name__ == "__main__":
    main()
