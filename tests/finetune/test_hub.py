"""Model names and adapters: a local path is told from a hub id (a missing one is named, never tried on the hub),
an unreachable hub (HF_HUB_OFFLINE=1, or an endpoint that refuses connections) fails in seconds with what to do
unless the model is in the local cache, which is then used without a network call, and --adapter takes a run
directory. The hub library is the real one; there is no network here, and the unreachable endpoint is a closed
local port (http://127.0.0.1:9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants
from tests.conftest import within

from gpucert.finetune.config import DataConfig, ModelConfig
from gpucert.finetune.data import hub
from gpucert.finetune.data.hub import ModelSourceError, pretrained_source, resolve_adapter
from gpucert.finetune.data.tokenizer import load_tokenizer
from gpucert.finetune.model.lora import load_base_model
from gpucert.runtime.launch_env import RANK_VARIABLES

CLOSED_PORT = "http://127.0.0.1:9"
CACHED_ID = "gpucert-test/tiny-qwen2"


@pytest.fixture
def hub_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """An empty hub cache of this test's own, and a fresh probe before and after."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    hub.hub_unreachable.cache_clear()
    yield monkeypatch
    hub.hub_unreachable.cache_clear()


def cache_tiny_model(cache: Path, repo_id: str = CACHED_ID) -> None:
    """The tiny model and tokenizer as the hub cache holds a downloaded repo (refs/main -> a snapshot)."""
    revision = "0" * 40
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    cfg = ModelConfig(name="tiny", dtype="fp32")
    tokenizer = load_tokenizer(cfg, DataConfig())
    load_base_model(cfg, len(tokenizer), __import__("torch").device("cpu")).save_pretrained(str(snapshot))
    tokenizer.save_pretrained(str(snapshot))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)


# --- Local paths ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["/data/models/qwen2-7b", "./qwen", "../models/qwen", "configs/models/nope/v2"])
def test_a_missing_local_path_is_named_not_taken_for_a_hub_id(name: str, hub_state: pytest.MonkeyPatch) -> None:
    started = time.monotonic()
    with pytest.raises(ModelSourceError) as refused:
        pretrained_source(name)
    message = str(refused.value)
    assert message.startswith(f"model.name: no directory {name}") and "Repo id must be" not in message
    assert "relative to" in message if not name.startswith("/") else "relative to" not in message
    assert time.monotonic() - started < within(1)  # decided from the name: no probe, no retries


def test_an_existing_directory_is_local_and_a_file_is_refused(tmp_path: Path, hub_state: pytest.MonkeyPatch) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    assert pretrained_source(str(tmp_path)) == (str(tmp_path), {})
    hub_state.setenv("HOME", str(tmp_path))
    assert pretrained_source("~") == (str(tmp_path), {})  # transformers would take "~/..." for a hub id
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelSourceError, match="is a file; expected a model directory"):
        pretrained_source(str(tmp_path / "weights.bin"))
    with pytest.raises(ModelSourceError, match="neither an existing directory nor a valid hub id"):
        pretrained_source("Qwen/Qwen2 7B")


# --- The hub out of reach ---------------------------------------------------------------------------------


def test_hf_hub_offline_fails_at_once_saying_what_to_do(hub_state: pytest.MonkeyPatch) -> None:
    hub_state.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelSourceError) as refused:
        pretrained_source("Qwen/Qwen2-7B-Instruct")
    message = str(refused.value)
    assert "model.name: Qwen/Qwen2-7B-Instruct is no local directory" in message
    assert "HF_HUB_OFFLINE is set" in message and constants.HF_HUB_CACHE in message
    assert "hf download Qwen/Qwen2-7B-Instruct" in message


def test_an_unreachable_endpoint_is_found_by_one_quick_probe(hub_state: pytest.MonkeyPatch) -> None:
    hub_state.setattr(constants, "HF_HUB_OFFLINE", False)
    hub_state.setattr(constants, "ENDPOINT", CLOSED_PORT)
    started = time.monotonic()
    with pytest.raises(ModelSourceError, match=rf"{CLOSED_PORT} did not answer within 5 s"):
        pretrained_source("Qwen/Qwen2-7B-Instruct")
    assert time.monotonic() - started < hub.PROBE_TIMEOUT_S + within(1)


def test_a_cached_model_loads_from_the_cache_when_the_hub_is_unreachable(
    tmp_path: Path, hub_state: pytest.MonkeyPatch
) -> None:
    cache_tiny_model(Path(constants.HF_HUB_CACHE))
    hub_state.setattr(constants, "HF_HUB_OFFLINE", False)
    hub_state.setattr(constants, "ENDPOINT", CLOSED_PORT)
    assert pretrained_source(CACHED_ID) == (CACHED_ID, {"local_files_only": True})
    started = time.monotonic()
    cfg = ModelConfig(name=CACHED_ID, dtype="fp32")
    tokenizer = load_tokenizer(cfg, DataConfig())
    model = load_base_model(cfg, len(tokenizer), __import__("torch").device("cpu"))
    assert model.config.num_hidden_layers == 2 and tokenizer.name_or_path == CACHED_ID
    assert time.monotonic() - started < within(10)  # no retries against the closed port


# The two ways a machine has no hub: told so (HF_HUB_OFFLINE=1), or an endpoint that refuses connections.
WITHOUT_NETWORK = pytest.mark.parametrize(
    ("env", "why"),
    [({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"), ({"HF_ENDPOINT": CLOSED_PORT}, "did not answer")],
    ids=["HF_HUB_OFFLINE", "unreachable endpoint"],
)


def train_cli(
    tmp_path: Path, env: dict[str, str], model: str, *extra: str
) -> tuple[subprocess.CompletedProcess, float]:
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{name: {model}}}\ndata: {{cache_dir: {tmp_path / 'cache'}}}\n")
    base = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES and not k.startswith("HF_")}
    argv = [sys.executable, "-m", "gpucert.finetune.train", str(config), "--output-dir", str(tmp_path / "run")]
    started = time.monotonic()
    done = subprocess.run(
        [*argv, *extra], env={**base, "HF_HOME": str(tmp_path / "hf"), **env}, capture_output=True, text=True
    )
    return done, time.monotonic() - started


@pytest.mark.slow
@WITHOUT_NETWORK
def test_the_7b_recipe_without_network_exits_3_in_seconds_with_one_message(
    tmp_path: Path, env: dict[str, str], why: str
) -> None:
    done, _ = train_cli(tmp_path, env, "Qwen/Qwen2-7B-Instruct")
    assert done.returncode == 3, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and len(lines) <= 3, done.stderr
    assert "model.name: Qwen/Qwen2-7B-Instruct is no local directory" in lines[-1] and why in lines[-1]
    assert "Retrying" not in done.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()
    # No retries (the hub's alone were ~50 s): said by their absence above, not by a wall-clock bound, which a
    # busy machine breaks (46 s once, with other test runs beside it).


@pytest.mark.slow
@WITHOUT_NETWORK
def test_a_hub_dataset_without_network_exits_3_in_seconds_saying_what_to_do(
    tmp_path: Path, env: dict[str, str], why: str
) -> None:
    """The 7B recipe's dataset with no hub: ~27 s of retries once, then an error without a word on what to do."""
    done, _ = train_cli(tmp_path, env, "tiny", "--set", "data.source=glaiveai/glaive-function-calling-v2")
    assert done.returncode == 3, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Retrying" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "data.source: glaiveai/glaive-function-calling-v2 is no local file" in last and why in last
    assert "hf download glaiveai/glaive-function-calling-v2 --repo-type dataset --local-dir DIR" in last
    # Refused in preparation (a prepared copy in data.cache_dir would have done without the hub): nothing prepared,
    # and the run directory made for it gone.
    assert not (tmp_path / "run").exists() and not list((tmp_path / "cache").glob("*/READY"))


def test_a_hub_dataset_in_the_datasets_cache_is_loaded_offline(hub_state: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Classification only: with the hub unreachable, a dataset `datasets` holds (its cache's namespace___name/
    config/version/hash layout) is loaded with HF_HUB_OFFLINE for that call; one it does not hold is refused."""
    from datasets import config

    hub_state.setattr(config, "HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    hub_state.setattr(constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "datasets" / "glaiveai___glaive-function-calling-v2" / "default" / "0.0.0" / "abc").mkdir(parents=True)
    assert hub.dataset_offline(DataConfig(source="glaiveai/glaive-function-calling-v2")) is True
    with pytest.raises(ModelSourceError, match="not in the local cache"):
        hub.dataset_offline(DataConfig(source="yahma/alpaca-cleaned"))
    assert hub.dataset_offline(DataConfig(source="sample")) is False


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("missing.csv", "data.source missing.csv: no such file"),
        ("data/train/part-0", "data.source data/train/part-0: no such file"),
        ("./rows", "data.source ./rows: no such file"),
    ],
)
def test_a_data_source_that_is_a_path_is_never_tried_on_the_hub(
    source: str, message: str, hub_state: pytest.MonkeyPatch
) -> None:
    hub_state.setattr(constants, "ENDPOINT", CLOSED_PORT)  # a probe would show as "did not answer"
    with pytest.raises(ModelSourceError, match=message):
        hub.dataset_offline(DataConfig(source=source))


def test_a_data_file_of_a_format_not_read_is_refused_naming_the_suffix(tmp_path: Path) -> None:
    from gpucert.finetune.config import local_data_problem

    rows = tmp_path / "rows.csv"
    rows.write_text("instruction,output\n")
    assert local_data_problem(DataConfig(source=str(rows))) == (
        f"data.source {rows}: .csv files are not read; convert it to JSON Lines (.jsonl) or Parquet"
    )


@pytest.mark.slow
def test_a_missing_local_model_path_exits_3_naming_it(tmp_path: Path) -> None:
    done, _ = train_cli(tmp_path, {"HF_HUB_OFFLINE": "1"}, "/models/qwen2-7b-instruct")
    assert done.returncode == 3
    assert "model.name: no directory /models/qwen2-7b-instruct" in done.stderr and "Repo id" not in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_cached_model_trains_with_the_hub_unreachable(tmp_path: Path) -> None:
    cache_tiny_model(tmp_path / "hf" / "hub")
    done, _ = train_cli(
        tmp_path, {"HF_ENDPOINT": CLOSED_PORT}, CACHED_ID, "--set", "train.max_steps=2", "--set", "data.max_length=256"
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]  # the run's verdict; what matters: it trained
    assert "Retrying" not in done.stderr
    assert json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]


# --- --adapter --------------------------------------------------------------------------------------------


def test_adapter_takes_an_adapter_directory_or_a_run_directory(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "20260101-finetune"
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "adapter_config.json").write_text("{}")
    assert resolve_adapter(run / "adapter") == (run / "adapter", None)
    adapter, note = resolve_adapter(run)
    assert adapter == run / "adapter" and note is not None and "is a run directory" in note


def test_adapter_refusals_name_what_is_there(tmp_path: Path) -> None:
    unfinished = tmp_path / "unfinished"
    (unfinished / "checkpoints" / "step-50").mkdir(parents=True)
    (unfinished / "config.yaml").write_text("{}")
    with pytest.raises(ModelSourceError, match=r"a run directory without a final adapter .* has not finished"):
        resolve_adapter(unfinished)
    # One a run is training in now: its `--resume auto` advice would be refused by that run's lock.
    lock = str(unfinished / ".gpucert.lock")
    hold = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.lockf(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, lock], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        said = r"is in use by another gpucert run .*\(it has no final adapter yet\)"
        with pytest.raises(ModelSourceError, match=said):
            resolve_adapter(unfinished)
    finally:
        holder.kill()
    with pytest.raises(ModelSourceError, match=r"no adapter_config\.json there"):
        resolve_adapter(tmp_path)
    started = time.monotonic()
    with pytest.raises(ModelSourceError, match=r"--adapter runs/nope: no such directory \(relative to"):
        resolve_adapter("runs/nope")  # a run id mistyped is not a hub id to retry for 28 s
    assert time.monotonic() - started < within(1)


def test_evaluate_refuses_an_unfinished_run_before_loading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpucert.cli import main as cli

    unfinished = tmp_path / "run"
    (unfinished / "checkpoints").mkdir(parents=True)
    assert cli(["evaluate", "--adapter", str(unfinished)]) == 3
    assert "has not finished" in capsys.readouterr().err


def test_a_cut_or_broken_adapter_is_named_before_the_base_model_loads(tmp_path: Path) -> None:
    """A truncated adapter_model.safetensors was a safetensors traceback, and a broken adapter_config.json a bare
    JSON error, both after the base model had loaded."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 16')
    with pytest.raises(ModelSourceError, match=r"adapter_config.json: not a readable adapter config: Expecting"):
        resolve_adapter(adapter)
    (adapter / "adapter_config.json").write_text('{"r": 16}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\x10" * 100)
    with pytest.raises(ModelSourceError, match=r"adapter_model.safetensors: not a readable safetensors file"):
        resolve_adapter(tmp_path / "adapter")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ModelSourceError, match=r"--adapter .*afile: a file; expected a run directory"):
        resolve_adapter(tmp_path / "afile")


def test_a_local_model_directory_transformers_cannot_read_is_refused_before_the_run(tmp_path: Path) -> None:
    """An empty or half-copied model directory was a ValueError traceback from transformers after the run began."""
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(ModelSourceError, match=r"model.name: .*model has no config.json"):
        pretrained_source(str(model))
    (model / "config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(ModelSourceError, match=r"config.json names no model_type"):
        pretrained_source(str(model))
    (model / "config.json").write_text('{"model_type": "qwen2"')
    with pytest.raises(ModelSourceError, match=r"config.json is unreadable"):
        pretrained_source(str(model))
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    assert pretrained_source(str(model)) == (str(model), {})
