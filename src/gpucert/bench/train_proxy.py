"""Training-throughput proxy: a fixed Llama-style decoder trained for a few steps, on one GPU and then on all.

`gpucert bench train` runs it (one process per GPU; two gloo processes on a CPU machine). Rank 0 first trains
alone while the others wait, then every rank trains together under DDP. Reading the output:
- tokens/s per GPU at world size 1 and N; scaling efficiency is their ratio (1.0 = DDP costs nothing);
- MFU = FLOPs/token x tokens/s per GPU / bf16 peak, FLOPs/token = 6N + 12·L·H·Q·T (PaLM convention, as
  torchtitan; N = matmul parameters without the input embedding, lm_head counted; T = seq_len, no packing);
- the loss per step of each phase: the synthetic data is learnable, so a loss that does not fall means wrong
  numerics (a bad GPU, a corrupting all-reduce), not bad luck.

Weights come from a fixed seed and the data from a fixed phrase table, so two healthy runs give the same
loss curve up to kernel non-determinism.
"""

from __future__ import annotations

import gc
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpucert.bench.timing import time_repeats
from gpucert.config.floors import describe_count, floor_for
from gpucert.config.profiles import Profile
from gpucert.config.run import TrainBenchConfig
from gpucert.report.schema import Result
from gpucert.runtime.group import Runtime, host_barrier
from gpucert.status import Status


@dataclass(frozen=True)
class ModelPreset:
    d_model: int
    n_layers: int
    n_heads: int
    ffn_dim: int
    vocab_size: int
    # Peak learning rate after warm-up: 3e-4 is the usual ~1B-model AdamW rate; a 128-wide model learns
    # nothing in a dozen steps at that rate, so the CI preset takes 10x.
    lr: float = 3e-4
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


PRESETS = {
    # TinyLlama-1.1B's width and FFN with full multi-head attention: 1.16 B parameters, 1.09 B in matmuls.
    "1b": ModelPreset(d_model=2048, n_layers=20, n_heads=16, ffn_dim=5632, vocab_size=32000),
    "tiny": ModelPreset(d_model=128, n_layers=2, n_heads=4, ffn_dim=344, vocab_size=512, lr=3e-3),
}

MODEL_SEED = 1234
DATA_SEED = 4321
# The data: rows are concatenations of PHRASES random phrases of PHRASE_LEN tokens. A model first learns
# which few tokens occur, then each phrase's continuation; random init starts at ln(vocab).
PHRASES, PHRASE_LEN = 16, 8
ADAM_BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
# train.loss_decreasing: mean of the last LOSS_WINDOW losses below LOSS_RATIO_MAX x the first LOSS_WINDOW.
LOSS_WINDOW, LOSS_RATIO_MAX = 3, 0.9
GIB = 1 << 30


# --- The model --------------------------------------------------------------------------------------------


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) queries or keys by position, rotate-half layout (GPT-NeoX, HF Llama)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, p: ModelPreset) -> None:
        super().__init__()
        self.n_heads, self.head_dim = p.n_heads, p.head_dim
        self.qkv = nn.Linear(p.d_model, 3 * p.d_model, bias=False)
        self.out = nn.Linear(p.d_model, p.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, p: ModelPreset) -> None:
        super().__init__()
        self.gate_up = nn.Linear(p.d_model, 2 * p.ffn_dim, bias=False)
        self.down = nn.Linear(p.ffn_dim, p.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, p: ModelPreset) -> None:
        super().__init__()
        self.attn_norm, self.attn = nn.RMSNorm(p.d_model, eps=1e-5), Attention(p)
        self.mlp_norm, self.mlp = nn.RMSNorm(p.d_model, eps=1e-5), SwiGLU(p)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """Embedding, n_layers pre-norm blocks, final RMSNorm, untied lm_head: tokens (B, T) -> logits (B, T, V)."""

    def __init__(self, p: ModelPreset) -> None:
        super().__init__()
        self.embed = nn.Embedding(p.vocab_size, p.d_model)
        self.blocks = nn.ModuleList(Block(p) for _ in range(p.n_layers))
        self.norm = nn.RMSNorm(p.d_model, eps=1e-5)
        self.lm_head = nn.Linear(p.d_model, p.vocab_size, bias=False)
        inv_freq = 1.0 / p.rope_theta ** (torch.arange(0, p.head_dim, 2).float() / p.head_dim)
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        for name, w in self.named_parameters():
            if w.dim() == 2:
                # GPT-2 init: residual-stream outputs scaled by 1/sqrt(2 x layers) so the sum stays ~unit.
                out_proj = name.endswith(("attn.out.weight", "mlp.down.weight"))
                nn.init.normal_(w, std=0.02 / math.sqrt(2 * p.n_layers) if out_proj else 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # RoPE angles per step, as HF Llama does: a few tiny kernels, and nothing sizeable for DDP to broadcast.
        angles = torch.outer(torch.arange(tokens.shape[1], device=tokens.device).float(), self.inv_freq)
        cos, sin = angles.cos(), angles.sin()
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x))


def count_params(model: nn.Module) -> tuple[int, int]:
    """(all parameters, matmul parameters): the latter are the nn.Linear weights, so lm_head in, embedding out."""
    total = sum(p.numel() for p in model.parameters())
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return total, matmul


def flops_per_token(p: ModelPreset, matmul_params: int, seq_len: int) -> tuple[int, str]:
    """Training FLOPs per token, 6N + 12·L·H·Q·T (fine-tuning.md §8), and the formula with numbers filled in."""
    flops = 6 * matmul_params + 12 * p.n_layers * p.n_heads * p.head_dim * seq_len
    formula = (
        f"FLOPs/token = 6N + 12·L·H·Q·T = 6 x {matmul_params:,} + 12 x {p.n_layers} x {p.n_heads} x "
        f"{p.head_dim} x {seq_len} = {flops:,}; MFU = FLOPs/token x tokens/s per GPU / bf16 peak FLOP/s"
    )
    return flops, formula


# --- Data and one training phase --------------------------------------------------------------------------


def synthetic_batches(p: ModelPreset, cfg: TrainBenchConfig, rank: int) -> torch.Tensor:
    """(steps, micro_batch, seq_len + 1) tokens: the same phrase table everywhere, each rank its own rows."""
    table = torch.randint(p.vocab_size, (PHRASES, PHRASE_LEN), generator=torch.Generator().manual_seed(DATA_SEED))
    per_row = -(-(cfg.seq_len + 1) // PHRASE_LEN)
    rows = torch.Generator().manual_seed(DATA_SEED + 1 + rank)
    picks = torch.randint(PHRASES, (cfg.steps, cfg.micro_batch, per_row), generator=rows)
    return table[picks].flatten(2)[..., : cfg.seq_len + 1]


def train_phase(env: Runtime, p: ModelPreset, cfg: TrainBenchConfig, ddp: bool) -> dict[str, Any]:
    """cfg.steps AdamW steps from the seeded weights; throughput over the steps after cfg.warmup_steps."""
    device, cuda = env.device, env.device.type == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(MODEL_SEED)
    with device:
        model: nn.Module = Decoder(p)
    total_params, matmul_params = count_params(model)
    if ddp:
        model = DistributedDataParallel(
            model, device_ids=[env.device.index] if cuda else None, gradient_as_bucket_view=True
        )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=p.lr, betas=ADAM_BETAS, weight_decay=WEIGHT_DECAY, fused=True if cuda else None
    )
    batches = synthetic_batches(p, cfg, env.rank).to(device)
    losses: list[torch.Tensor] = []

    def step(i: int) -> None:
        for group in optimizer.param_groups:
            group["lr"] = p.lr * min(1.0, (i + 1) / max(1, cfg.warmup_steps))
        tokens = batches[i]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    timing = time_repeats(step, device, warmup=cfg.warmup_steps, repeats=cfg.steps - cfg.warmup_steps)
    loss_curve = torch.stack(losses)
    if ddp:
        # The curve of the whole batch: gloo has no AVG, so sum and divide.
        dist.all_reduce(loss_curve)
        loss_curve /= env.world_size
    timed_s = sum(timing.samples_s)
    return {
        "params": total_params,
        "matmul_params": matmul_params,
        "tokens_per_s": cfg.micro_batch * cfg.seq_len * len(timing.samples_s) / timed_s,
        "step_time_s": timed_s / len(timing.samples_s),
        "step_timing": timing.summary(),
        "loss": [v if math.isfinite(v) else None for v in loss_curve.tolist()],
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / GIB if cuda else None,
    }


def measure(env: Runtime, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """Every rank: rank 0 trains alone (others wait), then all train with DDP. Rank 0 returns the data."""
    peak_tflops = cfg.get("peak_tflops")
    bench = TrainBenchConfig(**{k: v for k, v in cfg.items() if k != "peak_tflops"})
    if bench.model not in PRESETS:
        raise ValueError(f"bench.train.model: unknown preset {bench.model!r}; presets: {', '.join(PRESETS)}")
    if bench.steps <= bench.warmup_steps:
        raise ValueError(f"bench.train.steps ({bench.steps}) must exceed warmup_steps ({bench.warmup_steps})")
    preset = PRESETS[bench.model]
    phases = [train_phase(env, preset, bench, ddp=False)] if env.is_main else []
    if env.world_size > 1:
        host_barrier(env, "after rank 0 trained alone")  # nothing runs on the other GPUs while rank 0 trains alone
        phases.append(train_phase(env, preset, bench, ddp=True))
    # DDP's reducer sits in a reference cycle: free it while the process group lives, or its threads die at
    # interpreter exit and abort the process ("terminate called without an active exception").
    gc.collect()
    if not env.is_main:
        return None
    flops, formula = flops_per_token(preset, phases[0]["matmul_params"], bench.seq_len)
    world_sizes = [1, env.world_size] if env.world_size > 1 else [1]
    tps = [ph["tokens_per_s"] for ph in phases]
    return {
        "model": bench.model,
        "preset": asdict(preset),
        "params": phases[0]["params"],
        "matmul_params": phases[0]["matmul_params"],
        "seq_len": bench.seq_len,
        "micro_batch": bench.micro_batch,
        "steps": bench.steps,
        "warmup_steps": bench.warmup_steps,
        "world_sizes": world_sizes,
        "num_nodes": env.num_nodes,
        "tokens_per_s_per_gpu": tps,
        "step_time_s": [ph["step_time_s"] for ph in phases],
        "step_timing": [ph["step_timing"] for ph in phases],
        "mfu": [flops * t / (peak_tflops * 1e12) if peak_tflops else None for t in tps],
        "peak_tflops": peak_tflops,
        "flops_per_token": flops,
        "formula": formula,
        "loss": {str(n): ph["loss"] for n, ph in zip(world_sizes, phases, strict=True)},
        "scaling_efficiency": tps[-1] / tps[0] if len(tps) > 1 else None,
        "peak_memory_gib": [ph["peak_memory_gib"] for ph in phases],
        "device": torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else "cpu",
    }


# --- Judging ----------------------------------------------------------------------------------------------


def _phase_name(world_size: str) -> str:
    return "world size 1 (one GPU, no DDP)" if world_size == "1" else f"world size {world_size} (DDP)"


def loss_drop(losses: list[float | None]) -> tuple[float, float] | None:
    """(mean of the first, mean of the last) LOSS_WINDOW losses; None when a loss is missing or not finite."""
    if len(losses) < 2 * LOSS_WINDOW or any(v is None for v in losses):
        return None
    values = [float(v) for v in losses if v is not None]
    return sum(values[:LOSS_WINDOW]) / LOSS_WINDOW, sum(values[-LOSS_WINDOW:]) / LOSS_WINDOW


def judge(data: dict[str, Any], profile: Profile, cfg: TrainBenchConfig) -> list[Result]:
    del cfg  # the data carries the configuration it ran with
    world = data["world_sizes"][-1]
    subject = f"{world} x {data['device']}"
    base: dict[str, Any] = {"subject": subject, "category": "benchmark"}
    tps = data["tokens_per_s_per_gpu"]
    per_phase = ", ".join(f"{t:,.0f} at world size {n}" for n, t in zip(data["world_sizes"], tps, strict=True))
    results = [
        Result(
            name="train.tokens_per_s_per_gpu",
            # Judged as MFU (tokens/s x FLOPs/token / peak), which holds any model size to the same bar.
            status=Status.INFO,
            value=tps[-1],
            unit="tokens/s",
            message=f"shown, not judged (train.mfu is): tokens/s per GPU: {per_phase}; model {data['model']} "
            f"({data['params'] / 1e9:.3g} B params), {data['micro_batch']} x {data['seq_len']} tokens per step",
            details=data,
            **base,
        ),
        judge_mfu(data, profile, base),
        judge_scaling(data, profile, base),
    ]
    bad, shown_losses = [], []
    for n, losses in data["loss"].items():
        drop = loss_drop(losses)
        if drop is None:
            bad.append(f"{_phase_name(n)}: missing or non-finite losses {losses}")
        else:
            shown_losses.append(f"{drop[0]:.3f} -> {drop[1]:.3f} at {_phase_name(n)}")
            if not drop[1] < LOSS_RATIO_MAX * drop[0]:
                bad.append(f"{drop[0]:.3f} -> {drop[1]:.3f} at {_phase_name(n)}")
    rule = f"mean of the last {LOSS_WINDOW} losses < {LOSS_RATIO_MAX} x the first {LOSS_WINDOW}"
    loss_base = {
        **base,
        "name": "train.loss_decreasing",
        "expected": rule,
        "threshold_source": "gpucert.bench.train_proxy.LOSS_RATIO_MAX",
    }
    first_phase = next(iter(data["loss"].values()))
    if len(first_phase) < 2 * LOSS_WINDOW:
        results.append(
            Result(
                status=Status.ERROR,
                message=f"expected at least {2 * LOSS_WINDOW} steps to judge the loss, found {len(first_phase)}",
                remediation=f"set bench.train.steps >= {2 * LOSS_WINDOW}",
                **loss_base,
            )
        )
    elif bad:
        results.append(
            Result(
                status=Status.FAIL,
                message=f"expected the {rule} in every phase, found {'; '.join(bad)}, on {subject}",
                remediation="the model does not learn a learnable synthetic dataset, so the arithmetic is wrong: "
                "look for XIDs and ECC errors, run `gpucert health` (liveness) and the matmul benchmark; if only "
                "the DDP phase fails, suspect the all-reduce (run the collectives benchmark)",
                **loss_base,
            )
        )
    else:
        results.append(Result(status=Status.PASS, message="; ".join(shown_losses), **loss_base))
    return results


def judge_mfu(data: dict[str, Any], profile: Profile, base: dict[str, Any]) -> Result:
    """MFU at the largest world size against the profile's train_mfu_min; INFO without one."""
    mfu, floor = data["mfu"][-1], profile.benchmarks.train_mfu_min
    field_name = "benchmarks.train_mfu_min"
    mfu_base = {**base, "name": "train.mfu", "unit": "%"}
    if mfu is None:
        return Result(
            status=Status.SKIP,
            message=f"no bf16 peak for {data['device']} in profile {profile.name}; MFU not computed",
            **mfu_base,
        )
    shown = ", ".join(
        f"{100 * m:.1f} % at world size {n}" for n, m in zip(data["world_sizes"], data["mfu"], strict=True)
    )
    how = f"{data['formula']}, peak {data['peak_tflops']:g} TFLOP/s"
    if floor is None:
        return Result(
            status=Status.INFO,
            value=100 * mfu,
            message=f"shown, not judged: profile {profile.name} sets no {field_name}; MFU {shown}; {how}",
            **mfu_base,
        )
    judged = {
        **mfu_base,
        "value": 100 * mfu,
        "expected": f">= {100 * floor:g} %",
        "threshold_source": f"profile {profile.name}: {field_name}",
    }
    if mfu >= floor:
        return Result(status=Status.PASS, message=f"MFU {shown}; {how}", **judged)
    return Result(
        status=Status.FAIL,
        message=f"expected MFU >= {100 * floor:g} %, found {100 * mfu:.1f} %, on {base['subject']} ({shown}; {how})",
        remediation="compare with the matmul benchmark: a slow GPU there points at clocks, power cap or "
        "cooling (nvidia-smi -q -d CLOCK,POWER,TEMPERATURE); a fine matmul with low MFU points at the "
        "host (CPU frequency governor, launch overhead) or at PCIe/NVLink when only DDP is slow",
        **judged,
    )


def judge_scaling(data: dict[str, Any], profile: Profile, base: dict[str, Any]) -> Result:
    """DDP tokens/s per GPU over one GPU's, against the profile's floor for this many GPUs and nodes."""
    eff, tps = data["scaling_efficiency"], data["tokens_per_s_per_gpu"]
    world, nodes = data["world_sizes"][-1], data.get("num_nodes") or 1
    field_name = "benchmarks.train_scaling_efficiency_min"
    eff_base = {**base, "name": "train.scaling_efficiency", "unit": "%"}
    if eff is None:
        return Result(status=Status.SKIP, message="one process: scaling needs two or more GPUs", **eff_base)
    found = f"{100 * eff:.1f} % ({tps[-1]:,.0f} tokens/s per GPU at {world} vs {tps[0]:,.0f} alone)"
    floor = floor_for(profile.benchmarks.train_scaling_efficiency_min, world // nodes, nodes)
    if world % nodes or floor is None:
        count = describe_count(world // nodes, nodes) if not world % nodes else f"{world} ranks on {nodes} nodes"
        return Result(
            status=Status.INFO,
            value=100 * eff,
            message=f"shown, not judged: profile {profile.name} sets no {field_name} for {count}; {found}",
            **eff_base,
        )
    judged = {
        **eff_base,
        "value": 100 * eff,
        "expected": f">= {100 * floor.value:g} %",
        "threshold_source": f"profile {profile.name}: {field_name}{floor.entry}",
    }
    if eff >= floor.value:
        return Result(status=Status.PASS, message=found, **judged)
    return Result(
        status=Status.FAIL,
        message=f"expected scaling efficiency >= {100 * floor.value:g} %, found {found}, on {base['subject']}",
        remediation="DDP's gradient all-reduce is not hidden behind the backward pass: run the collectives and p2p "
        "benchmarks, check NVLink (nvidia-smi nvlink -s, nvidia-smi topo -m) and NCCL_DEBUG=INFO for the "
        "transport NCCL picked",
        **judged,
    )
