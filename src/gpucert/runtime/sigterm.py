"""SIGTERM from an outside launcher, handled on a thread of its own, so rank 0 can still write what ran.

When one rank of a job ends, torchrun SIGTERMs every other rank of its node at once (as does a cancelled job's
scheduler), within a fraction of a second, long before rank 0's watchdog (a heartbeat interval) has read why. Left to
the default action, rank 0 dies with its partial report unwritten and nobody named. Python runs a signal
handler only in the main thread, between bytecodes, which may be blocked in a collective or a store wait for
minutes; but its C-level handler writes the signal's number to a wakeup fd from whichever thread received it.
`TermWatch` reads that fd on its own thread, runs its callback there, and ends the process.

`why_terminated` says who most likely caused it: the abort record in the job's store if a rank recorded one,
else a rank of this node whose process is gone (SIGKILLed, the OOM killer: no word of its own) and that did not
say it was stopped by the launcher too (`sigterm/<rank>`, `stopped_by_launcher`) or that it had finished
(`closed/<rank>`), else the launcher itself.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpucert.runtime.errors import restore_handlers
from gpucert.runtime.group import AbortRecord, read_abort, read_phase, watch_store
from gpucert.runtime.watchdog import process_state

if TYPE_CHECKING:
    from gpucert.runtime.group import Runtime


# The started watch, if any: a child forked while it runs (a data-preparation or DataLoader worker) must not
# inherit its do-nothing handler and its wakeup fd, or the child would ignore SIGTERM and its signal would
# reach this process's watch, which would end this process. The child puts both back first thing; a SIGTERM
# that reaches it before its first instruction still goes to the watch (a pool is stopped after it has worked,
# not within a microsecond of its fork). A child that execs (subprocess) gets neither: the kernel resets
# handlers at exec, and the pipe is close-on-exec.
_STARTED: list[TermWatch] = []


def _reset_in_child() -> None:
    for watch in _STARTED:
        watch._restore()
    _STARTED.clear()


os.register_at_fork(after_in_child=_reset_in_child)


class TermWatch:
    """While started: SIGTERM runs `on_term` on a thread of its own, then the process exits with `exit_code`,
    after `limit_s` at most (a store that no longer answers must not keep a stopped process running: the
    launcher's SIGKILL would come next). Start and stop it from the main thread (Python's signal functions
    require it); elsewhere it does nothing."""

    def __init__(self, on_term: Callable[[], None], exit_code: int, limit_s: float = 15.0) -> None:
        self.on_term = on_term
        self.exit_code = exit_code
        self.limit_s = limit_s
        self._stop = threading.Event()
        self._seen = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved: tuple[Any, int] | None = None
        self._fds: tuple[int, int] | None = None

    def start(self) -> TermWatch:
        if threading.current_thread() is not threading.main_thread():
            return self
        read, write = os.pipe()
        os.set_blocking(write, False)  # the C handler must never block on a full pipe
        self._fds = (read, write)
        # A Python-level handler is what makes the interpreter's C handler write to the wakeup fd; the handler
        # itself does nothing (the thread acts), so the main thread carries on until the exit. The fd first: a
        # SIGTERM in between meets the old handler, never ours without its fd.
        old_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        old_handler = signal.signal(signal.SIGTERM, _noted)
        self._saved = (old_handler, old_fd)
        self._thread = threading.Thread(target=self._run, args=(read,), name="gpucert-sigterm", daemon=True)
        self._thread.start()
        _STARTED.append(self)
        return self

    @property
    def stopping(self) -> bool:
        """SIGTERM has come: this process ends within limit_s."""
        return self._seen.is_set()

    def hold_if_stopping(self) -> None:
        """For the main thread before it starts new work (the next benchmark): once SIGTERM has come, wait here for
        the watch's exit instead (it carried on while the watch wrote the partial report, and started p2p and
        collectives). Bounded: the watch exits by limit_s; past that, RuntimeError."""
        if not self.stopping:
            return
        deadline = time.monotonic() + self.limit_s + 5
        while time.monotonic() < deadline:
            time.sleep(0.2)
        raise RuntimeError(f"SIGTERM came, and this process did not end within {self.limit_s + 5:g} s")

    def stop(self) -> None:
        """SIGTERM goes back to what it was (the default: the process ends)."""
        if self._saved is None or self._fds is None:
            return
        self._stop.set()
        if self in _STARTED:
            _STARTED.remove(self)
        self._restore()  # before the thread stops: a SIGTERM from here on meets the old handler
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._saved = self._fds = None

    def _restore(self) -> None:
        """The handler, then the wakeup fd, as they were (the handler first: ours never runs without its fd)."""
        if self._saved is None:
            return
        old_handler, old_fd = self._saved
        restore_handlers({signal.SIGTERM: old_handler})
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(old_fd)

    def _run(self, read: int) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([read], [], [], 0.2)
            if not ready:
                continue
            try:
                numbers = os.read(read, 512)
            except OSError:
                return
            if signal.SIGTERM in numbers:  # the fd also carries other handled signals (SIGINT): not ours
                self._seen.set()
                acting = threading.Thread(target=self._act, name="gpucert-sigterm-act", daemon=True)
                acting.start()
                acting.join(timeout=self.limit_s)
                if acting.is_alive():
                    print(f"gpucert: stopping took over {self.limit_s:g} s: exiting without it", file=sys.stderr)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(self.exit_code)

    def _act(self) -> None:
        try:
            self.on_term()
        except Exception as exc:  # the exit must happen whatever the callback did
            print(f"gpucert: while stopping: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _noted(signum: int, frame: FrameType | None) -> None:
    """The main thread's share of SIGTERM: none (TermWatch's thread writes, then ends the process)."""


def stopped_by_launcher(rt: Runtime) -> AbortRecord:
    """For a rank's SIGTERM callback: say in the job's store that the launcher stopped this rank, so that no
    peer takes it for the rank that ended, then why_terminated."""
    store = watch_store(rt)
    with contextlib.suppress(RuntimeError):
        store.set(f"sigterm/{rt.rank}", "1")
    return why_terminated(rt, store)


# How long a rank waits before it looks at its peers' processes: the launcher signals every rank at once, and
# each one it stopped says so (a store write, milliseconds) before it goes; a rank looked at sooner could be
# gone without having said it yet, and be named for what the launcher did.
SETTLE_S = 0.5


def why_terminated(rt: Runtime, store: Any, settle_s: float = SETTLE_S) -> AbortRecord:
    """Why the launcher stopped this rank, as best this rank can tell (module docstring)."""
    with contextlib.suppress(RuntimeError):
        found = read_abort(store)
        if found is not None:
            return found
    time.sleep(settle_s)
    for peer in rt.peers:
        # Same node rank: started by the same launcher on this machine, so its pid means the same process here.
        if peer.rank == rt.rank or peer.node_rank != rt.node_rank or not process_gone(peer.pid):
            continue
        with contextlib.suppress(RuntimeError):
            if store.check([f"sigterm/{peer.rank}"]) or store.check([f"closed/{peer.rank}"]):
                continue  # stopped by the launcher too, or finished and left: not the one that ended
        phase = "start"
        with contextlib.suppress(RuntimeError):
            phase = read_phase(store, peer.rank)
        return AbortRecord(
            who=peer.describe(),
            cause=f"its process (pid {peer.pid}) ended without a word (killed: SIGKILL, the kernel's OOM killer?), "
            "and the launcher stopped every rank",
            phase=phase,
            rank=peer.rank,
            node=peer.node,
        )
    alone = rt.world_size == 1
    return AbortRecord(
        who=rt.me.describe(),
        # A lone run: the SIGTERM may come from the user's `kill` as well as a launcher. In a job nobody here ended
        # first: a cancelled job or a time limit, or a rank on another node that ended without a word; said as the
        # launcher's stop, naming no rank (this one only noticed it).
        cause="stopped by SIGTERM (a `kill`, a cancelled job, or a launcher stopping it); it ran alone, so no other "
        "rank ended first"
        if alone
        else "no rank had ended before it (a cancelled job or a time limit; or torchrun stopping every rank after "
        "one on another node ended: look for it in that node's launcher output)",
        phase=rt.phase,
        rank=rt.rank,
        node=rt.me.node if alone else None,
        launcher=not alone,
    )


def process_gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie not yet reaped has ended too)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return process_state(pid) == "gone"
