"""A real two-node Slurm cluster on one machine, for tests: Debian's slurm packages, munge, one slurmctld and
two slurmd daemons (`node1`, `node2`) that share this host (Debian builds Slurm with multiple-slurmd support).

All state, spool, pid and log files live under one folder; clients and daemons find the config through
`SLURM_CONF`, so the host's /etc/slurm is never read or written. Outside that folder the cluster touches
only munged (started if not running, stopped after if it started it) and one tagged line of /etc/hosts
(`127.0.0.1 node1 node2`, removed after).

Use from tests (the `slurm_cluster` fixture in conftest.py does the start and stop):

    job_id = submit("#!/bin/bash\\nsrun hostname\\n", cluster.env, args=["-N", "2"])
    job = wait_job(job_id, cluster.env, timeout_s=60)
    assert job["JobState"] == "COMPLETED", output_of(job)
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpucert.launch.slurm import FINAL_STATES

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
# The binaries that say the packages above are installed.
BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "munged", "munge", "unmunge")
NODES = ("node1", "node2")
PARTITION = "debug"
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN_DIR = Path("/run/munge")
MUNGE_PID_FILE = MUNGE_RUN_DIR / "munged.pid"
ETC_HOSTS = Path("/etc/hosts")
# Job states after which a job never runs again: the ones gpucert launch follows a job to.
FINISHED_STATES = FINAL_STATES
# Below Linux's default ephemeral range (32768-60999), so an outgoing connection cannot take a port between
# the moment it is picked and the moment a daemon binds it; above 30000, so no daemon takes the port a gpucert
# job's store serves on under Slurm (20000 + the job id mod 10000: runtime/launch_env.slurm_port).
PORT_RANGE = (30000, 32000)
# Job ids start at a random point (FirstJobId), so the stores of two clusters on one host (another test session
# beside this one) do not both ask for port 20001 with their first job.
FIRST_JOB_IDS = (1, 9000)


class SlurmSetupError(RuntimeError):
    """The cluster could not be installed or started; the message carries the logs that say why."""


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class SlurmCluster:
    """A running cluster. `env` is what every subprocess that talks to it (sbatch, srun, gpucert) must get."""

    root: Path
    conf: Path
    env: dict[str, str]
    nodes: tuple[str, ...] = NODES
    partition: str = PARTITION
    daemons: list[Daemon] = field(default_factory=list)
    started_munged: bool = False
    start_s: float = 0.0

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(_tail(d.log, lines, d.name) for d in self.daemons)


# -- install and munge ---------------------------------------------------------------------------------------


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if _which(b) is None]


def reason_cannot_install() -> str | None:
    """Why this machine cannot run the cluster (a skip reason), or None when it can."""
    if os.geteuid() != 0:
        return "a real Slurm cluster needs root (slurmd runs jobs as their user; munged and apt need root)"
    if missing_binaries() and shutil.which("apt-get") is None:
        return f"Slurm is not installed ({', '.join(missing_binaries())} missing) and apt-get is unavailable"
    return None


def install_packages() -> None:
    """apt-get install the packages if a binary is missing; `apt-get update` only when the first try fails."""
    if not missing_binaries():
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Wait for a dpkg lock held by another apt instead of failing at once.
    apt = ["apt-get", "-q", "-o", "DPkg::Lock::Timeout=120"]
    install = [*apt, "install", "-y", "--no-install-recommends", *PACKAGES]
    first = _apt(install, env)
    if first.returncode == 0 and not missing_binaries():
        return
    update = _apt([*apt, "update"], env)
    second = _apt(install, env)
    if second.returncode != 0 or missing_binaries():
        raise SlurmSetupError(
            f"expected `{' '.join(install)}` to install {', '.join(BINARIES)}, found "
            f"{', '.join(missing_binaries()) or 'none'} missing (exit {second.returncode}):\n"
            f"--- first install ---\n{_last_lines(first.stdout, 40)}\n"
            f"--- apt-get update (exit {update.returncode}) ---\n{_last_lines(update.stdout, 40)}\n"
            f"--- second install ---\n{_last_lines(second.stdout, 40)}"
        )


def munge_works() -> bool:
    encode = subprocess.run(["munge", "-n"], capture_output=True)
    if encode.returncode != 0:
        return False
    return subprocess.run(["unmunge"], input=encode.stdout, capture_output=True).returncode == 0


def start_munged() -> bool:
    """Make `munge -n | unmunge` work; True when this call started munged (so the caller stops it later)."""
    if munge_works():
        return False
    if not MUNGE_KEY.exists():
        _run(["mungekey", "--create", "--keyfile", str(MUNGE_KEY)])
        _run(["chown", "munge:munge", str(MUNGE_KEY)])
        MUNGE_KEY.chmod(0o400)
    _run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", str(MUNGE_RUN_DIR)])
    # munged forks into the background and writes its pid file before this returns.
    _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"])
    deadline = time.monotonic() + 10
    while not munge_works():
        if time.monotonic() > deadline:
            raise SlurmSetupError("expected `munge -n | unmunge` to succeed within 10 s of starting munged")
        time.sleep(0.1)
    return True


def stop_munged() -> None:
    try:
        pid = int(MUNGE_PID_FILE.read_text().strip())
    except (OSError, ValueError):
        return
    _stop_pids([pid])


# -- node names ------------------------------------------------------------------------------------------------


HOSTS_TAG = "# gpucert test Slurm cluster "


def hosts_line(root: Path) -> str:
    """The /etc/hosts line that makes the node names resolve, as they do on a real cluster: job scripts and
    gpucert take the rendezvous host from SLURM_JOB_NODELIST (`node1`). Tagged with `root`, so that two
    sessions on one host each add and remove their own line."""
    return f"127.0.0.1 {' '.join(NODES)}  {HOSTS_TAG}{root}"


def add_hosts_line(root: Path) -> None:
    text = ETC_HOSTS.read_text()
    with ETC_HOSTS.open("a") as hosts:
        hosts.write(("" if text.endswith("\n") or not text else "\n") + hosts_line(root) + "\n")


def remove_hosts_line(root: Path) -> None:
    # Rewritten in place, not replaced: /etc/hosts is often a bind mount in containers.
    text = ETC_HOSTS.read_text()
    kept = [line for line in text.splitlines(keepends=True) if line.rstrip("\n") != hosts_line(root)]
    if len(kept) != len(text.splitlines()):
        ETC_HOSTS.write_text("".join(kept))


def other_clusters_running() -> bool:
    """Whether a cluster of another session (its tagged /etc/hosts line) still has a live slurmctld."""
    for line in ETC_HOSTS.read_text().splitlines():
        _, tag, root = line.partition(HOSTS_TAG)
        if not tag:
            continue
        try:
            if _alive(psutil.Process(int((Path(root) / "slurmctld.pid").read_text().strip()))):
                return True
        except (OSError, ValueError, psutil.Error):
            continue
    return False


# -- config ----------------------------------------------------------------------------------------------------


def render_slurm_conf(
    root: Path, hostname: str, ctld_port: int, node_ports: Sequence[int], cpus: int, real_memory_mb: int
) -> str:
    """slurm.conf for a cluster of `node1..nodeN` slurmd daemons on this host, everything under `root`."""
    nodes = [
        f"NodeName={name} NodeHostname={hostname} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
        f"RealMemory={real_memory_mb} State=UNKNOWN"
        for name, port in zip(NODES, node_ports, strict=True)
    ]
    return "\n".join(
        [
            "ClusterName=gpucert-test",
            f"FirstJobId={random.randint(*FIRST_JOB_IDS)}",
            f"SlurmctldHost={hostname}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "AuthType=auth/munge",
            f"StateSaveLocation={root}/ctld-state",
            f"SlurmctldPidFile={root}/slurmctld.pid",
            f"SlurmctldLogFile={root}/slurmctld.log",
            # %n is the node name, so the two slurmd daemons of this host keep apart.
            f"SlurmdSpoolDir={root}/d-%n",
            f"SlurmdPidFile={root}/slurmd-%n.pid",
            f"SlurmdLogFile={root}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # Lets a node declare the CPUs and memory below, whatever this host has.
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",
            # Submit-to-done ~1 s instead of ~3 s.
            "SchedulerParameters=batch_sched_delay=0",
            # A task that ignores SIGTERM is killed after 2 s, not the default 30 s.
            "KillWait=2",
            # Impossible requests fail at submit instead of pending forever.
            "EnforcePartLimits=ALL",
            # A node that stopped answering for a while (a loaded CI machine) is back as soon as it registers.
            "ReturnToService=2",
            *nodes,
            f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE "
            "OverSubscribe=YES State=UP",
            "",
        ]
    )


def free_port(taken: Sequence[int] = ()) -> int:
    """A TCP port on 127.0.0.1 that nothing holds now, outside the ephemeral range."""
    for _ in range(200):
        port = random.randint(*PORT_RANGE)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SlurmSetupError(f"expected a free TCP port in {PORT_RANGE}, found none in 200 tries")


def real_memory_mb(meminfo: str) -> int:
    """The node's RealMemory: MemTotal less a quarter, so Slurm never promises the host's last megabytes."""
    match = re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.MULTILINE)
    if match is None:
        raise SlurmSetupError("expected a MemTotal line in /proc/meminfo, found none")
    return int(match.group(1)) // 1024 * 3 // 4


def write_config(root: Path) -> Path:
    ctld_port = free_port()
    node_ports = [free_port(taken=[ctld_port])]
    node_ports.append(free_port(taken=[ctld_port, *node_ports]))
    # At least 2 CPUs per node so a 2-task step fits on one node even on a 1-core host (config_overrides).
    text = render_slurm_conf(
        root,
        hostname=socket.gethostname(),
        ctld_port=ctld_port,
        node_ports=node_ports,
        cpus=max(os.cpu_count() or 1, 2),
        real_memory_mb=real_memory_mb(Path("/proc/meminfo").read_text()),
    )
    conf = root / "slurm.conf"
    conf.write_text(text)
    # No GRES yet. Fake GPUs would be `GresTypes=gpu` and a node's `Gres=gpu:2` in slurm.conf, and here
    # `Name=gpu File=<a character device, e.g. a symlink to /dev/null>` lines.
    (root / "gres.conf").write_text("AutoDetect=off\n")
    return conf


# -- daemons ---------------------------------------------------------------------------------------------------


def cluster_env(conf: Path) -> dict[str, str]:
    """This process's environment for the cluster's clients: its SLURM_CONF, this Python's bin first on PATH,
    and no SLURM_* variables leaked from an outer job (they would steer sbatch and srun)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(conf)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, *(p for p in env.get("PATH", "").split(os.pathsep) if p != bin_dir)])
    return env


def start_cluster(root: Path, ready_timeout_s: float = 30.0) -> SlurmCluster:
    """Install if needed, start munged, slurmctld and one slurmd per node; return when every node is idle."""
    t0 = time.monotonic()
    install_packages()
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("ctld-state", *(f"d-{n}" for n in NODES)):
        (root / sub).mkdir(exist_ok=True)
    conf = write_config(root)
    cluster = SlurmCluster(root=root, conf=conf, env=cluster_env(conf))
    try:
        cluster.started_munged = start_munged()
        add_hosts_line(cluster.root)
        cluster.daemons.append(_spawn("slurmctld", ["slurmctld", "-D"], root / "slurmctld.log", cluster.env))
        for node in NODES:
            cluster.daemons.append(
                _spawn(f"slurmd {node}", ["slurmd", "-D", "-N", node], root / f"slurmd-{node}.log", cluster.env)
            )
        _wait_idle(cluster, ready_timeout_s)
    except BaseException:
        stop_cluster(cluster)
        raise
    cluster.start_s = time.monotonic() - t0
    return cluster


def node_states(env: dict[str, str]) -> dict[str, str]:
    """Each node's state as sinfo prints it (`idle`, `down*`, ...), one line per node."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True, timeout=10
    ).stdout
    return dict(line.split(maxsplit=1) for line in out.splitlines() if line.strip())


def stop_cluster(cluster: SlurmCluster) -> None:
    """Cancel every job, stop the daemons (TERM, then KILL), and munged if this cluster started it."""
    if any(d.process.poll() is None for d in cluster.daemons if d.name == "slurmctld"):
        subprocess.run(["scancel", "--full", "--user", "root"], env=cluster.env, capture_output=True, timeout=10)
        _wait_no_jobs(cluster.env, timeout_s=10)
    # slurmd first, then slurmctld, so no node is marked down and rescheduled while we stop.
    for daemon in reversed(cluster.daemons):
        _stop_process(daemon.process)
    _kill_stray_steps(cluster.root)
    remove_hosts_line(cluster.root)
    # Another session's cluster on this host may have found munged running (ours) and be using it still.
    if cluster.started_munged and not other_clusters_running():
        stop_munged()


# -- jobs ------------------------------------------------------------------------------------------------------


def submit(script: str | Path, env: dict[str, str], args: Sequence[str] = (), workdir: Path | None = None) -> int:
    """sbatch a script (its text, or a path to it) and return the job id. `workdir` is the job's working
    directory, where slurm-<id>.out goes; by default `jobs/` in the cluster's folder (beside SLURM_CONF)."""
    workdir = workdir or Path(env["SLURM_CONF"]).parent / "jobs"
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = ["sbatch", "--parsable", f"--chdir={workdir}", *args]
    text: str | None = None
    if isinstance(script, Path):
        cmd.append(str(script))
    else:
        text = script
    done = subprocess.run(cmd, input=text, env=env, capture_output=True, text=True, timeout=30, cwd=workdir)
    if done.returncode != 0:
        raise RuntimeError(f"expected sbatch to accept the job, found exit {done.returncode}: {done.stderr.strip()}")
    # --parsable prints "<id>" or "<id>;<cluster>".
    return int(done.stdout.strip().split(";")[0])


def parse_job_record(line: str) -> dict[str, str]:
    """`scontrol show job -o` output as a dict: `JobState`, `ExitCode` ("3:0" = exit:signal), `NodeList`, ...
    A value runs until the next ` Key=`, so values with spaces (Command=, Reason=) survive."""
    pairs = re.findall(r"(\S+?)=(.*?)(?=\s+[A-Za-z][\w/:]*=|\s*$)", line.strip())
    return dict(pairs)


def show_job(job_id: int, env: dict[str, str]) -> dict[str, str]:
    done = subprocess.run(
        ["scontrol", "show", "job", "-o", str(job_id)], env=env, capture_output=True, text=True, timeout=10
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"expected scontrol to know job {job_id}, found: {done.stderr.strip() or 'no output'}")
    return parse_job_record(done.stdout.splitlines()[0])


def wait_job(job_id: int, env: dict[str, str], timeout_s: float = 60.0) -> dict[str, str]:
    """Poll until the job has finished and return its record; raise TimeoutError with its last state."""
    deadline = time.monotonic() + timeout_s
    while True:
        job = show_job(job_id, env)
        if job.get("JobState") in FINISHED_STATES:
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"expected job {job_id} to finish within {timeout_s:g} s, found JobState={job.get('JobState')} "
                f"Reason={job.get('Reason')} NodeList={job.get('NodeList')}"
            )
        time.sleep(0.2)


def exit_code(job: dict[str, str]) -> tuple[int, int]:
    """The job's (exit status, signal) from its `ExitCode=<status>:<signal>`."""
    status, _, sig = job["ExitCode"].partition(":")
    return int(status), int(sig or 0)


def output_of(job: dict[str, str]) -> str:
    """The job's stdout file (StdOut=, with stderr too unless the job split them)."""
    path = Path(job["StdOut"])
    return path.read_text() if path.exists() else f"(no output file {path})"


# -- private ---------------------------------------------------------------------------------------------------


def _which(binary: str) -> str | None:
    # Daemons live in /usr/sbin, which a non-login root shell may lack on PATH.
    return shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/sbin")


def _apt(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(cmd, 124, out + "\n(timed out after 600 s)")


def _last_lines(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SlurmSetupError(f"expected `{' '.join(cmd)}` to succeed, found exit {done.returncode}: {done.stderr}")


def _spawn(name: str, cmd: list[str], log: Path, env: dict[str, str]) -> Daemon:
    exe = _which(cmd[0]) or cmd[0]
    # Own session: Ctrl-C at the terminal reaches pytest, whose teardown then stops the daemons in order.
    with open(log.with_suffix(".stderr"), "wb") as stderr:
        process = subprocess.Popen(
            [exe, *cmd[1:]], env=env, stdout=stderr, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Daemon(name=name, process=process, log=log)


def _wait_idle(cluster: SlurmCluster, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        dead = [d for d in cluster.daemons if d.process.poll() is not None]
        if dead:
            raise SlurmSetupError(
                f"expected {', '.join(d.name for d in dead)} to keep running, found it exited "
                f"(code {dead[0].process.returncode}):\n{cluster.log_tail()}"
            )
        states = node_states(cluster.env)
        if all(states.get(n) == "idle" for n in cluster.nodes):
            return
        time.sleep(0.2)
    raise SlurmSetupError(
        f"expected nodes {', '.join(cluster.nodes)} idle within {timeout_s:g} s, found {states or 'no sinfo'}:\n"
        f"{cluster.log_tail()}"
    )


def _wait_no_jobs(env: dict[str, str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=10)
        if out.returncode != 0 or not out.stdout.strip():
            return
        time.sleep(0.2)


def _stop_process(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace_s)


def _alive(process: psutil.Process) -> bool:
    # An exited daemon whose parent never reaps it stays a zombie (some container inits do not reap).
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stop_pids(pids: Sequence[int], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL whatever still runs after `grace_s`."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)
        deadline = time.monotonic() + grace_s
        while any(_alive(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        procs = [p for p in procs if _alive(p)]
        if not procs:
            return


def _kill_stray_steps(root: Path) -> None:
    """Kill the slurmstepd processes of this cluster (and their tasks) that outlived their job: slurmstepd
    survives its slurmd by design and ignores SIGTERM. They are this cluster's when they hold a file under root."""
    pids: list[int] = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] != "slurmstepd" or not _alive(proc):
            continue
        try:
            if any(Path(f.path).is_relative_to(root) for f in proc.open_files()):
                pids.extend([c.pid for c in proc.children(recursive=True)] + [proc.pid])
        except psutil.Error:
            continue
    if pids:
        _stop_pids(pids, grace_s=2)


def _tail(path: Path, lines: int, name: str) -> str:
    # With -D a daemon writes its log file and stderr alike; stderr alone has what came before the log opened.
    for p in (path, path.with_suffix(".stderr")):
        text = p.read_text(errors="replace") if p.exists() else ""
        if text.strip():
            return "\n".join([f"--- {name}: {p} ---", *text.splitlines()[-lines:]])
    return f"--- {name}: no log in {path} ---"
