"""Every fine-tuning config value is checked at load: a bad one exits 3 naming the key, and nothing is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucert.cli import main
from gpucert.config.loader import ConfigError, load_config
from gpucert.finetune import config as finetune_config
from gpucert.finetune.config import FinetuneConfig, TrainConfig, load_finetune_config

SHIPPED = sorted((Path(__file__).parents[2] / "configs" / "finetune").glob("*.yaml"))

# (--set override, the message it must give)
BAD_VALUES = [
    ("train.micro_batch=0", "train.micro_batch must be >= 1, found 0"),
    ("train.grad_accum=-1", "train.grad_accum must be >= 1, found -1"),
    ("train.save_every=0", "train.save_every must be >= 1, found 0"),
    ("train.eval_every=0", "train.eval_every must be >= 1, found 0"),
    ("train.log_every=0", "train.log_every must be >= 1, found 0"),
    ("train.keep_checkpoints=0", "train.keep_checkpoints must be >= 1, found 0"),
    ("train.lr=0", "train.lr must be a finite number > 0, found 0.0"),
    ("train.lr=.inf", "train.lr must be a finite number > 0, found inf"),
    ("train.lr=.nan", "train.lr must be a finite number > 0, found nan"),
    ("train.warmup_ratio=1", "train.warmup_ratio must be in [0, 1), found 1.0"),
    ("train.warmup_ratio=-0.1", "train.warmup_ratio must be in [0, 1), found -0.1"),
    ("train.weight_decay=-1", "train.weight_decay must be >= 0, found -1.0"),
    ("train.max_grad_norm=-1", "train.max_grad_norm must be >= 0 (0 turns clipping off), found -1.0"),
    ("train.epochs=0", "train.epochs must be a finite number > 0, found 0.0"),
    ("train.max_steps=0", "train.max_steps must be null or >= 1, found 0"),
    ("train.seed=-1", "train.seed must be in 0..4294967295, found -1"),
    ("train.final_loss_max=0", "train.final_loss_max must be a finite number > 0, found 0.0"),
    ("train.peak_tflops=-5", "train.peak_tflops must be a finite number > 0, found -5.0"),
    ("train.parallel=fsdp", "train.parallel must be one of auto, none, ddp, fsdp2, found 'fsdp'"),
    ("model.name=''", "model.name must be a hub id, a local directory or \"tiny\", found ''"),
    ("model.dtype=bfloat16", "model.dtype must be one of bf16, fp16, fp32, found 'bfloat16'"),
    (
        "model.attn_implementation=flash",
        "model.attn_implementation must be one of sdpa, flex_attention, eager, flash_attention_2, flash_attention_3, "
        "varlen, found 'flash'",
    ),
    ("lora.r=0", "lora.r must be >= 1, found 0"),
    ("lora.alpha=0", "lora.alpha must be > 0, found 0"),
    ("lora.dropout=1", "lora.dropout must be in [0, 1), found 1.0"),
    ("lora.target_modules=[]", "lora.target_modules must be a non-empty list of module names"),
    ("data.source=''", "data.source must be a hub dataset id"),
    ("data.format=sharegpt", "data.format must be one of glaive, alpaca, messages, found 'sharegpt'"),
    ("data.split=''", "data.split must be a split name (e.g. train), found ''"),
    ("data.template=chatml", "data.template must be one of qwen2.5-tools, alpaca, tokenizer, found 'chatml'"),
    ("data.max_length=1", "data.max_length must be >= 2, found 1"),
    ("data.eval_fraction=0", "data.eval_fraction must be in (0, 1): training and `gpucert evaluate` need a"),
    ("data.eval_fraction=1", "data.eval_fraction must be in (0, 1)"),
    ("data.max_rows=0", "data.max_rows must be null or >= 1, found 0"),
    ("data.cache_dir=''", "data.cache_dir must be a directory, found ''"),
    ("data.seed=4294967296", "data.seed must be in 0..4294967295, found 4294967296"),
    ("eval.max_examples=0", "eval.max_examples must be >= 1, found 0"),
    ("eval.batch_size=0", "eval.batch_size must be >= 1, found 0"),
    ("eval.max_new_tokens=0", "eval.max_new_tokens must be >= 1, found 0"),
    ("output_dir=''", "output_dir must be null or a directory, found ''"),
    ("resume=''", "resume must be none, auto or a checkpoint directory, found ''"),
    ("runtime.collective_timeout_s=0", "runtime.collective_timeout_s must be > 0, found 0"),
]


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty directory, so anything created (runs/, .gpucert-cache/) shows."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("override", "message"), BAD_VALUES, ids=[o for o, _ in BAD_VALUES])
def test_finetune_refuses_a_bad_value_and_creates_nothing(
    override: str, message: str, empty_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --output is a later output_dir override: left out where output_dir is the value under test.
    output = [] if override.startswith("output_dir=") else ["--output", str(empty_cwd / "run")]
    assert main(["finetune", "--set", override, *output]) == 3
    err = capsys.readouterr().err
    assert f"gpucert: error: --set {override}: {message}" in err
    assert list(empty_cwd.iterdir()) == []


@pytest.mark.parametrize("override", ["train.micro_batch=0", "data.eval_fraction=0", "data.template=x"])
def test_prepare_refuses_before_making_a_cache_entry(
    override: str, empty_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["finetune", "prepare", "--set", override]) == 3
    assert f"--set {override}: " in capsys.readouterr().err
    assert list(empty_cwd.iterdir()) == []


def test_evaluate_refuses_before_loading_anything(empty_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["evaluate", "--adapter", str(empty_cwd / "adapter"), "--output", str(empty_cwd / "out")]
    assert main([*args, "--set", "eval.batch_size=0"]) == 3
    assert "--set eval.batch_size=0: eval.batch_size must be >= 1, found 0" in capsys.readouterr().err
    assert list(empty_cwd.iterdir()) == []


def test_the_torchrun_entry_point_refuses_with_3(empty_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpucert.finetune.train.run import main as train_main

    assert train_main(["--set", "train.micro_batch=0", "--output-dir", str(empty_cwd / "run")]) == 3
    assert "gpucert finetune: error: --set train.micro_batch=0: train.micro_batch must be >= 1" in (
        capsys.readouterr().err
    )
    assert list(empty_cwd.iterdir()) == []


def test_a_bad_value_in_a_file_names_the_file(empty_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = empty_cwd / "bad.yaml"
    path.write_text("train: {micro_batch: 0, save_every: 0}\neval: {batch_size: 0}\n")
    assert main(["finetune", "--config", str(path), "--output", str(empty_cwd / "run")]) == 3
    err = capsys.readouterr().err
    # Every problem at once, a line each, with the file and line it came from.
    assert err.startswith("gpucert: error: 3 problems:\n"), err
    assert f"\n  {path}:1: train.micro_batch must be >= 1, found 0\n  {path}:1: train.save_every must be >= 1" in err
    assert f"\n  {path}:2: eval.batch_size must be >= 1, found 0\n" in err
    assert sorted(p.name for p in empty_cwd.iterdir()) == ["bad.yaml"]


def test_wrong_types_and_bad_ranges_are_said_together(tmp_path: Path) -> None:
    """A type problem hid every range problem until it was fixed: two runs to learn of four mistakes. A range
    problem of a key whose value was wrong is not said twice, nor one the defaults would have passed."""
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lr: abc\n  max_steps: -1\nlora:\n  r: 0\n")
    overrides = ["train.micro_batch=x", "train.seed=q", "train.epochs=0"]
    with pytest.raises(ConfigError) as caught:
        load_finetune_config(path, overrides)
    problems = caught.value.problems
    assert problems[:3] == [  # the file's, in its line order (types and ranges are found in two passes)
        f"{path}:2: train.lr: expected float, found 'abc'",
        f"{path}:3: train.max_steps must be null or >= 1, found -1",
        f"{path}:5: lora.r must be >= 1, found 0",
    ], problems
    assert sorted(problems[3:]) == [
        "--set train.epochs=0: train.epochs must be a finite number > 0, found 0.0",
        "--set train.micro_batch=x: train.micro_batch must be a number >= 1 or \"auto\", found 'x'",
        "--set train.seed=q: train.seed: expected int, found 'q'",
    ], problems


def test_which_range_problems_stand_beside_a_wrong_type_is_read_from_the_keys_not_the_file_name(
    tmp_path: Path,
) -> None:
    """A file named train.yaml read as the key `train` and hid lora.r's range; a top-level key given the wrong type
    (output_dir) kept the range problem of another key that names it (resume auto needs output_dir)."""
    path = tmp_path / "train.yaml"
    path.write_text("train: 5\nlora: {r: 0}\n")
    with pytest.raises(ConfigError) as caught:
        load_finetune_config(path, [])
    assert [p.split(": ", 1)[1] for p in caught.value.problems] == [
        "train: expected a mapping, found int",
        "lora.r must be >= 1, found 0",
    ], caught.value.problems
    with pytest.raises(ConfigError) as caught:
        load_finetune_config(None, ["output_dir=5", "resume=auto"], training=True)
    assert caught.value.problems == ["--set output_dir=5: output_dir: expected str, found 5"], caught.value


def test_a_set_that_fixes_the_file_wins(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("train: {micro_batch: 0}\n")
    assert load_finetune_config(path, ["train.micro_batch=1"]).train.micro_batch == 1


def test_a_missing_resume_directory_is_refused_before_the_run_directory(
    empty_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["finetune", "--resume", "atuo", "--output", str(empty_cwd / "run")]) == 3
    # Named as typed: --resume, not the --set it becomes inside.
    assert "gpucert: error: --resume atuo: resume must be none, auto or a checkpoint directory, found 'atuo' (no " in (
        capsys.readouterr().err
    )
    assert list(empty_cwd.iterdir()) == []


def test_resume_auto_without_a_run_directory_is_refused_before_any_work(
    empty_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --output each run makes a new runs/<time>-finetune, so auto would find nothing and start at step 0."""
    assert main(["finetune", "--resume", "auto"]) == 3
    assert "resume auto needs output_dir (--output DIR, the run directory to continue)" in capsys.readouterr().err
    assert list(empty_cwd.iterdir()) == []


def test_an_output_dir_that_is_a_file_is_refused(empty_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (empty_cwd / "taken").write_text("")
    assert main(["finetune", "--output", str(empty_cwd / "taken")]) == 3
    assert "output_dir must be a directory" in capsys.readouterr().err
    assert [p.name for p in empty_cwd.iterdir()] == ["taken"]


def test_filesystem_checks_are_for_training_only(tmp_path: Path) -> None:
    # evaluate and prepare use neither output_dir nor resume.
    cfg = load_finetune_config(None, [f"resume={tmp_path / 'gone'}"])
    assert cfg.path_problems() == [
        f"resume must be none, auto or a checkpoint directory, found '{tmp_path / 'gone'}' (no such directory)"
    ]
    with pytest.raises(ConfigError, match="no such directory"):
        load_finetune_config(None, [f"resume={tmp_path / 'gone'}"], training=True)


@pytest.mark.parametrize(
    ("overrides", "ok"),
    [
        (["data.max_rows=10", "data.eval_fraction=0.01"], False),  # 0 rows held out
        (["data.max_rows=10", "data.eval_fraction=0.99"], False),  # no row left to train on
        (["data.max_rows=10", "data.eval_fraction=0.1"], True),
        (["data.eval_fraction=0.0005"], False),  # of the 512 rows made without max_rows: 0 held out
    ],
)
def test_synthetic_data_needs_a_row_in_each_split(overrides: list[str], ok: bool) -> None:
    cfg = load_config(FinetuneConfig, None, ["data.source=synthetic", *overrides])
    found = [p for p in cfg.problems() if "synthetic row" in p]
    assert (not found) == ok, found


def test_edges_that_mean_something_are_accepted() -> None:
    cfg = load_finetune_config(
        None,
        [
            "train.max_grad_norm=0",  # no clipping
            "train.warmup_ratio=0",
            "train.weight_decay=0",
            "train.max_steps=null",
            "lora.dropout=0",
            "data.max_length=2",
            "data.seed=0",
            "train.seed=0",
        ],
    )
    assert cfg.problems() == []


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_configs_pass(path: Path) -> None:
    cfg = load_finetune_config(path)
    assert cfg.problems() == []


def test_shipped_configs_are_there() -> None:
    assert {p.name for p in SHIPPED} >= {"tiny.yaml", "qwen2-7b-glaive.yaml", "qwen2-7b-speed.yaml"}


def test_defaults_pass() -> None:
    assert FinetuneConfig().problems() == []


def test_the_allowed_values_are_those_the_code_accepts() -> None:
    from gpucert.finetune.data import formats, prepare, template
    from gpucert.finetune.model import lora as model
    from gpucert.finetune.train import parallel

    assert tuple(model.DTYPES) == finetune_config.DTYPES
    assert model.ATTN_IMPLEMENTATIONS == finetune_config.ATTN_IMPLEMENTATIONS
    assert parallel.MODES == finetune_config.PARALLEL_MODES
    assert formats.FORMATS == finetune_config.FORMATS
    assert {*template.SHIPPED_TEMPLATES, "tokenizer"} == set(finetune_config.TEMPLATES)
    assert prepare.SYNTHETIC_ROWS == finetune_config.SYNTHETIC_ROWS


def test_run_finetune_refuses_a_bad_config_built_in_code(tmp_path: Path) -> None:
    from dataclasses import replace

    from gpucert.finetune.train.run import run_finetune

    cfg = replace(FinetuneConfig(), train=TrainConfig(micro_batch=0), output_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"train\.micro_batch must be >= 1, found 0"):
        run_finetune(cfg)
    assert list(tmp_path.iterdir()) == []


def test_a_shipped_recipes_model_directory_is_found_from_any_directory(empty_cwd: Path) -> None:
    """qwen2-7b-speed named configs/finetune/models/qwen2-7b relative to a checkout: from anywhere else it was
    'no directory ... Check the path'. A relative model.name in a file is read beside the file; a --set one
    from here."""
    from gpucert.finetune.config import load_finetune_config, resolve_recipe

    cfg = load_finetune_config(resolve_recipe("qwen2-7b-speed"))
    assert Path(cfg.model.name).is_absolute() and (Path(cfg.model.name) / "config.json").is_file()
    mine = load_finetune_config(resolve_recipe("qwen2-7b-speed"), ["model.name=models/qwen2-7b"])
    assert mine.model.name == "models/qwen2-7b"  # the user's own, as typed: named if missing when the run starts
