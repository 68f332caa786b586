"""Python's compiled modules kept in gpucert's cache where the environment forbids writing them beside the sources.

Container images often set PYTHONDONTWRITEBYTECODE=1 and install packages without their .pyc files (pip's
--no-compile, or a layer that strips them). Python then compiles every module's source again at every start: on
one H100 cloud VM set up that way (2026-11-27) a fine-tuning rank spent 18.5-24.9 s importing torch, transformers,
PEFT and datasets, against 5 s on a CPU VM whose packages carry their .pyc. Each rank of a job pays it, before its
first step.

`use_cache()` runs first in gpucert's entry points (the CLI and `python -m gpucert.finetune.train`), before torch
is imported. Where bytecode may not be written and torch has none, it points Python's bytecode at a cache of
gpucert's own (sys.pycache_prefix: `$GPUCERT_BYTECODE_CACHE`, default ~/.cache/gpucert/bytecode) and lets Python
write there: the image and site-packages are left untouched, the first start fills the cache and every later start
of any rank reads from it. Python writes each file atomically and checks it against its source's size and time,
so ranks on a shared filesystem share one cache and an upgraded package is compiled again. PYTHONPYCACHEPREFIX and
GPUCERT_BYTECODE_CACHE are exported too: inductor's compile workers (processes of their own) read the same cache,
and the ranks a gpucert process starts read and write it.

Nothing changes where bytecode may be written, where the user chose a prefix, or with
GPUCERT_BYTECODE_CACHE=off. Only the standard library is imported here: the point is to run before anything heavy.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ENV = "GPUCERT_BYTECODE_CACHE"
OFF = ("0", "off", "false", "no")

# What use_cache() decided in this process, for the run's metrics: {"cache": dir or None, "reason": why}.
decision: dict[str, str | None] = {}


def default_dir(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """~/.cache/gpucert/bytecode, or under $XDG_CACHE_HOME: beside the compile cache (compile_cache.py)."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpucert" / "bytecode"


def has_bytecode(package: str) -> bool | None:
    """Whether an importable package has its __init__'s .pyc beside its source; None where it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    # sys.pycache_prefix is still unset here, so this is the __pycache__ path beside the source.
    return Path(importlib.util.cache_from_source(spec.origin)).is_file()


def use_cache(environ: dict[str, str] | os._Environ[str] = os.environ, probe: str = "torch") -> dict[str, str | None]:
    """Point Python's bytecode at gpucert's cache where none can be written beside the sources (the module's
    docstring says when). Returns, and keeps in `decision`, the cache used (None: none) and why."""
    setting = environ.get(ENV, "").strip()
    if not sys.dont_write_bytecode:
        reason = "Python writes bytecode beside the sources"
    elif sys.pycache_prefix:
        if setting and Path(setting).expanduser() == Path(sys.pycache_prefix):
            # gpucert's cache, passed down by the gpucert process that started this one (a rank of `gpucert
            # finetune`): this process writes there too, or the modules its parent never imported (transformers,
            # PEFT) would be compiled again at every start, their own .pyc being ignored under a prefix.
            sys.dont_write_bytecode = False
            decision.update(cache=sys.pycache_prefix, reason=f"{ENV} passed down by the launching process")
        else:
            decision.update(cache=sys.pycache_prefix, reason="PYTHONPYCACHEPREFIX is set")
        return decision
    elif setting.lower() in OFF:
        reason = f"{ENV}={setting}"
    elif not setting and (found := has_bytecode(probe)) is not False:
        reason = f"PYTHONDONTWRITEBYTECODE is set, but {probe} has its bytecode"
        if found is None:
            reason = f"{probe} is not installed"
    else:
        directory = Path(setting).expanduser() if setting else default_dir(environ)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            writable = os.access(directory, os.W_OK)
        except OSError as exc:
            writable, directory = False, Path(f"{directory} ({exc.strerror})")
        if not writable:
            # Not an error: the run is only slower to start, as it would be without gpucert. The reason says so.
            reason = f"PYTHONDONTWRITEBYTECODE is set and {probe} has no bytecode, but {directory} is not writable"
        else:
            sys.pycache_prefix = str(directory)
            sys.dont_write_bytecode = False
            # Children read it (PYTHONPYCACHEPREFIX); gpucert's own children write to it as well (the branch above).
            os.environ["PYTHONPYCACHEPREFIX"] = os.environ[ENV] = str(directory)
            reason = f"PYTHONDONTWRITEBYTECODE is set and {probe} has no bytecode beside its sources"
            decision.update(cache=str(directory), reason=reason)
            return decision
    decision.update(cache=None, reason=reason)
    return decision
