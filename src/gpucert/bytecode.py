"""Python's compiled modules kept in gpucert's cache where the environment forbids writing them beside the sources.

Container images often set PYTHONDONTWRITEBYTECODE=1 and install packages without their .pyc files (pip's
--no-compile, or a layer that strips them). Python then compiles those packages' sources again at every start: on
one H100 cloud VM set up that way (2026-11-27) a fine-tuning rank spent 18.5-24.9 s importing torch, transformers,
PEFT and datasets, against 5 s on a CPU VM whose packages carry their .pyc. Each rank of a job pays it, before its
first step.

`use_cache()` runs first in gpucert's entry points (the CLI and `python -m gpucert.finetune.train`), before torch
is imported. Where bytecode may not be written and torch has none, it points Python's bytecode at a cache of
gpucert's own (sys.pycache_prefix: `$GPUCERT_BYTECODE_CACHE`, default ~/.cache/gpucert/bytecode) and lets Python
write there; the image and site-packages are left untouched. Under a prefix Python reads bytecode from the prefix
alone, also for packages that have theirs beside the sources: the first start of a process compiles everything it
imports into the cache (on that VM 34.5 s of imports instead of 19.8), and every later start that imports the
same modules reads them (10.2 s). So the cache must outlive the container: on a cluster it is on the shared home
by default; an image whose home is thrown away should set GPUCERT_BYTECODE_CACHE to a mounted directory.

Python writes each file atomically (a temporary file renamed into place) and checks it against its source's size
and modification time, so ranks on a shared filesystem share one cache and an upgraded package is compiled again.
PYTHONPYCACHEPREFIX and GPUCERT_BYTECODE_CACHE are exported: inductor's compile workers (processes of their own)
read the cache, and the ranks a gpucert process starts (`gpucert finetune` on a node) read and write it. A cache
that exists but cannot be written (another user's on a shared filesystem) is read, not written.

Nothing changes where bytecode may be written, where the user chose a prefix, or with
GPUCERT_BYTECODE_CACHE=off. Only the standard library is imported here: the point is to run before anything heavy.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import sys
from pathlib import Path

ENV = "GPUCERT_BYTECODE_CACHE"
OFF = ("0", "off", "false", "no")

# What use_cache() decided in this process, for the run's metrics: the cache used (None: none), whether it held
# the probe's bytecode already ("read") or not ("filled") or may only be read ("read-only"), and why.
decision: dict[str, str | None] = {}


def default_dir(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """~/.cache/gpucert/bytecode, or under $XDG_CACHE_HOME: beside the compile cache (compile_cache.py). Raises
    RuntimeError where there is no home directory (HOME unset, a uid without a passwd entry)."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpucert" / "bytecode"


def source_of(package: str) -> str | None:
    """The package's __init__.py, None where it is not installed (or not from a source file)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return spec.origin


def has_bytecode(package: str) -> bool | None:
    """Whether an importable package has its __init__'s bytecode where Python looks for it now (beside the source,
    or under sys.pycache_prefix once set); None where it is not installed."""
    origin = source_of(package)
    return None if origin is None else Path(importlib.util.cache_from_source(origin)).is_file()


def cache_loaded_modules() -> int:
    """Write the bytecode of the modules this process imported before the prefix was set (the standard library's
    and gpucert's CLI's) into the cache, where it is missing: the processes started from this one read the
    prefix from their first import, so without it they would compile those sources at every start. Returns how
    many were written."""
    written = 0
    for module in list(sys.modules.values()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if not isinstance(origin, str) or not origin.endswith(".py"):
            continue
        target = importlib.util.cache_from_source(origin)
        if os.path.exists(target):
            continue
        try:
            py_compile.compile(origin, cfile=target, doraise=True)
        except (OSError, py_compile.PyCompileError):
            continue  # a source gone or unreadable: that module is compiled at start, as without the cache
        written += 1
    return written


def _record(cache: str | None, state: str | None, reason: str) -> dict[str, str | None]:
    decision.clear()
    decision.update(cache=cache, state=state, reason=reason)
    return decision


def _state(probe: str) -> str:
    return "read" if has_bytecode(probe) else "filled"


def use_cache(environ: dict[str, str] | os._Environ[str] = os.environ, probe: str = "torch") -> dict[str, str | None]:
    """Point Python's bytecode at gpucert's cache where none can be written beside the sources (the module's
    docstring says when). Returns, and keeps in `decision`, the cache used (None: none), its state and why."""
    setting = environ.get(ENV, "").strip()
    if sys.pycache_prefix:
        prefix = sys.pycache_prefix
        if setting and setting.lower() not in OFF and os.path.abspath(os.path.expanduser(setting)) == prefix:
            # gpucert's cache, passed down by the gpucert process that started this one (a rank of `gpucert
            # finetune`): this process writes there too where it can, or the modules its parent never imported
            # (transformers, PEFT) would be compiled again at every start, their own .pyc ignored under a prefix.
            writable = os.access(prefix, os.W_OK)
            sys.dont_write_bytecode = not writable
            state = _state(probe) if writable else "read-only"
            if writable:
                cache_loaded_modules()
            return _record(prefix, state, f"{ENV} passed down by the launching process")
        return _record(prefix, _state(probe), "PYTHONPYCACHEPREFIX is set")
    if not sys.dont_write_bytecode:
        return _record(None, None, "Python writes bytecode beside the sources")
    if setting.lower() in OFF:
        return _record(None, None, f"{ENV}={setting}")
    if not setting:
        found = has_bytecode(probe)
        if found is None:
            return _record(None, None, f"{probe} is not installed")
        if found:
            return _record(None, None, f"PYTHONDONTWRITEBYTECODE is set, but {probe} has its bytecode")
    try:
        directory = Path(setting).expanduser() if setting else default_dir(environ)
        directory = Path(os.path.abspath(directory))
        directory.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError, KeyError) as exc:
        # Not an error: the run is only slower to start, as it would be without gpucert. The reason says so.
        where = setting or "~/.cache/gpucert/bytecode"
        return _record(None, None, f"no bytecode cache: {where} cannot be made ({exc}); set {ENV}=DIR")
    writable = os.access(directory, os.W_OK)
    sys.pycache_prefix = str(directory)
    sys.dont_write_bytecode = not writable
    # Children read it (PYTHONPYCACHEPREFIX); gpucert's own children write to it as well (the branch above).
    os.environ["PYTHONPYCACHEPREFIX"] = os.environ[ENV] = str(directory)
    state = "read-only" if not writable else _state(probe)
    if writable:
        cache_loaded_modules()
    reason = f"PYTHONDONTWRITEBYTECODE is set and {probe} has no bytecode beside its sources"
    return _record(str(directory), state, reason)
