"""Two GPUs of one machine as two "nodes" on NCCL's network path, started as the README says: figures for
docs/results. `python tools/two_nodes_gpu.py PART --out DIR` with PART one of:

- accept: `gpucert accept --nnodes 2 --node-rank R --master-addr 127.0.0.1` on each node, full default run;
- finetune: the shipped speed recipe (`--config qwen2-7b-speed`, with each `--set KEY=VALUE` given) across the two
  nodes on an empty compile cache, then on one GPU alone (the cache now warm), tokens/s per GPU of each and the
  share kept;
- faults: node 0 alone (named within the rendezvous timeout), then a rank SIGKILLed and a rank SIGSTOPped
  mid-fine-tuning (named on both nodes within the heartbeat timeout), with the default heartbeats;
- stop: the operator's Ctrl-C to node 1's gpucert mid-fine-tuning, then to node 0's: how long until both nodes are
  gone, what each says, what is left on the GPUs and which checkpoint a rerun continues from.

finetune --transport local lets NCCL take the host's own path (shared memory or peer access) instead: beside a
--transport net run, it tells what the network path costs.

Each node sees only its own GPU (CUDA_VISIBLE_DEVICES) and NCCL may use neither peer access nor shared memory
(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), so the collectives take the network path as between two machines.
Needs a machine of two GPUs; writes PART.json (and the run's reports) under --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
from fault_timings import free_port, ranks_alive  # tools/ is on the path: run as a script

GPUCERT = [sys.executable, "-m", "gpucert"]
NAMES = ("node-a", "node-b")
STEPS = 20


# "net": NCCL's network path, as between two machines; "local": whatever NCCL picks inside one host (shared
# memory or peer access), to tell what the network path costs a run (finetune --transport local).
TRANSPORT = ["net"]


def node_env(gpu: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    net = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"} if TRANSPORT[0] == "net" else {}
    return {**env, "CUDA_VISIBLE_DEVICES": str(gpu), **net, "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"}


def node_flags(rank: int, port: int) -> list[str]:
    return ["--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--node-name", NAMES[rank]]  # fmt: skip


# Every node this script started, killed (with its ranks) when the script ends however it ends: a time limit
# around the script (SIGTERM) must not leave ranks holding the GPUs.
STARTED: list[subprocess.Popen[bytes]] = []


def start(argv: list[str], gpu: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=node_env(gpu), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    STARTED.append(proc)
    return proc


def stop_started() -> None:
    for proc in STARTED:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the node's launcher and the ranks it started
            proc.wait()


def last_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def gpucert_lines(log: Path) -> list[str]:
    return [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("gpucert:")]


def gpu_processes() -> int:
    """Compute processes still holding a GPU (nvidia-smi's view): a rank that outlived its node shows here."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                         text=True, check=False).stdout  # fmt: skip
    return len([ln for ln in out.splitlines() if ln.strip()])


def wait_all(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> list[int | None]:
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return [p.returncode for p in procs]


def accept(out: Path) -> dict[str, Any]:
    port, runs = free_port(), [Path(f"/tmp/accept-{n}") for n in NAMES]
    for run in runs:
        shutil.rmtree(run, ignore_errors=True)
    sets = ["--set", "health.expected_gpus=2"]  # NVML counts the host's GPUs, not the ones a node's process sees
    # Over sockets (a few GB/s) the default sweep to the largest message takes minutes per operation.
    if os.environ.get("MAX_BYTES"):
        sets += ["--set", f"bench.collectives.max_bytes={os.environ['MAX_BYTES']}"]
        sets += ["--set", f"bench.collectives.gate_bytes={os.environ['MAX_BYTES']}"]
    # Each node's --metrics-file (METRICS=1): node 0's process writes the cluster's once; node 1 has no report.
    proms = [Path(f"/tmp/accept-{n}.prom") for n in NAMES]
    for prom in proms:
        prom.unlink(missing_ok=True)
    metrics_flags = [["--metrics-file", str(proms[r])] if os.environ.get("METRICS") else [] for r in (0, 1)]
    t0 = time.monotonic()
    procs = [start([*GPUCERT, "accept", "-o", str(runs[r]), *node_flags(r, port), *sets, *metrics_flags[r]], r,
                   out / f"accept-{r}.log")
             for r in (0, 1)]  # fmt: skip
    codes = wait_all(procs, 560)
    took = time.monotonic() - t0
    report_dir = next((p.parent for p in runs[0].rglob("report.json")), None)
    said = [last_line(out / f"accept-{r}.log") for r in (0, 1)]
    summary: dict[str, Any] = {"seconds": round(took, 1), "exit_codes": codes, "said": said}
    if os.environ.get("METRICS"):
        summary["metrics_files"] = {
            NAMES[r]: {"lines": len(proms[r].read_text().splitlines()) if proms[r].exists() else None,
                       "errors_said": (out / f"accept-{r}.log").read_text(errors="replace").count("--metrics-file")}
            for r in (0, 1)
        }  # fmt: skip
        if proms[0].exists():
            shutil.copy(proms[0], out / "accept-node-a.prom")
    if report_dir is not None:
        for name in ("report.json", "report.md", "report.html"):
            if (report_dir / name).exists():
                shutil.copy(report_dir / name, out / f"accept-{name}")
        report = json.loads((report_dir / "report.json").read_text())
        results = report["results"]
        summary["verdict"] = report.get("verdict") or report.get("status")
        summary["nodes"] = sorted({str(r.get("node")) for r in results if r.get("node")})
        summary["counts"] = {s: sum(r["status"] == s for r in results) for s in sorted({r["status"] for r in results})}
        summary["collectives"] = [
            {k: r.get(k) for k in ("name", "status", "value", "unit", "expected", "message")}
            for r in results if r["name"].startswith("collective.")
        ]  # fmt: skip
        summary["not_pass"] = [f"{r['status']} {r['name']} {r.get('subject', '')}: {r.get('message', '')}"
                               for r in results if r["status"] not in ("PASS", "INFO")]  # fmt: skip
    return summary


def metrics(run: Path) -> dict[str, Any]:
    found = sorted(run.rglob("metrics.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        return {}
    m = json.loads(found[-1].read_text())
    keep = ("world_size", "parallel", "device", "tokens_per_s_per_gpu", "mfu", "peak_memory_gib", "t_eff",
            "time_to_first_step_s", "first_step_s", "compile", "wall_time_s", "train_time_s", "status")  # fmt: skip
    return {k: m.get(k) for k in keep}


def finetune_argv(run: Path, cache: Path, steps: int, sets: Sequence[str] = ()) -> list[str]:
    return [*GPUCERT, "finetune", "--config", "qwen2-7b-speed", "--output", str(run),
            "--set", f"train.max_steps={steps}", "--set", f"train.compile_cache_dir={cache}",
            *(a for kv in sets for a in ("--set", kv))]  # fmt: skip


def finetune(out: Path, sets: list[str], warm: bool, one_gpu: bool) -> dict[str, Any]:
    cache = Path("/tmp/gpucert-compile-two-nodes")
    if not warm:
        shutil.rmtree(cache, ignore_errors=True)
    state = "as an earlier part left it" if warm else "empty before the two-node run"
    figures: dict[str, Any] = {"steps": STEPS, "compile_cache": f"{state}, shared by both nodes", "sets": sets,
                               "transport": TRANSPORT[0]}  # fmt: skip
    run2, port = Path("/tmp/ft-two-nodes"), free_port()
    shutil.rmtree(run2, ignore_errors=True)
    t0 = time.monotonic()
    procs = [start([*finetune_argv(run2, cache, STEPS, sets), *node_flags(r, port)], r, out / f"finetune-2n-{r}.log")
             for r in (0, 1)]  # fmt: skip
    codes = wait_all(procs, 400)
    figures["two_nodes"] = {"seconds": round(time.monotonic() - t0, 1), "exit_codes": codes, **metrics(run2)}
    if (run2 / "metrics.json").exists():  # with every step's time, for where a gap goes
        shutil.copy(run2 / "metrics.json", out / "finetune-2n-metrics.json")
    if not one_gpu:
        return figures
    run1 = Path("/tmp/ft-one-gpu")
    shutil.rmtree(run1, ignore_errors=True)
    t0 = time.monotonic()
    codes = wait_all([start(finetune_argv(run1, cache, STEPS, sets), 0, out / "finetune-1.log")], 300)
    figures["one_gpu"] = {"seconds": round(time.monotonic() - t0, 1), "exit_codes": codes, **metrics(run1)}
    try:
        two = figures["two_nodes"]["tokens_per_s_per_gpu"]["effective"]
        one = figures["one_gpu"]["tokens_per_s_per_gpu"]["effective"]
        figures["share_kept"] = round(two / one, 4)
    except (KeyError, TypeError):
        figures["share_kept"] = None
    return figures


def missing_node(out: Path) -> dict[str, Any]:
    run, port, timeout_s = Path("/tmp/ft-missing"), free_port(), 30
    argv = [*finetune_argv(run, Path("/tmp/gpucert-compile-two-nodes"), STEPS), *node_flags(0, port)]
    argv += ["--set", f"runtime.rendezvous_timeout_s={timeout_s}"]
    t0 = time.monotonic()
    [code] = wait_all([start(argv, 0, out / "fault-missing.log")], 200)
    return {"rendezvous_timeout_s": timeout_s, "seconds": round(time.monotonic() - t0, 1), "exit_code": code,
            "said": gpucert_lines(out / "fault-missing.log")[-3:], "gpu_processes_left": gpu_processes()}  # fmt: skip


def two_node_fault(
    run: Path, logs: list[Path], sets: Sequence[str], step: int, hit: Callable[[list[subprocess.Popen[bytes]]], None]
) -> dict[str, Any]:
    """Both nodes of a long run of the speed recipe (with `sets`) started, and `hit` (given the two nodes'
    gpucert processes) at step `step`: how long until every node is gone, what each said last, and what is left
    of the ranks and on the GPUs."""
    port = free_port()
    shutil.rmtree(run, ignore_errors=True)
    argv = finetune_argv(run, Path("/tmp/gpucert-compile-two-nodes"), 5000, sets)
    procs = [start([*argv, *node_flags(r, port)], r, logs[r]) for r in (0, 1)]
    deadline = time.monotonic() + 300
    while not re.search(rf"\[finetune\] step {step}/", logs[0].read_text(errors="replace")):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            wait_all(procs, 1)
            return {"error": f"no step {step} before the fault", "tail": logs[0].read_text(errors="replace")[-2000:]}
        time.sleep(0.5)
    hit(procs)
    t0 = time.monotonic()
    codes = wait_all(procs, 240)
    took = time.monotonic() - t0
    time.sleep(1)
    return {"seconds_to_every_node_gone": round(took, 1), "exit_codes": codes,
            "said": [gpucert_lines(log)[-2:] for log in logs], "ranks_left": len(ranks_alive(str(run))),
            "gpu_processes_left": gpu_processes(),
            "tracebacks_on_terminal": sum("Traceback" in log.read_text(errors="replace") for log in logs)}  # fmt: skip


def rank_fault(out: Path, name: str, sig: signal.Signals) -> dict[str, Any]:
    def hit(procs: list[subprocess.Popen[bytes]]) -> None:
        # The rank itself: a direct child of node 1's gpucert (its compile workers inherit RANK too).
        [victim] = [p for p in psutil.Process(procs[1].pid).children() if p.environ().get("RANK") == "1"]
        victim.send_signal(sig)

    logs = [out / f"fault-{name}-{r}.log" for r in (0, 1)]
    return {"signal": sig.name, **two_node_fault(Path(f"/tmp/ft-{name}"), logs, (), 3, hit)}


def operator_stop(out: Path, node: int, sets: Sequence[str]) -> dict[str, Any]:
    """Ctrl-C (SIGINT) to node `node`'s gpucert at step 4 of a run saving every 2 steps: how long until every node
    is gone, what each says, what is left on the GPUs, which checkpoints there are."""
    run, logs = Path(f"/tmp/ft-stop-{node}"), [out / f"stop-on-{node}-{r}.log" for r in (0, 1)]

    def ctrl_c(procs: list[subprocess.Popen[bytes]]) -> None:
        procs[node].send_signal(signal.SIGINT)

    found = two_node_fault(run, logs, ["train.save_every=2", *sets], 4, ctrl_c)
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    return {"signal": "SIGINT", "to_node": node, **found, "checkpoints": checkpoints}


def faults(out: Path) -> dict[str, Any]:
    return {
        "heartbeats": "defaults: runtime.heartbeat_interval_s and runtime.heartbeat_timeout_s",
        **({} if os.environ.get("SKIP_MISSING") else {"missing_node": missing_node(out)}),
        "killed_rank": rank_fault(out, "killed", signal.SIGKILL),
        "stopped_rank": rank_fault(out, "stopped", signal.SIGSTOP),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("accept", "finetune", "faults", "stop"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="finetune, stop: a config override of every run (model.precision=fp8)")  # fmt: skip
    parser.add_argument("--transport", choices=("net", "local"), default="net",
                        help="NCCL between the two nodes: the network path (default) or the host's own")  # fmt: skip
    parser.add_argument("--warm", action="store_true", help="finetune: keep the compile cache an earlier part left")
    parser.add_argument("--two-nodes-only", action="store_true", help="finetune: no one-GPU run after")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if (args.warm or args.two_nodes_only) and args.part != "finetune":
        parser.error("--warm and --two-nodes-only apply to the finetune part only")
    if args.sets and args.part not in ("finetune", "stop"):
        parser.error("--set applies to the finetune and stop parts only")
    TRANSPORT[0] = args.transport
    parts = {
        "accept": accept,
        "finetune": lambda out: finetune(out, args.sets, args.warm, not args.two_nodes_only),
        "faults": faults,
        "stop": lambda out: {f"on_node_{n}": operator_stop(out, n, args.sets) for n in (1, 0)},
    }
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally below runs
    try:
        figures = parts[args.part](args.out)
    finally:
        stop_started()
    text = json.dumps(figures, indent=1, default=str)
    print(text)
    (args.out / f"{args.part}.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
