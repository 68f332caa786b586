"""The job's store and process group, the rendezvous that names who is missing, and abort records.

`start_runtime()` is the one place a process joins its job: it binds the GPU, meets every rank in the job's
TCP store (bounded by runtime.rendezvous_timeout_s; a timeout names the missing ranks and their node ranks),
reads the roster rank 0 publishes so every rank can name every other, creates the process group with the
collective timeout, and starts the watchdog. A rank that fails records *why* in the store (`fail()`); every
other rank's watchdog reads it and exits within a heartbeat, saying which rank, on which node, failed and how.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from gpucert.config.loader import ConfigError
from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.device import gpu_uuid_and_index, pick_ordinal
from gpucert.runtime.errors import RendezvousError
from gpucert.runtime.identity import RankIdentity, pack_roster, relabel, unpack_roster
from gpucert.runtime.launch_env import RankEnv, read_rank_env
from gpucert.runtime.open_files import fit_open_files

# Exit code of a rank that stopped because another rank failed (the job's verdict: ERROR, nothing judged).
ABORTED_EXIT = 3
POLL_S = 0.2


@dataclass(frozen=True)
class AbortRecord:
    """Why the job stopped: the first failure recorded wins; later ones are its consequences."""

    who: str
    cause: str
    phase: str
    rank: int | None = None
    node: str | None = None
    # A rank's own exception: `file:line in function` where it was raised, and the traceback's last lines.
    where: str | None = None
    traceback: list[str] = field(default_factory=list)
    # The operator stopped the run (Ctrl-C or SIGTERM to a node's gpucert, recorded by its launcher): nobody
    # failed, and no rank is to be looked for.
    operator: bool = False
    # SIGTERM from the launcher reached this rank with no rank ended before it (a cancelled job, a time limit):
    # `rank` is the rank that noticed, not a culprit, and the message names none.
    launcher: bool = False

    def message(self) -> str:
        if self.operator:
            return f"{self.cause} during {self.phase}"
        if self.launcher:
            return f"stopped by SIGTERM from the launcher during {self.phase}: {self.cause}"
        where = f" (raised at {self.where})" if self.where else ""
        return f"{self.who} failed during {self.phase}: {self.cause}{where}"


def record_abort(store: Any, record: AbortRecord) -> AbortRecord:
    """Record this failure unless one is recorded already; the record in force comes back."""
    payload = json.dumps(asdict(record))
    current = store.compare_set("abort", "", payload)
    return AbortRecord(**json.loads(current)) if current else record


def read_phase(store: Any, rank: int, default: str = "start") -> str:
    """Where rank `rank` last said it was (Runtime.set_phase), or `default` if it never said."""
    return store.get(f"phase/{rank}").decode() if store.check([f"phase/{rank}"]) else default


def previous_round_abort(rt: Runtime) -> AbortRecord | None:
    """Why the launcher's last round of workers ended, as recorded under its key prefix (None: nothing was)."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart < 1 or rt.endpoint is None:
        return None
    prefix = f"gpucert/{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}.{restart - 1}/"
    base = connect_store(*rt.endpoint, False, rt.config.rendezvous_timeout_s, rt.me.describe())
    return read_abort(dist.PrefixStore(prefix, base))


def read_abort(store: Any) -> AbortRecord | None:
    if not store.check(["abort"]):
        return None
    return AbortRecord(**json.loads(store.get("abort")))


# A wait for the job's store or its peers says what it waits for once it has lasted SAY_AFTER_S (a node started
# a little before node 0 is normal; two silent minutes look hung), then every PROGRESS_EVERY_S.
SAY_AFTER_S = 10.0
PROGRESS_EVERY_S = 30.0
# How often a client tries node rank 0's port while nothing answers there: a node started first joins within
# this of the store coming up.
RETRY_S = 0.5


class Waiting:
    """One bounded wait, timed by our own monotonic deadline (TCPStore's connect timeout ran 1.5-2.5x past
    its limit), that says what it waits for: once after say_after_s, then every every_s."""

    def __init__(self, timeout_s: float, say_after_s: float = SAY_AFTER_S, every_s: float = PROGRESS_EVERY_S) -> None:
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s
        self.every_s = every_s
        self._next_say = self.started + say_after_s
        self.told = 0  # lines said so far: the first says what it waits for, later ones "still"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def tell(self, line: Callable[[], str], now: bool = False) -> None:
        """say(line()) if it is time to (or `now`, the first time only)."""
        if now or time.monotonic() >= self._next_say:
            say(line())
            self.told += 1
            self._next_say = time.monotonic() + self.every_s


def _try_port(addr: str, port: int, limit_s: float) -> str | None:
    """None if something accepts connections at addr:port, else why not, in words."""
    if (unresolved := _resolves(addr, port)) is not None:
        return unresolved
    try:
        with socket.create_connection((addr, port), timeout=max(limit_s, 0.05)):
            return None
    except OSError as exc:
        return (exc.strerror or str(exc) or type(exc).__name__).lower()


def _resolves(addr: str, port: int) -> str | None:
    """None where addr resolves here, else what says it does not."""
    try:
        socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"{addr!r} does not resolve on this host ({exc.strerror or exc})"
    return None


def connect_store(
    addr: str,
    port: int,
    serve: bool,
    timeout_s: float,
    who: str,
    setting: str = "runtime.rendezvous_timeout_s",
    tell: bool = True,
    say_after_s: float = SAY_AFTER_S,
    every_s: float = PROGRESS_EVERY_S,
) -> dist.TCPStore:
    """A client of the job's store (or its server, on the rank or agent that serves it), errors named.

    A client tries node rank 0's port every RETRY_S until timeout_s, by our own deadline, saying what it waits
    for after say_after_s and then every every_s. A name that does not resolve is retried too, and said at
    once: a Kubernetes Service name resolves only once its pod is up, but on a cluster it is most often a typo.
    `setting` names where timeout_s comes from; a watcher's short reconnect passes tell=False (its caller names
    a store gone quiet)."""
    wait = Waiting(timeout_s, say_after_s, every_s)
    limit = f"{timeout_s:g} s ({setting})"
    if serve:
        # The server connects to itself by this name: one that does not resolve held the constructor (C++, deaf
        # to Ctrl-C) past the timeout, then was blamed on the port. Said at once and retried, as a client does
        # (a Kubernetes pod's own name resolves only once the pod is ready).
        while (why := _resolves(addr, port)) is not None:
            if wait.left() <= 0:
                raise RendezvousError(
                    f"{who}: {why} within {limit}, and node rank 0 serves the job's store under that name; give "
                    "--master-addr / MASTER_ADDR as this host's name or IP address as the other nodes reach it"
                )
            if tell:
                wait.tell(
                    lambda why=why: (  # type: ignore[misc]
                        f"{who}: {why}; a typo in --master-addr / MASTER_ADDR? waited {wait.elapsed():.0f} s, "
                        f"gives up after {limit}"
                    ),
                    now=not wait.told,
                )
            time.sleep(max(0.0, min(RETRY_S, wait.left())))
        try:
            return dist.TCPStore(
                addr, port, None, True, timedelta(seconds=timeout_s), wait_for_workers=False, multi_tenant=True
            )
        except (RuntimeError, OSError) as exc:  # DistNetworkError / DistStoreError are RuntimeErrors
            raise RendezvousError(
                f"{who}: cannot serve the job's store on port {port}: {str(exc).splitlines()[0]}; "
                "is another job using that port? choose another (--master-port / MASTER_PORT)"
            ) from None
    said_unresolved = False
    while True:
        why = _try_port(addr, port, min(wait.left(), 2 * RETRY_S))
        if why is None:
            try:
                # Up: the connection is made at once. Its timeout is then every request's default (get, wait).
                store = dist.TCPStore(addr, port, None, False, timedelta(seconds=max(wait.left(), 1.0)), False)
                store.set_timeout(timedelta(seconds=timeout_s))
                return store
            except (RuntimeError, OSError) as exc:
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        unresolved = "does not resolve" in why
        if wait.left() <= 0:
            hint = (
                "check --master-addr / MASTER_ADDR (node rank 0's hostname as this host knows it, or its IP address)"
                if unresolved
                else "is node rank 0 running gpucert, and is that address reachable from this host?"
            )
            raise RendezvousError(
                f"{who}: could not reach the job's store at {addr}:{port} within {limit}: {why}; {hint}"
            )
        if tell:
            wait.tell(
                lambda why=why, unresolved=unresolved: (  # type: ignore[misc]
                    f"{who}: {'still ' if wait.told else ''}waiting for the job's store at {addr}:{port} (served by "
                    f"node rank 0's gpucert): {why}"
                    + ("; a typo in --master-addr / MASTER_ADDR?" if unresolved else "")
                    + f"; waited {wait.elapsed():.0f} s, gives up after {limit}"
                ),
                now=unresolved and not said_unresolved,
            )
            said_unresolved = said_unresolved or unresolved
        time.sleep(max(0.0, min(RETRY_S, wait.left())))


@dataclass
class Runtime:
    """This process in its job: identity, device, backend, the job's store and every peer's identity."""

    me: RankIdentity
    peers: list[RankIdentity]
    device: torch.device
    backend: str
    config: RuntimeConfig
    store: Any
    endpoint: tuple[str, int] | None = None
    watchdog: Any = None
    phase: str = "start"
    serves_store: bool = False
    # What outlives this round of workers when the launcher restarts them after a failure (runtime/launcher.py):
    # node checks, finished benchmarks, the verdict. The same store, not this round's key prefix.
    run_store: Any = None
    _node_group: Any = field(default=None, repr=False)
    _host_barriers: int = field(default=0, repr=False)  # host_barrier's calls so far: every rank's count agrees

    # The names benchmarks and the training loop use.
    @property
    def rank(self) -> int:
        return self.me.rank

    @property
    def world_size(self) -> int:
        return self.me.world_size

    @property
    def local_rank(self) -> int:
        return self.me.local_rank

    @property
    def local_world_size(self) -> int:
        return self.me.local_world_size

    @property
    def node_rank(self) -> int:
        return self.me.node_rank

    @property
    def num_nodes(self) -> int:
        return self.me.num_nodes

    @property
    def is_main(self) -> bool:
        return self.me.rank == 0

    def set_phase(self, phase: str) -> None:
        """What this rank is doing, so a failure or a hang elsewhere can say where everyone was."""
        self.phase = phase
        if self.world_size > 1:
            self.store.set(f"phase/{self.rank}", phase)

    def node_group(self) -> Any:
        """The process group of this node's ranks (collective: every rank of the job calls it, in order)."""
        if self._node_group is None:
            by_node: dict[int, list[int]] = {}
            for peer in self.peers:
                by_node.setdefault(peer.node_rank, []).append(peer.rank)
            groups = [dist.new_group(ranks) for _, ranks in sorted(by_node.items())]
            self._node_group = groups[sorted(by_node).index(self.node_rank)]
        return self._node_group


def _lone_identity(device: torch.device, uuid: str | None, index: int | None) -> RankIdentity:
    host = socket.gethostname()
    return RankIdentity(0, 1, 0, 1, 0, 1, host, host, str(device), uuid, index, os.getpid())


def unsaid_node_layout(env: RankEnv, visible: int) -> None:
    """A launcher that set RANK and WORLD_SIZE only (a Kubeflow PyTorchJob) makes the whole job one node: said
    before the GPU count's own complaint, which would send the user after GPU binding instead."""
    # One GPU visible is one GPU a process (CUDA_VISIBLE_DEVICES set per rank): no layout needed on one host.
    if not env.local_said and env.local_world_size > visible > 1:
        raise ConfigError(
            f"rank {env.rank} of {env.world_size}: the launcher set RANK and WORLD_SIZE but not LOCAL_WORLD_SIZE or "
            f"GROUP_RANK, so all {env.world_size} ranks are taken for one node, which has {visible} GPU(s); set "
            "LOCAL_WORLD_SIZE and GROUP_RANK (torchrun does), or run one gpucert per node"
        )


def _bind_device(env: RankEnv | None) -> tuple[torch.device, str | None, int | None]:
    if not torch.cuda.is_available():
        return torch.device("cpu"), None, None
    local_rank, local_world = (env.local_rank, env.local_world_size) if env else (0, 1)
    visible = torch.cuda.device_count()
    if env:
        unsaid_node_layout(env, visible)
    ordinal = pick_ordinal(local_rank, local_world, visible, os.environ.get("CUDA_VISIBLE_DEVICES"))
    torch.cuda.set_device(ordinal)
    uuid, index = gpu_uuid_and_index(ordinal)
    return torch.device("cuda", ordinal), uuid, index


def start_runtime(
    config: RuntimeConfig | None = None,
    environ: Mapping[str, str] | None = None,
    on_abort: Callable[[AbortRecord], None] | None = None,
) -> Runtime:
    """Join this process's job (or stand alone) and return who it is; errors name the rank and what to do."""
    config = config or RuntimeConfig()
    problems = config.problems()
    if problems:
        raise ConfigError(problems=problems)
    environ = os.environ if environ is None else environ
    if environ.get("GPUCERT_AGENT_PID"):
        # Started by gpucert's launcher (runtime/launcher.py): die with it, and one log a rank.
        from gpucert.runtime.launcher import merge_rank_log
        from gpucert.runtime.spawn import die_with_parent

        die_with_parent(int(environ["GPUCERT_AGENT_PID"]))
        merge_rank_log()
    env = read_rank_env(environ)
    device, uuid, index = _bind_device(env)
    backend = "nccl" if device.type == "cuda" else "gloo"
    # A lone rank of gpucert's launcher still joins the store: its launcher reads the abort record there.
    if env is None or (env.world_size == 1 and not env.agent_store):
        # A lone process needs no rendezvous: an in-memory store binds no port.
        store: Any = dist.HashStore()
        if not dist.is_initialized():
            dist.init_process_group(
                backend, store=store, rank=0, world_size=1, timeout=timedelta(seconds=config.collective_timeout_s)
            )
        me = _lone_identity(device, uuid, index)
        run_store = dist.PrefixStore("gpucert/run/", store)
        return Runtime(
            me=me, peers=[me], device=device, backend=backend, config=config, store=store, run_store=run_store
        )
    host = socket.gethostname()
    mine = RankIdentity(
        env.rank,
        env.world_size,
        env.local_rank,
        env.local_world_size,
        env.node_rank,
        env.num_nodes,
        env.node_name or host,
        host,
        str(device),
        uuid,
        index,
        os.getpid(),
    )
    serves = env.rank == 0 and not env.agent_store
    who = f"rank {env.rank} (node rank {env.node_rank}, host {host})"
    if serves:
        fit_open_files(env.world_size, env.num_nodes, who)
    base = connect_store(env.master_addr, env.master_port, serves, config.rendezvous_timeout_s, who)
    store = dist.PrefixStore(f"gpucert/{env.store_prefix}/", base)
    peers = _meet(store, mine, env, config, serves)
    me = peers[env.rank]
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("pg/", store),
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=config.collective_timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    rt = Runtime(
        me=me,
        peers=peers,
        device=device,
        backend=backend,
        config=config,
        store=store,
        endpoint=(env.master_addr, env.master_port),
        serves_store=serves,
        run_store=dist.PrefixStore("gpucert/run/", base),
    )
    from gpucert.runtime.watchdog import Watchdog

    rt.watchdog = Watchdog(rt, f"gpucert/{env.store_prefix}/", on_abort).begin()
    return rt


def _meet(store: Any, mine: RankIdentity, env: RankEnv, config: RuntimeConfig, serves: bool) -> list[RankIdentity]:
    """Every rank says who it is; rank 0 publishes one compact roster of every rank, which every rank reads. A
    timeout names the ranks (and nodes) that never came.

    The store's work stays linear in the ranks (docs/results/store-scale.md): each rank appends its identity to
    one key and blocks in a store wait (one request, answered when the key appears) instead of polling; the
    rank that completes `joined` wakes rank 0, which reads the identities once and publishes `roster`, about 80
    bytes a rank, for every rank to read once. Before, every rank fetched every rank's identity: N² x 250 bytes,
    6.7 s at 1,024 ranks, 16.8 GB from node 0 at 8,192."""
    store.append("identities", json.dumps(mine.to_dict(), separators=(",", ":")) + "\n")
    if store.add("joined", 1) == env.world_size:
        store.set("all_joined", "1")
    if mine.rank == 0:
        roster = _publish_roster(store, mine, env, config)
        if ("missing" in roster or "error" in roster) and serves:
            # The ranks that came read why from this process's store: it stays up for two heartbeats (leave_failed).
            time.sleep(2 * config.heartbeat_interval_s)
    else:
        # Rank 0 answers within the timeout, who is missing included; one heartbeat interval more covers its
        # own late start. Past that rank 0 itself never came, and this rank works out who is missing itself.
        try:
            store.wait(["roster"], timedelta(seconds=config.rendezvous_timeout_s + config.heartbeat_interval_s))
        except dist.DistStoreError:
            raise RendezvousError(_missing_message(_absent(store, env), mine, env, config)) from None
        roster = json.loads(store.get("roster"))
    if "missing" in roster:
        raise RendezvousError(_missing_message(roster["missing"], mine, env, config))
    if "error" in roster:
        raise RendezvousError(roster["error"])
    return unpack_roster(roster)


def _publish_roster(store: Any, mine: RankIdentity, env: RankEnv, config: RuntimeConfig) -> dict[str, Any]:
    """Rank 0: wait for the last rank (bounded), check the identities, publish the roster or why there is none."""
    try:
        store.wait(["all_joined"], timedelta(seconds=config.rendezvous_timeout_s))
    except dist.DistStoreError:  # the wait's timeout (the store's connection errors are DistNetworkErrors)
        roster: dict[str, Any] = {"missing": _absent(store, env)}
        store.set("roster", json.dumps(roster))
        return roster
    peers = [RankIdentity.from_dict(json.loads(line)) for line in store.get("identities").decode().splitlines()]
    peers.sort(key=lambda peer: peer.rank)
    problem = _split_node(peers)
    roster = {"error": problem} if problem else pack_roster(relabel(peers))
    if not problem:
        # Before the roster: a watcher's first multi_get must find every node's counter (watchdog.py); it would
        # wait for a key not there yet.
        store.multi_set([f"hb/node/{n}" for n in range(env.num_nodes)], ["0"] * env.num_nodes)
    store.set("roster", json.dumps(roster, separators=(",", ":")))
    return roster


def _split_node(peers: list[RankIdentity]) -> str | None:
    hosts: dict[int, set[str]] = {}
    for peer in peers:
        hosts.setdefault(peer.node_rank, set()).add(peer.host)
    split = {n: h for n, h in hosts.items() if len(h) > 1}
    if not split:
        return None
    # A launcher that says no LOCAL_WORLD_SIZE/GROUP_RANK (a Kubeflow PyTorchJob sets RANK and WORLD_SIZE only)
    # makes every rank node 0: results would name one node for GPUs of several.
    node, names = next(iter(split.items()))
    return (
        f"node rank {node} has ranks on hosts {', '.join(sorted(names))}: the launcher did not say each rank's "
        "node; set LOCAL_WORLD_SIZE and GROUP_RANK (torchrun does), or run one gpucert per node"
    )


def _absent(store: Any, env: RankEnv) -> dict[str, Any]:
    """Who joined and who did not, from the identities appended so far (failure path: one read)."""
    text = store.get("identities").decode() if store.check(["identities"]) else ""
    joined = [json.loads(line) for line in text.splitlines()]
    present = {ident["rank"] for ident in joined}
    # Node ranks from who did join, not from rank arithmetic: srun's cyclic distribution and uneven nodes
    # break `rank // ranks per node`.
    return {
        "joined": len(present),
        "hosts": sorted({ident["host"] for ident in joined}),
        "ranks": sorted(set(range(env.world_size)) - present),
        "nodes": sorted(set(range(env.num_nodes)) - {ident["node_rank"] for ident in joined}),
    }


def _missing_message(absent: dict[str, Any], mine: RankIdentity, env: RankEnv, config: RuntimeConfig) -> str:
    nodes = f" = node rank(s) {_ranges(absent['nodes'])}" if absent["nodes"] else " (on nodes that did join)"
    return (
        f"rank {mine.rank} (node rank {mine.node_rank}, host {mine.host}): rendezvous at "
        f"{env.master_addr}:{env.master_port} timed out after {config.rendezvous_timeout_s:g} s "
        f"(runtime.rendezvous_timeout_s): {absent['joined']} of {env.world_size} ranks joined (hosts "
        f"{', '.join(absent['hosts'])}); missing rank(s) {_ranges(absent['ranks'])}{nodes}. Start gpucert on "
        f"those nodes, or check that they reach {env.master_addr}:{env.master_port}"
    )


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5': a 1,000-rank job's missing half stays one line."""
    parts: list[str] = []
    for v in values:
        if parts and parts[-1].split("-")[-1] == str(v - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{v}"
        else:
            parts.append(str(v))
    return ", ".join(parts)


# Traceback lines kept in a record: the raising frame and its caller, and the exception line(s).
TRACEBACK_LINES = 8


def own_record(rt: Runtime, exc: BaseException) -> AbortRecord:
    """This rank's failure as it would be recorded: who, the exception's first line, where it was raised, the
    traceback's last lines, and the phase."""
    cause = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".rstrip(": ")
    text = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    lines = [line for line in text if line.strip(" ^~")]  # not the column markers under the code
    return AbortRecord(
        who=rt.me.describe(),
        cause=cause,
        phase=rt.phase,
        rank=rt.rank,
        node=rt.me.node,
        where=raised_at(exc),
        traceback=lines[-TRACEBACK_LINES:],
    )


def raised_at(exc: BaseException) -> str | None:
    """Where exc was raised: `file:line in function` of the innermost frame, by its package path."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    last = frames[-1]
    path = last.filename
    for root in ("/site-packages/", "/src/"):  # the package path, not where it is installed
        if root in path:
            path = path.split(root, 1)[1]
            break
    return f"{path}:{last.lineno} in {last.name}"


def fail(rt: Runtime, exc: BaseException) -> AbortRecord:
    """This rank failed: record why, unless a peer's failure came first. A collective broken by a dead peer is
    a consequence, not the culprit: wait (a heartbeat timeout) for the real cause with the watchdog still
    running, since it is what names a peer that died silently (rank 0's watches every rank; when it names one
    it ends this process itself). Only then, with nobody else named, this rank records itself."""
    record = own_record(rt, exc)
    if rt.world_size > 1 and _looks_like_peer_failure(exc):
        # The watchdog names a silent peer by heartbeat_timeout_s + one interval, give or take its store round trips
        # on a loaded machine: two intervals more before this rank names itself instead.
        deadline = time.monotonic() + rt.config.heartbeat_timeout_s + 4 * rt.config.heartbeat_interval_s
        while time.monotonic() < deadline:
            try:
                found = read_abort(rt.store)
            except RuntimeError:
                break  # the store went with node 0: nobody else can name the cause
            if found:
                if rt.watchdog is not None:
                    rt.watchdog.stop_beating()
                return found
            time.sleep(POLL_S)
    if rt.watchdog is not None:
        rt.watchdog.stop_beating()  # this process's own cause is recorded next: its watchdog must not exit first
    try:
        return record_abort(rt.store, record)
    except RuntimeError:
        return record


def watch_store(rt: Runtime) -> Any:
    """The job's store over the watchdog's own connection where there is one: the main thread's may be blocked
    in a wait on a dead peer (a thread that must still read the store while the main one waits)."""
    store = rt.watchdog.store if rt.watchdog is not None else None  # a waiting rank's: connected when first asked
    return rt.store if store is None else store


def watch_run_store(rt: Runtime) -> Any:
    """The run store over the watchdog's own connection where there is one (see watch_store)."""
    watchdog = rt.watchdog
    return watchdog.run_store if watchdog is not None and watchdog.run_store is not None else rt.run_store


@contextlib.contextmanager
def deadline(
    rt: Runtime, phase: str, limit_s: float, setting: str, on_abort: Callable[[AbortRecord], None] | None = None
) -> Iterator[None]:
    """Rank 0: the block not done within limit_s (a hung collective or kernel) ends the job, recording where
    every rank was (on_abort sees the record first: a partial report); the other ranks read it and leave.
    `setting` names where the limit comes from, for the message."""

    def overdue() -> None:
        store = watch_store(rt)
        phases = "; ".join(
            f"rank {r}: {rt.phase if r == rt.rank else read_phase(store, r, 'start-up')}" for r in range(rt.world_size)
        )
        record = AbortRecord(
            who=f"node {rt.me.node}",
            cause=f"no result within {limit_s:g} s ({setting}; hung collective or kernel?); {phases}",
            phase=phase,
            node=rt.me.node,
        )
        with contextlib.suppress(RuntimeError):
            record = record_abort(store, record)
        if on_abort is not None:
            on_abort(record)
        say(f"{rt.me.describe()} stops: {record.message()}")
        leave_failed(rt, ABORTED_EXIT)

    # A limit beyond what a timer can wait (time_t) waits as long as one can: the config caps what it takes.
    timer = threading.Timer(min(limit_s, threading.TIMEOUT_MAX), overdue) if rt.is_main else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


def leave_failed(rt: Runtime, code: int) -> NoReturn:
    """Exit after fail(), without tearing down a process group whose peers may be gone (that can block). The
    rank that serves the job's store keeps it up for two heartbeats, so every peer reads the abort record. A
    node's keeper wakes its node's waiting ranks first (watchdog.py): they read the record and leave too."""
    if rt.watchdog is not None:
        rt.watchdog.wake_node()
    if rt.serves_store:
        time.sleep(2 * rt.config.heartbeat_interval_s)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _looks_like_peer_failure(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return isinstance(exc, dist.DistError) or any(
        k in text for k in ("connection closed", "connection reset", "broken pipe", "nccl", "timed out", "gloo")
    )


def stop_runtime(rt: Runtime) -> None:
    """Leave the job: say so, then stop the watchdog, then the group. A peer that finished is not a dead peer:
    `closed/<rank>` is set before this rank's heartbeats stop, so a watcher still at work (rank 0 merging the
    adapter, alone, for minutes) does not take the silence for a death. The rank that serves the store waits
    (bounded) until every rank has stopped watching it."""
    if rt.world_size > 1:
        with contextlib.suppress(RuntimeError):
            rt.store.set(f"closed/{rt.rank}", "1")
    if rt.watchdog is not None:
        rt.watchdog.stop()
    if rt.world_size > 1:
        try:
            rt.store.add("closed", 1)
            if rt.serves_store:
                wait_for_count(rt.store, "closed", rt.world_size, rt.config.rendezvous_timeout_s)
        except RuntimeError:
            pass
    if dist.is_initialized():
        dist.destroy_process_group()


def wait_for_count(store: Any, key: str, count: int, limit_s: float) -> None:
    """Until the store's counter `key` reaches `count`, for at most limit_s: the serving side of a quiet hand-off
    (every rank has stopped watching, every node has read how the job ended), where running out is no error."""
    deadline = time.monotonic() + limit_s
    while store.add(key, 0) < count and time.monotonic() < deadline:
        time.sleep(POLL_S)


def gather_to_main(rt: Runtime, payload: Any) -> list[Any] | None:
    """Every rank's JSON-able payload on rank 0 (None elsewhere)."""
    if rt.world_size == 1:
        return [payload]
    out: list[Any] | None = [None] * rt.world_size if rt.is_main else None
    dist.gather_object(payload, out, dst=0)
    return out


def host_barrier(rt: Runtime, name: str) -> None:
    """Every rank of the job here, waited for on the host through the job's store, so that no kernel runs on the
    GPU of a rank that waits. dist.barrier() on NCCL is an all-reduce whose kernel spins on the GPU of every rank
    that arrived first: while a node's local rank 0 copied between its GPUs (p2p), the other three ranks'
    spinning barrier held every copy into their GPUs to 239 GB/s against 395 into GPU 0 (4 x H200, NVLink,
    2026-11-29). Bounded by runtime.collective_timeout_s; a rank that never comes is named by the watchdog."""
    if rt.world_size == 1:
        return
    rt._host_barriers += 1
    key = f"host-barrier/{rt._host_barriers}/{name}"
    if rt.store.add(key, 1) == rt.world_size:
        rt.store.set(f"{key}/all", "1")
    try:
        rt.store.wait([f"{key}/all"], timedelta(seconds=rt.config.collective_timeout_s))
    except dist.DistStoreError:
        came = rt.store.add(key, 0)
        raise RuntimeError(
            f"{rt.me.describe()}: {came} of {rt.world_size} ranks reached the barrier ({name}) within "
            f"{rt.config.collective_timeout_s:g} s (runtime.collective_timeout_s)"
        ) from None


def say(line: str) -> bool:
    """One line on stderr, flushed: what an operator reads when the job ends. False where nobody reads stderr any
    more (`gpucert accept 2>&1 | head` once the reader left), never an exception: the watchdog's, a deadline's
    and SIGTERM's threads say a line just before they end the process, and must not die of it instead."""
    try:
        print(f"gpucert: {line}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):  # ValueError: stderr closed
        return False
    return True


def say_stop(rt: Runtime, line: str, record: AbortRecord) -> bool:
    """say(line) as a rank leaves on `record`, unless the operator stopped the run and this is rank 0 under
    gpucert's launcher: it shares the terminal with the gpucert process that was signalled, which says it once.
    False where stderr has no reader any more (say)."""
    if not (record.operator and rt.is_main and os.environ.get("GPUCERT_AGENT_PID")):
        return say(line)
    return True


def rank_row(rt: Runtime) -> dict[str, Any]:
    """Who measured a per-rank row: the fields judges name a GPU by (see identity.row_identity)."""
    name = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else "cpu"
    return {
        "rank": rt.rank,
        "local_rank": rt.local_rank,
        "node": rt.me.node,
        "host": rt.me.host,
        "device": name,
        "uuid": rt.me.gpu_uuid,
        "gpu_index": rt.me.gpu_index,
        "subject": rt.me.subject,
    }
