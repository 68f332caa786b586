"""The fine-tuning workload of `gpucert.finetune.train` under DeepSpeed ZeRO-3, for docs/OPTIMIZATION.md's row on
the seeds' "+100-200 % from DeepSpeed ZeRO-3" (issue 13). A measuring tool, not a training mode: no checkpoints,
no adapter saved, no report.

Run under torchrun on the lent GPU machine (carry .whl; `bash tools/device_zero3.sh` installs DeepSpeed from
.whl-ds), with the same config and --set lines as the DDP and FSDP2 runs it is compared with:

  torchrun --standalone --nproc-per-node=2 tools/zero3_finetune.py configs/finetune/qwen2-7b-speed.yaml \
      --out zero3.json --set data.source=synthetic --set model.compile=false ...

Everything but the engine is gpucert's: the config, tokenizer, synthetic rows, the model with its LoRA adapters
and fused loss (the lm_head weight is a plain tensor there, so ZeRO-3 leaves it whole, as FSDP2 does),
micro-batches, forward_loss and the LoRA FLOP count. DeepSpeed owns the rest, as its users run it: bf16
parameters with fp32 master weights in its optimizer wrapper, ZeRO-3 partitioning of every parameter (the
frozen 7B weights included: gathered layer by layer in the forward and again in the backward), gradient
accumulation and clipping. The client optimizer is torch's fused AdamW, as in gpucert; DeepSpeed's own
FusedAdam would be compiled on the first run. One JSON object: tokens/s per GPU, MFU, step times, peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

from gpucert.finetune.config import load_finetune_config
from gpucert.finetune.data.prepare import prepare_dataset
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.model.lora import forward_loss, forward_plan, load_model
from gpucert.finetune.train import metrics as flops
from gpucert.finetune.train.loop import ADAM_BETAS
from gpucert.finetune.train.run import profile_peak
from gpucert.finetune.train.step import batch_to, epoch_order, rank_micro_batches

UNTIMED_STEPS = 2  # compile-free, but the first steps still allocate and warm NCCL up (as in the trainer)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", type=Path, required=True, help="where rank 0 writes the JSON result")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args(argv)
    cfg = load_finetune_config(args.config, args.overrides)
    tc = cfg.train
    if not isinstance(tc.micro_batch, int):
        raise SystemExit(f"{args.config}: set train.micro_batch to a number (found {tc.micro_batch!r})")

    cuda = torch.cuda.is_available()  # a CPU run (gloo, tiny model) checks the script before device time is spent
    deepspeed.init_distributed("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(tc.seed)

    tokenizer = load_tokenizer(cfg.model, cfg.data)
    data = prepare_dataset(cfg, tokenizer)
    model, info = load_model(cfg.model, cfg.lora, tokenizer, device, cfg.data.max_length, sharded=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=tc.lr, betas=ADAM_BETAS, weight_decay=tc.weight_decay, fused=cuda or None
    )
    ds_config = {
        "train_micro_batch_size_per_gpu": tc.micro_batch,
        "gradient_accumulation_steps": tc.grad_accum,
        "gradient_clipping": tc.max_grad_norm,
        "bf16": {"enabled": cuda},
        "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    engine.train()

    pad_to = forward_plan(engine).pad_to
    global_batch = tc.micro_batch * tc.grad_accum * world
    order = epoch_order(len(data.train), tc.seed, 0)
    step_times, losses = [], []
    tokens_per_step = 0
    for step in range(args.steps):
        start = (step * global_batch) % max(len(order) - global_batch + 1, 1)
        micro = rank_micro_batches(order[start : start + global_batch], rank, tc.micro_batch, tc.grad_accum)
        sync(device)
        began = time.perf_counter()  # from reading the rows, as the trainer times a step
        batches = [batch_to([data.train[i] for i in ids], tokenizer.pad_token_id, device, pad_to) for ids in micro]
        total = torch.zeros((), device=device)
        for batch in batches:
            loss_sum, count = forward_loss(engine, batch, cfg.model.attn_implementation)
            loss = loss_sum / count.clamp(min=1)
            engine.backward(loss)
            engine.step()  # steps the optimizer only at the accumulation boundary
            total += loss.detach()
        sync(device)
        step_times.append(time.perf_counter() - began)
        losses.append(float(total) / len(batches))
        tokens_per_step = sum(int(b["input_ids"].numel()) for b in batches)
        if rank == 0:
            print(f"[zero3] step {step + 1}/{args.steps}: {step_times[-1]:.3f} s, loss {losses[-1]:.4f}", flush=True)

    timed = step_times[UNTIMED_STEPS:]
    per_gpu = tokens_per_step * len(timed) / sum(timed)  # the trainer's formula: timed tokens over timed seconds
    per_token = flops.lora_flops_per_token(info.flop_counts(), float(cfg.data.max_length))
    peak = profile_peak()
    peak_mem = torch.tensor([torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0], device=device)
    dist.all_reduce(peak_mem, op=dist.ReduceOp.MAX)
    result = {
        "engine": f"deepspeed {deepspeed.__version__} ZeRO-3",
        "zero_config": ds_config,
        "world_size": world,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "trainable_params": info.trainable_params,
        "tokens_per_step_per_gpu": tokens_per_step,
        "tokens_per_s_per_gpu": per_gpu,
        "mfu": flops.utilisation(per_token, per_gpu, peak.tflops if peak else None),
        "step_times_s": step_times,
        "timed_from_step": UNTIMED_STEPS + 1,
        "losses": losses,
        "peak_memory_gib": float(peak_mem),
        "overrides": args.overrides,
    }
    if rank == 0:
        args.out.write_text(json.dumps(result, indent=1))
        print(
            f"[zero3] {world} x {result['device']}: {per_gpu:,.0f} tokens/s per GPU, MFU {result['mfu'] or 0:.1%}, "
            f"peak {result['peak_memory_gib']:.1f} GiB",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
