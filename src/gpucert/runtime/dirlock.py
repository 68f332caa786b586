"""The one lock every gpucert run takes on the directory it writes into (accept and the other verbs' --output,
fine-tuning's output_dir), so that two runs never write into one directory and a second run is refused, told
which run holds it.

The lock is a POSIX record lock (fcntl.lockf) on <dir>/.gpucert.lock, whose text names the holder (pid, host,
since when). Why this kind of lock:
- the kernel drops it when its process ends however it ends, so a lock file left by a killed run blocks nothing;
- unlike flock, it is not inherited by forked children (compile and data workers), and it is opened O_CLOEXEC, so
  no child keeps a dead run's directory locked;
- it reaches other nodes through NFS's lock manager, where the run directory is on the shared filesystem.
A POSIX lock is the process's, not the descriptor's: the holding process could take it again, and closing any
other descriptor of the lock file there would drop it. So this process keeps a list of the directories it holds,
refuses a second claim from that list without opening the file again, and reads its own lock file only through
the descriptor it locked.
Release unlinks the file before closing it; a run that opened the old file meanwhile finds, once it has the
lock, that its inode is no longer the file's, and starts over. A filesystem without locks (some NFS mounts
without lockd, Lustre without `flock`) gets a warning and no lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import struct
import sys
from datetime import datetime, timezone
from pathlib import Path

from gpucert.config.loader import ConfigError

LOCK_FILE = ".gpucert.lock"
# errnos of a filesystem that keeps no locks (as opposed to a lock held by someone else).
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
BUSY = (errno.EACCES, errno.EAGAIN)
# The directories this process holds (real path -> holder line).
_HELD: dict[str, str] = {}


class DirBusy(ConfigError):
    """Another live gpucert run holds the directory (exit 3)."""


def holder_line() -> str:
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return f"pid {os.getpid()} on host {socket.gethostname()}, since {stamp}"


def _refuse_if_held_here(path: Path, what: str) -> str:
    """DirBusy where this process holds `path` already (a second claim must not open the lock file: closing it
    would drop the lock); else the key it is held under once taken."""
    key = os.path.realpath(path)
    if key in _HELD:
        raise DirBusy(f"{what} {path} is in use by another gpucert run ({_HELD[key]}): choose another {what}")
    return key


def lock_dir(path: Path, what: str) -> int | None:
    """Lock `path` (an existing directory) for this process: the open lock file, or None on a filesystem that
    keeps no locks. `what` names the option the directory came from (--output, output_dir) in messages.
    DirBusy, naming the directory and the holder, when another live run holds it."""
    lock = path / LOCK_FILE
    key = _refuse_if_held_here(path, what)
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ConfigError(f"{what} {path}: cannot create the lock file {lock}: {exc.strerror or exc}") from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)  # not ours: closing it drops nothing of the holder's
            if exc.errno in BUSY:
                raise DirBusy(
                    f"{what} {path} is in use by another gpucert run ({holder}): wait for it to finish, or choose "
                    f"another {what} (a lock left by a run that died does not count: the kernel released it)"
                ) from None
            if exc.errno in NO_LOCKS:
                print(
                    f"gpucert: warning: {path} is on a filesystem without file locks ({exc.strerror}): a second run "
                    f"into this {what} would not be stopped",
                    file=sys.stderr,
                    flush=True,
                )
                return None
            raise ConfigError(f"{what} {path}: cannot lock {lock}: {exc.strerror or exc}") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)  # the holder released (and unlinked) it between our open and our lock: again
            continue
        line = holder_line()
        os.ftruncate(fd, 0)
        os.pwrite(fd, (line + "\n").encode(), 0)
        _HELD[key] = line
        return fd


def check_free(path: Path, what: str) -> None:
    """DirBusy where another live run holds `path`'s lock now; nothing is taken or written. For a refusal before
    any work (a second run started into a live run's directory is told so, not told to delete its checkpoints).
    Not a claim: the run still takes the lock with lock_dir, and a run that starts in between is refused there."""
    _refuse_if_held_here(path, what)
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file: nobody holds it (a run takes it by creating the file)
    try:
        # F_GETLK-style probe: lockf cannot test a write lock through a read-only descriptor, so ask with fcntl.
        layout = "hh4xqqi4x"  # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid
        probe = struct.pack(layout, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, probe)
        held = struct.unpack(layout, answer)[0] != fcntl.F_UNLCK
        holder = _read_holder(fd) if held else ""
    except OSError:
        held = False  # a filesystem that keeps no locks: lock_dir warns when the run starts
    finally:
        os.close(fd)  # this process holds no lock on it (checked above): closing drops nothing
    if held:
        raise DirBusy(
            f"{what} {path} is in use by another gpucert run ({holder}): wait for it to finish, or choose another "
            f"{what}"
        )


def unlock_dir(path: Path, fd: int | None) -> None:
    """Release a lock_dir lock: the file goes first (unlinked while still held), then the lock with the fd."""
    if fd is None:
        return
    _HELD.pop(os.path.realpath(path), None)
    with contextlib.suppress(OSError):
        (path / LOCK_FILE).unlink()
    os.close(fd)


def _read_holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if text:
            return text
    return "a run that has not written its name yet"
