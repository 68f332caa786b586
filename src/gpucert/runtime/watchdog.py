"""Heartbeats: a rank that stops (SIGSTOP, a dead node, a kernel hang that froze the process) is named and
the whole job exits, long before a collective timeout.

Per node, not per rank: the store's heartbeat traffic is the job's nodes', not its GPUs'
(docs/results/store-scale.md). Each node's keeper (its local rank 0):
- bumps `hb/node/<node rank>` in the job's store every runtime.heartbeat_interval_s, over its own connection
  (the main thread's may be blocked in a store wait), and reads the abort record;
- watches its node's other ranks by pid: a process gone, or stopped (/proc state T), for
  runtime.heartbeat_timeout_s is named, with the phase it was in;
- watches node 0's counter (rank 0's), and rank 0 watches every node's: a counter that has not moved for
  runtime.heartbeat_timeout_s on the watcher's own clock (no cross-node clock skew) names that node's keeper
  (stopped, hung or dead, or its node gone).
Every other rank blocks in a store wait on its own key, `wake/<rank>` (no request until it is written), and
watches its keeper by pid: a keeper that leaves on an abort record (leave_failed) wakes its node's waiting ranks
first, and so does a watcher that names another node's keeper. A rank its keeper cannot see (another pid
namespace) beats `hb/<rank>` itself, as every rank did before, and its keeper watches that counter instead.
Whoever names a rank records the abort naming it, and every rank exits with ABORTED_EXIT.

A store call can block for good when the store's server is stopped or unreachable (a TCPStore timeout does not
bound a call already sent), so a second thread, the deadman, ends the process when the heartbeat thread has not
completed a round trip for the heartbeat timeout: then the store itself is gone, and it says so. A rank that
waits instead of beating has no round trips to count: its keeper's, seen by pid, stand in for them, and when the
keeper is gone it asks the store itself.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
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
    say_stop,
)
from gpucert.runtime.identity import RankIdentity

if TYPE_CHECKING:
    from gpucert.runtime.group import Runtime

# A waiting rank's wait for the abort record is renewed this often (a timed-out wait costs two requests).
WAIT_S = 24 * 3600.0


def keepers(peers: list[RankIdentity]) -> dict[int, RankIdentity]:
    """Node rank -> the rank that keeps that node's heartbeat: its lowest local rank."""
    found: dict[int, RankIdentity] = {}
    for peer in peers:
        if peer.node_rank not in found or peer.local_rank < found[peer.node_rank].local_rank:
            found[peer.node_rank] = peer
    return found


def process_state(pid: int) -> str:
    """`running` (any state but these), `stopped` (T: SIGSTOP; t: a tracer's stop) or `gone` (no such process, or
    a zombie: it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    state = stat.rsplit(")", 1)[-1].split()[0]
    if state in ("Z", "X"):
        return "gone"
    return "stopped" if state in ("T", "t") else "running"


def silent_cause(silent_s: float, timeout_s: float, state: str | None, pid: int) -> str:
    """Why a rank is named: `no heartbeat for N s (...)`, and what its process looks like where the watcher sees it."""
    head = f"no heartbeat for {silent_s:.0f} s (runtime.heartbeat_timeout_s {timeout_s:g})"
    if state == "stopped":
        return f"{head}: its process (pid {pid}) is stopped (SIGSTOP, a debugger?)"
    if state == "gone":
        return f"{head}: its process (pid {pid}) has ended (killed: SIGKILL, the kernel's OOM killer?)"
    return f"{head}: the process is stopped, hung or dead, or its node is gone"


class Watchdog:
    def __init__(self, rt: Runtime, prefix: str, on_abort: Callable[[AbortRecord], None] | None) -> None:
        self.rt = rt
        self.prefix = prefix
        self.on_abort = on_abort
        self.keeper = keepers(rt.peers)[rt.node_rank]
        self.keeps = self.keeper.rank == rt.rank
        # The heartbeat thread's own connection, also for on_abort (the main thread's may be mid-wait). A waiting
        # rank's is blocked in its wait: `store` is then a spare one, connected when first asked for.
        self._store: Any = None
        self._spare_lock = threading.Lock()
        self.waits = False
        self.last_ok = time.monotonic()
        self._beating = threading.Event()
        self._armed = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpucert-watchdog", daemon=True)
        self._deadman = threading.Thread(target=self._watch_store, name="gpucert-deadman", daemon=True)

    @property
    def store(self) -> Any:
        """The job's store over a connection of the watchdog's (None: none could be made)."""
        if not self.waits or self._store is not None:
            return self._store
        # Not under the lock: a connect to a stopped server can hang, and must not hang every other caller.
        assert self.rt.endpoint is not None
        try:
            base = connect_store(
                *self.rt.endpoint,
                False,
                self.rt.config.heartbeat_timeout_s,
                self.rt.me.describe(),
                "runtime.heartbeat_timeout_s",
                tell=False,
            )
        except RuntimeError:
            return None
        with self._spare_lock:
            if self._store is None:
                self._store = dist.PrefixStore(self.prefix, base)
            return self._store

    @property
    def run_store(self) -> Any:
        """The run store (Runtime.run_store) over the same connection as `store`."""
        store = self.store
        return None if store is None else dist.PrefixStore("gpucert/run/", store.underlying_store)

    def begin(self) -> Watchdog:
        self._beating.set()
        self._armed.set()
        self._thread.start()
        self._deadman.start()
        # A thread still in a store wait when the interpreter shuts down aborts the process (its wait ends in an
        # exception it can no longer raise): woken and joined first, whatever way the process ends.
        atexit.register(self.stop_beating)
        return self

    def stop_beating(self) -> None:
        """Stop heartbeats and abort reading (this rank records its own failure next); the deadman stays armed,
        so an exit blocked on a dead store still ends. A waiting rank's thread is woken from its wait (over the
        main thread's connection: this runs on the main thread) and sees it must not act."""
        self._beating.clear()
        if not self._thread.is_alive() or threading.current_thread() is self._thread:
            return
        if self.waits:
            try:
                self.rt.store.set(f"wake/{self.rt.rank}", "stop")
            except RuntimeError:
                return  # the store is gone: so is the wait, with an error
        self._thread.join(timeout=self.rt.config.heartbeat_interval_s * 3)

    def wake_node(self) -> None:
        """A keeper leaving on an abort: its node's waiting ranks read the record too (one request)."""
        if self.keeps and self._store is not None:
            ranks = [p.rank for p in self.rt.peers if p.node_rank == self.rt.node_rank and p.rank != self.rt.rank]
            self._wake(self._store, ranks)

    @staticmethod
    def _wake(store: Any, ranks: list[int]) -> None:
        if ranks:
            with contextlib.suppress(RuntimeError):
                store.multi_set([f"wake/{r}" for r in ranks], ["abort"] * len(ranks))

    def stop(self) -> None:
        """The run is over: nothing is watched any more."""
        self._armed.clear()
        self.stop_beating()

    def _run(self) -> None:
        rt, cfg = self.rt, self.rt.config
        assert rt.endpoint is not None
        try:
            base = connect_store(*rt.endpoint, False, cfg.rendezvous_timeout_s, rt.me.describe(), tell=False)
            store = dist.PrefixStore(self.prefix, base)
            unseen = self._plan(store)
            # Waiting needs the keeper seen from here too: a pid that only looks like it (another namespace) would
            # seem gone, and the keeper be named for nothing.
            self.waits = not self.keeps and rt.rank not in unseen and process_state(self.keeper.pid) != "gone"
        except RuntimeError as exc:
            say(f"watchdog of {rt.me.describe()} could not connect: {exc}")
            return
        finally:
            self.last_ok = time.monotonic()
            self._ready.set()  # the deadman's kind depends on `waits`
        if self.waits:
            self._wait_for_abort(store)
            return
        self._store = store
        self._beat(store, unseen)

    def _plan(self, store: Any) -> list[int]:
        """Which of this node's ranks its keeper cannot see by pid (another pid namespace): they beat in the
        store. The keeper decides and publishes `plan/<node rank>`; the others read it."""
        rt = self.rt
        key = f"plan/{rt.node_rank}"
        if self.keeps:
            mine = [p for p in rt.peers if p.node_rank == rt.node_rank and p.rank != rt.rank]
            unseen = [p.rank for p in mine if p.pid <= 0 or p.pid == os.getpid() or process_state(p.pid) == "gone"]
            if unseen:
                store.multi_set([f"hb/{r}" for r in unseen], ["0"] * len(unseen))
            store.set(key, json.dumps(unseen))
            return unseen
        store.wait([key], timedelta(seconds=rt.config.rendezvous_timeout_s))
        return list(json.loads(store.get(key)))

    def _beat(self, store: Any, unseen: list[int]) -> None:
        """A keeper's loop, or a rank's its keeper cannot see: beat, read the abort record, look at the watched."""
        rt, cfg = self.rt, self.rt.config
        if self.keeps:
            beat = f"hb/node/{rt.node_rank}"
            # Rank 0's node: every other node's keeper; any other node: rank 0's node. Both: the ranks of this node
            # it cannot see.
            head, by_node = rt.peers[0].node_rank, keepers(rt.peers)
            nodes = [n for n in by_node if n != rt.node_rank] if rt.node_rank == head else [head]
            keys = [f"hb/node/{n}" for n in nodes] + [f"hb/{r}" for r in unseen]
            named = [by_node[n].rank for n in nodes] + unseen
            locals_ = [
                p for p in rt.peers if p.node_rank == rt.node_rank and p.rank != rt.rank and p.rank not in unseen
            ]
        else:
            beat, keys, named, locals_ = f"hb/{rt.rank}", [f"hb/node/{rt.node_rank}"], [self.keeper.rank], []
        last: dict[int, tuple[bytes, float]] = {}
        bad: dict[int, tuple[str, float]] = {}
        left: set[int] = set()
        while self._beating.is_set():
            time.sleep(cfg.heartbeat_interval_s)
            if not self._beating.is_set():
                return
            try:
                store.add(beat, 1)
                record = read_abort(store)
                now = time.monotonic()
                if record is None and keys:
                    record = self._silent_peer(store, named, store.multi_get(keys), last, now, left)
                if record is None and locals_:
                    record = self._stopped_local(store, locals_, bad, now, left)
            except RuntimeError:
                continue  # the store errs: the deadman decides once it has been gone for the timeout
            self.last_ok = time.monotonic()
            if record is not None:
                self._fire(record)
                return

    def _wait_for_abort(self, store: Any) -> None:
        """A rank its keeper watches: no request until it is woken (the server answers the wait then), however
        long the run: by its keeper or a watcher when the job's abort is recorded, by itself when it stops."""
        while True:
            try:
                store.wait([f"wake/{self.rt.rank}"], timedelta(seconds=WAIT_S))
            except dist.DistStoreError:
                continue  # the wait's own timeout: wait again
            except RuntimeError:
                return  # the connection is gone (the store, or this run, ended): the keeper watch decides
            if not self._beating.is_set():
                return  # this rank records its own failure, or has left
            try:
                record = read_abort(store)
            except RuntimeError:
                return
            if record is not None:
                self._fire(record)
            return

    def _watch_store(self) -> None:
        self._ready.wait()
        assert self.rt.endpoint is not None
        addr, port = self.rt.endpoint
        if self.waits:
            self._watch_keeper()
            return
        deadman(
            lambda: self.last_ok,
            self._armed,
            self.rt.config.heartbeat_interval_s,
            self.rt.config.heartbeat_timeout_s,
            f"{self.rt.me.describe()} stops: the job's store at {addr}:{port}",
        )

    def _watch_keeper(self) -> None:
        """A waiting rank's deadman: its keeper, by pid. Gone or stopped for the heartbeat timeout (and not
        left), the keeper is named, over a spare connection; if the store does not answer that, it is the store
        that is gone, and this rank says so and exits."""
        rt, cfg = self.rt, self.rt.config
        keeper = self.keeper
        since: float | None = None
        while self._armed.is_set():
            time.sleep(cfg.heartbeat_interval_s)
            state = process_state(keeper.pid)
            now = time.monotonic()
            if state == "running":
                since = None
                continue
            since = now if since is None else since
            if now - since <= cfg.heartbeat_timeout_s or not self._armed.is_set():
                continue

            def name_keeper(silent_s: float = now - since, seen: str = state) -> AbortRecord | str:
                store = self.store
                if store is None:
                    raise RuntimeError("no connection")
                if store.check([f"closed/{keeper.rank}"]):
                    return "left"  # it finished its part and left (stop_runtime): nothing left to watch here
                if not self._beating.is_set():
                    return "busy"  # this rank records its own failure; the store answers, so it will
                return record_abort(store, self._named(store, keeper, silent_s, seen))

            try:
                # Bounded here: a call to a stopped store's server waits for good, whatever its timeout.
                outcome = bounded(name_keeper, cfg.heartbeat_timeout_s)
            except (RuntimeError, TimeoutError):
                addr, port = rt.endpoint or ("?", 0)
                say(
                    f"{rt.me.describe()} stops: the job's store at {addr}:{port} has not answered, and "
                    f"{keeper.describe()}, which heartbeats for this node, has been {state} for {now - since:.0f} s "
                    f"(runtime.heartbeat_timeout_s {cfg.heartbeat_timeout_s:g}): the process that serves it (node "
                    "rank 0's gpucert or torchrun agent, or rank 0) is gone, stopped or unreachable"
                )
                os._exit(ABORTED_EXIT)
            if outcome == "left":
                return
            if isinstance(outcome, AbortRecord):
                self._fire(outcome)
                return

    def _named(self, store: Any, peer: RankIdentity, silent_s: float, state: str | None) -> AbortRecord:
        """The record naming a silent peer; one stopped where this process can see it is woken (SIGCONT): it
        holds the SIGTERM its launcher sends next until then, and woken it reads the record and leaves now."""
        cfg = self.rt.config
        if peer.host == self.rt.me.host and state != "gone":
            with contextlib.suppress(OSError):
                os.kill(peer.pid, signal.SIGCONT)
        return AbortRecord(
            who=peer.describe(),
            cause=silent_cause(silent_s, cfg.heartbeat_timeout_s, state, peer.pid),
            phase=read_phase(store, peer.rank),
            rank=peer.rank,
            node=peer.node,
        )

    def _silent_peer(
        self,
        store: Any,
        watched: list[int],
        values: list[bytes],
        last: dict[int, tuple[bytes, float]],
        now: float,
        left: set[int],
    ) -> AbortRecord | None:
        """A counter (a node's, or a rank's its keeper cannot see) unchanged for the timeout: its rank is named."""
        cfg = self.rt.config
        for r, value in zip(watched, values, strict=True):
            seen = last.get(r)
            if r in left:
                continue
            if seen is None or seen[0] != value:
                last[r] = (value, now)
            elif now - seen[1] > cfg.heartbeat_timeout_s:
                if store.check([f"closed/{r}"]):
                    left.add(r)  # it finished its part and left (stop_runtime): silent, not dead
                    continue
                # Its process state is not looked at: a host name says nothing of pid namespaces between nodes.
                peer = self.rt.peers[r]
                record = record_abort(store, self._named(store, peer, now - seen[1], None))
                if peer.node_rank != self.rt.node_rank:
                    # Its node's waiting ranks have nobody else to wake them.
                    others = [p.rank for p in self.rt.peers if p.node_rank == peer.node_rank and p.rank != r]
                    self._wake(store, others)
                return record
        return None

    def _stopped_local(
        self, store: Any, ranks: list[RankIdentity], bad: dict[int, tuple[str, float]], now: float, left: set[int]
    ) -> AbortRecord | None:
        """A keeper's look at its node's ranks: one gone or stopped for the timeout is named."""
        cfg = self.rt.config
        for peer in ranks:
            if peer.rank in left:
                continue
            state = process_state(peer.pid)
            if state == "running":
                bad.pop(peer.rank, None)
                continue
            since = bad.setdefault(peer.rank, (state, now))[1]
            if now - since > cfg.heartbeat_timeout_s:
                if store.check([f"closed/{peer.rank}"]):
                    left.add(peer.rank)
                    continue
                return record_abort(store, self._named(store, peer, now - since, state))
        return None

    def _fire(self, record: AbortRecord) -> None:
        """End this process: a peer failed, so every collective here would wait for it until the timeout."""
        self.last_ok = time.monotonic()  # the deadman gives on_abort its time
        if self.on_abort is not None:
            try:
                self.on_abort(record)
            except Exception as exc:  # the exit below must happen whatever the callback did
                say(f"while stopping: {type(exc).__name__}: {exc}")
        say_stop(self.rt, f"{self.rt.me.describe()} stops: {record.message()}", record)
        leave_failed(self.rt, ABORTED_EXIT)


def bounded(call: Callable[[], Any], limit_s: float) -> Any:
    """call() on a thread of its own, its result or exception here; TimeoutError past limit_s (the thread, a
    daemon, is left to its blocked call)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="gpucert-bounded", daemon=True)
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {limit_s:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


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
