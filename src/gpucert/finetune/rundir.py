"""The run directory of `gpucert finetune`: named by rank 0, locked for the run's life, gone again when a run it
was made for fails before its first step.

The lock is a POSIX record lock (fcntl) on <run>/gpucert.lock, taken by global rank 0 alone: only rank 0 writes
into the run directory (checkpoints, adapter, metrics), and on a filesystem shared by the nodes every other
node's ranks would meet rank 0's lock. A second run into the same directory is refused (exit 3) naming the
directory and the holder (pid@host, written into the lock file). The kernel drops the lock when its process
ends however it ends, so a lock file left by a killed run blocks nothing. fcntl locks, unlike flock's, are not
inherited by forked children, so a compile or data-loading worker cannot keep the lock alive after rank 0 dies;
they reach other nodes through NFS's lock manager. A filesystem without locks (Lustre mounted without `flock`)
gets a warning and no lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import yaml

from gpucert.config.loader import ConfigError
from gpucert.finetune.config import FinetuneConfig
from gpucert.runtime.group import Runtime

LOCK_FILE = "gpucert.lock"
CONFIG_FILE = "config.yaml"
# errnos of a filesystem that keeps no locks (as opposed to a lock held by someone else).
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class RunDirBusy(ConfigError):
    """Another live run holds the run directory."""


@dataclass
class RunDir:
    """A run directory as this rank holds it: rank 0 has the lock; every other rank only the path."""

    path: Path
    # Rank 0's open lock file (the lock lives as long as it is open); None elsewhere or without locks.
    lock_fd: int | None = None
    # Rank 0 found no directory (made) or an empty one (fresh): what is in it then is this run's alone.
    made: bool = False
    fresh: bool = False
    # Set by the training loop after its first optimizer step: from then on the directory holds a result.
    trained: bool = False

    def close(self, failed: bool) -> None:
        """Release the lock. After a failure before the first step, also take back what this run put into a
        directory it found missing or empty (config.yaml, the TensorBoard file, the lock file): no half-made run
        directory is left behind. Idempotent (the watchdog may call it while the main thread unwinds)."""
        if failed and self.fresh and not self.trained:
            for entry in list(self.path.iterdir()) if self.path.is_dir() else []:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
            if self.made:
                with contextlib.suppress(OSError):  # something appeared in it meanwhile: leave it
                    self.path.rmdir()
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # closing drops the fcntl lock
            self.lock_fd = None
        self.fresh = False


def holder() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def describe_holder(lock_path: Path) -> str:
    """pid@host (since when) from a lock file, as well as it can be read."""
    try:
        who = json.loads(lock_path.read_text())
        return f"pid {who['pid']}@{who['host']} (since {who['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


def lock_run_dir(path: Path) -> int | None:
    """Take the run's lock in `path` (an existing directory): the open lock file, or None on a filesystem that
    keeps no locks. RunDirBusy when another live process holds it."""
    lock_path = path / LOCK_FILE
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            raise RunDirBusy(
                f"output_dir {path} is in use by another run, {describe_holder(lock_path)}, which holds "
                f"{lock_path}: wait for it to end, or choose another output_dir (a lock left by a run that "
                "died does not count: the kernel released it)"
            ) from None
        if exc.errno in NO_LOCKS:
            print(
                f"gpucert: warning: {path} is on a filesystem without file locks ({exc.strerror}): a second run "
                "into this output_dir would not be stopped",
                file=sys.stderr,
                flush=True,
            )
            return None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder()) + "\n").encode(), 0)
    return fd


def claim_run_dir(path: Path) -> RunDir:
    """Rank 0: create `path` if needed and lock it. Nothing in it is touched before the lock is held."""
    made = not path.exists()
    fresh = made or (path.is_dir() and not any(path.iterdir()))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"output_dir {path}: cannot create it: {exc.strerror or exc}") from None
    try:
        return RunDir(path, lock_run_dir(path), made, fresh)
    except BaseException:
        # Refused or failed: a directory made just now for this run goes again (never one that was there).
        if made:
            RunDir(path, None, made, fresh).close(failed=True)
        raise


def open_run_dir(config: FinetuneConfig, rt: Runtime) -> RunDir:
    """output_dir, or runs/<timestamp>-finetune named by rank 0 (ranks' clocks may straddle a second). Rank 0
    creates and locks it, then writes the resolved config there; other ranks take the path only. Collective."""
    names = [config.output_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-finetune"]
    if rt.world_size > 1:
        dist.broadcast_object_list(names, src=0)
    path = Path(names[0])
    if not rt.is_main:
        return RunDir(path)
    run = claim_run_dir(path)
    try:
        (path / CONFIG_FILE).write_text(yaml.safe_dump(asdict(config), sort_keys=False))
    except BaseException:
        run.close(failed=True)
        raise
    return run
