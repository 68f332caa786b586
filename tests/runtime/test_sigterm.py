"""Rank 0's SIGTERM (runtime/sigterm.py): a launcher stops every rank once one ends; rank 0 must still write what
ran and name who ended. TermWatch in a real process with its main thread blocked in a system call; why_terminated
against a real store and real processes."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tests.conftest import free_port, kill_process_tree, within

from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.group import AbortRecord, Runtime, record_abort
from gpucert.runtime.identity import RankIdentity
from gpucert.runtime.sigterm import process_gone, why_terminated

CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from gpucert.runtime.sigterm import TermWatch

    out = Path(sys.argv[1])
    watch = TermWatch(lambda: out.write_text("written by the watch"), exit_code=7).start()
    print("ready", flush=True)
    read, _ = os.pipe()
    os.read(read, 1)  # blocked in a system call, as in a collective: no data ever comes
    """
)


def test_sigterm_runs_the_callback_on_its_own_thread_while_the_main_one_is_blocked(tmp_path: Path) -> None:
    out = tmp_path / "partial.txt"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7  # the watch's exit code: not -15, the default death
    assert out.read_text() == "written by the watch"


FORKS = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from gpucert.runtime.sigterm import TermWatch

    out = Path(sys.argv[1])
    watch = TermWatch(lambda: out.write_text("the parent's watch fired"), exit_code=7).start()
    ready, started = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(started, b"x")
        time.sleep(15)  # a data worker: SIGTERM must end it, as it would without the parent's watch
        os._exit(0)
    os.read(ready, 1)  # the child runs (a signal before its first instruction would find the parent's fd)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    time.sleep(1)  # time for the parent's watch to (wrongly) read the child's signal
    watch.stop()
    print(os.waitstatus_to_exitcode(status), flush=True)
    """
)


def test_a_forked_child_keeps_the_default_sigterm_and_does_not_trip_the_parents_watch(tmp_path: Path) -> None:
    out = tmp_path / "fired.txt"
    done = subprocess.run([sys.executable, "-c", FORKS, str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(-signal.SIGTERM)
    assert not out.exists()


def test_a_stopped_watch_gives_sigterm_back(tmp_path: Path) -> None:
    child = CHILD.replace('print("ready"', 'watch.stop()\nprint("ready"')
    proc = subprocess.Popen([sys.executable, "-c", child, str(tmp_path / "x")], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert not (tmp_path / "x").exists()


HOLDS = textwrap.dedent(
    """
    import sys, time
    from gpucert.runtime.sigterm import TermWatch

    watch = TermWatch(lambda: time.sleep(1), exit_code=7).start()  # writing the partial report takes a while
    print("ready", flush=True)
    for benchmark in ("memory", "p2p", "collectives"):
        watch.hold_if_stopping()
        print(f"started {benchmark}", flush=True)
        time.sleep(3)  # the signal comes meanwhile, read by the watch within its 0.2 s select
    """
)


def test_once_sigterm_has_come_the_main_thread_starts_no_further_work() -> None:
    """The main thread carried on while the watch wrote the partial report: after SIGTERM in memory, p2p and
    collectives still started. It now waits at the next start for the watch's exit."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDS], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    assert proc.stdout.readline().strip() == "started memory"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7
    assert proc.stdout.read() == ""


def identity(rank: int, node_rank: int, pid: int) -> RankIdentity:
    return RankIdentity(rank, 3, rank, 2, node_rank, 2, f"node-{node_rank}", "host", "cpu", pid=pid)


def runtime(peers: list[RankIdentity], store: dist.Store) -> Runtime:
    cpu = torch.device("cpu")
    return Runtime(me=peers[0], peers=peers, device=cpu, backend="gloo", config=RuntimeConfig(), store=store)


def test_why_names_a_recorded_failure_then_a_local_rank_whose_process_is_gone_then_the_launcher() -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        store = dist.HashStore()
        # Rank 2 is on another node: its pid means nothing here, even one that is gone.
        peers = [identity(0, 0, alive.pid), identity(1, 0, ended.pid), identity(2, 1, ended.pid)]
        rt = runtime(peers, store)
        store.set("phase/1", "bench matmul")
        found = why_terminated(rt, store, 0)
        assert (found.rank, found.phase) == (1, "bench matmul")
        assert f"its process (pid {ended.pid}) ended" in found.message() and found.who.startswith("rank 1 (")
        # Gone, but it said the launcher stopped it too (a cancelled job), or that it had finished: not blamed.
        for key in ("sigterm/1", "closed/1"):
            said = dist.HashStore()
            said.set(key, "1")
            assert why_terminated(runtime(peers, said), said, 0).launcher

        recorded = AbortRecord("rank 2 (node-1, cpu local rank 0)", "ValueError: bad", "bench memory", 2, "node-1")
        record_abort(store, recorded)
        assert why_terminated(rt, store, 0) == recorded  # what a rank said of itself comes first

        rt = runtime([identity(0, 0, alive.pid), identity(1, 0, alive.pid)], dist.HashStore())
        found = why_terminated(rt, rt.store, 0)
        # The launcher's stop names no rank (docs/cluster.md: a cancelled job): rank 0 only noticed it.
        assert found.launcher and found.node is None and "rank 0" not in found.message(), found.message()
        assert found.message().startswith("stopped by SIGTERM from the launcher during start: no rank had ended")
    finally:
        alive.kill()
        alive.wait()


def test_a_lone_rank_is_not_told_to_look_for_the_rank_that_ended_first() -> None:
    """World size 1 (`gpucert finetune` run by hand): the SIGTERM came from a `kill` as likely as from a launcher,
    and there is no other rank to look for."""
    me = RankIdentity(0, 1, 0, 1, 0, 1, "node-0", "host", "cpu", pid=os.getpid())
    found = why_terminated(runtime([me], dist.HashStore()), dist.HashStore(), 0)
    assert "it ran alone, so no other rank ended first" in found.cause and "launcher's output" not in found.cause


def test_a_process_that_ended_is_gone_even_before_it_is_reaped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert not process_gone(proc.pid)
    proc.kill()
    deadline = time.monotonic() + 10
    while not process_gone(proc.pid) and time.monotonic() < deadline:  # a zombie until wait() below
        time.sleep(0.05)
    assert process_gone(proc.pid)
    proc.wait()
    assert process_gone(proc.pid)


def test_a_line_to_a_stderr_nobody_reads_is_dropped_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog's, a deadline's and SIGTERM's threads say a line just before they end the process; with
    `2>&1 | head` gone, print raised BrokenPipeError there and the thread died before its exit."""
    from gpucert.runtime.group import say

    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stderr", Gone())
    assert say("rank 0 stops") is False
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert say("rank 0 stops") is True and sys.stderr.getvalue() == "gpucert: rank 0 stops\n"


@pytest.mark.slow
def test_a_node_agent_started_over_ssh_stops_when_its_stdin_ends(tmp_path: Path) -> None:
    """localize stops a pair job by killing its ssh client; without a pty sshd signals nothing to the remote
    gpucert, which held its GPUs and port until its own timeouts. The remote command's stdin ends then: the agent
    localize starts over ssh (GPUCERT_STDIN_EOF_STOPS=1, its stdin a pipe localize holds) stops on it, at once."""
    port = free_port()
    env = {**os.environ, "GPUCERT_STDIN_EOF_STOPS": "1"}
    argv = [sys.executable, "-m", "gpucert", "accept", "--profile", "cpu", "--nnodes", "2", "--node-rank", "0"]
    argv += ["--master-addr", "127.0.0.1", "--master-port", str(port), "-o", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None and proc.stdin is not None
        for line in proc.stderr:  # then it waits for node rank 1, which never comes (for 120 s)
            if "starting" in line:
                break
        time.sleep(2.0)
        t0 = time.monotonic()
        proc.stdin.close()  # what the death of the ssh client does to the remote command
        # 143: stopped in the rendezvous, by its handler; -15: before it (its ranks not started yet).
        assert proc.wait(timeout=within(30)) in (143, -signal.SIGTERM), proc.stderr.read()
        assert time.monotonic() - t0 < within(10)
    finally:
        kill_process_tree(proc.pid)
