"""What `gpucert finetune`, `gpucert finetune prepare` and `gpucert evaluate` do, called from gpucert.cli.

gpucert finetune                                   offline default: configs/finetune/tiny.yaml
gpucert finetune --config configs/finetune/qwen2-7b-glaive.yaml
torchrun --nproc_per_node=8 -m gpucert finetune --config ...       DDP or FSDP2 from train.parallel
gpucert finetune prepare --config ...              data preparation alone (once per cluster)
gpucert evaluate --adapter runs/<id>/adapter [--config ...]       function-calling accuracy
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from gpucert.finetune.config import FinetuneConfig, load_finetune_config


def default_config_path() -> Path:
    return Path(str(resources.files("gpucert.configs").joinpath("finetune/tiny.yaml")))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="finetune YAML (default: the offline tiny recipe)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. --set train.max_steps=10 (repeatable)",
    )


def load(args: argparse.Namespace, extra: list[str] | None = None, training: bool = False) -> FinetuneConfig:
    """The checked config: a bad value is a ConfigError (exit 3) before any directory, cache entry or model."""
    return load_finetune_config(args.config or default_config_path(), [*args.overrides, *(extra or [])], training)


def finetune(args: argparse.Namespace) -> int:
    from gpucert.finetune.train import finetune_exit_code

    # json.dumps quotes the value, so YAML reads a path like 2026-01-01 or a word like "on" as a string.
    extra = [f"resume={json.dumps(args.resume)}"] if args.resume else []
    extra += [f"output_dir={json.dumps(str(args.output))}"] if args.output else []
    cfg = load(args, extra, training=args.stage != "prepare")
    if args.stage == "prepare":
        return prepare(cfg)
    return finetune_exit_code(cfg)


def prepare(cfg: FinetuneConfig) -> int:
    """Tokenize, mask, split and pack once; every later run with the same fingerprint reuses the cache."""
    from gpucert.finetune.prepare import prepare_dataset, report_lines
    from gpucert.finetune.tokenizer import load_tokenizer

    prepared = prepare_dataset(cfg, load_tokenizer(cfg.model, cfg.data))
    print(f"{'prepared' if prepared.built else 'reused'} {prepared.path} (fingerprint {prepared.fingerprint[:12]})")
    print("\n".join(report_lines(prepared.stats)))
    return 0


def evaluate(args: argparse.Namespace) -> int:
    """Generate on the held-out split with the adapter and score the function calls."""
    import torch
    from peft import PeftModel

    from gpucert.finetune.evaluate import evaluate as run_eval
    from gpucert.finetune.evaluate import scores_to_results
    from gpucert.finetune.model import load_base_model
    from gpucert.finetune.packing import collate
    from gpucert.finetune.prepare import load_eval_conversations, prepare_dataset
    from gpucert.finetune.tokenizer import load_tokenizer
    from gpucert.status import worst

    cfg = load(args, [f"data.source={json.dumps(args.data)}"] if args.data else [])
    tokenizer = load_tokenizer(cfg.model, cfg.data)
    prepared = prepare_dataset(cfg, tokenizer)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = load_base_model(cfg.model, len(tokenizer), device)
    model = PeftModel.from_pretrained(base, str(args.adapter)).eval()
    conversations = [c.to_json() for c in load_eval_conversations(prepared.path)]
    pad = tokenizer.pad_token_id
    rows = list(prepared.eval)
    batches = [
        {k: v.to(device) for k, v in collate(rows[i : i + cfg.eval.batch_size], pad).items()}
        for i in range(0, len(rows), cfg.eval.batch_size)
    ]
    with torch.no_grad():
        scores, loss = run_eval(
            model, tokenizer, conversations, cfg.eval, loss_batches=batches, attn_impl=cfg.model.attn_implementation
        )
    results = scores_to_results(scores)
    for r in results:
        print(
            f"{r.status.value:5} {r.name:20} {r.value if r.value is not None else '-':>8} {r.unit or ''}  {r.message}"
        )
    print(f"eval loss {loss:.4f}" if loss is not None else "eval loss: no supervised tokens")
    summary: dict[str, Any] = {
        "adapter": str(args.adapter),
        "eval_loss": loss,
        "results": [r.to_dict() for r in results],
        "counts": scores.counts,
    }
    out = Path(args.output) if args.output else Path(args.adapter).parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"written: {out / 'evaluation.json'}", file=sys.stderr)
    return worst(r.status for r in results).exit_code
