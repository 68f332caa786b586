"""The run directory of `gpucert finetune`: named by rank 0, locked for the run's life, gone again when a run it
was made for fails before its first step.

The lock (runtime/dirlock.py, the one every gpucert run takes) is taken by global rank 0 alone: only rank 0
writes into the run directory (checkpoints, adapter, metrics), and on a filesystem shared by the nodes every other
node's ranks would meet rank 0's lock. A second run into the same directory is refused (exit 3) naming the
directory and the holder; a lock file left by a killed run blocks nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch.distributed as dist
import yaml

from gpucert.config.loader import ConfigError
from gpucert.finetune.config import FinetuneConfig
from gpucert.finetune.train.checkpoint import CORRUPT_SUFFIX
from gpucert.runtime.dirlock import LOCK_FILE, lock_dir, unlock_dir
from gpucert.runtime.group import Runtime

CONFIG_FILE = "config.yaml"


_CLOSING = threading.Lock()  # RunDir.close, from whichever thread


@dataclass
class RunDir:
    """A run directory as this rank holds it: rank 0 has the lock; every other rank only the path."""

    path: Path
    # Rank 0's open lock file (the lock lives as long as it is open); None elsewhere or without locks.
    lock_fd: int | None = None
    # Rank 0 found no directory (made) or an empty one (fresh): what is in it then is this run's alone.
    made: bool = False
    fresh: bool = False
    # Set by the training loop after its first optimizer step (mark_trained): from then on the directory holds a
    # result.
    trained: bool = False
    # In a directory that held something (a run resumed, or files of the user's), the files found there when it
    # was claimed, and this run's config.yaml until its first step: a run that fails before it leaves that
    # directory as it found it (its config.yaml once said the failed run's data and steps, not the result's).
    found: frozenset[Path] = frozenset()
    pending_config: str | None = None

    def mark_trained(self) -> None:
        """The first optimizer step is done: this run's config.yaml replaces the one it found."""
        if not self.trained and self.pending_config is not None:
            (self.path / CONFIG_FILE).write_text(self.pending_config)
            self.pending_config = None
        self.trained = True

    def close(self, failed: bool) -> None:
        """Release the lock. After a failure before the first step, also take back what this run put into the
        directory (config.yaml, the TensorBoard file, the lock file): all of it in one it found missing or empty,
        what was not there before in one that held something. No half-made run directory is left behind.
        Idempotent, and one caller at a time (the watchdog's or SIGTERM's thread may call it while the main thread
        unwinds: the lock file must be closed once)."""
        with _CLOSING:
            if failed and not self.trained and self.fresh:
                for entry in list(self.path.iterdir()) if self.path.is_dir() else []:
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
                if self.made:
                    with contextlib.suppress(OSError):  # something appeared in it meanwhile: leave it
                        self.path.rmdir()
            elif failed and not self.trained and self.lock_fd is not None:  # rank 0, in a directory that held files
                self._remove_new_entries()
            fd, self.lock_fd = self.lock_fd, None
            unlock_dir(self.path, fd)
            self.fresh = False

    def _remove_new_entries(self) -> None:
        """What appeared under the directory since it was claimed (deepest first), the lock file aside, and the
        checkpoints found unreadable and renamed step-N.corrupt: new paths, but the earlier run's files, kept for a
        person to look at (removing them left `--resume auto` nothing, and the next one started over)."""
        for entry in sorted(listing(self.path) - self.found, key=lambda p: len(p.parts), reverse=True):
            if entry.name == LOCK_FILE or any(CORRUPT_SUFFIX in part for part in entry.relative_to(self.path).parts):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir() and not entry.is_symlink():
                    entry.rmdir()  # emptied above; one that is not was there in part: left
                else:
                    entry.unlink()


def listing(path: Path) -> frozenset[Path]:
    """Every file and directory under path (not following links)."""
    found: set[Path] = set()
    for root, dirs, files in os.walk(path):
        found.update(Path(root) / name for name in (*dirs, *files))
    return frozenset(found)


def claim_run_dir(path: Path) -> RunDir:
    """Rank 0: create `path` if needed and lock it. Nothing in it is touched before the lock is held."""
    made = not path.exists()
    fresh = made or (path.is_dir() and not any(path.iterdir()))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"output_dir {path}: cannot create it: {exc.strerror or exc}") from None
    try:
        fd = lock_dir(path, "output_dir")
        return RunDir(path, fd, made, fresh, found=frozenset() if fresh else listing(path))
    except BaseException:
        # Refused or failed: a directory made just now for this run goes again (never one that was there).
        if made:
            RunDir(path, None, made, fresh).close(failed=True)
        raise


def run_dir_name(config: FinetuneConfig) -> str:
    """output_dir, or a new runs/<timestamp>-finetune."""
    return config.output_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-finetune"


def open_run_dir(config: FinetuneConfig, rt: Runtime) -> RunDir:
    """output_dir, or runs/<timestamp>-finetune named by rank 0 (ranks' clocks may straddle a second). Rank 0
    creates and locks it, then writes the resolved config there; other ranks take the path only. Collective."""
    names = [run_dir_name(config)]
    if rt.world_size > 1:
        dist.broadcast_object_list(names, src=0)
    path = Path(names[0])
    if not rt.is_main:
        return RunDir(path)
    run = claim_run_dir(path)
    text = yaml.safe_dump(asdict(config), sort_keys=False)
    try:
        if run.fresh:
            (path / CONFIG_FILE).write_text(text)
        else:  # the config.yaml found there stays until this run's first step (RunDir.found says why)
            run.pending_config = text
    except BaseException:
        run.close(failed=True)
        raise
    return run
