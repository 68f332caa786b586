"""Where a model named in a config comes from (a local directory or a Hugging Face hub id), and which directory
an --adapter argument means.

transformers takes any string that is not an existing directory for a hub id: a missing local path then fails
with "Repo id must be in the form ...", and without network every hub file is retried for about 50 s before an
87-line traceback. Here a name is classified first, and a hub id is only used when the hub answers a single
quick request (or, when it does not or HF_HUB_OFFLINE=1 is set, from the local cache with local_files_only):

    /data/qwen, ./qwen, ~/qwen, a/b/c    a local path: it must exist
    Qwen/Qwen2-7B-Instruct, gpt2         a hub id, unless a directory of that name exists here

`--adapter` takes an adapter directory or a run directory (runs/<id>, meaning its adapter/). Every problem is a
ModelSourceError (a ConfigError: exit 3, no traceback) that names the key, the name and what to do. The probe
runs at most once per process.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from gpucert.config.loader import ConfigError
from gpucert.finetune.config import DataConfig, ModelConfig, local_data_problem, looks_like_path

# One connection attempt, no retries: long enough for a slow proxy, short next to transformers' ~50 s of retries.
PROBE_TIMEOUT_S = 5.0
# The file whose presence in the hub cache means a model repo was downloaded here before.
MODEL_MARKER = "config.json"
ADAPTER_MARKER = "adapter_config.json"


class ModelSourceError(ConfigError):
    """A model or adapter name that can be neither found locally nor fetched from the hub."""


@functools.cache
def hub_unreachable() -> str | None:
    """Why the hub cannot be used from this process (HF_HUB_OFFLINE, or a probe that got no answer), or None."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        # Any HTTP answer, even an error status from a mirror's root, means the endpoint can be reached.
        get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
    except Exception as exc:  # httpx's transport errors, proxies' and SSL errors alike: no answer
        return f"{constants.ENDPOINT} did not answer within {PROBE_TIMEOUT_S:g} s ({exc})"
    return None


def _cached(repo_id: str, marker: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, marker), str)


def _hub_id(name: str, key: str) -> str:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ModelSourceError(
            f"{key}: {name!r} is neither an existing directory nor a valid hub id (namespace/name of letters, "
            "digits, '-', '_' and '.'): give the path of a local directory or a hub id like Qwen/Qwen2-7B-Instruct"
        ) from None
    return name


def _missing_path(name: str, key: str) -> ModelSourceError:
    where = Path(name).expanduser()
    relative = "" if where.is_absolute() else f" (relative to {Path.cwd()})"
    return ModelSourceError(
        f"{key}: no directory {name}{relative}: a name with a leading / . or ~, or more than one '/', is a local "
        "path, not a hub id. Check the path (a relative one is taken from the current directory), or give a hub id "
        "like Qwen/Qwen2-7B-Instruct"
    )


def _offline_kwargs(name: str, key: str, marker: str) -> dict[str, Any]:
    """{} while the hub answers; local_files_only when it does not but `name` is cached; else the error."""
    why = hub_unreachable()
    if why is None:
        return {}
    if _cached(name, marker):
        return {"local_files_only": True}
    from huggingface_hub import constants

    raise ModelSourceError(
        f"{key}: {name} is no local directory, and as a hub id it is not in the local cache "
        f"({constants.HF_HUB_CACHE}) and the hub cannot be used: {why}. Download it where there is network "
        f"(hf download {name}) and copy the cache here (HF_HOME), or download it into a directory "
        f"(hf download {name} --local-dir DIR) and set {key} to that directory"
    )


def pretrained_source(name: str, key: str = "model.name") -> tuple[str, dict[str, Any]]:
    """What to give from_pretrained for the model `name`, after checking that it can be loaded from here: a local
    directory (~ expanded), or the hub id with {} normally and local_files_only=True when the hub is unreachable
    but the model is cached. A ModelSourceError otherwise."""
    path = Path(name).expanduser()
    if path.is_dir():
        _check_model_dir(path, name, key)
        return str(path), {}
    if path.exists():
        raise ModelSourceError(f"{key}: {name} is a file; expected a model directory (with config.json) or a hub id")
    if looks_like_path(name):
        raise _missing_path(name, key)
    return name, _offline_kwargs(_hub_id(name, key), key, MODEL_MARKER)


def _check_model_dir(path: Path, name: str, key: str) -> None:
    """A local model directory transformers can read the architecture from: a config.json that is a JSON object
    with its model_type. An empty or half-copied directory was a traceback from transformers after the run
    started."""
    config = path / "config.json"
    try:
        loaded = json.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelSourceError(
            f"{key}: {name} has no config.json: expected a model directory (config.json, the tokenizer's files and "
            "the weights, as `hf download ID --local-dir DIR` writes them) or a hub id"
        ) from None
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"{key}: {config} is unreadable: {exc}") from None
    if not isinstance(loaded, dict) or not loaded.get("model_type"):
        raise ModelSourceError(
            f"{key}: {config} names no model_type (the architecture transformers builds): a half-copied or edited "
            "file? Copy the model directory again"
        )


def resolve_adapter(given: str | os.PathLike[str]) -> tuple[Path, str | None]:
    """(the adapter directory, a note for the user or None) for --adapter: an adapter directory, or a run
    directory, whose final adapter/ it means. A ModelSourceError naming what is there otherwise."""
    name = str(given)
    path = Path(name).expanduser()
    if (path / ADAPTER_MARKER).is_file():
        return check_adapter_files(path), None
    final = path / "adapter"
    if (final / ADAPTER_MARKER).is_file():
        return check_adapter_files(final), f"{name} is a run directory: evaluating its final adapter, {final}"
    if path.exists() and not path.is_dir():
        raise ModelSourceError(f"--adapter {name}: a file; expected a run directory (runs/<id>) or its adapter/")
    if (path / "config.yaml").is_file() or (path / "checkpoints").is_dir():
        from gpucert.runtime.dirlock import DirBusy, check_free

        try:
            check_free(path, "--adapter")
        except DirBusy as busy:  # the advice below, `--resume auto`, would be refused while it trains
            raise ModelSourceError(f"{busy} (it has no final adapter yet)") from None
        raise ModelSourceError(
            f"--adapter {name}: a run directory without a final adapter (no {final / ADAPTER_MARKER}): the run "
            f"has not finished. Finish it (gpucert finetune --config {path / 'config.yaml'} --output {name} "
            f"--resume auto), then evaluate {name}"
        )
    if path.is_dir():
        raise ModelSourceError(
            f"--adapter {name}: no {ADAPTER_MARKER} there; expected a run directory (runs/<id>) or its adapter/"
        )
    raise ModelSourceError(
        f"--adapter {name}: no such directory{'' if path.is_absolute() else f' (relative to {Path.cwd()})'}; "
        "expected a run directory (runs/<id>) or its adapter/. An adapter on the hub: hf download ID --local-dir DIR"
    )


def check_adapter_files(adapter: Path) -> Path:
    """The adapter directory, its config and weights readable: a cut or broken file is named now, not as a
    library's traceback after the base model has loaded (seconds on a CPU, minutes for a 7B)."""
    config = adapter / ADAPTER_MARKER
    try:
        if not isinstance(json.loads(config.read_text()), dict):
            raise ValueError("expected a JSON object")
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"--adapter: {config}: not a readable adapter config: {exc}") from None
    weights = adapter / "adapter_model.safetensors"
    if weights.is_file():
        from safetensors import safe_open

        try:
            with safe_open(str(weights), framework="pt") as opened:
                opened.keys()
        except Exception as exc:  # safetensors' own error type: a header cut short, not a safetensors file
            raise ModelSourceError(
                f"--adapter: {weights}: not a readable safetensors file ({exc}): a copy cut short? copy it again, "
                "or evaluate another checkpoint"
            ) from None
    return adapter


def check_model_source(model_cfg: ModelConfig) -> None:
    """Refuse, before a run directory or a cache entry exists, a model.name that cannot be loaded from here."""
    if model_cfg.name != "tiny":
        pretrained_source(model_cfg.name)


def hub_dataset_cached(name: str) -> bool:
    """Whether `datasets` holds a prepared copy of the hub dataset `name` (what it loads offline: its cache's
    namespace___name/<config>/<version>/<hash> directories)."""
    from datasets import config
    from datasets.naming import camelcase_to_snakecase

    parts = name.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    root = Path(config.HF_DATASETS_CACHE).expanduser() / "___".join(parts)
    return any(p.is_dir() for p in root.glob("*/*/*"))


def dataset_offline(data_cfg: DataConfig) -> bool:
    """For a hub dataset id in data.source: False while the hub answers, True where it does not but `datasets`
    has the dataset cached (load it offline: no retries), else a ModelSourceError saying what to do. Without
    this, an unreachable hub cost ~27 s of retries, then an error with no advice. Local files, "sample" and
    "synthetic" are False (config.local_data_problem names a missing file)."""
    name = data_cfg.source
    if name in ("sample", "synthetic") or Path(name).expanduser().exists():
        return False
    problem = local_data_problem(data_cfg)  # a missing local file
    if problem:
        raise ModelSourceError(problem)
    _hub_id(name, "data.source")
    why = hub_unreachable()
    if why is None:
        return False
    if hub_dataset_cached(name):
        return True
    from datasets import config

    raise ModelSourceError(
        f"data.source: {name} is no local file, and as a hub dataset it is not in the local cache "
        f"({config.HF_DATASETS_CACHE}) and the hub cannot be used: {why}. Download it where there is network "
        f"(hf download {name} --repo-type dataset --local-dir DIR) and set data.source to its .json/.jsonl/"
        ".parquet file in DIR, or copy a datasets cache that holds it here (HF_HOME)"
    )
