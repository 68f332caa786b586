"""Heartbeats: a rank that stops (SIGSTOP, a dead node, a kernel hang that froze the process) is named and
the whole job exits, long before a collective timeout.

Every rank bumps `hb/<rank>` in the job's store every runtime.heartbeat_interval_s, over its own connection
(the main thread's may be blocked in a store wait). Rank 0 watches every rank; every rank watches rank 0 and
the abort record. A counter that has not moved for runtime.heartbeat_timeout_s on the watcher's own clock
(no cross-node clock skew) is a dead or stopped rank: the watcher records the abort, naming it, and every rank
exits with ABORTED_EXIT. A store that stops answering means node 0, which serves it, is gone.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from gpucert.runtime.group import ABORTED_EXIT, AbortRecord, connect_store, read_abort, record_abort, say

if TYPE_CHECKING:
    from gpucert.runtime.group import Runtime


class Watchdog:
    def __init__(self, rt: Runtime, prefix: str, on_abort: Callable[[AbortRecord], None] | None) -> None:
        self.rt = rt
        self.prefix = prefix
        self.on_abort = on_abort
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpucert-watchdog", daemon=True)

    def begin(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.rt.config.heartbeat_interval_s * 3)

    def _run(self) -> None:
        rt, cfg = self.rt, self.rt.config
        assert rt.endpoint is not None
        try:
            base = connect_store(*rt.endpoint, False, cfg.rendezvous_timeout_s, rt.me.describe())
        except RuntimeError as exc:
            say(f"watchdog of {rt.me.describe()} could not connect: {exc}")
            return
        store = dist.PrefixStore(self.prefix, base)
        watched = range(rt.world_size) if rt.rank == 0 else [0]
        keys = [f"hb/{r}" for r in watched]
        last: dict[int, tuple[bytes, float]] = {}
        lost_since: float | None = None
        while not self._stop.wait(cfg.heartbeat_interval_s):
            now = time.monotonic()
            try:
                store.add(f"hb/{rt.rank}", 1)
                record = read_abort(store)
                if record is None:
                    record = self._silent_peer(store, watched, store.multi_get(keys), last, now)
                lost_since = None
            except RuntimeError:
                lost_since = lost_since or now
                if now - lost_since < cfg.heartbeat_timeout_s:
                    continue
                host = rt.peers[0]
                record = AbortRecord(
                    who=host.describe(),
                    cause=f"the job's store at {rt.endpoint[0]}:{rt.endpoint[1]}, served by node rank 0, "
                    f"stopped answering for {cfg.heartbeat_timeout_s:g} s: that node or its gpucert is gone",
                    phase="unknown",
                    rank=0,
                    node=host.node,
                )
            if record is not None:
                self._fire(record)
                return

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
                peer = self.rt.peers[r]
                phase = store.get(f"phase/{r}").decode() if store.check([f"phase/{r}"]) else "start"
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
        os._exit(ABORTED_EXIT)
