"""The Slurm test harness itself: the pure parts on captured text, then jobs on the real two-node cluster
(`slurm_cluster`, marked slow: the first one pays the cluster's start)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster import slurm
from tests.cluster.slurm import (
    SlurmCluster,
    exit_code,
    node_states,
    output_of,
    parse_job_record,
    real_memory_mb,
    render_slurm_conf,
    submit,
    wait_job,
)

# `scontrol show job -o 1` from Slurm 22.05.8 (Debian 12) on this harness's cluster: a 2-node job whose
# `srun --kill-on-bad-exit=1` step failed (143 = the surviving task's SIGTERM, not the failing task's 3).
FAILED_JOB = (
    "JobId=1 JobName=sbatch UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) "
    "QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=143:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-22T17:21:38 "
    "EligibleTime=2026-11-22T17:21:38 AccrueTime=2026-11-22T17:21:38 StartTime=2026-11-22T17:21:40 "
    "EndTime=2026-11-22T17:21:40 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-22T17:21:40 "
    "Scheduler=Main Partition=debug AllocNode:Sid=localhost:23295 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=node[1-2] BatchHost=node1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=2,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 "
    "MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) "
    "Network=(null) Command=(null) WorkDir=/tmp/slurmcap-okn0tmuv/w StdErr=/tmp/slurmcap-okn0tmuv/w/slurm-1.out "
    "StdIn=/dev/null StdOut=/tmp/slurmcap-okn0tmuv/w/slurm-1.out Power= "
)


def test_parse_job_record_reads_state_exit_code_and_nodes() -> None:
    job = parse_job_record(FAILED_JOB)
    assert (job["JobState"], job["ExitCode"], job["NodeList"]) == ("FAILED", "143:0", "node[1-2]")
    assert exit_code(job) == (143, 0)
    assert job["StdOut"] == "/tmp/slurmcap-okn0tmuv/w/slurm-1.out"
    assert job["AllocNode:Sid"] == "localhost:23295"
    assert job["TRES"] == "cpu=2,node=2,billing=2"
    assert job["Power"] == ""


def test_parse_job_record_keeps_a_value_with_spaces() -> None:
    job = parse_job_record("JobId=7 WorkDir=/tmp/my jobs StdOut=/tmp/my jobs/slurm-7.out Power=")
    assert job == {"JobId": "7", "WorkDir": "/tmp/my jobs", "StdOut": "/tmp/my jobs/slurm-7.out", "Power": ""}


def test_slurm_conf_keeps_every_file_under_root_and_gives_each_node_its_port() -> None:
    text = render_slurm_conf(
        Path("/r"), hostname="h", ctld_port=20001, node_ports=[20002, 20003], cpus=2, real_memory_mb=1000
    )
    lines = text.splitlines()
    assert "SlurmctldHost=h(127.0.0.1)" in lines
    assert "NodeName=node1 NodeHostname=h NodeAddr=127.0.0.1 Port=20002 CPUs=2 RealMemory=1000 State=UNKNOWN" in lines
    assert "NodeName=node2 NodeHostname=h NodeAddr=127.0.0.1 Port=20003 CPUs=2 RealMemory=1000 State=UNKNOWN" in lines
    paths = [v for k, _, v in (line.partition("=") for line in lines) if k.endswith(("File", "Location", "Dir"))]
    assert paths and all(p.startswith("/r/") for p in paths), paths


def test_real_memory_leaves_a_quarter_of_the_host() -> None:
    assert real_memory_mb("MemTotal:       24684092 kB\nMemFree: 1 kB\n") == 18078


def test_the_cluster_is_skipped_only_without_root_or_without_a_way_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(slurm.os, "geteuid", lambda: 1000)
    assert "needs root" in (slurm.reason_cannot_install() or "")
    monkeypatch.setattr(slurm.os, "geteuid", lambda: 0)
    monkeypatch.setattr(slurm, "missing_binaries", lambda: ["slurmd"])
    monkeypatch.setattr(slurm.shutil, "which", lambda name, path=None: None)
    assert "apt-get is unavailable" in (slurm.reason_cannot_install() or "")
    monkeypatch.setattr(slurm.shutil, "which", lambda name, path=None: f"/usr/bin/{name}")
    assert slurm.reason_cannot_install() is None


def test_each_cluster_adds_and_removes_only_its_own_hosts_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost")  # no final newline
    monkeypatch.setattr(slurm, "ETC_HOSTS", hosts)
    slurm.add_hosts_line(Path("/a"))
    slurm.add_hosts_line(Path("/b"))
    slurm.remove_hosts_line(Path("/a"))
    assert hosts.read_text() == f"127.0.0.1 localhost\n{slurm.hosts_line(Path('/b'))}\n"
    assert slurm.hosts_line(Path("/b")).startswith("127.0.0.1 node1 node2 ")


# -- on the real cluster ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sinfo_shows_both_nodes_idle(slurm_cluster: SlurmCluster) -> None:
    assert node_states(slurm_cluster.env) == {"node1": "idle", "node2": "idle"}


@pytest.mark.slow
def test_two_node_job_runs_one_task_per_node(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = "#!/bin/bash\nset -euo pipefail\nsrun --ntasks-per-node=1 bash -c 'echo $SLURM_NODEID $SLURMD_NODENAME'\n"
    job = wait_job(submit(script, slurm_cluster.env, args=["-N", "2"], workdir=tmp_path), slurm_cluster.env, 60)
    assert job["JobState"] == "COMPLETED", output_of(job)
    assert job["NodeList"] == "node[1-2]"
    # The two tasks write to one file in whichever order they finish.
    assert sorted(output_of(job).splitlines()) == ["0 node1", "1 node2"]


@pytest.mark.slow
def test_a_failing_task_fails_the_job_quickly(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    # Task 1 fails; task 0 would sleep for 5 min unless srun kills it.
    script = (
        "#!/bin/bash\nset -euo pipefail\n"
        "srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c '[ $SLURM_NODEID = 1 ] && exit 3; sleep 300'\n"
        "echo not reached\n"
    )
    t0 = time.monotonic()
    job = wait_job(submit(script, slurm_cluster.env, args=["-N", "2"], workdir=tmp_path), slurm_cluster.env, 60)
    assert time.monotonic() - t0 < 60
    assert job["JobState"] == "FAILED", output_of(job)
    assert exit_code(job)[0] != 0
    assert "not reached" not in output_of(job)


# Each task prints its SLURM_* variables as JSON; task 0 listens on an ephemeral port on 127.0.0.1 and
# publishes it in a file of the shared working directory; task 1 connects to it by the name of task 0's node
# (the first of SLURM_JOB_NODELIST, as a launcher would take MASTER_ADDR) and sends its own node name.
TASK = """
import json, os, socket, sys, time
env = {k: v for k, v in os.environ.items() if k.startswith("SLURM")}
port_file = "port"
if env["SLURM_PROCID"] == "0":
    server = socket.create_server(("127.0.0.1", 0))
    open(port_file + ".tmp", "w").write(str(server.getsockname()[1]))
    os.rename(port_file + ".tmp", port_file)
    server.settimeout(30)
    conn, _ = server.accept()
    env["heard"] = conn.recv(100).decode()
else:
    deadline = time.monotonic() + 30
    while not os.path.exists(port_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    env["node1_addr"] = socket.gethostbyname("node1")
    with socket.create_connection(("node1", int(open(port_file).read())), timeout=30) as conn:
        conn.sendall(os.environ["SLURMD_NODENAME"].encode())
env["python"] = sys.executable
print(json.dumps(env), flush=True)
"""


@pytest.mark.slow
def test_python_tasks_see_their_node_and_reach_each_other_on_localhost(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "task.py").write_text(TASK)
    # One file per task: srun forwards task output in ~1 KB pieces, so two tasks' long lines interleave.
    script = "#!/bin/bash\nset -euo pipefail\nsrun --ntasks-per-node=1 --output=task-%t.json python3 task.py\n"
    job = wait_job(submit(script, slurm_cluster.env, args=["-N", "2"], workdir=tmp_path), slurm_cluster.env, 60)
    assert job["JobState"] == "COMPLETED", output_of(job)
    tasks = {str(i): json.loads((tmp_path / f"task-{i}.json").read_text()) for i in range(2)}
    assert (tasks["1"]["SLURMD_NODENAME"], tasks["1"]["SLURM_NODEID"]) == ("node2", "1")
    assert (tasks["0"]["SLURMD_NODENAME"], tasks["0"]["SLURM_NODEID"]) == ("node1", "0")
    assert tasks["0"]["heard"] == "node2"
    assert tasks["1"]["node1_addr"] == "127.0.0.1"
    # The job got the fixture's PATH: `python3` is this test run's interpreter.
    assert Path(tasks["1"]["python"]).parent == Path(slurm_cluster.env["PATH"].split(":")[0])


@pytest.mark.slow
def test_an_impossible_request_is_refused_at_submit(slurm_cluster: SlurmCluster) -> None:
    with pytest.raises(RuntimeError, match="Node count specification invalid"):
        submit("#!/bin/bash\ntrue\n", slurm_cluster.env, args=["-N", "3"])
    with pytest.raises(RuntimeError, match="Invalid partition name specified"):
        submit("#!/bin/bash\ntrue\n", slurm_cluster.env, args=["-p", "gpu"])
    done = subprocess.run(["sinfo", "-h", "-o", "%P %a"], env=slurm_cluster.env, capture_output=True, text=True)
    assert done.stdout.split() == ["debug*", "up"]


@pytest.mark.slow
def test_health_as_health_check_program_drains_a_failing_node_and_resumes_it(slurm_cluster, tmp_path) -> None:
    """`gpucert health --drain` on node2: a failing check (one GPU expected on this CPU machine) drains it with
    the check as reason; passing again resumes it. A drain someone else set is left alone."""
    import subprocess
    import sys

    def health(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "gpucert", "health", "--profile", "cpu", "--drain", "--slurm-node", "node2"]
        argv += ["--json", "-o", str(tmp_path / f"run{len(extra)}"), *extra]
        return subprocess.run(argv, env=slurm_cluster.env, capture_output=True, text=True, timeout=120)

    def node2() -> dict[str, str]:
        out = subprocess.run(["scontrol", "show", "node", "node2", "-o"], env=slurm_cluster.env, capture_output=True,
                             text=True, timeout=30, check=True).stdout  # fmt: skip
        state = out.split("State=")[1].split()[0]
        return {"state": state, "reason": out.split(" Reason=")[1].strip() if " Reason=" in out else ""}

    try:
        failed = health("--set", "health.expected_gpus=1")
        assert failed.returncode == 2, failed.stderr
        assert "drained node2: gpucert: gpu.count" in failed.stderr
        seen = node2()
        assert "DRAIN" in seen["state"] and seen["reason"].startswith("gpucert: gpu.count"), seen
        assert "expected 1" in seen["reason"], seen
        passed = health()
        assert passed.returncode == 0, passed.stderr
        assert "resumed node2" in passed.stderr and "DRAIN" not in node2()["state"]
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=cable swap"],
                       env=slurm_cluster.env, check=True, timeout=30)  # fmt: skip
        kept = health()
        assert kept.returncode == 0 and "drained by someone else: cable swap" in kept.stderr, kept.stderr
        assert "DRAIN" in node2()["state"]
    finally:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=RESUME"], env=slurm_cluster.env, timeout=30)
