"""The training loop on CPU: the data order and schedule as pure functions, then one tiny single-process run
(falling loss, metrics.json, report.json in the report schema, an adapter PEFT reloads with the trained outputs)."""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from jsonschema import Draft202012Validator
from peft import PeftModel
from safetensors.torch import load_file

import gpucert.report
from gpucert.finetune.config import DataConfig, FinetuneConfig, LoraConfig, ModelConfig, TrainConfig
from gpucert.finetune.data.packing import collate
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.model.fused import AInGemmLoraLinear, FusedProjections
from gpucert.finetune.model.lora import forward_loss, load_base_model, load_model
from gpucert.finetune.train import loop as train_module
from gpucert.finetune.train.checkpoint import find_latest, save_adapter
from gpucert.finetune.train.run import main, run_finetune
from gpucert.finetune.train.step import epoch_order, lr_factor, plan_steps, rank_micro_batches
from gpucert.finetune.train.summary import data_time_share
from gpucert.runtime.group import start_runtime, stop_runtime

SCHEMA = json.loads((Path(gpucert.report.__file__).parent / "report.schema.json").read_text())
REPORT_RESULTS = [
    "final_loss",
    "checkpoint_present",
    "no_oom",
    "steps",
    "eval_loss",
    "tokens_per_s_per_gpu",
    "mfu",
    "time_to_first_step",
    "peak_memory_gib",
    "peak_rss_gib",
    "train.memory_plan",
    "data.preparation",
]

METRICS_KEYS = {
    "schema",
    "status",
    "criteria",
    "wall_time_s",
    "train_time_s",
    "data_time_share",
    "step_time_s",
    "world_size",
    "parallel",
    "device",
    "versions",
    "model",
    "dataset",
    "config",
    "steps",
    "resumed_from",
    "timed_steps",
    "tokens",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "t_eff",
    "flops_per_token",
    "flops_formula",
    "peak_tflops",
    "peak_source",
    "mfu",
    "hfu",
    "peak_memory_gib",
    "peak_memory_reserved_gib",
    "peak_rss_gib",
    "final_loss",
    "loss_history",
    "eval_losses",
    "final_eval_loss",
    "step_log",
    "oom",
    "memory_plan",
    "plan",
    "outputs",
    "time_to_first_step_s",
    "first_step_s",
    "first_step_setup_s",
    "compile",
}


def tiny_run(tmp_path: Path, **train: object) -> FinetuneConfig:
    """The tiny recipe, shortened: 256-token rows, 16 steps, data cached under tmp_path."""
    return FinetuneConfig(
        model=ModelConfig(name="tiny", dtype="fp32", attn_implementation="sdpa"),
        lora=LoraConfig(r=8, alpha=16, dropout=0.0),
        data=DataConfig(max_length=256, eval_fraction=0.1, cache_dir=str(tmp_path / "cache")),
        train=replace(
            TrainConfig(micro_batch=2, grad_accum=2, lr=1e-2, warmup_ratio=0.1, max_steps=16),
            eval_every=8,
            save_every=8,
            keep_checkpoints=2,
            final_loss_max=7.5,
            **train,  # type: ignore[arg-type]
        ),
        output_dir=str(tmp_path / "run"),
    )


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch):
    """A lone rank (pytest may run under a launcher): RANK=0 of WORLD_SIZE=1, no rendezvous."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_PORT", raising=False)


# --- Pure parts -------------------------------------------------------------------------------------------


def test_plan_steps() -> None:
    assert plan_steps(100, 8, 1.0, None) == (12, 12)
    assert plan_steps(100, 8, 2.5, None) == (12, 30)
    assert plan_steps(100, 8, 2.5, 7) == (12, 7)
    with pytest.raises(ValueError, match="fewer than one global batch of 16"):
        plan_steps(10, 16, 1.0, None)


def test_epoch_order_is_a_function_of_seed_and_epoch() -> None:
    assert epoch_order(50, 42, 0) == epoch_order(50, 42, 0)
    assert epoch_order(50, 42, 0) != epoch_order(50, 42, 1)
    assert sorted(epoch_order(50, 42, 3)) == list(range(50))


def test_ranks_split_a_global_batch_like_one_process_does() -> None:
    rows = list(range(100, 108))
    one = rank_micro_batches(rows, 0, micro_batch=2, grad_accum=4)
    two = [rank_micro_batches(rows, r, micro_batch=2, grad_accum=2) for r in range(2)]
    assert one == [[100, 101], [102, 103], [104, 105], [106, 107]]
    assert two == [[[100, 101], [102, 103]], [[104, 105], [106, 107]]]


def test_data_time_share_counts_only_steps_that_timed_their_data() -> None:
    old = {"step_time_s": 1.0}  # logged by a run before data_s existed, then resumed
    new = [{"step_time_s": 2.0, "data_s": 0.02}, {"step_time_s": 2.0, "data_s": 0.04}]
    assert data_time_share([old, *new]) == pytest.approx(0.015)
    assert data_time_share([old]) is None


def test_lr_warms_up_linearly_then_decays_by_cosine() -> None:
    factors = [lr_factor(s, total=10, warmup=2) for s in range(10)]
    assert factors[:3] == [0.5, 1.0, 1.0]
    assert factors[6] == pytest.approx(0.5 * (1 + math.cos(math.pi * 4 / 8)))
    assert all(a >= b for a, b in itertools.pairwise(factors[1:]))
    assert lr_factor(0, total=10, warmup=0) == 1.0


def test_config_errors_exit_3(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("train: {micro_batchh: 2}\n")
    assert main([str(tmp_path / "bad.yaml")]) == 3


# --- A run ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_run_learns_and_reports(tmp_path: Path, single_process: None) -> None:
    cfg = tiny_run(tmp_path)
    result = run_finetune(cfg)
    run = Path(cfg.output_dir or "")

    written = json.loads((run / "metrics.json").read_text())
    assert written == json.loads(json.dumps(result))
    assert set(written) == METRICS_KEYS
    losses = written["loss_history"]
    assert len(losses) == written["steps"] == 16
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.5, losses
    assert written["status"] == "PASS", written["criteria"]
    assert [c["name"] for c in written["criteria"]] == ["final_loss", "checkpoint_present", "no_oom"]
    assert [e["step"] for e in written["eval_losses"]] == [8, 16]
    assert written["eval_losses"][-1]["loss"] < written["eval_losses"][0]["loss"]

    step = written["step_log"][-1]
    # The host's data work is timed inside the step: a share of it, never all of it.
    assert 0 < step["data_s"] < step["step_time_s"] and 0 < written["data_time_share"] < 1
    assert step["tokens"]["padded"] >= step["tokens"]["effective"] >= step["tokens"]["supervised"] > 0
    assert 1 <= written["t_eff"] <= 256
    assert "4N + 6·N_lora + 12·L·H·Q·T_eff" in written["flops_formula"]
    assert written["mfu"] is None and written["peak_tflops"] is None  # no peak on a CPU
    assert written["config"]["train"]["max_steps"] == 16
    assert (run / "config.yaml").is_file() and any((run / "tensorboard").iterdir())
    # The run's time counts from the process's start, as its time to the first step does (it left the start-up
    # out and came out shorter than that).
    assert written["wall_time_s"] >= written["time_to_first_step_s"] > 0

    # The same run in the report schema: the criteria judged, every other number INFO (SKIP where it cannot be
    # measured: no MFU and no device memory on a CPU), the per-step curves in `steps`.
    report = json.loads((run / "report.json").read_text())
    validator = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    assert [e.message for e in validator.iter_errors(report)] == []
    results = {r["name"]: r for r in report["results"]}
    assert list(results) == REPORT_RESULTS
    assert report["status"] == written["status"] == "PASS"
    assert [
        r for r in report["results"] if r["status"] == "PASS" and not (r["expected"] and r["threshold_source"])
    ] == []
    assert [c["name"] for c in written["criteria"]] == [n for n, r in results.items() if r["status"] == "PASS"]
    assert {results[n]["status"] for n in ("steps", "eval_loss", "tokens_per_s_per_gpu", "peak_rss_gib")} == {"INFO"}
    assert results["mfu"]["status"] == results["peak_memory_gib"]["status"] == "SKIP"
    assert results["final_loss"]["value"] == written["final_loss"]
    assert results["tokens_per_s_per_gpu"]["value"] == written["tokens_per_s_per_gpu"]["effective"]
    series = results["steps"]["details"]
    assert series["step"] == list(range(1, 17)) and series["loss"] == losses
    assert series["eval_step"] == [8, 16] and series["eval_loss"] == [e["loss"] for e in written["eval_losses"]]
    assert series["warmup"] == [True, True] + [False] * 14
    assert all(v > 0 for v in series["rss_gib"]) and set(series["memory_peak_gib"]) == {None}
    assert results["data.preparation"]["details"]["train"]["rows"] == written["dataset"]["train_rows"]
    assert report["meta"]["verb"] == "finetune" and report["meta"]["config"] == written["config"]
    assert (run / "report.md").read_text().startswith("# gpucert finetune: PASS")

    # Retention kept both checkpoints (8, 16); the final adapter equals the last checkpoint's weights.
    assert find_latest(run) == run / "checkpoints" / "step-16"
    checkpoint = load_file(str(run / "checkpoints" / "step-16" / "adapter_model.safetensors"))
    tokenizer = load_tokenizer(cfg.model, cfg.data)
    reloaded = PeftModel.from_pretrained(
        load_base_model(cfg.model, len(tokenizer), torch.device("cpu")), run / "adapter"
    )
    adapter = {k: v for k, v in reloaded.state_dict().items() if "lora_" in k}
    assert set(adapter) == set(checkpoint)
    assert all(torch.equal(adapter[k], checkpoint[k]) for k in checkpoint)
    assert any(v.abs().sum() > 0 for k, v in checkpoint.items() if "lora_B" in k)


@pytest.mark.slow
def test_each_step_gets_the_rows_the_previous_step_read_ahead(
    tmp_path: Path, single_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows are read one step ahead, behind the GPU work; across an epoch's end too, and never past the last step."""
    calls: list[tuple[Any, list[list[int]], Any]] = []  # (host rows given, the step's rows, rows read ahead)
    plain = train_module.train_step

    def recording(*args: Any) -> Any:
        stats, upcoming = plain(*args)
        calls.append((args[3], args[4], args[9]))
        if upcoming is not None:
            assert upcoming.micro_ids == args[9]
        return stats, upcoming

    monkeypatch.setattr(train_module, "train_step", recording)
    run_finetune(tiny_run(tmp_path, epochs=2.0, max_steps=44))  # 39 steps an epoch
    assert len(calls) == 44 and calls[0][0] is None  # the first step reads its own rows
    for (_, _, ahead), (host, ids, _) in itertools.pairwise(calls):
        assert host is not None and host.micro_ids == ids == ahead
    assert calls[-1][2] is None
    rows = [i for _, ids, _ in calls for micro in ids for i in micro]
    assert len(rows) > len(set(rows))  # rows came round again: the read-ahead crossed an epoch's end


@pytest.mark.slow
def test_the_frozen_gemms_carry_the_updated_adapters_after_every_step(
    tmp_path: Path, single_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 without LoRA dropout carries the adapters in the frozen GEMMs (finetune/model/fused.py). The trainer copies
    them in right after each optimizer step, and the forwards then copy nothing: the fused AdamW the trainer runs on
    a GPU (here on the CPU too) updates them without bumping a version counter, so only that copy keeps them."""
    adamw = torch.optim.AdamW
    monkeypatch.setattr(torch.optim, "AdamW", lambda *a, **k: adamw(*a, **{**k, "fused": True}))
    plain = train_module.train_step
    checked = []

    def checking(*args: Any) -> Any:
        result = plain(*args)
        carriers = [m for m in args[0].modules() if isinstance(m, FusedProjections | AInGemmLoraLinear)]
        items = [item for m in carriers for item in m.refresh_items()]
        assert len(items) == 2 * 7  # two layers of q/k/v, gate/up B and o, down A
        for dst, src, scale in items:
            torch.testing.assert_close(dst, (src * scale).to(dst.dtype), rtol=0, atol=0)
        checked.append(len(items))
        return result

    monkeypatch.setattr(train_module, "train_step", checking)
    cfg = tiny_run(tmp_path, max_steps=4)
    m = run_finetune(replace(cfg, model=replace(cfg.model, dtype="bf16")))
    assert "4 single projections with their A in the frozen GEMM" in m["model"]["fused_projections"]
    assert len(checked) == 4
    assert m["loss_history"][0] != m["loss_history"][-1]


def test_saved_adapter_reloads_with_identical_outputs(tmp_path: Path, single_process: None) -> None:
    rt = start_runtime()
    try:
        cfg = tiny_run(tmp_path)
        tokenizer = load_tokenizer(cfg.model, cfg.data)
        torch.manual_seed(0)
        model, _ = load_model(cfg.model, cfg.lora, tokenizer, rt.device)
        rows = [{"input_ids": list(range(5, 45)), "labels": list(range(5, 45)), "position_ids": list(range(40))}]
        batch = collate(rows, tokenizer.pad_token_id)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        for _ in range(3):
            loss, n = forward_loss(model, batch, "sdpa")
            (loss / n).backward()
            opt.step()
            opt.zero_grad()
        save_adapter(model, tokenizer, tmp_path / "adapter", rt)
    finally:
        stop_runtime(rt)
    model.eval()
    base = load_base_model(cfg.model, len(tokenizer), torch.device("cpu"))
    reloaded = PeftModel.from_pretrained(base, tmp_path / "adapter")
    with torch.no_grad():
        # The training model fuses its head into the loss; the reloaded one has a plain head: the same loss.
        trained_loss, trained_n = forward_loss(model, batch, "sdpa")
        reloaded_loss, reloaded_n = forward_loss(reloaded, batch, "sdpa")
    assert int(trained_n) == int(reloaded_n)
    assert float(reloaded_loss) == pytest.approx(float(trained_loss), rel=1e-6)
    assert (tmp_path / "adapter" / "tokenizer.json").is_file()


# --- Failures ---------------------------------------------------------------------------------------------


def write_tiny_config(tmp_path: Path) -> Path:
    config = tmp_path / "tiny.yaml"
    config.write_text(f"model: {{name: tiny, dtype: fp32}}\ndata: {{cache_dir: {tmp_path / 'cache'}}}\n")
    return config


def test_an_error_names_the_rank_and_phase_then_exits_3(
    tmp_path: Path, single_process: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def disk_full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train_module, "prepare_dataset", disk_full)
    assert main([str(write_tiny_config(tmp_path)), "--output-dir", str(tmp_path / "run")]) == 3
    err = capsys.readouterr().err
    first, *rest = [line for line in err.splitlines() if line.startswith("gpucert:")]
    assert re.fullmatch(
        r"gpucert: rank 0 \([^,()]*, cpu\) failed during data preparation: "
        r"OSError: \[Errno 28\] No space left on device \(raised at .*test_train.py:\d+ in disk_full\)",
        first,
    ), err
    assert rest == [] and "Traceback (most recent call last)" in err


def test_bad_data_is_one_line_without_a_traceback(
    tmp_path: Path, single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Data that cannot be prepared is bad input, like a bad key: the rank's line says which lines and what to
    change, and nothing more (a traceback once repeated the message in 20 lines)."""
    data = tmp_path / "rows.jsonl"
    data.write_text("{not json\n" * 3)
    argv = [str(write_tiny_config(tmp_path)), "--output-dir", str(tmp_path / "run"), "--set", f"data.source={data}"]
    assert main(argv) == 3
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("gpucert:")]
    assert len(lines) == 1 and "failed during data preparation" in lines[0] and "rows.jsonl:1" in lines[0], err
    assert "Traceback" not in err, err[-3000:]


def test_ctrl_c_prints_one_line_and_exits_130(
    tmp_path: Path, single_process: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "load_model", interrupted)
    assert main([str(write_tiny_config(tmp_path)), "--output-dir", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("gpucert:")]
    assert len(lines) == 1 and re.fullmatch(r"gpucert: rank 0 \(.*\) interrupted during model load", lines[0]), err
    assert "Traceback" not in err
