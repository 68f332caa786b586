"""Heartbeats: a rank that stops (SIGSTOP, a dead node, a kernel hang that froze the process) is named and
the whole job exits, long before a collective timeout.

Every rank bumps `hb/<rank>` in the job's store every runtime.heartbeat_interval_s, over its own connection
(the main thread's may be blocked in a store wait). Rank 0 watches every rank; every rank watches rank 0 and
the abort record. A counter that has not moved for runtime.heartbeat_timeout_s on the watcher's own clock
(no cross-node clock skew) is a dead or stopped rank: the watcher records the abort, naming it, and every rank
exits with ABORTED_EXIT.

A store call can block for good when the store's server is stopped or unreachable (a TCPStore timeout does not
bound a call already sent), so a second thread, the deadman, ends the process when the heartbeat thread has not
completed a round trip for the heartbeat timeout: then the store itself is gone, and it says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from gpucert.runtime.group import (
    ABORTED_EXIT,
    AbortRecord,
    connect_store,
    leave_failed,
    read_abort,
    read_phase,
    record_abort,
    say,
)

if TYPE_CHECKING:
    from gpucert.runtime.group import Runtime


class Watchdog:
    def __init__(self, rt: Runtime, prefix: str, on_abort: Callable[[AbortRecord], None] | None) -> None:
        self.rt = rt
        self.prefix = prefix
        self.on_abort = on_abort
        # The heartbeat thread's own connection, also for on_abort (the main thread's may be mid-wait).
        self.store: Any = None
        self.run_store: Any = None  # the run store (Runtime.run_store) over the same connection
        self.last_ok = time.monotonic()
        self._beating = threading.Event()
        self._armed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpucert-watchdog", daemon=True)
        self._deadman = threading.Thread(target=self._watch_store, name="gpucert-deadman", daemon=True)

    def begin(self) -> Watchdog:
        self._beating.set()
        self._armed.set()
        self._thread.start()
        self._deadman.start()
        return self

    def stop_beating(self) -> None:
        """Stop heartbeats and abort reading (this rank records its own failure next); the deadman stays armed,
        so an exit blocked on a dead store still ends."""
        self._beating.clear()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.rt.config.heartbeat_interval_s * 3)

    def stop(self) -> None:
        """The run is over: nothing is watched any more."""
        self._armed.clear()
        self.stop_beating()

    def _run(self) -> None:
        rt, cfg = self.rt, self.rt.config
        assert rt.endpoint is not None
        try:
            base = connect_store(*rt.endpoint, False, cfg.rendezvous_timeout_s, rt.me.describe())
        except RuntimeError as exc:
            say(f"watchdog of {rt.me.describe()} could not connect: {exc}")
            return
        store = self.store = dist.PrefixStore(self.prefix, base)
        self.run_store = dist.PrefixStore("gpucert/run/", base)
        watched = range(rt.world_size) if rt.rank == 0 else [0]
        keys = [f"hb/{r}" for r in watched]
        last: dict[int, tuple[bytes, float]] = {}
        while self._beating.is_set():
            time.sleep(cfg.heartbeat_interval_s)
            if not self._beating.is_set():
                return
            try:
                store.add(f"hb/{rt.rank}", 1)
                record = read_abort(store)
                if record is None:
                    record = self._silent_peer(store, watched, store.multi_get(keys), last, time.monotonic())
            except RuntimeError:
                continue  # the store errs: the deadman decides once it has been gone for the timeout
            self.last_ok = time.monotonic()
            if record is not None:
                self._fire(record)
                return

    def _watch_store(self) -> None:
        assert self.rt.endpoint is not None
        addr, port = self.rt.endpoint
        deadman(
            lambda: self.last_ok,
            self._armed,
            self.rt.config.heartbeat_interval_s,
            self.rt.config.heartbeat_timeout_s,
            f"{self.rt.me.describe()} stops: the job's store at {addr}:{port}",
        )

    def _silent_peer(
        self,
        store: Any,
        watched: range | list[int],
        values: list[bytes],
        last: dict[int, tuple[bytes, float]],
        now: float,
    ) -> AbortRecord | None:
        cfg = self.rt.config
        for r, value in zip(watched, values, strict=True):
            if r == self.rt.rank:
                continue
            seen = last.get(r)
            if seen is None or seen[0] != value:
                last[r] = (value, now)
            elif now - seen[1] > cfg.heartbeat_timeout_s:
                if store.check([f"closed/{r}"]):
                    continue  # it finished its part and left (stop_runtime): silent, not dead
                peer = self.rt.peers[r]
                phase = read_phase(store, r)
                if peer.host == self.rt.me.host:
                    # A SIGSTOPped peer holds the SIGTERM its launcher sends next until it is woken: wake it, so
                    # it reads the record and leaves now, not after the launcher's grace period.
                    with contextlib.suppress(OSError):
                        os.kill(peer.pid, signal.SIGCONT)
                return record_abort(
                    store,
                    AbortRecord(
                        who=peer.describe(),
                        cause=f"no heartbeat for {now - seen[1]:.0f} s (runtime.heartbeat_timeout_s "
                        f"{cfg.heartbeat_timeout_s:g}): the process is stopped, hung or dead, or its node is gone",
                        phase=phase,
                        rank=r,
                        node=peer.node,
                    ),
                )
        return None

    def _fire(self, record: AbortRecord) -> None:
        """End this process: a peer failed, so every collective here would wait for it until the timeout."""
        if self.on_abort is not None:
            try:
                self.on_abort(record)
            except Exception as exc:  # the exit below must happen whatever the callback did
                say(f"while stopping: {type(exc).__name__}: {exc}")
        say(f"{self.rt.me.describe()} stops: {record.message()}")
        leave_failed(self.rt, ABORTED_EXIT)


def deadman(
    last_ok: Callable[[], float], armed: threading.Event, interval_s: float, timeout_s: float, who: str
) -> None:
    """Exit the process once `last_ok()` (the last completed store round trip) is older than the timeout."""
    limit = timeout_s + 2 * interval_s
    while armed.is_set():
        time.sleep(interval_s)
        silent = time.monotonic() - last_ok()
        if armed.is_set() and silent > limit:
            say(
                f"{who} has not answered for {silent:.0f} s (runtime.heartbeat_timeout_s {timeout_s:g}): the process "
                "that serves it (node rank 0's gpucert or torchrun agent, or rank 0) is gone, stopped or unreachable"
            )
            os._exit(ABORTED_EXIT)
