"""What `gpucert launch slurm` renders, on a real two-node Slurm cluster (node1, node2): every `--dry-run` script
submitted as a user would, with plain `sbatch` from an empty directory; one job submitted and followed by
`gpucert launch slurm` itself; `gpucert cluster slurm` on the same cluster."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.cluster.slurm import SlurmCluster, wait_job
from tests.conftest import free_port, within

pytestmark = pytest.mark.slow
GPUCERT = [sys.executable, "-m", "gpucert"]


def launch(cluster: SlurmCluster, *argv: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUCERT, "launch", "slurm", *argv], env=cluster.env, capture_output=True, text=True, timeout=timeout_s
    )


def dry_run_then_sbatch(cluster: SlurmCluster, tmp_path: Path, verb: str, *argv: str) -> tuple[Path, Path]:
    """What a user does with `--dry-run`: save the script, then plain `sbatch` from an empty directory (no run
    directory, no logs/ made beforehand by gpucert). Returns the run directory and the job's own log."""
    run = tmp_path / verb
    rendered = launch(cluster, verb, "--nodes", "2", "--gpus-per-node", "0", "--output", str(run), *argv, "--dry-run")
    assert rendered.returncode == 0, rendered.stderr
    assert not run.exists(), "--dry-run made the run directory: the script would not be tested as printed"
    empty = tmp_path / f"{verb}-submit"
    empty.mkdir()
    (empty / "job.sh").write_text(rendered.stdout)
    # Plain sbatch, as printed; then polled (sbatch --wait polls at growing intervals: 30 s more a job).
    done = subprocess.run(
        ["sbatch", "--parsable", "job.sh"], cwd=empty, env=cluster.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    record = wait_job(int(done.stdout.strip().split(";")[0]), cluster.env, timeout_s=within(300))
    [job_log] = list(empty.glob(f"gpucert-{verb}-*.out"))  # where the script's header says it goes
    # The job's exit code is the run's verdict: 0 PASS, 1 WARN (a check directory on no shared filesystem).
    code = record.get("ExitCode", "?").split(":")[0]
    assert code in ("0", "1"), str(record) + job_log.read_text()[-2000:] + slurm_log_tails(run)
    return run, job_log


def test_accept_dry_run_script_runs_under_plain_sbatch_and_writes_one_report_naming_both(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # The benchmarks this test does not look at are left out (the two-node accept in tests/runtime runs them all):
    # the suite must stay under 15 minutes on CI's 2 cores.
    run, job_log = dry_run_then_sbatch(
        slurm_cluster, tmp_path, "accept", "--profile", "cpu", "--nproc", "1", "--skip", "burn,p2p,train"
    )
    # The job's own log, where a plain sbatch user looks first, ends with the verdict (it was empty).
    assert "verdict: PASS" in job_log.read_text()
    report = json.loads((run / "report.json").read_text())
    assert report["meta"]["nodes"] == ["node1", "node2"] and report["status"] == "PASS"
    assert {r["node"] for r in report["results"] if r["name"] == "memory.copy"} == {"node1", "node2"}
    assert {r["subject"] for r in report["results"] if r["name"] == "collective.all_reduce"} == {
        "2 nodes x 1 ranks (gloo)"
    }
    # One log per node, apart even when the two nodes share this host's name.
    host = socket.gethostname()
    assert sorted(p.name for p in (run / "logs").glob("node-*.log")) == [f"node-0-{host}.log", f"node-1-{host}.log"]
    slurm = report["nodes"]["node2"]["environment"]["slurm"]
    assert slurm["nnodes"] == 2 and slurm["job_name"] == "gpucert-accept"


def test_finetune_dry_run_script_runs_under_plain_sbatch_and_trains_with_ddp_on_both_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    run, _ = dry_run_then_sbatch(
        slurm_cluster, tmp_path, "finetune", "--config", "configs/finetune/tiny.yaml",
        "--set", "train.max_steps=8", "--set", "train.parallel=ddp", "--set", "train.final_loss_max=7.8",
        "--set", f"data.cache_dir={tmp_path / 'cache'}",
    )  # fmt: skip
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["parallel"] == "ddp" and metrics["status"] == "PASS"


def test_fs_dry_run_script_runs_under_plain_sbatch_and_checks_from_both_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    run, _ = dry_run_then_sbatch(slurm_cluster, tmp_path, "fs", str(shared), "--files", "20", "--size-mib", "4")
    report = json.loads((run / "report.json").read_text())
    assert report["meta"]["nodes"] == ["node1", "node2"]
    assert {r["node"] for r in report["results"] if r["name"] == "fs.write"} >= {"node1", "node2"}
    assert list(shared.iterdir()) == []  # its files are removed


def test_a_rank_lost_in_a_slurm_job_is_named_and_the_job_fails(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """`gpucert launch slurm` submits and follows; node2's rank is SIGKILLed mid-matmul: the report names the rank
    and node, the job FAILs."""
    run = tmp_path / "lost"
    argv = [*GPUCERT, "launch", "slurm", "accept", "--nodes", "2", "--gpus-per-node", "0", "--profile", "cpu"]
    argv += ["--nproc", "1", "--output", str(run), "--follow-timeout", "200"]
    argv += ["--skip", "burn,memory,p2p,collectives,train"]
    argv += ["--set", "bench.matmul.warmup_s=60", "--set", "runtime.heartbeat_interval_s=0.5"]
    argv += ["--set", "runtime.heartbeat_timeout_s=3"]
    proc = subprocess.Popen(argv, env=slurm_cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim, deadline = None, time.monotonic() + within(120)
    while victim is None and time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            try:
                cmdline = p.info["cmdline"] or []
                # This job's rank 1 only (its output directory is on its command line): another test may be
                # running an accept of its own beside this one (pytest -n).
                mine = any(str(run) in arg for arg in cmdline)
                if mine and "accept" in cmdline and p.environ().get("RANK") == "1":
                    victim = p
            except psutil.Error:
                continue
        time.sleep(0.5)
    assert victim is not None, "no worker of rank 1 appeared"
    # Past its node checks and in the benchmark: its log says it joined (acceptance.run_in_ranks).
    log = run / "logs" / "rank-1.log"
    while not (log.exists() and "joined the job" in log.read_text(errors="replace")):
        assert time.monotonic() < deadline and proc.poll() is None, "rank 1 never joined the benchmarks"
        time.sleep(0.5)
    time.sleep(1)
    victim.kill()
    killed = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - killed < 60
    assert proc.returncode == 3, err[-3000:]
    [matmul] = [r for r in json.loads((run / "report.json").read_text())["results"] if r["name"] == "bench.matmul"]
    assert matmul["status"] == "ERROR" and "rank 1 (node2" in matmul["message"], matmul["message"]
    assert "FAILED" in err


def test_cluster_slurm_passes_on_a_working_cluster(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    done = subprocess.run(
        [*GPUCERT, "cluster", "slurm", "--mem", "64", "--timeout", "60", "--json", "-o", str(tmp_path / "smoke")],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    report = json.loads(done.stdout)
    found = {(r["name"], r["subject"]): r["status"] for r in report["results"]}
    assert done.returncode == 0, found
    assert found[("slurm.controller", "slurmctld")] == "PASS"
    assert found[("slurm.node", "node1")] == found[("slurm.node", "node2")] == "PASS"
    assert found[("slurm.partition", "debug")] == "PASS"
    assert found[("slurm.sbatch", "sbatch --wait")] == "PASS"
    assert {name for name, _ in found} >= {"slurm.srun", "slurm.job.cpus", "slurm.job.gpus", "slurm.job.memory"}


def test_cluster_slurm_refuses_a_partition_it_lacks_and_names_gpus_slurm_cannot_give(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """docs/cluster.md's command on this cluster (one partition, debug; no GRES): a command-line mistake, exit 3,
    said as what it is, before Slurm refuses the jobs with messages of its own."""

    def smoke(name: str, *argv: str) -> tuple[int, dict[tuple[str, str], dict[str, str]]]:
        argv = ("cluster", "slurm", *argv, "--timeout", "60", "--json", "-o", str(tmp_path / name))
        done = subprocess.run([*GPUCERT, *argv], env=slurm_cluster.env, capture_output=True, text=True, timeout=180)
        report = json.loads(done.stdout)
        return done.returncode, {(r["name"], r["subject"]): r for r in report["results"]}

    code, found = smoke("gpu", "--partition", "gpu", "--gpus", "8", "--cpus", "16", "--mem", "64000")
    assert code == 3, found
    unknown = found[("slurm.partition", "gpu")]
    assert unknown["status"] == "ERROR" and "found only: debug (default, UP)" in unknown["message"], unknown
    assert {name for name, _ in found} == {"slurm.controller", "slurm.partition"}, found
    code, found = smoke("gpus", "--partition", "debug", "--gpus", "8", "--mem", "64")
    assert code == 3, found
    request = found[("slurm.request", "debug")]
    assert request["status"] == "ERROR" and "no GPU is configured in Slurm" in request["message"], request
    assert found[("slurm.sbatch", "sbatch --wait")]["status"] == "PASS"
    assert "slurm.srun" not in {name for name, _ in found}
    assert not [r["message"] for r in found.values() if "None" in r["message"]]


def test_localize_dry_run_script_runs_one_srun_step_per_pair_and_names_both_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """localize runs once in the batch step; its pair job is an srun step on node1 and node2, judged here against
    a floor any working pair clears (two nodes have no other pair to compare with)."""
    run, _ = dry_run_then_sbatch(
        slurm_cluster, tmp_path, "localize", "--profile", "cpu",
        "--set", "bench.nproc=1", "--set", "localize.pair_busbw_gbps_min=0.0001",
        "--set", f"localize.base_port={free_port()}",
    )  # fmt: skip
    report = json.loads((run / "report.json").read_text())
    assert report["meta"]["nodes"] == ["node1", "node2"] or report["meta"]["nodes"] == ["node2", "node1"]
    [pair] = [r for r in report["results"] if r["name"] == "localize.pair"]
    assert pair["status"] == "PASS" and set(pair["details"]["nodes"]) == {"node1", "node2"}, pair
    assert pair["threshold_source"] == "config: localize.pair_busbw_gbps_min"
    verdicts = {r["node"]: r["status"] for r in report["results"] if r["name"] == "localize.node"}
    assert verdicts == {"node1": "PASS", "node2": "PASS"}
    # Every node's inventory and health came back from its pair job, under its Slurm name.
    assert set(report["nodes"]) == {"node1", "node2"}
    assert {r["node"] for r in report["results"] if r["name"] == "node.xid"} == {"node1", "node2"}


def slurm_log_tails(run: Path) -> str:
    return "\n".join(
        f"== {p}\n{p.read_text()[-2000:]}" for p in sorted(run.rglob("*.log")) + sorted(run.rglob("*.out"))
    )
