"""The config tree of `gpucert finetune` and `gpucert evaluate` (YAML files in configs/finetune/).

Units and meanings live in the names; every field says what it changes. `tiny.yaml` is the offline default:
a small randomly initialised Qwen2-architecture model and the bundled Glaive-format sample data.

A recipe is a YAML shipped in gpucert.configs/finetune/, named by its stem (`--config qwen2-7b-glaive`) or given
as a path (`resolve_recipe`, `recipe_lines` for `gpucert finetune --list-recipes`). Nothing here imports torch,
transformers or datasets: the CLI checks --config, --set and a local data file with this module alone, in well
under a second, before the modules that train or evaluate are imported.

Every value is checked when the config is loaded (`load_finetune_config`), before a run directory, a data
cache entry or a model exists: a bad one is a ConfigError (exit 3) naming the key, the rule and where the
value came from, e.g. `--set train.micro_batch=0: train.micro_batch must be >= 1, found 0`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Literal

from gpucert.config.loader import ConfigError, also_wrong, blame_sources, in_file_order, load_config, salvage
from gpucert.runtime.config import RuntimeConfig

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# The values the code accepts, kept here so a config is judged without importing torch; the modules that act on
# them hold the same lists (model.DTYPES, model.ATTN_IMPLEMENTATIONS, parallel.MODES, formats.FORMATS,
# template.SHIPPED_TEMPLATES), and tests/finetune/test_config_validation.py checks that they agree.
DTYPES = ("bf16", "fp16", "fp32")
# model.precision: how the frozen base weights of the decoder layers compute (finetune/model/fp8.py).
PRECISIONS = ("bf16", "fp8")
ATTN_IMPLEMENTATIONS = ("sdpa", "flex_attention", "eager", "flash_attention_2", "flash_attention_3", "varlen")
PARALLEL_MODES = ("auto", "none", "ddp", "fsdp2")
FORMATS = ("glaive", "alpaca", "messages")
TEMPLATES = ("qwen2.5-tools", "alpaca", "tokenizer")
# data.source "synthetic" makes max_rows rows, this many when max_rows is unset (prepare.SYNTHETIC_ROWS).
SYNTHETIC_ROWS = 512
# The first token of every document has no label: a row needs two tokens to train on anything.
MIN_MAX_LENGTH = 2
# numpy's seed range (np.random.seed refuses anything else).
SEED_MAX = 2**32 - 1


def _rule(ok: bool, key: str, rule: str, value: object) -> list[str]:
    """[] when ok, else the one message "<key> must be <rule>, found <value>"."""
    return [] if ok else [f"{key} must be {rule}, found {value!r}"]


def _at_least_1(section: str, config: object, names: Sequence[str]) -> list[str]:
    return [
        m
        for name in names
        for m in _rule(getattr(config, name) >= 1, f"{section}.{name}", ">= 1", getattr(config, name))
    ]


def _positive(key: str, value: float) -> list[str]:
    return _rule(value > 0 and math.isfinite(value), key, "a finite number > 0", value)


def _fraction(key: str, value: float) -> list[str]:
    return _rule(0 <= value < 1, key, "in [0, 1)", value)


def _one_of(key: str, value: str, allowed: Sequence[str]) -> list[str]:
    return _rule(value in allowed, key, f"one of {', '.join(allowed)}", value)


def _named(key: str, value: str, what: str) -> list[str]:
    return _rule(bool(value.strip()), key, what, value)


def _seed(key: str, value: int) -> list[str]:
    return _rule(0 <= value <= SEED_MAX, key, f"in 0..{SEED_MAX}", value)


@dataclass(frozen=True)
class ModelConfig:
    # A hub id (Qwen/Qwen2-7B-Instruct), a local directory, or "tiny" (built from a config, nothing downloaded).
    name: str = "tiny"
    # Build the architecture from its config with random weights: speed runs without downloading weights.
    random_init: bool = False
    dtype: str = "bf16"
    # "sdpa", "flex_attention", "eager", "flash_attention_2", "flash_attention_3" (FlashAttention-3, Hopper
    # only, its package installed) or "varlen" (torch's own variable-length FlashAttention-2 kernels, torch >=
    # 2.10, CUDA); packed rows stay document-masked with each.
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
    # With compile on a GPU: inductor tunes the block sizes of the compiled kernels by coordinate descent (its
    # coordinate_descent_tuning). "auto": off. In bf16 it bought at most about 1 % while it was most of a cold
    # compile (27 of 46 s for r16, 81 of 119 s for the speed recipe); in FP8, since the MLP's quantizing SwiGLU
    # runs in kernels of our own, 0.0-0.4 % for 53-98 s more compile on an empty cache (docs/OPTIMIZATION.md,
    # "FP8 without inductor's tuning"). true turns it on, for a run of hours that may gain that 1 %.
    compile_tuning: bool | Literal["auto"] = "auto"
    # "fp8": the frozen base weights of the decoder layers quantized once to float8 (per-row scales) and their
    # matmuls run on the FP8 tensor cores (finetune/model/fp8.py); needs dtype bf16 and a GPU of compute capability
    # >= 8.9, checked when the model loads. "bf16": the weights as loaded. Adapters stay fp32 either way.
    precision: str = "bf16"
    # With precision fp8 and the fused loss: the frozen lm_head's two matmuls (logits, and the hidden states'
    # gradient) in FP8 as well (loss.py); false keeps the head bf16. A head tied to the embeddings stays bf16.
    fp8_head: bool = True
    # Projections that share an input run as one (finetune/model/fused.py): q/k/v a single stacked frozen GEMM, and
    # without LoRA dropout q/k/v and gate/up each a single adapter down-projection. PEFT's formula (not bit for
    # bit: sums in another order), less memory traffic.
    fuse_projections: bool = True
    # With fused projections, bf16 and no LoRA dropout: each group's adapters computed inside its frozen GEMM
    # ([x | xA] @ [W | s B]^T, finetune/model/fused.py), not as separate products added after it, and o_proj's and
    # down_proj's A as extra rows of theirs (x @ [W; A]^T). Off under FSDP2 and FP8.
    adapters_in_gemm: bool = True
    # With the adapters in the frozen GEMMs, gate/up/down all adapted and r <= 16: each SwiGLU MLP one function whose
    # backward runs one Triton kernel for the SwiGLU backward and gate's, up's and down_proj's rank-r weight
    # gradients (finetune/model/kernels/swiglu.py), and whose forward keeps no silu(gate) * up. In fp8 (adapters
    # beside the frozen GEMMs, one A for gate/up, no dropout, not FSDP2): the MLP one function whose SwiGLU, rank-r
    # products and FP8 quantizations run as Triton kernels between its FP8 GEMMs (finetune/model/fp8_mlp.py).
    fuse_mlp: bool = True

    def problems(self) -> list[str]:
        return [
            *_named("model.name", self.name, 'a hub id, a local directory or "tiny"'),
            *_one_of("model.dtype", self.dtype, DTYPES),
            *_one_of("model.attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS),
            *_one_of("model.precision", self.precision, PRECISIONS),
            *_rule(
                self.precision != "fp8" or self.dtype == "bf16",
                "model.dtype",
                "bf16 with model.precision fp8",
                self.dtype,
            ),
        ]


@dataclass(frozen=True)
class LoraConfig:
    r: int = 64
    alpha: int = 128
    dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: list(ALL_LINEAR))

    def problems(self) -> list[str]:
        return [
            *_rule(self.r >= 1, "lora.r", ">= 1", self.r),
            *_rule(self.alpha > 0, "lora.alpha", "> 0", self.alpha),
            *_fraction("lora.dropout", self.dropout),
            *_rule(
                bool(self.target_modules) and all(m.strip() for m in self.target_modules),
                "lora.target_modules",
                "a non-empty list of module names (e.g. [q_proj, v_proj])",
                self.target_modules,
            ),
        ]


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
    # Held-out share, split by conversation (never by row of a packed sequence); in (0, 1): training evaluates
    # on it and `gpucert evaluate` generates from it, so it cannot be empty.
    eval_fraction: float = 0.05
    max_rows: int | None = None
    # Lines of a local JSON/JSONL source that are not a JSON object are skipped and counted; above this share of
    # the file's lines preparation stops (exit 3) naming the file and the first bad lines. 0 refuses any.
    max_bad_row_share: float = 0.01
    # Prepared datasets are cached here by fingerprint; put it on the shared filesystem for multi-node runs.
    cache_dir: str = ".gpucert-cache/data"
    seed: int = 1234
    # How long a process waits for another that is preparing the same data (its lock in cache_dir) before it
    # stops, naming that process (exit 3). A 7B recipe's Glaive preparation takes minutes; a hung one never ends.
    lock_timeout_s: float = 1800.0

    def problems(self) -> list[str]:
        found = [
            *_named("data.source", self.source, 'a hub dataset id, a local file, "sample" or "synthetic"'),
            *_one_of("data.format", self.format, FORMATS),
            *_named("data.split", self.split, "a split name (e.g. train)"),
            *_one_of("data.template", self.template, TEMPLATES),
            *_rule(self.max_length >= MIN_MAX_LENGTH, "data.max_length", f">= {MIN_MAX_LENGTH}", self.max_length),
            *_rule(
                0 < self.eval_fraction < 1,
                "data.eval_fraction",
                "in (0, 1): training and `gpucert evaluate` need a held-out split",
                self.eval_fraction,
            ),
            *_rule(self.max_rows is None or self.max_rows >= 1, "data.max_rows", "null or >= 1", self.max_rows),
            *_rule(0 <= self.max_bad_row_share <= 1, "data.max_bad_row_share", "in [0, 1]", self.max_bad_row_share),
            *_named("data.cache_dir", self.cache_dir, "a directory"),
            *_seed("data.seed", self.seed),
            *_rule(self.lock_timeout_s > 0, "data.lock_timeout_s", "> 0 (seconds)", self.lock_timeout_s),
        ]
        if self.source == "synthetic" and 0 < self.eval_fraction < 1 and (self.max_rows is None or self.max_rows >= 1):
            # Synthetic rows are split by count: both splits need at least one row.
            total = self.max_rows or SYNTHETIC_ROWS
            held = round(self.eval_fraction * total)
            if not 1 <= held < total:
                found.append(
                    f"data.eval_fraction x data.max_rows must leave at least one synthetic row in each split, "
                    f"found {self.eval_fraction} x {total} rows = {held} held out; raise data.max_rows or change "
                    "data.eval_fraction"
                )
        return found


@dataclass(frozen=True)
class TrainConfig:
    # "auto" (DDP when more than one process, else none), "none", "ddp" or "fsdp2".
    parallel: str = "auto"
    # Rows per forward/backward on each process, or "auto": the largest up to micro_batch_max that an estimate of
    # the step's peak memory fits into the GPU's free memory, without activation checkpointing if any fits, else
    # with it (finetune/train/memory_plan.py; 1 on a CPU). The plan is printed and recorded beside the measured peak.
    # grad_accum stays as given, so the global batch follows the micro-batch chosen.
    micro_batch: int | str = 2
    # The largest micro-batch micro_batch auto may choose.
    micro_batch_max: int = 4
    grad_accum: int = 4
    lr: float = 2e-5
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    # 0 turns gradient clipping off.
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
    # With model.compile: torch.compile's caches (inductor's compiled graphs, tuned block sizes, Triton kernels)
    # live here, so later runs and every rank of a job load the compile work instead of redoing it
    # (finetune/train/compile_cache.py); put it on a shared filesystem for multi-node jobs. None:
    # $TORCHINDUCTOR_CACHE_DIR when set, else the per-user ~/.cache/gpucert/compile ($XDG_CACHE_HOME/gpucert/compile).
    compile_cache_dir: str | None = None

    def problems(self) -> list[str]:
        return [
            *_one_of("train.parallel", self.parallel, PARALLEL_MODES),
            *(
                _rule(self.micro_batch >= 1, "train.micro_batch", ">= 1", self.micro_batch)
                if isinstance(self.micro_batch, int)
                else _rule(self.micro_batch == "auto", "train.micro_batch", 'a number >= 1 or "auto"', self.micro_batch)
            ),
            *_at_least_1(
                "train",
                self,
                ("micro_batch_max", "grad_accum", "log_every", "eval_every", "save_every", "keep_checkpoints"),
            ),
            *_positive("train.lr", self.lr),
            *_fraction("train.warmup_ratio", self.warmup_ratio),
            *_rule(0 <= self.weight_decay < math.inf, "train.weight_decay", ">= 0", self.weight_decay),
            *_rule(self.max_grad_norm >= 0, "train.max_grad_norm", ">= 0 (0 turns clipping off)", self.max_grad_norm),
            *_positive("train.epochs", self.epochs),
            *_rule(self.max_steps is None or self.max_steps >= 1, "train.max_steps", "null or >= 1", self.max_steps),
            *_seed("train.seed", self.seed),
            *(_positive("train.final_loss_max", self.final_loss_max) if self.final_loss_max is not None else []),
            *(_positive("train.peak_tflops", self.peak_tflops) if self.peak_tflops is not None else []),
        ]


@dataclass(frozen=True)
class EvalThresholds:
    """What `gpucert evaluate` holds its results to: a floor in % of the turns each metric counts (see
    gpucert.finetune.eval.report), and a ceiling on the held-out loss. null: the metric is shown as INFO, not
    judged. A recipe that sets one says where the number comes from."""

    call_accuracy_min_pct: float | None = None
    relevance_min_pct: float | None = None
    irrelevance_min_pct: float | None = None
    name_accuracy_min_pct: float | None = None
    args_valid_json_min_pct: float | None = None
    args_match_min_pct: float | None = None
    overall_min_pct: float | None = None
    # Mean cross-entropy per supervised held-out token, nats.
    loss_max: float | None = None
    # `gpucert evaluate --suite bfcl`: % of a BFCL category's entries fully right (finetune/eval/bfcl.py), and the
    # unweighted mean of the categories evaluated.
    bfcl_simple_min_pct: float | None = None
    bfcl_multiple_min_pct: float | None = None
    bfcl_parallel_min_pct: float | None = None
    bfcl_parallel_multiple_min_pct: float | None = None
    bfcl_irrelevance_min_pct: float | None = None
    bfcl_live_simple_min_pct: float | None = None
    bfcl_live_multiple_min_pct: float | None = None
    bfcl_live_parallel_min_pct: float | None = None
    bfcl_live_parallel_multiple_min_pct: float | None = None
    bfcl_live_irrelevance_min_pct: float | None = None
    bfcl_overall_min_pct: float | None = None

    def problems(self) -> list[str]:
        found = []
        for name in (f.name for f in dataclasses.fields(self) if f.name.endswith("_min_pct")):
            value = getattr(self, name)
            if value is not None:
                found += _rule(0 <= value <= 100, f"eval.thresholds.{name}", "null or in [0, 100]", value)
        return found + (_positive("eval.thresholds.loss_max", self.loss_max) if self.loss_max is not None else [])


@dataclass(frozen=True)
class EvalConfig:
    max_examples: int = 200
    batch_size: int = 8
    max_new_tokens: int = 256
    thresholds: EvalThresholds = field(default_factory=EvalThresholds)

    def problems(self) -> list[str]:
        return [
            *_at_least_1("eval", self, ("max_examples", "batch_size", "max_new_tokens")),
            *self.thresholds.problems(),
        ]


# The largest LoRA rank the fused MLP takes (finetune/model/kernels/swiglu.py): each of its programs keeps three fp32
# accumulators of max(16, r) x 128 in registers, 48 a thread at r16, the rank measured on the lent H100; from r64
# (192 a thread) they would spill. Larger ranks keep the unfused MLP.
FUSED_MLP_MAX_RANK = 16


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

    def problems(self) -> list[str]:
        """Every value the code cannot run with, as "<section>.<key> must be ..., found X" messages."""
        return [
            *self.model.problems(),
            *self.lora.problems(),
            *self.data.problems(),
            *self.train.problems(),
            *self.eval.problems(),
            *_rule(
                self.output_dir is None or bool(self.output_dir.strip()),
                "output_dir",
                "null or a directory",
                self.output_dir,
            ),
            *_named("resume", self.resume, "none, auto or a checkpoint directory"),
            *self.runtime.problems(),
            *_rule(
                self.model.precision != "fp8" or self.train.parallel != "fsdp2",
                "train.parallel",
                "auto, none or ddp with model.precision fp8 (FSDP2 would gather the float8 weights as bf16)",
                self.train.parallel,
            ),
        ]

    def path_problems(self) -> list[str]:
        """What the filesystem says about output_dir and resume, for training (evaluate uses neither)."""
        found = []
        if self.output_dir and Path(self.output_dir).exists() and not Path(self.output_dir).is_dir():
            found.append(f"output_dir must be a directory, found {self.output_dir!r}, which is a file")
        if self.resume not in ("none", "auto") and not Path(self.resume).is_dir():
            found.append(
                f"resume must be none, auto or a checkpoint directory, found {self.resume!r} (no such directory)"
            )
        elif self.resume not in ("none", "auto"):
            found += _not_a_checkpoint(Path(self.resume))
        if self.resume == "auto" and not self.output_dir:
            # Without it each run makes a new runs/<time>-finetune, where auto never finds a checkpoint.
            found.append(
                "resume auto needs output_dir (--output DIR, the run directory to continue): without it every run "
                "starts in a new directory under runs/ and has nothing to resume"
            )
        return found


def _not_a_checkpoint(path: Path) -> list[str]:
    """A --resume directory that is a run directory or its checkpoints/ (a checkpoint is <run>/checkpoints/step-N):
    said before any worker starts, with the path to give, where the rank said "no COMPLETE marker: its write did
    not finish" after loading the model."""
    places = [p for p in (path / "checkpoints", path) if p.is_dir()]
    steps = [p for place in places for p in place.iterdir() if re.fullmatch(r"step-\d+", p.name)]
    steps.sort(key=lambda p: int(p.name.split("-")[1]))
    if (path / "checkpoints").is_dir() or (path.name == "checkpoints" and steps):
        run = path.parent if path.name == "checkpoints" else path
        newest = f" ({steps[-1]} is the newest)" if steps else ""
        return [
            f"resume {str(path)!r} is a run's {'checkpoints directory' if path.name == 'checkpoints' else 'directory'},"
            f" not a checkpoint: give one of its checkpoints, {run}/checkpoints/step-N{newest}, or --output {run} "
            "--resume auto for its newest complete one"
        ]
    return []


def load_finetune_config(
    path: Path | None, overrides: Sequence[str] = (), training: bool = False, flags: Mapping[str, str] | None = None
) -> FinetuneConfig:
    """The config of path (None: the defaults) < overrides, refused as a whole (ConfigError) when any value is bad.

    Each message names where its keys' values came from (config.loader.blame_sources): the last `--set` of a key,
    or the command-line flag that overrides gave it (`flags`: an override -> what the user typed, e.g.
    "resume=\"x\"" -> "--resume x"), else the file that sets it. `training` adds the checks of output_dir and
    resume against the filesystem.
    """

    def problems_of(cfg: FinetuneConfig, used: Sequence[str]) -> list[str]:
        cfg = _model_beside_recipe(cfg, path, used)
        return cfg.problems() + (cfg.path_problems() if training else [])

    def blame(found: list[str], used: Sequence[str]) -> list[str]:
        return blame_sources(found, path, used, flags=flags, top_keys=TOP_KEYS)

    try:
        cfg = load_config(FinetuneConfig, path, overrides)
    except ConfigError as exc:  # wrong types: said with the ranges of what was right, all at once
        more = also_wrong(salvage(FinetuneConfig, path, overrides, exc), problems_of, blame)
        raise ConfigError(problems=in_file_order(exc.problems + more, path)) from None
    found = problems_of(cfg, overrides)
    if found:
        raise ConfigError(problems=in_file_order(blame(found, overrides), path))
    return _model_beside_recipe(cfg, path, overrides)


def _model_beside_recipe(cfg: FinetuneConfig, path: Path | None, overrides: Sequence[str]) -> FinetuneConfig:
    """A relative model.name that a config file sets is read beside that file, as a shipped recipe's
    `models/qwen2-7b` (an architecture's config.json shipped with gpucert) must be from any directory; a
    --set model.name, or a path that exists from here, is the user's own."""
    name = cfg.model.name
    if path is None or any(o.split("=", 1)[0].strip() in ("model", "model.name") for o in overrides):
        return cfg
    if Path(name).is_absolute() or Path(name).exists() or not (Path(path).parent / name).is_dir():
        return cfg
    return dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, name=str((Path(path).parent / name).absolute()))
    )


# FinetuneConfig's keys outside any section (output_dir, resume, ...): the sections are built by a factory.
TOP_KEYS = tuple(f.name for f in fields(FinetuneConfig) if f.default is not MISSING)


# The recipe `gpucert finetune` runs without --config.
DEFAULT_RECIPE = "tiny"
# data.source suffixes read as a local file (formats.LOCAL_BUILDERS holds the same keys).
LOCAL_DATA_SUFFIXES = (".json", ".jsonl", ".parquet")
# Suffixes of data files gpucert does not read: such a name is a local file (named when missing), not a hub id.
OTHER_DATA_SUFFIXES = (".csv", ".tsv", ".txt", ".arrow", ".gz", ".bz2", ".xz", ".zst", ".zip", ".xlsx", ".yaml", ".yml")


def recipe_dir() -> Path:
    """configs/finetune/ of a checkout, gpucert/configs/finetune/ of an installed wheel."""
    return Path(str(resources.files("gpucert.configs").joinpath("finetune")))


def recipe_names() -> list[str]:
    return sorted(p.stem for p in recipe_dir().glob("*.yaml"))


def recipe_summary(path: Path) -> str:
    """The recipe's opening comment, its first sentence: what it trains on what."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    text = " ".join(lines)
    return text.split(". ", 1)[0].rstrip(".") if text else ""


def recipe_lines() -> list[str]:
    """One line per shipped recipe: name, summary, and the file, for `gpucert finetune --list-recipes`."""
    directory = recipe_dir()
    return [
        f"{name}: {recipe_summary(directory / f'{name}.yaml')} ({directory / f'{name}.yaml'})"
        for name in recipe_names()
    ]


def resolve_recipe(given: str | os.PathLike[str] | None) -> Path:
    """The file --config means: an existing file as given, else a shipped recipe of that name (`qwen2-7b-glaive`
    or `qwen2-7b-glaive.yaml`), None the default recipe. A ConfigError naming the path and listing the recipes
    otherwise."""
    if given is None:
        return recipe_dir() / f"{DEFAULT_RECIPE}.yaml"
    name = os.fspath(given)
    path = Path(name).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise ConfigError(f"--config {name}: is a directory; expected a finetune YAML file or a recipe name")
    stem = name[: -len(path.suffix)] if path.suffix in (".yaml", ".yml") else name
    # A bare name only: a path with a directory in it means that file, never a shipped recipe.
    if os.sep not in stem and "/" not in stem and (recipe_dir() / f"{stem}.yaml").is_file():
        return recipe_dir() / f"{stem}.yaml"
    relative = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
    raise ConfigError(
        f"--config {name}: no such file{relative} and no recipe of that name; recipes shipped with gpucert: "
        f"{', '.join(recipe_names())} (gpucert finetune --list-recipes says what each trains)"
    )


def looks_like_path(name: str) -> bool:
    """A name no hub id can be: absolute, relative to . or ~, or with more than one '/'."""
    return name.startswith(("/", "./", "../", "~")) or name in (".", "..") or name.count("/") > 1


def local_data_problem(data: DataConfig) -> str | None:
    """Why data.source, a local file (a path, or a name with a file suffix), cannot be read, or None: a hub
    dataset id, "sample" and "synthetic" are left to preparation."""
    if data.source in ("sample", "synthetic"):
        return None
    path = Path(data.source).expanduser()
    suffix = path.suffix.lower()
    expected = 'expected a local .json/.jsonl/.parquet file, "sample", "synthetic" or a hub dataset id'
    if path.is_dir():
        return f"data.source {data.source}: is a directory; expected a .json, .jsonl or .parquet file"
    if path.is_file():
        if suffix in OTHER_DATA_SUFFIXES:
            return (
                f"data.source {data.source}: {suffix} files are not read; convert it to JSON Lines (.jsonl) or Parquet"
            )
        return None
    if suffix not in LOCAL_DATA_SUFFIXES and suffix not in OTHER_DATA_SUFFIXES and not looks_like_path(data.source):
        return None  # a hub dataset id (namespace/name)
    relative = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
    return f"data.source {data.source}: no such file{relative}; {expected}"


def check_data_source(data: DataConfig) -> None:
    """Refuse, before any model or tokenizer is loaded, a local data file that is not there."""
    problem = local_data_problem(data)
    if problem:
        raise ConfigError(problem)
