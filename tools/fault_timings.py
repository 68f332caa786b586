"""Time the runtime's fault guarantees on this machine: `python tools/fault_timings.py [--out FILE]`.

Two "nodes" of 127.0.0.1 (gloo, one rank each) or one node of two ranks, started as the README says, with tight
heartbeats (0.5 s, dead after 3 s) and a 5 s rendezvous; each case prints how long from the fault to the last
gpucert process gone, the exit codes, the one line said, and whether any rank outlived it. The tests in
tests/runtime assert the same bounds; this prints the figures for docs/results.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPUCERT = [sys.executable, "-m", "gpucert"]
TIGHT = ["--set", "runtime.heartbeat_interval_s=0.5", "--set", "runtime.heartbeat_timeout_s=3"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}, "OMP_NUM_THREADS": "1"}


def ranks_alive(marker: str) -> list[int]:
    """Processes with a rank's environment whose command line holds `marker` (this case's output directory)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            environ = Path(f"/proc/{entry}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and "\0RANK=" in f"\0{environ}":
            found.append(int(entry))
    return found


def rank_pid(marker: str, rank: int, timeout_s: float = 600) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in ranks_alive(marker):
            try:
                if f"\0RANK={rank}\0" in f"\0{Path(f'/proc/{pid}/environ').read_bytes().decode(errors='replace')}":
                    return pid
            except OSError:
                continue
        time.sleep(0.2)
    raise SystemExit(f"no rank {rank} of {marker} within {timeout_s} s")


def joined(log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and "joined the job" in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise SystemExit(f"{log}: no 'joined the job' within {timeout_s} s")


def node_argv(verb: list[str], out: Path, rank: int, port: int) -> list[str]:
    flags = ["--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    return [*GPUCERT, *verb, "-o", str(out), *flags, *TIGHT]


def finish(procs: list[subprocess.Popen[str]], since: float, marker: str) -> dict[str, object]:
    outs = [p.communicate(timeout=600) for p in procs]
    took = time.monotonic() - since
    last_lines = [next((ln for ln in reversed(err.splitlines()) if ln.strip()), "") for _, err in outs]
    return {
        "seconds": round(took, 1),
        "exit_codes": [p.returncode for p in procs],
        "said": last_lines,
        "ranks_left": len(ranks_alive(marker)),
        "tracebacks": sum("Traceback" in err for _, err in outs),
    }


def missing_node(tmp: Path) -> dict[str, object]:
    out, port = tmp / "missing", free_port()
    argv = [*node_argv(["accept", "--profile", "cpu"], out, 0, port), "--set", "runtime.rendezvous_timeout_s=5"]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return {"rendezvous_timeout_s": 5, **finish([proc], t0, str(out))}


def two_nodes_fault(tmp: Path, name: str, sig: signal.Signals) -> dict[str, object]:
    out, port = tmp / name, free_port()
    verb = ["accept", "--profile", "cpu", "--nproc", "1", "--skip", "p2p,collectives,train,burn"]
    verb += ["--set", "bench.matmul.warmup_s=60"]
    procs = [
        subprocess.Popen(node_argv(verb, out, r, port), env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for r in (0, 1)
    ]  # fmt: skip
    joined(out / "logs" / "rank-1.log")
    time.sleep(1)
    victim = rank_pid(str(out), 1)
    os.kill(victim, sig)
    t0 = time.monotonic()
    result = finish(procs, t0, str(out))
    report = json.loads((out / "report.json").read_text())
    named = [r["message"] for r in report["results"] if r["name"] == "bench.matmul"]
    went_on = sorted({r["node"] for r in report["results"] if r["name"] == "memory.copy"})
    return {**result, "named": named[0] if named else None, "next_benchmark_ran_on": went_on}


def ctrl_c(tmp: Path) -> dict[str, object]:
    out = tmp / "ctrlc"
    argv = [*GPUCERT, "bench", "matmul", "--profile", "cpu", "--nproc", "2", "-o", str(out)]
    argv += ["--set", "bench.matmul.warmup_s=120"]
    proc = subprocess.Popen(argv, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    joined(out / "logs" / "rank-1.log")
    proc.send_signal(signal.SIGINT)
    return finish([proc], time.monotonic(), str(out))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpucert-faults-") as tmp:
        figures = {
            "missing_node": missing_node(Path(tmp)),
            "dead_rank_sigkill": two_nodes_fault(Path(tmp), "dead", signal.SIGKILL),
            "stopped_rank_sigstop": two_nodes_fault(Path(tmp), "stopped", signal.SIGSTOP),
            "ctrl_c": ctrl_c(Path(tmp)),
        }
    text = json.dumps(figures, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
