"""Where a 7B model's load goes on a GPU: `python tools/model_load_time.py RECIPE [--set k=v ...]` loads the
recipe's model with its adapters on cuda:0 through `finetune.model.lora.load_model`, twice in one process (the
first pays CUDA's start), timing its phases; then wraps a fresh base model with PEFT's adapters both ways, built on
the CPU (PEFT's default, what load_model did before 2026-11-28) and under the GPU as default device (what it does
now), profiling the CPU one; then loads a saved adapter (`gpucert evaluate`'s load) both ways,
`PeftModel.from_pretrained` as is and `lora.saved_adapter_on`. Issue 31: the Mistral recipe's model load took 7.4 s
of a 23.6 s warm start on an H200 (2026-11-28)."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel

import gpucert.finetune.model.lora as lora
from gpucert.finetune.config import load_finetune_config
from gpucert.finetune.data.tokenizer import load_tokenizer


def timed(name: str, phases: dict[str, float]) -> None:
    orig = getattr(lora, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        result = orig(*args, **kwargs)
        torch.cuda.synchronize()
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
        return result

    setattr(lora, name, wrapper)


def main(argv: list[str]) -> int:
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    cfg = load_finetune_config(Path(argv[0]), overrides)
    tokenizer = load_tokenizer(cfg.model, cfg.data)
    device = torch.device("cuda:0")
    saved = Path(tempfile.mkdtemp()) / "adapter"
    phases: dict[str, float] = {}
    for name in ("load_base_model", "get_peft_model", "fuse_projections", "defer_head"):
        timed(name, phases)
    for attempt in (1, 2):
        phases.clear()
        t = time.perf_counter()
        model, _ = lora.load_model(cfg.model, cfg.lora, tokenizer, device, cfg.data.max_length)
        torch.cuda.synchronize()
        if attempt == 1:
            model.save_pretrained(str(saved))
        shown = " ".join(f"{k} {v:.2f}" for k, v in phases.items())
        print(f"{argv[0]} load_model {attempt}: {time.perf_counter() - t:.2f} s ({shown})", flush=True)
        del model
        torch.cuda.empty_cache()
    peft_config = PeftLoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                                 target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")  # fmt: skip
    for where in ("cpu", "cuda"):
        base = lora.load_base_model(cfg.model, len(tokenizer), device)
        profile = cProfile.Profile()
        t = time.perf_counter()
        with lora.quiet_peft(), torch.device(where):
            if where == "cpu":
                profile.enable()
            model = lora.get_peft_model(base, peft_config)
            profile.disable()
        torch.cuda.synchronize()
        print(f"get_peft_model, adapters built on {where}: {time.perf_counter() - t:.2f} s", flush=True)
        if where == "cpu":
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
            print(text.getvalue())
        del model, base
        torch.cuda.empty_cache()
    for how in ("PeftModel.from_pretrained", "saved_adapter_on"):
        base = lora.load_base_model(cfg.model, len(tokenizer), device)
        t = time.perf_counter()
        if how == "saved_adapter_on":
            model = lora.saved_adapter_on(base, saved)
        else:
            model = PeftModel.from_pretrained(base, str(saved))
        torch.cuda.synchronize()
        print(f"saved adapter through {how}: {time.perf_counter() - t:.2f} s", flush=True)
        del model, base
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
