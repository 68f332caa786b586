"""One optimizer step of `gpucert finetune`, and the order of the rows it takes.

Every optimizer step takes one global batch (micro_batch x grad_accum x world rows) from a shuffle of the epoch
that depends only on seed and epoch, and each rank its own slice of it. The loss is the sum of token losses
divided by the supervised-token count of the whole global batch, counted before the backward, so 1 process and N
processes compute the same gradients for the same global batch (fine-tuning.md §7). Each step's rows are read
and collated on the host behind the previous step's GPU work, and nothing is read back from the GPU inside a step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from datasets import Dataset
from torch import nn

from gpucert.finetune.config import FinetuneConfig
from gpucert.finetune.data.packing import RowLayout, collate, row_layout
from gpucert.finetune.model.lora import (
    IGNORE_INDEX,
    forward_loss,
    forward_plan,
    supervised_count,
)
from gpucert.finetune.train import metrics as flops
from gpucert.finetune.train.memory_plan import fixed_micro_batch
from gpucert.finetune.train.parallel import gradient_sync
from gpucert.runtime.group import (
    Runtime,
)


def plan_steps(train_rows: int, global_batch: int, epochs: float, max_steps: int | None) -> tuple[int, int]:
    """(optimizer steps per epoch, total steps); a partial global batch at an epoch's end is dropped."""
    per_epoch = train_rows // global_batch
    if per_epoch == 0:
        raise ValueError(
            f"the train split has {train_rows} rows, fewer than one global batch of {global_batch} "
            "(micro_batch x grad_accum x processes): lower train.micro_batch or train.grad_accum, or add data"
        )
    total = math.ceil(epochs * per_epoch)
    return per_epoch, min(total, max_steps) if max_steps is not None else total


def epoch_order(rows: int, seed: int, epoch: int) -> list[int]:
    """The epoch's shuffle: a function of seed and epoch only, the same on every rank and after a resume."""
    return torch.randperm(rows, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def rank_micro_batches(global_rows: list[int], rank: int, micro_batch: int, grad_accum: int) -> list[list[int]]:
    """This rank's grad_accum micro-batches of one global batch: rank r takes the r-th contiguous slice."""
    mine = global_rows[rank * micro_batch * grad_accum : (rank + 1) * micro_batch * grad_accum]
    return [mine[i * micro_batch : (i + 1) * micro_batch] for i in range(grad_accum)]


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up over `warmup` steps to the peak, then a cosine to zero at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


@dataclass
class StepStats:
    loss: float
    grad_norm: float
    lr: float
    time_s: float
    # Tokens of the global batch: rows x row length, non-pad, with a label.
    padded: int
    effective: int
    supervised: int
    # Σs² and Σs over its packed documents, for T_eff.
    doc_sq: int
    doc_len: int
    # This rank's host time for the data inside time_s that the GPU waited for: the copy of rows read ahead, or
    # the whole read when nothing was (the first step of a process). What dataloader workers could hide at most.
    data_s: float = 0.0


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    if dist.get_world_size() == 1:
        return [float(v) for v in values]  # nothing to add: no copy to the device and back, no wait for it
    # float64 keeps token counts exact far beyond any run's size.
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def batch_to(
    rows: list[dict[str, Any]], pad_id: int, device: torch.device, pad_to: int | None = None
) -> dict[str, torch.Tensor]:
    return to_device(collate(rows, pad_id, pad_to), device)


@dataclass
class HostBatch:
    """One step's rows for this rank, read from the prepared set and collated on the host (pinned for CUDA), with
    the counts the step reports, taken from the host copy so that none waits for the GPU."""

    micro_ids: list[list[int]]
    micro: list[dict[str, torch.Tensor]]
    # Each micro-batch's RowLayout, from the host copy: the forward reads nothing back from the GPU.
    layouts: list[RowLayout]
    supervised: int
    padded: int
    effective: int
    doc_sq: int
    doc_len: int


def read_host_batch(
    micro_ids: list[list[int]], dataset: Dataset, pad_id: int, pad_to: int | None, pin: bool
) -> HostBatch:
    micro_rows = [[dataset[i] for i in ids] for ids in micro_ids]
    micro = [collate(rows, pad_id, pad_to) for rows in micro_rows]
    layouts = [row_layout(b) for b in micro]
    if pin:
        # Page-locked, so the step's copy to the GPU is asynchronous (torch's caching host allocator reuses the
        # pages, and holds them until the copy that reads them has run).
        micro = [{k: v.pin_memory() for k, v in b.items()} for b in micro]
        layouts = [layout.pin_memory() for layout in layouts]
    docs = [flops.document_lengths(row["position_ids"]) for rows in micro_rows for row in rows]
    return HostBatch(
        micro_ids=micro_ids,
        micro=micro,
        layouts=layouts,
        supervised=sum(int(supervised_count(b["labels"])) for b in micro),
        padded=sum(b["input_ids"].numel() for b in micro),
        effective=sum(len(row["input_ids"]) for rows in micro_rows for row in rows),
        doc_sq=sum(s * s for d in docs for s in d),
        doc_len=sum(s for d in docs for s in d),
    )


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    host: HostBatch | None,
    micro_ids: list[list[int]],
    dataset: Dataset,
    cfg: FinetuneConfig,
    rt: Runtime,
    pad_id: int,
    read_ahead: list[list[int]] | None = None,
) -> tuple[StepStats, HostBatch | None]:
    """One optimizer step over this rank's micro-batches (row indices into `dataset`), timed from the data to the
    last statistic. `host` is this step's rows when the previous step read them ahead (else they are read here);
    `read_ahead` names the next step's, which are read and collated once this step's work is queued on the GPU
    (host work the GPU does not wait for) and returned with the statistics."""
    started = time.perf_counter()
    pad_to = forward_plan(model).pad_to
    pin = rt.device.type == "cuda"
    if host is None:
        host = read_host_batch(micro_ids, dataset, pad_id, pad_to, pin)
    if host.micro_ids != micro_ids:  # the loop read ahead the wrong rows: exact resume would be lost
        raise RuntimeError(f"rank {rt.rank}: rows read ahead {host.micro_ids} are not this step's {micro_ids}")
    batches = [to_device(b, rt.device) for b in host.micro]
    layouts = [layout.to(rt.device, non_blocking=True) for layout in host.layouts]
    data_s = time.perf_counter() - started
    # The divisor of every micro-step's loss: all supervised tokens of the global batch, known before any backward.
    global_supervised = max(all_reduce_sum([host.supervised], rt.device)[0], 1.0)
    loss_sum = torch.zeros((), device=rt.device)
    for i, (batch, layout) in enumerate(zip(batches, layouts, strict=True)):
        with gradient_sync(model, enabled=i == len(batches) - 1):
            token_loss_sum, _ = forward_loss(model, batch, cfg.model.attn_implementation, layout)
            # DDP and FSDP2 average gradients over ranks; x world turns that average back into the global sum.
            (token_loss_sum * rt.world_size / global_supervised).backward()
        loss_sum += token_loss_sum.detach()
    params = [p for p in model.parameters() if p.requires_grad]
    max_norm = cfg.train.max_grad_norm if cfg.train.max_grad_norm > 0 else math.inf
    # DTensor-aware under FSDP2: the norm is over the full gradients, not this rank's shards.
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    grad_norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    lr = float(optimizer.param_groups[0]["lr"])  # what this step uses (after a resume, the schedule's at its step)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    refresh = forward_plan(model).refresh_adapters
    if refresh is not None:
        # The updated adapters copied into the frozen GEMMs now, while the GPU still runs this step: the walk over
        # the model costs the GPU nothing here, and the next forward's pre-hook finds nothing changed.
        refresh()
    # Everything above is queued on the GPU and nothing below waits for it until the loss is read: the next
    # step's rows are read now, behind the backward, instead of at the next step's start with the GPU idle
    # (4-5 ms a step of a 7B model: +1.4 % FP8, +0.9 % bf16 on the lent H100, docs/OPTIMIZATION.md).
    upcoming = read_host_batch(read_ahead, dataset, pad_id, pad_to, pin) if read_ahead is not None else None
    totals = all_reduce_sum(
        [float(loss_sum), host.padded, host.effective, host.doc_sq, host.doc_len],
        rt.device,
    )
    stats = StepStats(
        loss=totals[0] / global_supervised,
        grad_norm=float(grad_norm),
        lr=lr,
        time_s=time.perf_counter() - started,
        padded=int(totals[1]),
        effective=int(totals[2]),
        supervised=int(global_supervised),
        doc_sq=int(totals[3]),
        doc_len=int(totals[4]),
        data_s=data_s,
    )
    return stats, upcoming


def compile_step(model: nn.Module, host: HostBatch, cfg: FinetuneConfig, rt: Runtime) -> None:
    """A forward and backward of the step's first micro-batch that leaves no trace: what the first step compiles
    is compiled (or loaded from the cache) here, the gradients are dropped and the random state is put back, so
    the run trains exactly as without it (resume included)."""
    batch = to_device(host.micro[0], rt.device)
    layout = host.layouts[0].to(rt.device, non_blocking=True)
    devices = []
    if rt.device.type == "cuda":
        devices = [rt.device.index if rt.device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        loss_sum, _ = forward_loss(model, batch, cfg.model.attn_implementation, layout)
        loss_sum.backward()
    model.zero_grad(set_to_none=True)


@torch.no_grad()
def evaluate_loss(model: nn.Module, rows: Dataset, cfg: FinetuneConfig, rt: Runtime, pad_id: int) -> dict[str, Any]:
    """Token-weighted loss over the whole eval split, rows dealt round-robin to ranks."""
    model.eval()
    mine = list(range(rt.rank, len(rows), rt.world_size))
    micro = fixed_micro_batch(cfg.train)
    # Every rank runs the same number of forwards (FSDP2 gathers parameters collectively in each one);
    # a rank out of rows repeats its first row with no labels, which adds nothing to the sums.
    batches = math.ceil(math.ceil(len(rows) / rt.world_size) / micro)
    # As in the step: the rows' layout and counts from the host copy and the sum kept on the device, so the
    # forwards queue one after another and the GPU is waited for once, at the end.
    loss_sum, count = torch.zeros((), dtype=torch.float64, device=rt.device), 0
    for b in range(batches):
        chunk = [rows[i] for i in mine[b * micro : (b + 1) * micro]]
        if not chunk:
            first = rows[mine[0] if mine else 0]
            chunk = [{**first, "labels": [IGNORE_INDEX] * len(first["labels"])}]
        host = collate(chunk, pad_id, forward_plan(model).pad_to)
        layout = row_layout(host).to(rt.device, non_blocking=True)
        s, _ = forward_loss(model, to_device(host, rt.device), cfg.model.attn_implementation, layout)
        loss_sum += s.double()
        count += int(supervised_count(host["labels"]))
    model.train()
    total_loss, total_count = all_reduce_sum([float(loss_sum), count], rt.device)
    return {"loss": total_loss / max(total_count, 1.0), "tokens": int(total_count)}
