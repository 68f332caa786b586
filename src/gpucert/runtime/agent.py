"""gpucert's own launcher on one node: meet the other nodes, then run steps whose workers span all nodes.

One agent per node (`gpucert accept --nnodes 2 --node-rank R --master-addr A`, `srun --ntasks-per-node=1`, a
Kubernetes indexed Job; or a lone node, where the store takes a free port). Node rank 0's agent serves the
run's TCP store for the whole run, so every step (one benchmark) is a fresh set of worker processes over a fresh
key prefix: a benchmark that crashes or hangs costs that benchmark, not the run, and no port is reused.

    agent = NodeAgent.start(plan, nproc, config, workdir)   # bounded wait; names the node ranks that never came
    step = agent.run_step("matmul", argv, timeout_s)        # this node's workers; the job spans every node
    agent.put("part/0", {...}); agent.get("part/1")         # what nodes tell node 0
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.group import (
    POLL_S,
    AbortRecord,
    RendezvousError,
    connect_store,
    read_abort,
    read_phase,
    record_abort,
)
from gpucert.runtime.identity import RankIdentity, node_labels
from gpucert.runtime.launch_env import RANK_VARIABLES, NodeEnv
from gpucert.runtime.spawn import WorkerExit, run_workers


@dataclass
class StepResult:
    ok: bool
    failure: AbortRecord | None = None
    # The folder with every local worker's log of this step.
    logs: Path | None = None
    # Set when a node did not come back from the step: the run cannot go on with the next one.
    lost: str | None = None


@dataclass
class NodeAgent:
    plan: NodeEnv
    config: RuntimeConfig
    workdir: Path
    store: Any
    port: int
    nproc: int
    labels: dict[int, str] = field(default_factory=dict)
    nprocs: dict[int, int] = field(default_factory=dict)
    steps: int = 0
    # Workers' logs, one folder per step (the run's output directory, so they outlive the run); None: workdir.
    log_dir: Path | None = None
    deadman: Any = None

    @property
    def node_rank(self) -> int:
        return self.plan.node_rank

    @property
    def num_nodes(self) -> int:
        return self.plan.num_nodes

    @property
    def is_head(self) -> bool:
        return self.plan.node_rank == 0

    @property
    def label(self) -> str:
        return self.labels[self.node_rank]

    @property
    def world_size(self) -> int:
        return sum(self.nprocs.values())

    @property
    def rank_offset(self) -> int:
        return sum(n for r, n in self.nprocs.items() if r < self.node_rank)

    @classmethod
    def start(
        cls, plan: NodeEnv, nproc: int, config: RuntimeConfig, workdir: Path, host: str | None = None
    ) -> NodeAgent:
        """host: this node's name when it is not this machine's (a replayed capture bundle)."""
        host = host or socket.gethostname()
        who = f"node rank {plan.node_rank} (host {host})"
        serve = plan.node_rank == 0
        # A lone node takes a free port from the OS (no port races between runs on one machine).
        port = plan.master_port if plan.num_nodes > 1 else 0
        addr = plan.master_addr if plan.num_nodes > 1 else "127.0.0.1"
        base = connect_store(addr, port, serve, config.rendezvous_timeout_s, who)
        agent = cls(
            plan=NodeEnv(plan.launcher, plan.node_rank, plan.num_nodes, addr, base.port, plan.node_name),
            config=config,
            workdir=workdir,
            store=dist.PrefixStore("gpucert/agent/", base),
            port=base.port,
            nproc=nproc,
        )
        agent._meet(plan.node_name or host, host)
        if not serve:
            from gpucert.runtime.watchdog import StoreDeadman

            # Every later store call may block for good if node 0 stops: end then, naming the store.
            endpoint = (agent.plan.master_addr, agent.port)
            agent.deadman = StoreDeadman(endpoint, config.heartbeat_interval_s, config.heartbeat_timeout_s, who).begin()
        return agent

    def _meet(self, name: str, host: str) -> None:
        """Every node says who it is; node 0 waits for all (bounded) and hands out labels and rank offsets."""
        me = {"name": name, "host": host, "nproc": self.nproc}
        self.store.set(f"node/{self.node_rank}", json.dumps(me))
        self.store.add("nodes", 1)
        if self.is_head:
            deadline = time.monotonic() + self.config.rendezvous_timeout_s
            while self.store.add("nodes", 0) < self.num_nodes:
                if time.monotonic() > deadline:
                    message = self._missing_nodes_message(host)
                    self.store.set("roster", json.dumps({"error": message}))
                    raise RendezvousError(message)
                time.sleep(POLL_S)
            nodes = {r: json.loads(self.store.get(f"node/{r}")) for r in range(self.num_nodes)}
            roster = {
                "labels": node_labels({r: n["name"] for r, n in nodes.items()}),
                "nproc": {r: n["nproc"] for r, n in nodes.items()},
            }
            self.store.set("roster", json.dumps(roster))
        else:
            try:
                self.store.wait(["roster"], timedelta(seconds=self.config.rendezvous_timeout_s))
            except RuntimeError:
                raise RendezvousError(
                    f"node rank {self.node_rank} (host {host}): node rank 0 at {self.plan.master_addr}:{self.port} "
                    f"did not finish the rendezvous within {self.config.rendezvous_timeout_s:g} s "
                    "(runtime.rendezvous_timeout_s)"
                ) from None
            roster = json.loads(self.store.get("roster"))
            if "error" in roster:
                raise RendezvousError(roster["error"])
        self.labels = {int(r): label for r, label in roster["labels"].items()}
        self.nprocs = {int(r): n for r, n in roster["nproc"].items()}

    def _missing_nodes_message(self, host: str) -> str:
        present = [r for r in range(self.num_nodes) if self.store.check([f"node/{r}"])]
        missing = [r for r in range(self.num_nodes) if r not in present]
        hosts = [json.loads(self.store.get(f"node/{r}"))["host"] for r in present]
        return (
            f"node rank 0 (host {host}): waited {self.config.rendezvous_timeout_s:g} s "
            f"(runtime.rendezvous_timeout_s) at {self.plan.master_addr}:{self.port} for {self.num_nodes} nodes; "
            f"{len(present)} joined ({', '.join(hosts)}); missing node rank(s) {', '.join(map(str, missing))}. "
            f"Start gpucert there with --node-rank set, or check that they reach {self.plan.master_addr}:{self.port}"
        )

    # Node-to-node messages through the store: JSON under a key, waits bounded.

    def put(self, key: str, value: Any) -> None:
        self.store.set(f"data/{key}", json.dumps(value))

    def get(self, key: str, timeout_s: float, what: str) -> Any:
        try:
            self.store.wait([f"data/{key}"], timedelta(seconds=timeout_s))
        except RuntimeError:
            raise RendezvousError(f"{what}: nothing came within {timeout_s:g} s") from None
        return json.loads(self.store.get(f"data/{key}"))

    def barrier(self, name: str, timeout_s: float) -> None:
        """All nodes reach `name`, or the error names the node ranks that did not within timeout_s."""
        self.store.set(f"barrier/{name}/{self.node_rank}", "1")
        deadline = time.monotonic() + timeout_s
        while True:
            late = [r for r in range(self.num_nodes) if not self.store.check([f"barrier/{name}/{r}"])]
            if not late:
                return
            if time.monotonic() > deadline:
                names = ", ".join(f"{self.labels.get(r, r)} (node rank {r})" for r in late)
                raise RendezvousError(f"{names} did not reach {name} within {timeout_s:g} s: node lost?")
            time.sleep(POLL_S)

    def worker_env(self, local_rank: int, prefix: str, extra: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
        env.setdefault("OMP_NUM_THREADS", "1")
        # c10d's C++ logs repeat every connection retry; our own messages say what failed.
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        env.update(extra)
        env.update(
            RANK=str(self.rank_offset + local_rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(self.nproc),
            GROUP_RANK=str(self.node_rank),
            GROUP_WORLD_SIZE=str(self.num_nodes),
            MASTER_ADDR=self.plan.master_addr,
            MASTER_PORT=str(self.port),
            GPUCERT_AGENT_STORE="1",
            GPUCERT_STORE_PREFIX=prefix,
            GPUCERT_NODE_LABEL=self.label,
            GPUCERT_AGENT_PID=str(os.getpid()),
        )
        return env

    def run_step(
        self, name: str, argv: Sequence[str], timeout_s: float, extra_env: Mapping[str, str] | None = None
    ) -> StepResult:
        """This node's share of one job across all nodes; the result says which rank failed first, and how."""
        self.steps += 1
        prefix = f"step{self.steps}-{name}"
        self.barrier(f"{prefix}/start", self.config.rendezvous_timeout_s)
        job = dist.PrefixStore(f"gpucert/{prefix}/", self.store.underlying_store)
        ranks = [self.rank_offset + i for i in range(self.nproc)]

        def record(exit: WorkerExit) -> None:
            detail = exit.last_error()
            record_abort(
                job,
                AbortRecord(
                    who=self._describe(job, exit.rank, exit.local_rank),
                    cause=exit.cause + (f": {detail}" if detail else ""),
                    phase=read_phase(job, exit.rank, "start-up"),
                    rank=exit.rank,
                    node=self.label,
                ),
            )

        envs = [self.worker_env(i, prefix, extra_env or {}) for i in range(self.nproc)]
        logs = (self.log_dir or self.workdir) / prefix
        try:
            outcome = run_workers(
                argv,
                envs,
                ranks,
                logs,
                timeout_s,
                self.config.kill_grace_s,
                on_failure=record,
                should_stop=lambda: bool(job.check(["abort"])),
            )
            failure = read_abort(job)
        except RuntimeError as exc:  # the store: node 0 is gone
            failure = AbortRecord(who=f"node {self.label}", cause=f"lost the run's store: {exc}", phase=name)
            return StepResult(ok=False, failure=failure, lost=str(exc))
        if outcome.timed_out and failure is None:
            phases = "; ".join(f"rank {r}: {read_phase(job, r, 'start-up')}" for r in ranks)
            failure = record_abort(
                job,
                AbortRecord(
                    who=f"node {self.label}",
                    cause=f"no result within {timeout_s:g} s (hung collective or kernel?); {phases}",
                    phase=name,
                    node=self.label,
                ),
            )
        if not outcome.ok and failure is None:
            first = outcome.first_failure
            failure = AbortRecord(who=f"node {self.label}", cause=first.cause if first else "failed", phase=name)
        # Every node's workers of this step are gone before the next starts (a late one would join it).
        lost = None
        try:
            self.barrier(f"{prefix}/end", self.config.rendezvous_timeout_s + self.config.kill_grace_s)
        except RendezvousError as exc:
            lost = str(exc)
            failure = failure or AbortRecord(who=f"node {self.label}", cause=lost, phase=name)
        return StepResult(ok=outcome.ok and failure is None, failure=failure, logs=logs, lost=lost)

    def _describe(self, job: Any, rank: int, local_rank: int) -> str:
        if job.check([f"rank/{rank}"]):
            # The worker wrote its raw node name before the run's labels were known to it; ours is the label.
            ident = RankIdentity.from_dict(json.loads(job.get(f"rank/{rank}")))
            return dataclasses.replace(ident, node=self.label).describe()
        return f"rank {rank} ({self.label} local rank {local_rank})"

    def finish(self, verdict: int | None, lost: bool = False) -> int:
        """Node 0 publishes the run's exit code; the others wait for it (bounded) and exit with it too. After a
        lost node, node 0 does not wait for every node to read it."""
        if self.deadman is not None:
            self.deadman.stop()
        if self.is_head:
            self.put("verdict", verdict)
            deadline = time.monotonic() + (
                self.config.heartbeat_timeout_s if lost else self.config.rendezvous_timeout_s
            )
            # Serve the store until every node has read the verdict.
            while self.store.add("done", 0) < self.num_nodes - 1 and time.monotonic() < deadline:
                time.sleep(POLL_S)
            return int(verdict if verdict is not None else 3)
        code = self.get("verdict", self.config.collective_timeout_s, f"node {self.label}: the verdict of node 0")
        self.store.add("done", 1)
        return int(code)
