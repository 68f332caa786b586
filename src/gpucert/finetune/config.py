"""The config tree of `gpucert finetune` and `gpucert evaluate` (YAML files in configs/finetune/).

Units and meanings live in the names; every field says what it changes. `tiny.yaml` is the offline default:
a small randomly initialised Qwen2-architecture model and the bundled Glaive-format sample data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucert.runtime.config import RuntimeConfig

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class ModelConfig:
    # A hub id (Qwen/Qwen2-7B-Instruct), a local directory, or "tiny" (built from a config, nothing downloaded).
    name: str = "tiny"
    # Build the architecture from its config with random weights: speed runs without downloading weights.
    random_init: bool = False
    dtype: str = "bf16"
    # "sdpa", "flex_attention", "eager" or "flash_attention_2"; packed rows stay document-masked with each.
    attn_implementation: str = "sdpa"
    gradient_checkpointing: bool = False
    # Compute the fp32 LoRA adapters in the base dtype under autocast (bf16 matmuls, fp32 weights and
    # optimizer), instead of PEFT's upcast of every adapter input to fp32.
    autocast: bool = True
    # lm_head and cross-entropy fused and chunked, only over labelled tokens: no full-vocabulary logits.
    fused_loss: bool = True
    # torch.compile every decoder layer (fuses norms, RoPE, SwiGLU, dropout and the adapter adds); batches
    # are padded to data.max_length so shapes stay static.
    compile: bool = False


@dataclass(frozen=True)
class LoraConfig:
    r: int = 64
    alpha: int = 128
    dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: list(ALL_LINEAR))


@dataclass(frozen=True)
class DataConfig:
    # "sample" (bundled Glaive-format rows), a hub dataset id, a local .json/.jsonl/.parquet file, or
    # "synthetic": random tokens in full-length single-document rows, all labelled (throughput runs; max_rows
    # of them, 512 by default).
    source: str = "sample"
    # "glaive" (system + chat columns), "alpaca" (instruction/input/output) or "messages" (OpenAI-style + tools).
    format: str = "glaive"
    split: str = "train"
    # "qwen2.5-tools": the Hermes-style tool template shipped with gpucert; "tokenizer": the model's own.
    template: str = "qwen2.5-tools"
    max_length: int = 4096
    packing: bool = True
    # Held-out share, split by conversation (never by row of a packed sequence).
    eval_fraction: float = 0.05
    max_rows: int | None = None
    # Prepared datasets are cached here by fingerprint; put it on the shared filesystem for multi-node runs.
    cache_dir: str = ".gpucert-cache/data"
    seed: int = 1234


@dataclass(frozen=True)
class TrainConfig:
    # "auto" (DDP when more than one process, else none), "none", "ddp" or "fsdp2".
    parallel: str = "auto"
    micro_batch: int = 2
    grad_accum: int = 4
    lr: float = 2e-5
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    epochs: float = 1.0
    # Stops earlier than the epochs would; None runs the epochs.
    max_steps: int | None = None
    log_every: int = 1
    eval_every: int = 50
    save_every: int = 50
    keep_checkpoints: int = 3
    seed: int = 42
    # Success criterion for the run report: the final training loss must be below this.
    final_loss_max: float | None = None
    # Also write the adapter merged into the base weights (a full model directory).
    merge_adapter: bool = False
    # Peak dense BF16 TFLOP/s for MFU; None takes the hardware profile's.
    peak_tflops: float | None = None


@dataclass(frozen=True)
class EvalConfig:
    max_examples: int = 200
    batch_size: int = 8
    max_new_tokens: int = 256


@dataclass(frozen=True)
class FinetuneConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # Run directory; None: runs/<timestamp>-finetune.
    output_dir: str | None = None
    # "none", "auto" (rank 0 picks the latest complete checkpoint in output_dir; every rank loads that one), or a
    # checkpoint directory.
    resume: str = "none"
    # A checkpoint remembers the fingerprint of the prepared data it trained on; resuming over other data
    # (another source file, template, max_length...) is an error unless this is true.
    resume_allow_data_change: bool = False
    # Timeouts of the multi-process job: rendezvous, collectives, heartbeats (runtime.heartbeat_timeout_s...).
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
