"""A fine-tuning job fails fast instead of hanging: two "nodes" on localhost started as the README says
(`gpucert finetune --nnodes 2 --node-rank R --master-addr A`), one gloo rank each, and a failure on node 1 ends
both nodes within 60 s (on a quiet machine; scaled by its pace) with the failed rank named in one line, exit 3.
A SIGKILLed rank says nothing, so rank 0's watchdog names it from its heartbeats; a rank that raises (its data
file is missing on its node) records the cause, which every node prints.

Heartbeats are tightened (every 1 s, silent 6 s means dead) to keep each test near 20 s on 2 CPU cores."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from tests.conftest import free_port, kill_process_tree, within
from tests.runtime.test_cluster_runs import AS_FROM_A_SHELL, node_flags

from gpucert.finetune.train.checkpoint import complete_checkpoints
from gpucert.runtime.launch_env import RANK_VARIABLES

pytestmark = pytest.mark.slow

# A run of minutes if nothing stopped it: the failure always lands mid-run.
CONFIG = """\
model: {name: tiny, dtype: fp32, attn_implementation: sdpa}
lora: {r: 8, alpha: 16, dropout: 0.0}
data: {max_length: 256, eval_fraction: 0.1, cache_dir: CACHE}
train: {micro_batch: 2, grad_accum: 1, lr: 1.0e-3, epochs: 1000, max_steps: 5000, eval_every: 100000,
        save_every: 100000}
"""
HEARTBEATS = ("runtime.heartbeat_interval_s=1", "runtime.heartbeat_timeout_s=6")
START_TIMEOUT_S = 120
# What the issue promises: from the failure to the end of every node's agent.
END_TIMEOUT_S = 60


@dataclass
class Node:
    """One torchrun agent (a "node") and the file its output goes to."""

    agent: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def wait_until_training(output: Callable[[], str], procs: list[subprocess.Popen[bytes]]) -> None:
    """Until the output shows step 3 (the run is mid-training); fails if a process ended first, or past
    START_TIMEOUT_S."""
    deadline = time.monotonic() + within(START_TIMEOUT_S)
    while not re.search(r"\[finetune\] step 3/", output()):
        assert all(p.poll() is None for p in procs), output()[-3000:]
        assert time.monotonic() < deadline, f"no training step within {START_TIMEOUT_S} s:\n{output()[-3000:]}"
        time.sleep(0.2)


def worker_env() -> dict[str, str]:
    """This environment without any launcher's rank variables, one thread a process (2 CPU cores)."""
    return {**{k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}, "OMP_NUM_THREADS": "1"}


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[Callable[[dict[int, list[str]]], list[Node]]]:
    """Start node 0 and node 1 (`extra[n]`: --set items for node n only) through the returned function; every
    agent still running at the end is killed with its workers."""
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.replace("CACHE", str(tmp_path / "cache")))
    nodes: list[Node] = []
    env = worker_env()
    port = free_port()

    def start(extra: dict[int, list[str]]) -> list[Node]:
        for rank in (0, 1):
            # As a shell starts a foreground command: Ctrl-C (SIGINT) reaches it at its default action.
            argv = [*AS_FROM_A_SHELL, sys.executable, "-m", "gpucert", "finetune", "--config", str(config)]
            argv += ["--output", str(tmp_path / "run"), *node_flags(rank, port)]
            for item in (*HEARTBEATS, *extra.get(rank, [])):
                argv += ["--set", item]
            log = tmp_path / f"node{rank}.log"
            with log.open("wb") as out:
                agent = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
            nodes.append(Node(agent, log))
        return nodes

    yield start
    for node in nodes:
        if node.agent.poll() is None:
            kill_process_tree(node.agent.pid)
            node.agent.wait()


def wait_all(nodes: list[Node], since: float) -> float:
    """Seconds from `since` until every agent exited; fails past END_TIMEOUT_S."""
    for node in nodes:
        left = within(END_TIMEOUT_S) - (time.monotonic() - since)
        try:
            node.agent.wait(timeout=max(left, 0.1))
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job still runs {within(END_TIMEOUT_S):.0f} s after the failure:\n{node.output()[-3000:]}")
    return time.monotonic() - since


def test_a_killed_rank_ends_both_nodes_and_is_named(two_nodes: Callable[..., list[Node]], tmp_path: Path) -> None:
    node0, node1 = two_nodes({})
    wait_until_training(node0.output, [node0.agent, node1.agent])
    [rank1] = [p for p in psutil.Process(node1.agent.pid).children(recursive=True) if p.environ().get("RANK") == "1"]
    rank1.send_signal(signal.SIGKILL)
    took = wait_all([node0, node1], time.monotonic())

    assert node0.agent.returncode == 3 and node1.agent.returncode == 3
    # Node 0: its rank's watchdog saw rank 1's heartbeats stop and named it, with the step it was in.
    out0, out1 = node0.output(), node1.output()
    assert re.search(r"gpucert: rank 1 \(.*\) failed during step \d+: no heartbeat", out0), out0[-3000:]
    # Node 1: one line naming its rank, from the job's record or from how its process ended.
    assert re.search(r"gpucert: rank 1 .*(no heartbeat|SIGKILL)", out1), out1[-3000:]
    for out in (out0, out1):
        assert "Traceback" not in out and "frame #" not in out, out[-3000:]
    print(f"both nodes ended {took:.1f} s after the kill")


def test_an_error_on_one_rank_ends_both_nodes_with_its_cause(
    two_nodes: Callable[..., list[Node]], tmp_path: Path
) -> None:
    """Node 1 is given a data file its filesystem does not have: rank 1 refuses it in setup (before its run
    directory and data cache) while rank 0 has gone on and waits for it in the run directory's broadcast."""
    missing = tmp_path / "not-mounted" / "chats.jsonl"
    started = time.monotonic()
    node0, node1 = two_nodes({1: [f"data.source={missing}"]})
    took = wait_all([node0, node1], started)

    assert node0.agent.returncode == 3 and node1.agent.returncode == 3  # ERROR, on both
    cause = f"failed during setup: ConfigError: data.source {missing}: no such file"
    for out in (node0.output(), node1.output()):
        assert re.search(rf"gpucert: rank 1 \(.*\) {re.escape(cause)}", out), out[-3000:]
        assert "Traceback" not in out, out[-3000:]
    # The failed rank's own log has its line too (bad input: no traceback, the message says what to change).
    assert cause in (tmp_path / "run" / "logs" / "rank-1.log").read_text()
    print(f"both nodes ended {took:.1f} s after the start")


def wait_for_a_checkpoint(run: Path, procs: Sequence[subprocess.Popen[Any]], output: Callable[[], str]) -> None:
    """Until `run` holds a complete checkpoint (with save_every 2, step 2's soon after step 3 began; on a loaded
    machine a later one: only the last 3 are kept, and steps take milliseconds). Fails if a process ended first."""
    deadline = time.monotonic() + within(START_TIMEOUT_S)
    while not complete_checkpoints(run):
        assert all(p.poll() is None for p in procs), output()[-3000:]
        assert time.monotonic() < deadline, f"no checkpoint in {START_TIMEOUT_S} s: {output()[-3000:]}"
        time.sleep(0.2)


@pytest.mark.parametrize("where", [0, 1], ids=["on-node-0", "on-node-1"])
def test_ctrl_c_on_either_node_stops_both_and_node_0_says_which_checkpoint_continues(
    two_nodes: Callable[..., list[Node]], tmp_path: Path, where: int
) -> None:
    """The operator's Ctrl-C to one node's gpucert mid-training: that node exits 130 naming the stop in one line,
    the other ends too naming the same stop, no worker is left, and node 0 (rank 0 writes the checkpoints) says
    which checkpoint a rerun with --resume auto continues from."""
    nodes = two_nodes({0: ["train.save_every=2"], 1: ["train.save_every=2"]})
    procs = [node.agent for node in nodes]
    wait_until_training(nodes[0].output, procs)
    wait_for_a_checkpoint(tmp_path / "run", procs, nodes[0].output)
    workers = [w for p in procs for w in psutil.Process(p.pid).children(recursive=True)]
    nodes[where].agent.send_signal(signal.SIGINT)
    wait_all(nodes, time.monotonic())

    stopped = rf"interrupted by Ctrl-C \(SIGINT to gpucert, pid {nodes[where].agent.pid} on [^)]*\) during "
    # The other node was not stopped: its job was, which is an ERROR there. Its line says whose stop it was; it
    # said "rank 1 on this node ended: exit code 3" when node 0, gone at once, took the record with it.
    said = {where: f"gpucert: {stopped}", 1 - where: f"gpucert: the run stopped: {stopped}"}
    codes = {where: 130, 1 - where: 3}
    for rank, node in enumerate(nodes):
        out = node.output()
        assert node.agent.returncode == codes[rank], out[-3000:]
        last = [line for line in out.splitlines() if line.startswith("gpucert: ")][-1]
        assert re.match(said[rank], last), out[-3000:]
        assert "Traceback" not in out, out[-3000:]
    rank_1 = (tmp_path / "run" / "logs" / "rank-1.log").read_text()  # a broken collective's traceback is noise
    assert re.search(rf"gpucert: rank 1 \(.*\) stops.*: {stopped}", rank_1) and "Traceback" not in rank_1, rank_1
    latest = complete_checkpoints(tmp_path / "run")[-1][0]
    resume = f"the latest complete checkpoint is {tmp_path}/run/checkpoints/step-{latest} (step {latest})"
    assert resume in nodes[0].output() and "--resume auto continues" in nodes[0].output()
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]


def test_ctrl_c_to_a_lone_run_names_the_checkpoint_to_resume_from(tmp_path: Path) -> None:
    """One process (a GPU-less machine, or one GPU): Ctrl-C exits 130, its last line the checkpoint that
    `--resume auto` continues from."""
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.replace("CACHE", str(tmp_path / "cache")).replace("save_every: 100000", "save_every: 2"))
    run = tmp_path / "run"
    argv = [*AS_FROM_A_SHELL, sys.executable, "-m", "gpucert", "finetune", "--config", str(config)]
    argv += ["--output", str(run)]
    proc = subprocess.Popen(argv, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_a_checkpoint(run, [proc], lambda: "")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=within(END_TIMEOUT_S))
    assert proc.returncode == 130, err[-3000:]
    latest = complete_checkpoints(run)[-1][0]
    assert err.strip().splitlines()[-1] == (
        f"gpucert: the latest complete checkpoint is {run}/checkpoints/step-{latest} (step {latest}): the same "
        "command with --resume auto continues"
    ), err[-3000:]


def test_node_0_alone_stops_within_the_rendezvous_timeout_naming_the_missing_node(tmp_path: Path) -> None:
    """Started exactly as the README says, with no node 1: one line naming node rank 1 and the address."""
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.replace("CACHE", str(tmp_path / "cache")))
    port = free_port()
    argv = [sys.executable, "-m", "gpucert", "finetune", "--config", str(config), *node_flags(0, port)]
    argv += ["--set", "runtime.rendezvous_timeout_s=5"]
    t0 = time.monotonic()
    done = subprocess.run(argv, env=worker_env(), capture_output=True, text=True, timeout=within(120))
    took = time.monotonic() - t0
    assert done.returncode == 3, done.stderr[-3000:]
    assert took < 5 + within(15), f"node 0 waited {took:.0f} s"
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert f"waited 5 s (runtime.rendezvous_timeout_s) at 127.0.0.1:{port} for 2 nodes" in line
    assert "missing node rank(s) 1" in line


def test_a_sigterm_ends_a_run_saying_where_and_releases_its_directory(tmp_path: Path) -> None:
    """SIGTERM (a kill, scancel, a time limit) reaches a lone run mid-step: nothing failed, the operator stopped
    it. It says where it was and what resumes, exits 143 (the shell's code for SIGTERM, as Ctrl-C's is 130, so a
    requeue script does not read it as ERROR), and its output directory is left as a failure leaves it, its lock
    released (runtime/sigterm.py). Before, the default action ended it with no word and the lock file left."""
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.replace("CACHE", str(tmp_path / "cache")))
    run, log = tmp_path / "run", tmp_path / "out.log"
    env = worker_env()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpucert.finetune.train", str(config), "--output-dir", str(run)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_until_training(lambda: log.read_text(errors="replace"), [proc])
    assert (run / ".gpucert.lock").exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=within(END_TIMEOUT_S)) == 143
    said = log.read_text(errors="replace")
    where = r"gpucert: stopped by SIGTERM \(a kill, scancel, a time limit\) during step \d+\n"
    assert re.search(where, said), said[-3000:]
    resumes = r"gpucert: (the latest complete checkpoint is .* --resume auto continues|no complete checkpoint in)"
    assert re.search(resumes, said), said[-3000:]
    assert not (run / ".gpucert.lock").exists()


def test_a_reader_that_leaves_ends_every_rank_at_once_with_the_shells_sigpipe_code(tmp_path: Path) -> None:
    """`gpucert finetune --nproc 2 2>&1 | head`: rank 0's next progress line finds the reader gone. Every rank
    leaves at once and the job exits 141 without a word, as a lone run does; rank 1's log says why. Rank 0's
    BrokenPipeError was taken for a broken peer's socket and waited out a heartbeat timeout, then its traceback
    broke the same pipe: the job ended exit 1, rank 1 waiting out its own timeout."""
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.replace("CACHE", str(tmp_path / "cache")).replace("save_every: 100000", "save_every: 2"))
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "gpucert", "finetune", "--config", str(config), "--output", str(run)]
    argv += ["--nproc", "2", *(a for item in HEARTBEATS for a in ("--set", item))]
    proc = subprocess.Popen(argv, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        deadline = time.monotonic() + within(START_TIMEOUT_S)
        # The reader reads on until training, and leaves; a silent hang fails at the deadline, not never.
        while not (seen and seen[-1].startswith("[finetune] step 3/")):
            ready, _, _ = select.select([proc.stdout], [], [], max(deadline - time.monotonic(), 0))
            line = proc.stdout.readline() if ready else ""
            assert line, f"no training step within {START_TIMEOUT_S} s:\n" + "".join(seen)[-3000:]
            seen.append(line)
        workers = psutil.Process(proc.pid).children(recursive=True)
        proc.stdout.close()
        left = time.monotonic()
        assert proc.wait(timeout=within(END_TIMEOUT_S)) == 141
    finally:
        if proc.poll() is None:
            kill_process_tree(proc.pid)
            proc.wait()
    took = time.monotonic() - left
    # Rank 1 was told at once: less than the heartbeat timeout (6 s) and the wait fail() gave a peer's failure
    # (4 intervals more), which the old path spent before it even recorded the cause.
    assert took < within(6 + 4), took
    assert not [w for w in workers if _alive(w)]
    rank_1 = (run / "logs" / "rank-1.log").read_text()
    said = r"rank 1 \(.*\) stops: rank 0 \(.*\) failed during step \d+: ReaderLeft: the reader"
    assert re.search(said, rank_1), rank_1
    assert complete_checkpoints(run), "what was trained stays, for --resume auto"
    print(f"every rank gone {took:.1f} s after the reader left")


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # gone between the two questions
        return False


def test_two_ranks_that_fail_before_the_first_step_leave_no_run_directory(tmp_path: Path) -> None:
    """A lone run that fails in its start-up removes the directory it made; with --nproc 2 the ranks' logs
    (made before rank 0 claimed it) stayed in a directory of nothing else, and the last line spoke of
    checkpoints as if the run had trained."""
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.replace("CACHE", str(tmp_path / "cache")))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "gpucert", "finetune", "--config", str(config), "--output", str(run)]
    argv += ["--nproc", "2", "--set", f"data.source={empty}"]
    done = subprocess.run(argv, env=worker_env(), capture_output=True, text=True, timeout=within(START_TIMEOUT_S))
    assert done.returncode == 3, done.stderr[-3000:]
    assert "is empty: no rows" in done.stderr
    assert "checkpoint" not in done.stderr.splitlines()[-1]
    assert not run.exists()


def test_rank_0_killed_in_its_start_up_leaves_no_run_directory(tmp_path: Path) -> None:
    """rank 0 SIGKILLed while it prepared the data took nothing back: its lock, its TensorBoard file and rank 1's
    log stayed in the directory made for the run, and the last line spoke of checkpoints."""
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.replace("CACHE", str(tmp_path / "cache")))
    sample = Path(__file__).parents[2] / "src" / "gpucert" / "finetune" / "data" / "assets" / "glaive_sample.jsonl"
    big = tmp_path / "big.jsonl"
    big.write_text(sample.read_text() * 30)  # a preparation of seconds, to be killed in
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "gpucert", "finetune", "--config", str(config), "--output", str(run)]
    argv += ["--nproc", "2", "--set", f"data.source={big}"]
    proc = subprocess.Popen(argv, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + within(START_TIMEOUT_S)
        rank_0 = None
        while rank_0 is None and time.monotonic() < deadline:
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if child.environ().get("RANK") == "0" and list((tmp_path / "cache").glob("*.tmp-*")):
                        rank_0 = child
                except psutil.Error:
                    continue
            time.sleep(0.1)
        assert rank_0 is not None, "rank 0 never began preparing the data"
        rank_0.kill()
        _, err = proc.communicate(timeout=within(60))
    finally:
        kill_process_tree(proc.pid)
    assert proc.returncode == 3, err[-3000:]
    assert "rank 0 on this node ended: killed by SIGKILL" in err
    assert "checkpoint" not in err.splitlines()[-1]
    assert not run.exists(), sorted(p.name for p in run.rglob("*"))
