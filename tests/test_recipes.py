"""Fine-tuning recipes ship with gpucert and are found by name; `finetune` and `evaluate` refuse a bad input
(missing file, unknown key, unknown recipe, missing data file) before torch, transformers or datasets is
imported, through the real CLI in a fresh process. How long that takes is a benchmark (docs/results), not an
assertion here: what is checked is that the heavy modules were never imported, which is what made it slow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpucert.config.loader import ConfigError
from gpucert.finetune.config import load_finetune_config, recipe_dir, recipe_lines, recipe_names, resolve_recipe

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "peft", "datasets")


def gpucert(argv: list[str], cwd: Path) -> tuple[int, str, str, set[str]]:
    """Exit code, stdout, stderr (python's -X importtime lines taken out) and the modules imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpucert", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    imported, err = set(), []
    for line in done.stderr.splitlines():
        if line.startswith("import time:"):
            imported.add(line.rsplit("|", 1)[-1].strip())
        else:
            err.append(line)
    return done.returncode, done.stdout, "\n".join(err), imported


def heavy(imported: set[str]) -> list[str]:
    return sorted(m for m in imported if m.split(".")[0] in HEAVY)


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    """A directory that passes --adapter's check (the check of the data comes first anyway)."""
    path = tmp_path / "adapter"
    path.mkdir()
    (path / "adapter_config.json").write_text("{}\n")
    return path


CASES = [
    # (argv, fragments stderr must hold)
    (["finetune", "--config", "nope.yaml"], ["--config nope.yaml: no such file", "tiny", "qwen2-7b-glaive"]),
    (["finetune", "--config", "qwen2-7b-glaivee"], ["no recipe of that name", "mistral-7b-alpaca, qwen2-7b-glaive"]),
    (["finetune", "--config", "configs/finetune/tiny.yaml"], ["--config configs/finetune/tiny.yaml: no such file"]),
    (["finetune", "--set", "train.bogus=1"], ["--set train.bogus=1: unknown key 'train.bogus'"]),
    (["finetune", "--config", "qwen2-7b-glaive", "--set", "lora.r=0"], ["--set lora.r=0: lora.r must be >= 1"]),
    (["finetune", "prepare", "--set", "data.max_length=1"], ["data.max_length must be >= 2"]),
    (["finetune", "--resume", "nowhere"], ["resume must be none, auto or a checkpoint directory"]),
    (["evaluate", "--adapter", "ADAPTER", "--data", "/nonexistent.jsonl"], ["data.source /nonexistent.jsonl: no such"]),
    (["evaluate", "--adapter", "ADAPTER", "--config", "nope"], ["--config nope: no such file"]),
    (["evaluate", "--adapter", "ADAPTER", "--set", "eval.bogus=1"], ["unknown key 'eval.bogus'"]),
    (["evaluate", "--adapter", "nowhere"], ["--adapter nowhere: no such directory"]),
]


@pytest.mark.parametrize(("argv", "fragments"), CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_bad_input_is_refused_before_anything_heavy_is_imported(
    argv: list[str], fragments: list[str], tmp_path: Path, adapter: Path
) -> None:
    # tmp_path as the working directory: configs/finetune/tiny.yaml is no file there, so only a recipe name works.
    code, _, err, imported = gpucert([str(adapter) if a == "ADAPTER" else a for a in argv], tmp_path)
    assert code == 3, err
    for fragment in fragments:
        assert fragment in err, err
    assert "Traceback" not in err
    assert heavy(imported) == [], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # nothing written


def test_list_recipes_names_every_shipped_recipe_with_what_it_trains(tmp_path: Path) -> None:
    code, out, err, imported = gpucert(["finetune", "--list-recipes"], tmp_path)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert [line.split(":", 1)[0] for line in lines] == recipe_names()
    assert {"tiny", "qwen2-7b-glaive", "qwen2-7b-speed", "mistral-7b-alpaca"} <= set(recipe_names())
    glaive = next(line for line in lines if line.startswith("qwen2-7b-glaive:"))
    assert "Glaive function calling v2" in glaive and glaive.endswith("qwen2-7b-glaive.yaml)")
    assert heavy(imported) == []


def test_a_recipe_is_found_by_name_from_any_directory(tmp_path: Path, adapter: Path) -> None:
    """`--config qwen2-7b-glaive` outside a checkout: the recipe loads (its data is a hub id, so the next thing
    refused is the missing adapter, not the config)."""
    code, _, err, imported = gpucert(["evaluate", "--config", "qwen2-7b-glaive", "--adapter", "nowhere"], tmp_path)
    assert code == 3 and "--adapter nowhere: no such directory" in err, err
    assert "--config" not in err
    assert heavy(imported) == []


def test_resolve_recipe_prefers_a_file_then_a_recipe_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_recipe(None) == recipe_dir() / "tiny.yaml"
    assert resolve_recipe("qwen2-7b-glaive") == recipe_dir() / "qwen2-7b-glaive.yaml"
    assert resolve_recipe("qwen2-7b-glaive.yaml") == recipe_dir() / "qwen2-7b-glaive.yaml"
    # A file of that name here is what the user means.
    (tmp_path / "tiny.yaml").write_text("train: {max_steps: 3}\n")
    assert resolve_recipe("tiny.yaml") == Path("tiny.yaml")
    assert load_finetune_config(resolve_recipe("tiny.yaml")).train.max_steps == 3
    # A path with a directory in it is that path, never a shipped recipe.
    with pytest.raises(ConfigError, match=r"--config sub/tiny\.yaml: no such file"):
        resolve_recipe("sub/tiny.yaml")
    (tmp_path / "adir").mkdir()
    with pytest.raises(ConfigError, match="--config adir: is a directory"):
        resolve_recipe("adir")


def test_every_shipped_recipe_loads_and_has_a_summary() -> None:
    assert len(recipe_lines()) == len(recipe_names()) >= 4
    for name in recipe_names():
        cfg = load_finetune_config(resolve_recipe(name))
        assert cfg.problems() == []
        line = next(line for line in recipe_lines() if line.startswith(f"{name}:"))
        assert len(line.split(":", 1)[1].split(" (")[0].strip()) > 20, line
