"""Runs of several processes and "nodes" on one CPU machine: gpucert's own node agents and an outside torchrun,
and the faults a cluster has: a node that never comes, a stopped rank, a hung benchmark, Ctrl-C.

Two "nodes" are two gpucert (or torchrun) processes on localhost with node ranks 0 and 1; they share a
hostname, so their labels are `<host>[n0]` and `<host>[n1]`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from tests.conftest import NODE_BUNDLES, free_port, kill_process_tree, within
from tests.report.test_schema_and_store import schema_errors

from gpucert.report.schema import SCHEMA_VERSION

pytestmark = pytest.mark.slow
GPUCERT = [sys.executable, "-m", "gpucert"]


def clean_env(**extra: str) -> dict[str, str]:
    """No launcher variables from whatever runs pytest; one thread per process on the 2-core CI machine. Pass
    TMPDIR=<the test's tmp_path> to find the run's own workers (their spec files live there)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM_")}
    return {**env, "OMP_NUM_THREADS": "1", "COLUMNS": "200", **extra}


def node_flags(rank: int, port: int) -> list[str]:
    return ["--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port)]


def start_two_nodes(argv: list[str], port: int, tmp_path: Path) -> list[subprocess.Popen[str]]:
    """The same gpucert command on node ranks 0 and 1, started together."""
    return [
        subprocess.Popen(
            [*GPUCERT, *argv, *node_flags(rank, port)],
            env=clean_env(TMPDIR=str(tmp_path)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]


def two_nodes(
    argv: list[str], port: int, tmp_path: Path, timeout_s: float = 240
) -> list[subprocess.CompletedProcess[str]]:
    """start_two_nodes, run to the end: both outputs."""
    procs = start_two_nodes(argv, port, tmp_path)
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout_s)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def load(run: Path) -> dict[str, Any]:
    report = json.loads((run / "report.json").read_text())
    assert schema_errors(report) == []
    assert report["schema_version"] == SCHEMA_VERSION
    return report


def worker_processes(tmp_path: Path) -> list[psutil.Process]:
    """This test's ranks still alive: processes with a rank's environment whose command line names a path under
    its TMPDIR (see clean_env)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if not any(str(tmp_path) in arg for arg in cmdline):
            continue
        try:
            if "RANK" in proc.environ():
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_two_agents_as_two_nodes_accept_into_one_cluster_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    head, other = two_nodes(["accept", "--profile", "cpu", "--nproc", "1", "-o", str(out)], free_port(), tmp_path)
    assert head.returncode == 0, head.stderr[-3000:]
    assert other.returncode == 0, other.stderr[-3000:]
    assert "the report is written by node 0" in other.stderr  # a note, not a result: stdout carries results alone
    report = load(out)
    labels = report["meta"]["nodes"]
    host = socket.gethostname()
    assert labels == [f"{host}[n0]", f"{host}[n1]"]
    assert set(report["nodes"]) == set(labels)
    results = report["results"]
    # Health ran on both nodes; every benchmark ran on both nodes' ranks; each names its node.
    assert {r["node"] for r in results if r["name"] == "node.xid"} == set(labels)
    for name in ("matmul.fp32.max", "memory.copy"):
        rows = [r for r in results if r["name"] == name]
        assert sorted(r["subject"] for r in rows) == [f"{label} rank 0 (cpu)" for label in labels]
        assert all(r["subject"].startswith(r["node"]) for r in rows)
    [all_reduce] = [r for r in results if r["name"] == "collective.all_reduce"]
    assert all_reduce["subject"] == "2 nodes x 1 ranks (gloo)" and all_reduce["node"] is None
    assert all_reduce["status"] == "INFO"  # the cpu profile sets no busbw floor
    golden = {r["name"]: r["status"] for r in results if r["name"].startswith("cluster.config.")}
    assert golden["cluster.config.kernel"] == golden["cluster.config.gpucert"] == "PASS"
    assert not [r for r in results if r["status"] in ("FAIL", "ERROR")]
    subjects = [(r["name"], r["subject"]) for r in results if r["node"] is not None]
    assert len(subjects) == len(set(subjects)), "two results of the run collide"


def test_an_outside_torchrun_of_two_nodes_runs_accept_without_hanging(tmp_path: Path) -> None:
    """Two torchrun agents (node ranks 0/1), every rank running `gpucert accept`: one process group for
    the whole run (it used to hang after matmul re-initialising it), rank 0 writes one report."""
    port, out = free_port(), tmp_path / "run"
    procs = []
    for node in (0, 1):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}"]
        argv += ["--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}"]
        argv += ["-m", "gpucert", "accept", "--profile", "cpu", "-o", str(out)]
        procs.append(
            subprocess.Popen(
                argv, env=clean_env(TMPDIR=str(tmp_path)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outputs = [p.communicate(timeout=within(240)) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    report = load(out)
    host = socket.gethostname()
    assert report["meta"]["nodes"] == [f"{host}[n0]", f"{host}[n1]"]
    benchmarks = {r["name"].split(".")[0] for r in report["results"] if r["status"] != "SKIP"}
    assert {"matmul", "memory", "collective", "train"} <= benchmarks
    assert report["status"] == "PASS"


def test_a_node_whose_driver_differs_fails_the_golden_config_naming_it(tmp_path: Path) -> None:
    """Two nodes replaying captured bundles, one with another driver: the diff names the field and both nodes'
    values (two nodes have no majority to say which one is wrong)."""
    import shutil

    bundles = []
    for name, driver in (("gpu-a", None), ("gpu-b", "570.86.15")):
        bundle = tmp_path / name
        shutil.copytree(NODE_BUNDLES / "h200x4", bundle, symlinks=True)
        if driver:
            snapshot = json.loads((bundle / "nvml-snapshot.json").read_text())
            snapshot["system"]["nvmlSystemGetDriverVersion"] = driver
            (bundle / "nvml-snapshot.json").write_text(json.dumps(snapshot))
        bundles.append(bundle)
    out, port = tmp_path / "run", free_port()
    procs = [
        subprocess.Popen(
            [
                *GPUCERT,
                "health",
                "--replay",
                str(bundle),
                "--set",
                "health.expected_gpus=4",
                "-o",
                str(out),
                *node_flags(rank, port),
            ],
            env=clean_env(TMPDIR=str(tmp_path)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, bundle in enumerate(bundles)
    ]
    codes = [(p.wait(timeout=within(120)), p.stderr.read() if p.stderr else "") for p in procs]
    assert [c for c, _ in codes] == [2, 2], codes
    report = load(out)
    assert report["meta"]["nodes"] == ["gpu-a", "gpu-b"]
    [driver] = [r for r in report["results"] if r["name"] == "cluster.config.driver"]
    assert (driver["status"], driver["node"], driver["subject"]) == ("FAIL", None, "cluster")
    assert "570.86.15 on gpu-b" in driver["message"] and "580.159.04 on gpu-a" in driver["message"]
    assert {r["node"] for r in report["results"] if r["name"] == "gpu.ecc_mode"} == {"gpu-a", "gpu-b"}


def test_node_0_alone_stops_within_the_rendezvous_timeout_naming_the_missing_node(tmp_path: Path) -> None:
    port = free_port()
    argv = [*GPUCERT, "accept", "--profile", "cpu", "-o", str(tmp_path / "run"), "--nnodes", "2"]
    argv += ["--master-addr", "127.0.0.1", "--master-port", str(port), "--set", "runtime.rendezvous_timeout_s=5"]
    t0 = time.monotonic()
    head = subprocess.run(
        [*argv, "--node-rank", "0"],
        env=clean_env(TMPDIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=within(60),
    )
    took = time.monotonic() - t0
    assert head.returncode == 3
    assert took < within(20), f"node 0 waited {took:.0f} s"
    assert f"waited 5 s (runtime.rendezvous_timeout_s) at 127.0.0.1:{port} for 2 nodes" in head.stderr
    assert "missing node rank(s) 1" in head.stderr
    assert "Traceback" not in head.stderr
    # Node 0 writes the run's verdict: a prolog or a monitor reading report.json finds this run's ERROR.
    (said,) = json.loads((tmp_path / "run" / "report.json").read_text())["results"]
    assert (said["name"], said["status"]) == ("run.rendezvous", "ERROR")
    assert said["message"].startswith("the nodes never met, so nothing was run or judged: node rank 0 (host ")
    # Node 1 without node 0 says whom it could not reach.
    other = subprocess.run(
        [*argv, "--node-rank", "1"],
        env=clean_env(TMPDIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=within(60),
    )
    assert other.returncode == 3
    assert f"could not reach the job's store at 127.0.0.1:{port} within 5 s" in other.stderr


class TimedLines:
    """A process's stderr, each line with the monotonic time it came, read on a thread as it is written."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        assert proc.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, text: str, timeout_s: float) -> tuple[float, str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [(t, line) for t, line in self.lines if text in line]
            if found:
                return found[0]
            time.sleep(0.1)
        raise AssertionError(f"no line with {text!r} within {timeout_s:g} s; said: {[x for _, x in self.lines]}")

    def text(self) -> str:
        self._reader.join(timeout=10)
        return "\n".join(line for _, line in self.lines)


def test_node_1_alone_says_what_it_waits_for_and_stops_at_the_limit(tmp_path: Path) -> None:
    """Node 0 never comes: node 1 says after 10 s whom it waits for, and stops at the limit, by its own clock
    (TCPStore's connect timeout took 1.5-2.5x the limit, silently)."""
    port = free_port()
    argv = [*GPUCERT, "health", "-o", str(tmp_path / "run"), *node_flags(1, port)]
    argv += ["--set", "runtime.rendezvous_timeout_s=12"]
    proc = subprocess.Popen(
        argv, env=clean_env(TMPDIR=str(tmp_path)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    said = TimedLines(proc)
    try:
        waiting_at, waiting = said.wait_for("waiting for the job's store", within(60))
        proc.wait(timeout=within(30))
    finally:
        kill_process_tree(proc.pid)
    host = socket.gethostname()
    assert waiting == (
        f"gpucert: node rank 1 (host {host}): waiting for the job's store at 127.0.0.1:{port} (served by node rank "
        "0's gpucert): connection refused; waited 10 s, gives up after 12 s (runtime.rendezvous_timeout_s)"
    )
    stopped_at, stopped = said.wait_for("could not reach the job's store", 10)
    assert proc.returncode == 3
    assert f"at 127.0.0.1:{port} within 12 s (runtime.rendezvous_timeout_s): connection refused" in stopped
    # Said at 10 s of the wait, stopped at 12 s: 2 s apart, give or take a retry (0.5 s) and the line's way out.
    assert 1.5 < stopped_at - waiting_at < 2 + within(1.5), f"{stopped_at - waiting_at:.1f} s from 10 s to the end"
    assert "Traceback" not in said.text()


def test_node_1_started_first_joins_node_0_when_it_comes(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(TMPDIR=str(tmp_path))
    out = tmp_path / "run"
    late = subprocess.Popen(
        [*GPUCERT, "health", "-o", str(out), *node_flags(1, port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said = TimedLines(late)
    try:
        said.wait_for("waiting for the job's store", within(60))  # node 1 is in its wait: node 0 is late
        head = subprocess.run(
            [*GPUCERT, "health", "-o", str(out), *node_flags(0, port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=within(120),
        )
        late.wait(timeout=within(60))
    finally:
        kill_process_tree(late.pid)
    assert head.returncode == 0, head.stderr[-3000:]
    assert late.returncode == 0, said.text()[-3000:]
    said.wait_for("the report is written by node 0", within(10))  # a note: stderr, with the progress
    assert {r["node"] for r in load(out)["results"] if r["name"] == "node.xid"} == {
        f"{socket.gethostname()}[n0]",
        f"{socket.gethostname()}[n1]",
    }


def test_a_hung_benchmark_times_out_as_error_and_leaves_no_worker(tmp_path: Path) -> None:
    """The matmul warm-up outlasts bench.timeout_s: ERROR naming the timeout, every worker gone."""
    out = tmp_path / "run"
    argv = [*GPUCERT, "bench", "matmul", "--profile", "cpu", "--nproc", "2", "-o", str(out)]
    # 15 s: both ranks past start-up (import, rendezvous) on a loaded 2-core machine, so the phases say matmul.
    argv += ["--set", "bench.timeout_s=15", "--set", "bench.matmul.warmup_s=120"]
    done = subprocess.run(
        argv, env=clean_env(TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=within(120)
    )
    assert done.returncode == 3, done.stderr[-2000:]
    [error] = load(out)["results"]
    assert error["name"] == "bench.matmul" and error["status"] == "ERROR"
    assert "no result within 15 s" in error["message"] and "bench matmul" in error["message"]
    assert worker_processes(tmp_path) == []


def _worker_of_rank(parent: psutil.Process, rank: int, timeout_s: float, command: str = "gpucert") -> psutil.Process:
    """The process of `rank` among `parent`'s descendants whose command line has `command`, once it started."""
    deadline = time.monotonic() + within(timeout_s)
    while time.monotonic() < deadline:
        for child in parent.children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank) and command in child.cmdline():
                    return child
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no process of rank {rank} ({command}) appeared within {timeout_s} s")


def wait_until_joined(tmp_path: Path, rank: int, timeout_s: float = 90) -> None:
    """Until rank `rank` has joined its job (its log, <output>/logs/rank-<rank>.log, says so): past the
    rendezvous, its heartbeats and watchdog running. Then one heartbeat interval more has them flowing."""
    deadline = time.monotonic() + within(timeout_s)
    while time.monotonic() < deadline:
        for log in tmp_path.rglob(f"rank-{rank}.log"):
            if "joined the job" in log.read_text(errors="replace"):
                return
        time.sleep(0.2)
    raise AssertionError(f"no worker of rank {rank} joined its job within {timeout_s:g} s")


def test_a_stopped_rank_is_named_by_the_watchdog(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = [*GPUCERT, "bench", "matmul", "--profile", "cpu", "--nproc", "2", "-o", str(out)]
    argv += ["--set", "bench.matmul.warmup_s=120", "--set", "runtime.heartbeat_interval_s=0.5"]
    argv += ["--set", "runtime.heartbeat_timeout_s=3"]
    proc = subprocess.Popen(
        argv, env=clean_env(TMPDIR=str(tmp_path)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    worker = _worker_of_rank(psutil.Process(proc.pid), 1, 60)
    wait_until_joined(tmp_path, 1)
    time.sleep(1)
    worker.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    proc.communicate(timeout=within(60))
    assert time.monotonic() - stopped < within(20)
    assert proc.returncode == 3
    [error] = load(out)["results"]
    assert error["status"] == "ERROR"
    assert "rank 1 (" in error["message"] and "no heartbeat" in error["message"], error["message"]
    assert worker_processes(tmp_path) == []


# Run as a shell runs a foreground command: SIGINT delivered and at its default action, then exec'd into `argv`
# (same process, so Ctrl-C reaches gpucert itself). Both the ignored and the blocked state of a signal are
# inherited. In three full `make test` runs in a row (2026-11-28; alone it passed 45 times) gpucert ignored Ctrl-C,
# ran its benchmark to the end and exited 0, as a command started with nohup or in a script's background rightly
# does; starting pytest with SIGINT ignored reproduces that exactly. What left it so in the pytest worker was not
# found: a probe of the worker's SIGINT state before and after each test saw no change over 80 % of a run.
AS_FROM_A_SHELL = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
]


@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [
        (signal.SIGINT, 130, "interrupted by Ctrl-C (SIGINT to gpucert, pid {pid} on {host})"),
        (signal.SIGTERM, 143, "stopped by SIGTERM sent to gpucert (pid {pid} on {host}; a kill, or scancel)"),
    ],
    ids=["ctrl-c", "sigterm"],
)
def test_the_operators_stop_is_one_line_and_recorded_as_such(
    tmp_path: Path, sig: signal.Signals, code: int, said: str
) -> None:
    """Ctrl-C, or SIGTERM to gpucert itself (scancel): every worker stopped, exit 128 + the signal, one line naming
    the signal and where the run was, with the partial report, which says the same. It was recorded as rank 0
    failing ("look for the rank that ended first"), in three lines, with torch's "Received 15 death signal"."""
    out = tmp_path / "run"
    argv = [*AS_FROM_A_SHELL, *GPUCERT, "accept", "--profile", "cpu", "--nproc", "2", "-o", str(out)]
    argv += ["--set", "bench.matmul.warmup_s=120"]
    # PYTHONFAULTHANDLER: a SIGABRT makes it print every thread's stack (below, if the signal did not stop it).
    env = clean_env(TMPDIR=str(tmp_path), PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until_joined(tmp_path, 1)
    time.sleep(1)  # rank 0 is in matmul's warm-up
    proc.send_signal(sig)
    sent = time.monotonic()
    # If the signal does not stop it, the failure says how the run ended, or what its threads were doing.
    try:
        _, err = proc.communicate(timeout=within(60))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=30)
        for worker in worker_processes(tmp_path):  # left without their agent
            worker.kill()
        threads = err[-8000:]
        raise AssertionError(f"still running {within(60):.0f} s after {sig.name}; its threads:\n{threads}") from None
    took = time.monotonic() - sent
    assert proc.returncode == code, f"exit {proc.returncode} {took:.1f} s after {sig.name}\nstderr: {err[-3000:]}"
    cause = said.format(pid=proc.pid, host=socket.gethostname())
    # Progress ("starting 2 ranks on ...", "running benchmark matmul...") shares stderr: the stop is one line among
    # the gpucert: lines.
    said = [line for line in err.splitlines() if not line.startswith(("starting ", "running benchmark "))]
    assert said == [f"gpucert: {cause} during bench matmul; partial report written to {out}/report.json"], err
    (aborted,) = [r for r in load(out)["results"] if r["status"] == "ERROR"]
    assert aborted["name"] == "run.aborted", aborted
    assert aborted["message"].startswith(f"the run stopped: {cause}") and "during bench matmul" in aborted["message"]
    assert worker_processes(tmp_path) == []


def test_collectives_run_across_the_nodes_and_within_each(tmp_path: Path) -> None:
    """Also: --metrics-file is written once, by node 0's process from the report its rank 0 wrote (every rank
    probed the path again and rank 0 wrote it, so a failed write was said three times)."""
    out, prom = tmp_path / "run", tmp_path / "gpucert.prom"
    argv = ["bench", "collectives", "--profile", "cpu", "--nproc", "2", "-o", str(out), "--metrics-file", str(prom)]
    argv += ["--set", "bench.collectives.ops=[all_reduce]"]
    head, other = two_nodes(argv, free_port(), tmp_path)
    assert (head.returncode, other.returncode) == (0, 0), head.stderr[-2000:] + other.stderr[-2000:]
    assert "gpucert_run_status{" in prom.read_text() and 'verb="bench collectives"' in prom.read_text()
    host = socket.gethostname()
    results = load(out)["results"]
    found = {(r["name"], r["subject"], r["node"], r["status"]) for r in results if r["name"].startswith("collect")}
    assert found == {
        ("collective.all_reduce", "2 nodes x 2 ranks (gloo)", None, "INFO"),
        ("collective.intra_node.all_reduce", f"{host}[n0] 2 ranks (gloo)", f"{host}[n0]", "INFO"),
        ("collective.intra_node.all_reduce", f"{host}[n1] 2 ranks (gloo)", f"{host}[n1]", "INFO"),
    }


def test_a_node_lost_mid_run_is_named_in_the_report_and_nothing_is_left(tmp_path: Path) -> None:
    """Node 1's gpucert is SIGKILLed during matmul: its workers die with it, node 0's watchdog names the silent
    rank, the next step's barrier names the lost node, and node 0 still writes what ran."""
    out, port = tmp_path / "run", free_port()
    argv = ["accept", "--profile", "cpu", "--nproc", "1", "-o", str(out), "--set", "bench.matmul.warmup_s=60"]
    argv += ["--set", "runtime.heartbeat_interval_s=0.5", "--set", "runtime.heartbeat_timeout_s=3"]
    argv += ["--set", "runtime.rendezvous_timeout_s=8"]
    procs = start_two_nodes(argv, port, tmp_path)
    _worker_of_rank(psutil.Process(procs[1].pid), 1, 90)
    wait_until_joined(tmp_path, 1)
    time.sleep(1)
    procs[1].kill()
    killed = time.monotonic()
    procs[0].communicate(timeout=within(90))
    procs[1].communicate(timeout=within(10))
    assert time.monotonic() - killed < within(45)
    assert procs[0].returncode == 3
    results = {r["name"]: r for r in load(out)["results"]}
    host = socket.gethostname()
    assert results["bench.matmul"]["status"] == "ERROR"
    assert "rank 1 (" in results["bench.matmul"]["message"], results["bench.matmul"]["message"]
    assert f"{host}[n1] (node rank 1)" in results["run.aborted"]["message"]
    assert "node.xid" in results  # what ran before is still there
    assert worker_processes(tmp_path) == []


def accept_rank(agent: subprocess.Popen[Any], rank: int) -> psutil.Process:
    """The `gpucert accept` process of `rank` among a torchrun agent's children, once it has started."""
    return _worker_of_rank(psutil.Process(agent.pid), rank, 90, "accept")


def one_torchrun_in_matmul(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`gpucert accept` under one torchrun of two ranks (one node), once both ranks are in the matmul warm-up:
    the agent, and the file its output and its ranks' go to."""
    out, log = tmp_path / "run", tmp_path / "torchrun.log"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    argv += ["-m", "gpucert", "accept", "--profile", "cpu", "-o", str(out), "--set", "bench.matmul.warmup_s=60"]
    with log.open("wb") as sink:
        agent = subprocess.Popen(argv, env=clean_env(TMPDIR=str(tmp_path)), stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    # Rank 0 says so after the barrier that opens the benchmark: both ranks are past the node checks.
    while "running benchmark matmul" not in log.read_text(errors="replace"):
        assert agent.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)
    time.sleep(1)
    return agent, log


def test_under_one_torchrun_of_two_ranks_a_killed_rank_is_named_in_rank_0s_partial_report(tmp_path: Path) -> None:
    """One node, two ranks: once rank 1 is SIGKILLed, torchrun SIGTERMs rank 0 within a fraction of a second,
    before its watchdog could read anything. Rank 0 still writes what ran, naming rank 1 (runtime/sigterm.py)."""
    agent, log = one_torchrun_in_matmul(tmp_path)
    victim = accept_rank(agent, 1)
    victim.kill()
    agent.wait(timeout=within(90))
    out, said = tmp_path / "run", log.read_text(errors="replace")
    assert agent.returncode != 0
    assert "rank 0 (" in said and "stops (SIGTERM): rank 1 (" in said, said[-3000:]
    report = load(out)
    (aborted,) = [r for r in report["results"] if r["name"] == "run.aborted"]
    assert aborted["status"] == "ERROR" and "rank 1 (" in aborted["message"], aborted["message"]
    assert f"pid {victim.pid}) ended without a word" in aborted["message"]
    assert any(r["name"] == "node.xid" for r in report["results"])  # what ran before is there


def test_under_one_torchrun_a_cancelled_job_blames_its_launcher_not_a_rank(tmp_path: Path) -> None:
    """SIGTERM to torchrun itself (scancel, a time limit): it SIGTERMs both ranks. Rank 1, stopped too, says
    so in the store before it goes, so rank 0's partial report names the launcher, not rank 1."""
    agent, log = one_torchrun_in_matmul(tmp_path)
    agent.send_signal(signal.SIGTERM)
    agent.wait(timeout=within(90))
    said = log.read_text(errors="replace")
    assert agent.returncode != 0
    (aborted,) = [r for r in load(tmp_path / "run")["results"] if r["name"] == "run.aborted"]
    assert aborted["message"].startswith("the run stopped: stopped by SIGTERM from the launcher during "), (
        aborted["message"],
        said[-3000:],
    )
    # Naming no rank (docs/cluster.md): rank 0 only noticed the stop; it read "rank 0 (...) failed during ...".
    assert "failed" not in aborted["message"] and "rank 0 (" not in aborted["message"], aborted
    assert aborted["subject"] == "run", aborted
    assert "ended without a word" not in said


def test_under_an_outside_torchrun_a_dead_rank_is_named_in_a_partial_report(tmp_path: Path) -> None:
    """Every rank runs `gpucert accept` in one process group; rank 1 is SIGKILLed during matmul. Rank 0's
    watchdog names it, writes what ran (health of both nodes) with the cause, and every node exits."""
    port, out = free_port(), tmp_path / "run"
    procs, logs = [], [tmp_path / "node0.log", tmp_path / "node1.log"]
    for node in (0, 1):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}"]
        argv += ["--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}"]
        argv += ["-m", "gpucert", "accept", "--profile", "cpu", "-o", str(out), "--set", "bench.matmul.warmup_s=60"]
        argv += ["--set", "runtime.heartbeat_interval_s=0.5", "--set", "runtime.heartbeat_timeout_s=3"]
        with logs[node].open("wb") as sink:
            procs.append(
                subprocess.Popen(argv, env=clean_env(TMPDIR=str(tmp_path)), stdout=sink, stderr=subprocess.STDOUT)
            )
    victim = accept_rank(procs[1], 1)
    # Rank 0 says so after the barrier that opens the benchmark: both nodes are past their node checks.
    deadline = time.monotonic() + within(90)
    while "running benchmark matmul" not in logs[0].read_text(errors="replace"):
        assert procs[0].poll() is None and time.monotonic() < deadline, logs[0].read_text(errors="replace")[-3000:]
        time.sleep(0.2)
    time.sleep(1)
    victim.kill()
    killed = time.monotonic()
    for proc in procs:
        proc.wait(timeout=within(90))
    assert time.monotonic() - killed < within(30)
    assert procs[0].returncode != 0 and procs[1].returncode != 0
    said = logs[0].read_text(errors="replace")
    assert "rank 1 (" in said and "no heartbeat" in said, said[-2000:]
    report = load(out)
    results = {r["name"]: r for r in report["results"]}
    assert results["run.aborted"]["status"] == "ERROR" and "rank 1 (" in results["run.aborted"]["message"]
    host = socket.gethostname()
    assert {r["node"] for r in report["results"] if r["name"] == "node.xid"} == {f"{host}[n0]", f"{host}[n1]"}


def test_a_stopped_store_server_ends_every_rank_naming_the_store(tmp_path: Path) -> None:
    """Node 0's torchrun agent serves the job's store; SIGSTOPped, it answers nothing and a store call would
    wait for good. Node 1's rank ends within the heartbeat timeout, saying the store stopped answering."""
    port = free_port()
    procs = []
    for node in (0, 1):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}"]
        argv += ["--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}"]
        argv += ["-m", "gpucert", "bench", "matmul", "--profile", "cpu", "-o", str(tmp_path / "run")]
        argv += ["--set", "bench.matmul.warmup_s=60", "--set", "runtime.heartbeat_interval_s=0.5"]
        argv += ["--set", "runtime.heartbeat_timeout_s=3"]
        env = clean_env(TMPDIR=str(tmp_path))
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        _worker_of_any_rank(psutil.Process(procs[1].pid), 60)
        time.sleep(6)  # past the rendezvous: heartbeats flow
        procs[0].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        _, err = procs[1].communicate(timeout=within(60))
        assert time.monotonic() - stopped < within(20)
        assert procs[1].returncode != 0
        assert f"the job's store at 127.0.0.1:{port} has not answered" in err, err[-2000:]
    finally:
        procs[0].send_signal(signal.SIGCONT)
        kill_process_tree(procs[0].pid)
        procs[0].communicate(timeout=within(30))


def _worker_of_any_rank(parent: psutil.Process, timeout_s: float) -> psutil.Process:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = parent.children(recursive=True)
        if children:
            return children[0]
        time.sleep(0.2)
    raise AssertionError(f"no worker appeared within {timeout_s} s")


def test_a_stopped_worker_on_node_1_is_named_and_both_nodes_go_on(tmp_path: Path) -> None:
    """Rank 1 (node 1's only worker) is SIGSTOPped in matmul: rank 0's watchdog names it, node 1's agent reads
    the abort and stops its worker at once, and the run goes on to the next benchmark on both nodes."""
    out, port = tmp_path / "run", free_port()
    argv = ["accept", "--profile", "cpu", "--nproc", "1", "-o", str(out), "--skip", "p2p,collectives,train"]
    argv += ["--set", "bench.matmul.warmup_s=60", "--set", "runtime.heartbeat_interval_s=0.5"]
    argv += ["--set", "runtime.heartbeat_timeout_s=3"]
    procs = start_two_nodes(argv, port, tmp_path)
    victim = _worker_of_rank(psutil.Process(procs[1].pid), 1, 90)
    wait_until_joined(tmp_path, 1)
    time.sleep(1)
    victim.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    for proc in procs:
        proc.communicate(timeout=within(90))
    assert time.monotonic() - stopped < within(40)
    assert [p.returncode for p in procs] == [3, 3]
    results = {r["name"]: r for r in load(out)["results"]}
    assert "rank 1 (" in results["bench.matmul"]["message"] and "no heartbeat" in results["bench.matmul"]["message"]
    assert {r["node"] for r in load(out)["results"] if r["name"] == "memory.copy"} == {
        f"{socket.gethostname()}[n0]",
        f"{socket.gethostname()}[n1]",
    }
    assert worker_processes(tmp_path) == []


def test_a_killed_rank_beside_rank_0_is_said_once_and_the_run_goes_on(tmp_path: Path) -> None:
    """One node, gpucert's own launcher, two ranks: rank 1 SIGKILLed in matmul. The launcher stops rank 0, which
    says the cause once, with what happens next (a new round of workers), not again as its own stop; the next
    benchmark runs."""
    out = tmp_path / "run"
    argv = [*GPUCERT, "accept", "--profile", "cpu", "--nproc", "2", "-o", str(out), "--skip", "p2p,collectives,train"]
    argv += ["--set", "bench.matmul.warmup_s=60"]
    proc = subprocess.Popen(argv, env=clean_env(TMPDIR=str(tmp_path)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    victim = _worker_of_rank(psutil.Process(proc.pid), 1, 90)
    wait_until_joined(tmp_path, 1)
    time.sleep(1)
    victim.kill()
    _, err = proc.communicate(timeout=within(120))
    assert proc.returncode == 3, err[-3000:]
    cause = f"pid {victim.pid}) ended without a word"
    assert err.count(cause) == 1, err[-3000:]
    assert "bench.matmul failed; the next round of workers goes on: rank 1 (" in err, err[-3000:]
    results = load(out)["results"]
    assert any(r["name"] == "memory.copy" for r in results)
    assert worker_processes(tmp_path) == []
