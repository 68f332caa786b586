"""gpucert's bytecode cache (src/gpucert/bytecode.py), in real interpreters started with PYTHONDONTWRITEBYTECODE=1:
where the cache applies and where it must not, and that both entry points use it before torch is imported."""

from __future__ import annotations

import compileall
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucert import bytecode

# What a child prints: use_cache()'s decision, what it left set and exported, and whether the bytecode of json
# (imported before use_cache, as the CLI's imports are) is where the processes it starts will look for it.
CHILD = """
import importlib.util, json, os, sys
from gpucert.bytecode import ENV, use_cache
got = use_cache(probe="probe_pkg")
import probe_pkg.mod
exported = [os.environ.get("PYTHONPYCACHEPREFIX"), os.environ.get(ENV)]
early = os.path.exists(importlib.util.cache_from_source(json.__file__))
state = {"prefix": sys.pycache_prefix, "dont_write": sys.dont_write_bytecode, "env": exported, "early": early}
print(json.dumps({"decision": got, **state}))
"""
WRITTEN = "PYTHONDONTWRITEBYTECODE is set and probe_pkg has no bytecode beside its sources"


def make_package(root: Path, with_bytecode: bool) -> Path:
    pkg = root / "probe_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("VALUE = 1\n")
    if with_bytecode:
        assert compileall.compile_dir(str(pkg), quiet=1)
    return pkg


def child(root: Path, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", bytecode.ENV)}
    src = Path(bytecode.__file__).parents[1]
    environ.update(PYTHONPATH=f"{root}{os.pathsep}{src}", PYTHONDONTWRITEBYTECODE="1", HOME=str(root / "home"))
    environ.pop("XDG_CACHE_HOME", None)
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", CHILD], env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_package_without_bytecode_gets_it_in_gpucerts_cache(tmp_path: Path) -> None:
    pkg = make_package(tmp_path, with_bytecode=False)
    got = child(tmp_path)
    cache = tmp_path / "home" / ".cache" / "gpucert" / "bytecode"
    assert got["decision"] == {"cache": str(cache), "state": "filled", "reason": WRITTEN}
    assert (got["prefix"], got["dont_write"]) == (str(cache), False)
    assert got["env"] == [str(cache), str(cache)]  # what the processes it starts inherit
    assert got["early"]  # what was imported before the prefix is in the cache too, for those processes
    # Written under the prefix (the source's path mirrored), and nothing beside the sources.
    assert list(cache.rglob("mod.*.pyc")), sorted(cache.rglob("*"))
    assert not (pkg / "__pycache__").exists()
    # The next start finds the cache filled.
    assert child(tmp_path)["decision"]["state"] == "read"


def test_nothing_changes_where_bytecode_is_there_allowed_or_refused(tmp_path: Path) -> None:
    make_package(tmp_path, with_bytecode=True)
    got = child(tmp_path)
    assert got["decision"] == {"cache": None, "state": None, "reason": got["decision"]["reason"]}
    assert got["prefix"] is None and got["dont_write"] is True
    assert "probe_pkg has its bytecode" in got["decision"]["reason"]
    # Python may write bytecode: nothing to do.
    got = child(tmp_path, PYTHONDONTWRITEBYTECODE="")
    assert got["decision"] == {"cache": None, "state": None, "reason": "Python writes bytecode beside the sources"}
    # The user chose a prefix (with or without PYTHONDONTWRITEBYTECODE): recorded, left as it is.
    for dont_write in ("1", ""):
        mine = child(tmp_path, PYTHONPYCACHEPREFIX=str(tmp_path / "mine"), PYTHONDONTWRITEBYTECODE=dont_write)
        assert mine["prefix"] == str(tmp_path / "mine") and mine["dont_write"] is bool(dont_write)
        assert mine["decision"]["cache"] == str(tmp_path / "mine")
        assert mine["decision"]["reason"] == "PYTHONPYCACHEPREFIX is set"
    off = child(tmp_path, **{bytecode.ENV: "off"})
    assert off["decision"] == {"cache": None, "state": None, "reason": f"{bytecode.ENV}=off"}
    assert off["prefix"] is None


def test_a_rank_started_by_gpucert_writes_to_the_cache_it_inherits(tmp_path: Path) -> None:
    make_package(tmp_path, with_bytecode=True)  # ignored under a prefix: the rank must write its own
    cache = tmp_path / "bc"
    cache.mkdir()
    passed = child(tmp_path, PYTHONPYCACHEPREFIX=str(cache), **{bytecode.ENV: str(cache)})
    assert passed["prefix"] == str(cache) and passed["dont_write"] is False
    assert passed["decision"] == {
        "cache": str(cache),
        "state": "filled",
        "reason": f"{bytecode.ENV} passed down by the launching process",
    }
    assert list(cache.rglob("mod.*.pyc")) and passed["early"]


def test_a_named_cache_is_used_even_where_the_probe_has_bytecode_and_one_that_cannot_be_made_is_said(
    tmp_path: Path,
) -> None:
    make_package(tmp_path, with_bytecode=True)
    named = tmp_path / "shared" / "bc"
    got = child(tmp_path, **{bytecode.ENV: str(named)})
    assert got["decision"]["cache"] == str(named) and list(named.rglob("mod.*.pyc"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # A path under a file, and a home that cannot be found (what HOME unset for a uid without a passwd entry
    # gives): the start goes on without a cache, saying why.
    for where in (str(blocker / "bc"), "~no-such-user-gpucert/bc"):
        got = child(tmp_path, **{bytecode.ENV: where})
        assert got["decision"]["cache"] is None and got["prefix"] is None and got["dont_write"] is True
        assert got["decision"]["reason"].startswith(f"no bytecode cache: {where} cannot be made (")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere: a read-only cache needs another user")
def test_a_cache_this_user_cannot_write_is_read(tmp_path: Path) -> None:
    make_package(tmp_path, with_bytecode=False)
    cache = tmp_path / "theirs"
    assert child(tmp_path, **{bytecode.ENV: str(cache)})["decision"]["state"] == "filled"
    cache.chmod(0o555)
    try:
        got = child(tmp_path, **{bytecode.ENV: str(cache)})
    finally:
        cache.chmod(0o755)
    assert got["decision"]["state"] == "read-only" and got["prefix"] == str(cache) and got["dont_write"] is True


@pytest.mark.slow
def test_the_training_entry_point_caches_torchs_bytecode_before_importing_it(tmp_path: Path) -> None:
    """`python -m gpucert.finetune.train` as torchrun starts it: the cache is in place before torch loads, so
    torch's modules land in it (a bad config path then ends the rank after its imports)."""
    cache = tmp_path / "bc"
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    environ.update(PYTHONDONTWRITEBYTECODE="1", **{bytecode.ENV: str(cache)})
    done = subprocess.run(
        [sys.executable, "-m", "gpucert.finetune.train", str(tmp_path / "missing.yaml")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stderr
    assert "missing.yaml: cannot read" in done.stderr
    torch_dir = Path(__import__("torch").__file__).parent
    mirrored = cache / torch_dir.relative_to(torch_dir.anchor)  # under a prefix: no __pycache__ level
    assert list(mirrored.glob("__init__.*.pyc")), f"no torch bytecode under {mirrored}"


def test_the_cli_entry_point_uses_the_cache_for_what_it_imports_after_it(tmp_path: Path) -> None:
    cache = tmp_path / "bc"
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    environ.update(PYTHONDONTWRITEBYTECODE="1", **{bytecode.ENV: str(cache)})
    done = subprocess.run(
        [sys.executable, "-m", "gpucert", "finetune", "--list-recipes"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # gpucert.finetune.commands is imported only once main() runs, so its bytecode is in the cache.
    assert list(cache.rglob("gpucert/finetune/commands.*.pyc")), sorted(cache.rglob("*.pyc"))[:5]
