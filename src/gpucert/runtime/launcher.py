"""One node's share of a multi-process job, started by torchrun's engine in this process.

Every verb that needs more than one process (accept's and bench's benchmarks, finetune, evaluate, cluster fs, and
through those localize's pair jobs) starts the same way, on one node, under `srun --ntasks-per-node=1`, or in a
Kubernetes indexed Job: this process becomes the node's torchrun agent (torch.distributed.elastic's
LocalElasticAgent, the engine `torchrun` runs: one worker per GPU, all of a node's workers stopped once one
fails, SIGINT/SIGTERM passed on), and every worker runs the verb's own code as one rank of the job. What gpucert
adds is its rendezvous handler (backend "gpucert", `NodeRendezvous`):

- node rank 0 serves the job's TCP store, which is also the workers' store (torchrun's agent store); every node
  says who it is and waits, bounded by runtime.rendezvous_timeout_s; a timeout names, in one line, the node ranks
  that never came and the address they should reach.
- torchrun's agent sees only its own workers exit. While they run it asks the rendezvous, every monitor interval,
  whether another node wants a new round (`num_nodes_waiting`): that question is where this node learns that a
  rank anywhere recorded the job's abort, or that the store has stopped answering. Its own workers then get
  two heartbeat intervals to leave by themselves (their watchdogs read the same record), and are then killed,
  SIGCONT first (a SIGSTOPped worker holds SIGTERM); the agent sees them fail and ends.

    outcome = launch_ranks(node, nproc, [sys.executable, "-m", "gpucert", "accept", ...], config, log_dir)
    outcome.ok, outcome.cause      # cause: one line naming the rank, its node, what it was doing and why
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.errors import Interrupted, JobFailed, RendezvousError, restore_handlers
from gpucert.runtime.group import (
    POLL_S,
    AbortRecord,
    Waiting,
    connect_store,
    read_abort,
    read_phase,
    record_abort,
    wait_for_count,
)
from gpucert.runtime.launch_env import RANK_VARIABLES, VERDICT_FILE, NodeEnv
from gpucert.runtime.open_files import fit_open_files
from gpucert.runtime.sigterm import process_gone
from gpucert.runtime.spawn import exit_cause

BACKEND = "gpucert"
# One job per store: node rank 0's gpucert serves it for this run alone, so a fixed id is unique where it counts.
RUN_ID = "gpucert"
# The signals torch's agent handles for us (it stops the ranks and raises SignalException).
LAUNCH_SIGNALS = (signal.SIGHUP, signal.SIGQUIT)
# The operator's: Ctrl-C, and SIGTERM to this process (a `kill`, scancel). Handled here (operator_stop), not by
# torch: the stop is recorded in the job's store before any worker is signalled, or each would take its SIGTERM for
# a peer's failure, and torch's handler logs its own line ("Received 15 death signal").
OPERATOR_SIGNALS = (signal.SIGINT, signal.SIGTERM)
NODES_PREFIX = "gpucert/nodes/"
# What outlives a round of workers (group.Runtime.run_store); `over` there ends the job instead of a new round.
RUN_PREFIX = "gpucert/run/"
# How many nodes other than node 0 have read how the job ended (NodeRendezvous.linger), under RUN_PREFIX.
ACKED = "acked"
# The agent's own short connections to the store, to read the abort record: quiet, bounded by this.
WATCH_SETTING = "runtime.heartbeat_interval_s"


def worker_prefix(round_: int) -> str:
    """Where a round's workers keep their keys (group.start_runtime: gpucert/<TORCHELASTIC_RUN_ID>.<restart>/)."""
    return f"gpucert/{RUN_ID}.{round_}/"


# Set in every worker's environment: the node process's pid (workers die with it) and where local rank 0
# writes the node's verdict (the exit code this process returns).
AGENT_PID = "GPUCERT_AGENT_PID"
LOG_DIR = "GPUCERT_LOG_DIR"


class NodeRendezvous(RendezvousHandler):
    """torchrun's rendezvous, gpucert's way: nodes met by node rank, the wait bounded and its failure named, and
    the job's abort record watched for this node's agent (module docstring)."""

    def __init__(self, params: RendezvousParameters) -> None:
        self.addr, port = params.endpoint.rsplit(":", 1)
        self.port = int(port)
        self.node_rank = int(params.get("node_rank"))
        self.num_nodes = params.max_nodes
        self.host = str(params.get("host") or socket.gethostname())
        self.name = str(params.get("node_name") or self.host)
        self.config = RuntimeConfig(**json.loads(params.get("runtime", "{}")))
        self.nproc = int(params.get("nproc", 1))  # ranks per node: what node 0's store will serve
        self.store: Any = None
        self.round = -1  # torchrun's restart count: every node starts each round of workers together
        self.labels: dict[int, str] = {}
        self.cause: str | None = None
        self._watch: Any = None
        self._last_ok = time.monotonic()
        self._next_look = 0.0
        self._abort_seen: float | None = None
        self._acked = False
        self._closed = False

    @property
    def serves(self) -> bool:
        return self.node_rank == 0

    @property
    def who(self) -> str:
        return f"node rank {self.node_rank} (host {self.host})"

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        """Round 0: connect (node 0 serves) and meet. A later round (the ranks ended on a failure and torchrun
        restarts them, docs/architecture.md): meet again, unless the ranks said the run is over."""
        if self.store is None:
            if self.serves:
                fit_open_files(self.num_nodes * self.nproc, self.num_nodes, self.who)
            self.store = connect_store(self.addr, self.port, self.serves, self.config.rendezvous_timeout_s, self.who)
            self.port = self.store.port  # a lone node serves on a port the OS chose
        self.round += 1
        self.cause, self._abort_seen, self._acked = None, None, False
        try:
            if self.round > 0:
                run = dist.PrefixStore(RUN_PREFIX, self.store)
                if run.check(["over"]):
                    self._ack(self.store)
                    raise JobFailed(run.get("over").decode())
            self._meet()
            # The store's silence is counted from here: nodes that took minutes to meet are not minutes silent.
            self._last_ok = time.monotonic()
        except (RendezvousError, JobFailed):
            raise
        except RuntimeError:  # the store's own errors: its server, node rank 0's gpucert, is gone
            raise RendezvousError(
                f"{self.who}: the job's store at {self.addr}:{self.port} stopped answering before round "
                f"{self.round} of the workers: node rank 0's gpucert is gone (node lost, killed?)"
            ) from None
        info = RendezvousStoreInfo(self.addr, self.port)
        store = dist.PrefixStore(f"torchelastic/{self.round}/", self.store)  # torch's own keys, fresh each round
        return RendezvousInfo(store, self.node_rank, self.num_nodes, info)

    def _meet(self) -> None:
        """Every node says who it is; node 0 waits for all (bounded) and hands out the labels."""
        prefix = f"{NODES_PREFIX}{self.round}/"
        store, timeout_s = dist.PrefixStore(prefix, self.store), self.config.rendezvous_timeout_s
        if not 0 <= self.node_rank < self.num_nodes:
            raise RendezvousError(f"{self.who}: node rank {self.node_rank} is outside 0..{self.num_nodes - 1}")
        # A node rank claimed twice (two nodes given the same --node-rank) would run two agents as one node:
        # the second to claim it stops, naming the first, and leaves its name for node 0's missing-node message.
        me = json.dumps({"name": self.name, "host": self.host, "pid": os.getpid()})
        if store.add(f"claim/{self.node_rank}", 1) > 1 and not self._takes_over(store):
            store.set(f"twice/{self.node_rank}", me)
            first = json.loads(store.get(str(self.node_rank)))["host"] if store.check([str(self.node_rank)]) else "?"
            raise RendezvousError(
                f"{self.who}: node rank {self.node_rank} is already taken by host {first}: give every node its own "
                f"--node-rank (0..{self.num_nodes - 1})"
            )
        store.set(str(self.node_rank), me)
        ranks = [str(r) for r in range(self.num_nodes)]
        wait = Waiting(timeout_s)

        def waiting_line() -> str:
            joined = sum(store.check([r]) for r in ranks)
            return (
                f"{self.who}: {'still ' if wait.told else ''}waiting at {self.addr}:{self.port} for every node to "
                f"join: {joined} of {self.num_nodes} so far; waited {wait.elapsed():.0f} s, gives up after "
                f"{timeout_s:g} s (runtime.rendezvous_timeout_s)"
            )

        if self.serves:
            while not store.check(ranks):
                if wait.left() <= 0:
                    message = self._missing_nodes_message(store)
                    store.set("roster", json.dumps({"error": message}))
                    raise RendezvousError(message)
                wait.tell(waiting_line)
                time.sleep(POLL_S)
            from gpucert.runtime.identity import node_labels

            names = {r: json.loads(store.get(str(r)))["name"] for r in range(self.num_nodes)}
            store.set("roster", json.dumps({"labels": node_labels(names)}))
        else:
            # In short waits, not one: the line above is said meanwhile, and Ctrl-C is acted on between them.
            while not store.check(["roster"]):
                if wait.left() <= 0:
                    raise RendezvousError(
                        f"{self.who}: node rank 0 at {self.addr}:{self.port} did not finish the rendezvous within "
                        f"{timeout_s:g} s (runtime.rendezvous_timeout_s)"
                    )
                wait.tell(waiting_line)
                with contextlib.suppress(dist.DistStoreError):  # the short wait's timeout; the store's own errors
                    store.wait(["roster"], timedelta(seconds=max(min(1.0, wait.left()), 0.01)))
        roster = json.loads(store.get("roster"))
        if "error" in roster:
            raise RendezvousError(roster["error"])
        self.labels = {int(r): label for r, label in roster["labels"].items()}

    def _takes_over(self, store: Any) -> bool:
        """A claim of this node rank made before by a gpucert of this host that is gone (stopped, killed, started
        again with the same command while the others wait): this one takes its place. A live one, or one of
        another host, is a node rank given twice."""
        if not store.check([str(self.node_rank)]):
            return False  # the first claimant has not said who it is yet: alive
        first = json.loads(store.get(str(self.node_rank)))
        if first.get("host") != self.host or not isinstance(first.get("pid"), int):
            return False
        return process_gone(first["pid"])  # alive: two gpucerts given one node rank

    def _missing_nodes_message(self, store: Any) -> str:
        present = [r for r in range(self.num_nodes) if store.check([str(r)])]
        missing = [r for r in range(self.num_nodes) if r not in present]
        hosts = [json.loads(store.get(str(r)))["host"] for r in present]
        if self.labels:
            # A later round: the node was there, its workers ended with the failure and it did not come back.
            lost = ", ".join(f"{self.labels.get(r, r)} (node rank {r})" for r in missing)
            return (
                f"{lost} did not come back for round {self.round} of the workers within "
                f"{self.config.rendezvous_timeout_s:g} s (runtime.rendezvous_timeout_s): its gpucert is gone (node "
                "lost, killed?); what ran before is in the report"
            )
        twice = [
            f"node rank {r} on hosts {json.loads(store.get(str(r)))['host']} and "
            f"{json.loads(store.get(f'twice/{r}'))['host']}"
            for r in present
            if store.check([f"twice/{r}"])
        ]
        return (
            f"{self.who}: waited {self.config.rendezvous_timeout_s:g} s (runtime.rendezvous_timeout_s) at "
            f"{self.addr}:{self.port} for {self.num_nodes} nodes; {len(present)} joined ({', '.join(hosts)}); "
            f"missing node rank(s) {', '.join(map(str, missing))}. "
            + (f"Given twice: {'; '.join(twice)}. " if twice else "")
            + f"Start gpucert there with the same command and --node-rank set, or check that they reach "
            f"{self.addr}:{self.port}"
        )

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        """The agent's question every monitor interval; the answer is always 0 (no node joins a running job),
        and the moment to look at the job's abort record and at the store (module docstring)."""
        now = time.monotonic()
        if now < self._next_look or self.store is None:
            return 0
        self._next_look = now + self.config.heartbeat_interval_s
        if self._abort_seen is not None:
            if now - self._abort_seen > 2 * self.config.heartbeat_interval_s:
                kill_children(signal.SIGKILL)
            return 0
        try:
            if self._watch is None:
                # Its own connection with a short timeout: a stopped store must not hold the agent's loop.
                self._watch = self._short_connection()
            record = read_abort(dist.PrefixStore(worker_prefix(self.round), self._watch))
            self._last_ok = now
        except RuntimeError:
            silent = now - self._last_ok
            if silent > self.config.heartbeat_timeout_s + 2 * self.config.heartbeat_interval_s:
                self.cause = (
                    f"{self.who} stops: the job's store at {self.addr}:{self.port} has not answered for "
                    f"{silent:.0f} s (runtime.heartbeat_timeout_s {self.config.heartbeat_timeout_s:g}): node rank "
                    "0's gpucert is gone, stopped or unreachable"
                )
                kill_children()
            return 0
        if record is not None:
            self.cause = how_it_ended(record)
            self._abort_seen = now
            self._ack(self._watch)
            kill_children(None)  # woken, a SIGSTOPped worker reads the record and leaves by itself
        return 0

    def read_cause(self) -> str | None:
        """The job's abort record as it stands, if the store still answers (a local rank recorded it just now)."""
        if self.cause is not None or self.store is None:
            return self.cause
        with contextlib.suppress(RuntimeError):
            watch = self._watch or self._short_connection()
            run = dist.PrefixStore(RUN_PREFIX, watch)
            if run.check(["over"]):
                self._ack(watch)
                return str(run.get("over").decode())
            record = read_abort(dist.PrefixStore(worker_prefix(self.round), watch))
            if record is not None:
                self._ack(watch)
            return how_it_ended(record) if record is not None else None
        return None

    def _ack(self, watch: Any) -> None:
        """Tell node 0 this node has read how this round's job ended: it keeps its store up until every node has
        (linger). Counted per round: an earlier round's failure, read and acked, must not let a later stop go."""
        if not self._acked and not self.serves:
            with contextlib.suppress(RuntimeError):
                dist.PrefixStore(RUN_PREFIX, watch).add(f"{ACKED}/{self.round}", 1)
                self._acked = True

    def linger(self) -> None:
        """Node 0, its job ended (a failure, the operator's stop): keep serving the store until every other node
        has read how it ended (their agents look every heartbeat interval), for at most two intervals. Without
        this a node read only "rank 1 on this node ended: exit code 3" once node 0 was gone. Nothing to wait for
        before the nodes met: nothing was recorded for them."""
        if not self.serves or self.num_nodes == 1 or self.store is None or not self.labels:
            return
        run = dist.PrefixStore(RUN_PREFIX, self.store)
        with contextlib.suppress(RuntimeError):
            wait_for_count(run, f"{ACKED}/{self.round}", self.num_nodes - 1, 2 * self.config.heartbeat_interval_s)

    def _short_connection(self) -> Any:
        """A quiet client of the job's store bounded by runtime.heartbeat_interval_s: the agent's reads of the
        abort record and `over`, which a stopped store must not hold."""
        return connect_store(
            self.addr, self.port, False, self.config.heartbeat_interval_s, self.who, WATCH_SETTING, tell=False
        )

    def record_stop(self, cause: str) -> AbortRecord:
        """The operator stopped this node's gpucert: record it as the job's abort, before this node's workers are
        signalled (their SIGTERM then reads it), and as `over`, so that no node starts another round. Over a short
        connection of its own: this runs in a signal handler, and node 0's store may be gone."""
        record = AbortRecord(who=self.who, cause=cause, phase="the rendezvous", node=self.name, operator=True)
        if self.store is None or not self.labels:
            return record  # the nodes have not met: no worker to tell
        with contextlib.suppress(RuntimeError):
            watch = self._watch or self._short_connection()
            workers = dist.PrefixStore(worker_prefix(self.round), watch)
            record = dataclasses.replace(record, phase=read_phase(workers, 0, "start-up"))
            record_abort(workers, record)
            dist.PrefixStore(RUN_PREFIX, watch).compare_set("over", "", how_it_ended(record))
            self._ack(watch)  # this node knows how the job ended: node 0 need not wait for it to read so
        return record

    def get_run_id(self) -> str:
        return RUN_ID

    def shutdown(self) -> bool:
        return True


def how_it_ended(record: AbortRecord) -> str:
    """A node's line for the job's abort record: an operator's stop on any node reads as the run's stop."""
    return f"the run stopped: {record.message()}" if record.operator else record.message()


# The handler of the launch in progress, for the outcome's cause (torch builds it from the registry).
_CURRENT: list[NodeRendezvous] = []


def _create(params: RendezvousParameters) -> NodeRendezvous:
    handler = NodeRendezvous(params)
    _CURRENT[:] = [handler]
    return handler


def operator_stop(signum: int, frame: FrameType | None) -> NoReturn:
    """The handler of OPERATOR_SIGNALS during a launch: record the stop (NodeRendezvous.record_stop), then raise
    Interrupted, on which torch's agent stops the workers and launch_ranks the rest. A second signal is let be:
    the stop is under way, bounded by runtime.kill_grace_s."""
    for sig in OPERATOR_SIGNALS:
        if signal.getsignal(sig) is operator_stop:
            signal.signal(sig, _stopping_already)
    sig, host, pid = signal.Signals(signum), socket.gethostname(), os.getpid()
    if sig == signal.SIGINT:
        cause = f"interrupted by Ctrl-C (SIGINT to gpucert, pid {pid} on {host})"
    else:
        cause = f"stopped by {sig.name} sent to gpucert (pid {pid} on {host}; a kill, or scancel)"
    handler = _CURRENT[0] if _CURRENT else None
    record = (
        handler.record_stop(cause) if handler else AbortRecord(who=host, cause=cause, phase="start-up", operator=True)
    )
    raise Interrupted(record.message(), 128 + sig)


def _stopping_already(signum: int, frame: FrameType | None) -> None:
    """A second Ctrl-C or SIGTERM while the first one's stop is under way."""


def kill_children(sig: signal.Signals | None = signal.SIGKILL) -> None:
    """Every worker of this process, in its own session (torch starts them so): SIGCONT, then `sig`."""
    for pid in _children(os.getpid()):
        for each in (signal.SIGCONT, sig):
            if each is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, each)


def stop_children(grace_s: float) -> None:
    """SIGTERM every worker (each says where it was and leaves), SIGKILL what is left after grace_s."""
    kill_children(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _children(os.getpid()) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass  # reaped: a zombie is still our child
        time.sleep(0.05)
    kill_children(signal.SIGKILL)


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(int(entry))
    return found


class RankLogs(LogsSpecs):
    """Rank 0 keeps its node's terminal (it prints the report there); every other rank writes stdout and stderr
    to `<log_dir>/rank-<global rank>.log` (the rank merges its stderr into it)."""

    def __init__(self, log_dir: Path | None) -> None:
        super().__init__(log_dir=str(log_dir) if log_dir else None)
        self.log_dir = log_dir

    @property
    def root_log_dir(self) -> str:
        return str(self.log_dir or "")

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        console = dict.fromkeys(envs, "")  # torch's word for "the terminal"
        if self.log_dir is None:
            return LogsDest(stdouts=console, stderrs=dict(console), error_files=dict.fromkeys(envs, os.devnull))
        if any(env["RANK"] != "0" for env in envs.values()):
            self.log_dir.mkdir(parents=True, exist_ok=True)  # a lone rank 0 writes none: no empty folder
        stdouts = {
            local: "" if env["RANK"] == "0" else str(self.log_dir / f"rank-{env['RANK']}.log")
            for local, env in envs.items()
        }
        # torch opens stdout and stderr files apart (two offsets in one file would overwrite each other): the rank
        # sends its stderr into its stdout itself (merge_rank_log).
        errors = {local: str(self.log_dir / f"error-rank-{env['RANK']}.json") for local, env in envs.items()}
        return LogsDest(stdouts=stdouts, stderrs=console, error_files=errors)


def merge_rank_log() -> None:
    """In a rank whose stdout RankLogs sent to a file: its stderr goes there too, one log a rank."""
    if os.environ.get(LOG_DIR) and os.environ.get("RANK", "0") != "0" and not os.isatty(1):
        os.dup2(1, 2)


@dataclass(frozen=True)
class LaunchOutcome:
    ok: bool
    # This node's verdict (exit code) as its local rank 0 wrote it, when the ranks finished.
    verdict: int | None = None
    # Why the job failed, in one line: the recorded abort, else how this node's first worker ended.
    cause: str | None = None
    # Node rank -> label, as the nodes met.
    labels: dict[int, str] = dataclasses.field(default_factory=dict)


def launch_ranks(
    node: NodeEnv,
    nproc: int,
    argv: Sequence[str],
    config: RuntimeConfig,
    log_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    max_restarts: int = 0,
) -> LaunchOutcome:
    """Run `argv` as nproc ranks on this node, with every other node's (node.num_nodes nodes, met at
    node.master_addr:node.master_port; a lone node serves on a free port). Blocks until the job ends.

    max_restarts: rounds of fresh workers after a failure (accept: one a benchmark, so a benchmark that fails
    or hangs costs that benchmark, not the run); the ranks carry the run across rounds in the run store and set
    `over` there to end it (an outcome not ok, with the cause and local rank 0's verdict). RendezvousError: a
    node did not come (named); Interrupted (a KeyboardInterrupt): Ctrl-C or SIGTERM to this process, every worker
    stopped, the stop recorded for the job's ranks (operator_stop)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, launch_agent

    with contextlib.suppress(ValueError):  # registered already, by an earlier launch in this process
        rendezvous_handler_registry.register(BACKEND, _create)
    # torchrun's own logging repeats, as tracebacks and tables, what the cause line says.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    lone = node.num_nodes == 1
    verdict_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpucert-verdict-{os.getpid()}-{time.monotonic_ns()}"
    saved = dict(os.environ)
    # The workers inherit this process's environment (torch adds RANK, WORLD_SIZE, ... per worker).
    for key in RANK_VARIABLES:
        os.environ.pop(key, None)
    os.environ.update(env or {})
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # c10d's C++ logs repeat every connection retry, with stack dumps; our own messages say what failed.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    os.environ.update({AGENT_PID: str(os.getpid()), VERDICT_FILE: str(verdict_file)})
    if log_dir is not None:
        os.environ[LOG_DIR] = str(log_dir)
    settings: dict[str, Any] = {
        "min_nodes": node.num_nodes,
        "max_nodes": node.num_nodes,
        "nproc_per_node": nproc,
        "run_id": RUN_ID,
        "rdzv_backend": BACKEND,
        "rdzv_endpoint": f"{'127.0.0.1' if lone else node.master_addr}:{0 if lone else node.master_port}",
        "rdzv_configs": {
            "node_rank": node.node_rank,
            "node_name": node.node_name or "",
            "nproc": nproc,
            "runtime": json.dumps(dataclasses.asdict(config)),
        },
        "max_restarts": max_restarts,
        "monitor_interval": min(0.5, config.heartbeat_interval_s),
        "logs_specs": RankLogs(log_dir),
    }
    fields = {f.name for f in dataclasses.fields(LaunchConfig)}
    if "shutdown_timeout" in fields:
        settings["shutdown_timeout"] = max(int(config.kill_grace_s), 1)  # TERM, then KILL after this long
    if "signals_to_handle" in fields:
        # Ctrl-C and SIGTERM are ours (operator_stop); torch would pass SIGINT on to ranks that may still be
        # importing, each printing a traceback.
        settings["signals_to_handle"] = ",".join(sig.name for sig in LAUNCH_SIGNALS)
    _CURRENT.clear()
    # torch's agent installs its own handlers for these and leaves them: a process that launches more than once
    # (a test session, a library caller) would then meet SIGTERM as an exception in whatever runs next.
    handlers = {sig: signal.getsignal(sig) for sig in (*LAUNCH_SIGNALS, *OPERATOR_SIGNALS)}
    for sig in OPERATOR_SIGNALS:
        if handlers[sig] is not signal.SIG_IGN:  # started with it ignored (nohup, a script's background): so be it
            signal.signal(sig, operator_stop)
    try:
        launch_agent(LaunchConfig(**settings), argv[0], list(argv[1:]))
        return LaunchOutcome(True, _read_verdict(verdict_file), labels=_CURRENT[0].labels if _CURRENT else {})
    except ChildFailedError as exc:
        handler = _CURRENT[0] if _CURRENT else None
        cause = handler.read_cause() if handler else None
        if cause is None:
            rank, failure = exc.get_first_failure()
            cause = f"rank {rank} on this node ended: {exit_cause(failure.exitcode)}"
        if handler is not None:
            handler.linger()  # the other nodes read the abort record from our store
        return LaunchOutcome(False, _read_verdict(verdict_file), cause)
    except JobFailed as exc:
        # The ranks set `over` before the next round: the verdict local rank 0 wrote on its way out still counts
        # (141: the reader of the output left, which is no failure to report).
        if _CURRENT:
            _CURRENT[0].linger()  # the other nodes read `over` from our store as they meet for the next round
        return LaunchOutcome(False, _read_verdict(verdict_file), str(exc))
    except SignalException as exc:
        if exc.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        return LaunchOutcome(False, None, f"stopped by {signal.Signals(exc.sigval).name} (the job was cancelled?)")
    except KeyboardInterrupt:
        stop_children(config.kill_grace_s)
        if _CURRENT:
            _CURRENT[0].linger()  # the operator's stop, recorded in our store: the other nodes read it there
        raise
    finally:
        kill_children()  # whatever torch's shutdown left: nothing outlives the launch
        os.environ.clear()
        os.environ.update(saved)
        verdict_file.unlink(missing_ok=True)
        restore_handlers(handlers)


# What a node says where its ranks all exited 0 and local rank 0 wrote no verdict (write_verdict).
NO_VERDICT = (
    "every rank on this node exited 0, but local rank 0 wrote no verdict (GPUCERT_VERDICT_FILE): a path of the "
    "ranks that ended without judging, or ranks that see another /tmp than this process (a container); their logs "
    "say which"
)


def write_verdict(code: int) -> None:
    """In local rank 0 of a node: this node's exit code, for the process that launched the ranks."""
    path = os.environ.get(VERDICT_FILE)
    if path:
        tmp = Path(f"{path}.tmp")
        tmp.write_text(str(code))
        tmp.replace(path)


def _read_verdict(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
