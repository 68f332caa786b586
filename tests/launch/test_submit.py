"""`gpucert launch slurm` without --dry-run, against stand-in `sbatch` and `scontrol` on PATH (the real two-node
cluster runs the same paths in tests/cluster/test_launch_slurm.py): what it leaves in the run directory when
Slurm refuses the job, and which report it takes the verdict from."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpucert.cli import main


def stand_in(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def slurm_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


LAUNCH = ["launch", "slurm", "health", "--nodes", "1", "--gpus-per-node", "0", "--profile", "cpu"]


def test_a_job_sbatch_refuses_leaves_no_directory_and_no_script(tmp_path: Path, slurm_bin: Path, capsys) -> None:
    stand_in(slurm_bin, "sbatch", "echo 'sbatch: error: invalid partition specified: gpu' >&2; exit 1")
    out = tmp_path / "runs" / "launch-health"
    assert main([*LAUNCH, "--output", str(out)]) == 3
    assert "invalid partition specified: gpu" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    # An --output that existed keeps what it held, an earlier launch's script included.
    out.mkdir(parents=True)
    (out / "job.sbatch").write_text("the earlier launch's\n")
    assert main([*LAUNCH, "--output", str(out)]) == 3
    assert sorted(p.name for p in out.iterdir()) == ["job.sbatch"]
    assert (out / "job.sbatch").read_text() == "the earlier launch's\n"


def test_the_verdict_is_never_taken_from_an_earlier_runs_report(tmp_path: Path, slurm_bin: Path, capsys) -> None:
    """The job died before its gpucert claimed the --output: the PASS report there is the earlier run's."""
    stand_in(slurm_bin, "sbatch", "echo 17")
    stand_in(slurm_bin, "scontrol", "echo 'JobId=17 JobState=FAILED ExitCode=1:0 NodeList=node1'")
    out = tmp_path / "run"
    assert main(["health", "--profile", "cpu", "-o", str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["meta"]["verb"] == "health"
    capsys.readouterr()
    assert main([*LAUNCH, "--output", str(out)]) == 3
    assert "job 17 ended FAILED (exit 1:0) without a result" in capsys.readouterr().err


FINETUNE = ["launch", "slurm", "finetune", "--nodes", "2", "--gpus-per-node", "0", "--config", "tiny"]


def finished_finetune_run(out: Path, status: str) -> None:
    """What a finished fine-tuning run leaves (finetune/train/loop.py, finished_run): its report and metrics."""
    out.mkdir(parents=True)
    (out / "report.json").write_text(json.dumps({"status": status, "meta": {"verb": "finetune"}}))
    (out / "metrics.json").write_text(json.dumps({"status": status}))


@pytest.mark.parametrize(("status", "exit_code"), [("PASS", 0), ("FAIL", 2)])
def test_a_job_onto_a_finished_finetune_run_exits_with_its_standing_verdict(
    tmp_path: Path, slurm_bin: Path, capsys, status: str, exit_code: int
) -> None:
    """The requeue `--resume auto` is for: the run had finished, the job trains nothing and leaves its files as
    they were, and every node exits with the standing verdict."""
    out = tmp_path / "run"
    finished_finetune_run(out, status)
    state = "COMPLETED" if exit_code == 0 else "FAILED"
    stand_in(slurm_bin, "sbatch", "echo 17")
    stand_in(slurm_bin, "scontrol", f"echo 'JobId=17 JobState={state} ExitCode={exit_code}:0 NodeList=node[1-2]'")
    assert main([*FINETUNE, "--output", str(out)]) == exit_code
    said = capsys.readouterr()
    out = said.out  # the verdict is a result: stdout, as every verb's (README), progress on stderr
    assert "the run had already finished; its report stands" in out and f"fine-tuning {status}" in out, said
    assert "without a result" not in said.err


def test_a_job_that_died_onto_a_finished_finetune_run_is_no_result(tmp_path: Path, slurm_bin: Path, capsys) -> None:
    """Its exit code is not the standing run's verdict: the job died before its gpucert said anything."""
    out = tmp_path / "run"
    finished_finetune_run(out, "PASS")
    stand_in(slurm_bin, "sbatch", "echo 17")
    stand_in(slurm_bin, "scontrol", "echo 'JobId=17 JobState=FAILED ExitCode=3:0 NodeList=node[1-2]'")
    assert main([*FINETUNE, "--output", str(out)]) == 3
    assert "job 17 ended FAILED (exit 3:0) without a result" in capsys.readouterr().err


def test_a_venv_without_bin_activate_is_refused_before_submitting(tmp_path: Path, slurm_bin: Path, capsys) -> None:
    """Every node would fail at its first line, `source VENV/bin/activate`, once the job had its allocation."""
    stand_in(slurm_bin, "sbatch", f"touch {tmp_path}/submitted; echo 17")
    venv = tmp_path / "venv"
    argv = [*LAUNCH, "--output", str(tmp_path / "run"), "--venv", str(venv)]
    assert main(argv) == 3
    assert f"--venv {venv}: no {venv}/bin/activate there" in capsys.readouterr().err
    assert not (tmp_path / "submitted").exists() and not (tmp_path / "run").exists()
    # --dry-run prints the script, which may be submitted later, once the environment is made.
    assert main([*argv, "--dry-run"]) == 0
    assert f"source {venv}/bin/activate" in capsys.readouterr().out


def test_localize_onto_an_earlier_localize_run_is_refused_before_submitting(
    tmp_path: Path, slurm_bin: Path, capsys
) -> None:
    """The job would have queued for its allocation and then refused the directory (cluster/localize.py)."""
    stand_in(slurm_bin, "sbatch", f"touch {tmp_path}/submitted; echo 17")
    out = tmp_path / "run"
    (out / "pairs").mkdir(parents=True)
    argv = ["launch", "slurm", "localize", "--nodes", "2", "--gpus-per-node", "0", "--profile", "cpu"]
    assert main([*argv, "--output", str(out)]) == 3
    assert f"localize: {out} holds an earlier localize run (pairs/): choose another --output" in capsys.readouterr().err
    assert not (tmp_path / "submitted").exists()


def test_a_failed_job_shows_its_own_logs_not_an_earlier_jobs(tmp_path: Path, slurm_bin: Path, capsys) -> None:
    """An --output used again: an earlier job's logs there (its verdict PASS among them) are no part of why this
    job failed. Its own: the job's log named by its id and the node logs written while it ran."""
    out = tmp_path / "run"
    logs = out / "logs"
    logs.mkdir(parents=True)
    (logs / "gpucert-health-5.out").write_text("the earlier job's own log\n")
    (logs / "node-0-a.log").write_text("earlier node 0: verdict: PASS\n")
    (logs / "node-1-b.log").write_text("earlier node 1: verdict: PASS\n")
    (logs / "rank-1.log").write_text("earlier rank 1\n")
    stand_in(slurm_bin, "sbatch", "echo 17")
    # The job runs while it is followed: node 0's log written again, node 1's never (that node did not start).
    job = f"echo 'this job: node 0 died' > {logs}/node-0-a.log; "
    job += f"echo 'this job: srun failed' > {logs}/gpucert-health-17.out"
    stand_in(slurm_bin, "scontrol", f"{job}; echo 'JobId=17 JobState=FAILED ExitCode=3:0 NodeList=node[1-2]'")
    assert main([*LAUNCH, "--output", str(out)]) == 3
    err = capsys.readouterr().err
    assert "this job: node 0 died" in err and "this job: srun failed" in err, err
    assert "earlier" not in err and "verdict: PASS" not in err, err


def test_a_failed_job_that_wrote_no_log_says_so(tmp_path: Path, slurm_bin: Path, capsys) -> None:
    out = tmp_path / "run"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "node-0-a.log").write_text("earlier node 0: verdict: PASS\n")
    stand_in(slurm_bin, "sbatch", "echo 17")
    stand_in(slurm_bin, "scontrol", "echo 'JobId=17 JobState=FAILED ExitCode=1:0 NodeList=node1'")
    assert main([*LAUNCH, "--output", str(out)]) == 3
    err = capsys.readouterr().err
    assert f"job 17 ended FAILED (exit 1:0) without a result and wrote no log in {out / 'logs'}" in err, err
    assert "verdict: PASS" not in err


@pytest.mark.parametrize(
    "said",
    [
        "sbatch: error: Batch job submission failed: Invalid partition name specified",
        "sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification",
        "sbatch: error: Batch job submission failed: Node count specification invalid",
    ],
)
def test_a_request_slurm_cannot_give_says_where_to_look(tmp_path: Path, slurm_bin: Path, capsys, said: str) -> None:
    stand_in(slurm_bin, "sbatch", f"echo '{said}' >&2; exit 1")
    assert main([*LAUNCH, "--output", str(tmp_path / "run"), "--partition", "gpu"]) == 3
    err = capsys.readouterr().err
    assert said in err and "`sinfo -s` lists the partitions" in err and "gpucert cluster slurm --partition" in err
    stand_in(slurm_bin, "sbatch", "echo 'sbatch: error: Batch job submission failed: Invalid account' >&2; exit 1")
    assert main([*LAUNCH, "--output", str(tmp_path / "run")]) == 3
    assert "sinfo" not in capsys.readouterr().err  # no partition or node count at fault: no advice about them


def test_a_failing_scontrol_is_asked_again_and_the_time_limit_counts_from_the_jobs_start(
    tmp_path: Path, slurm_bin: Path, capsys
) -> None:
    """One failed `scontrol show job` (slurmctld busy) ended the follow with exit 3 while the job ran on; and the
    default limit, the job's --time + 10 min, counted its wait in the queue."""
    calls = tmp_path / "calls"
    stand_in(slurm_bin, "sbatch", "echo 17")
    # Call 1: slurmctld does not answer; 2-3: queued; 4: running; then running for ever.
    stand_in(
        slurm_bin,
        "scontrol",
        f"echo x >> {calls}; n=$(wc -l < {calls}); "
        'if [ "$n" = 1 ]; then echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2; exit 1; fi; '
        'if [ "$n" = 2 ]; then echo "JobId=17 JobState=PENDING Reason=Priority NodeList=(null)"; fi; '
        'if [ "$n" = 3 ]; then echo "JobId=17 JobState=PENDING Reason=ReqNodeNotAvail,_UnavailableNodes:n2"; fi; '
        'if [ "$n" -ge 4 ]; then echo "JobId=17 JobState=RUNNING Reason=None NodeList=n1"; fi',
    )
    from gpucert.launch import slurm

    said: list[str] = []
    with pytest.raises(slurm.SlurmError, match=r"job 17 still RUNNING after 0.2 s \(--time"):
        slurm.follow("17", 30.0, said.append, poll_s=0.05, run_timeout_s=0.2, what="--time + 10 min from its start")
    assert said[0].startswith("job 17: scontrol show: slurm_load_jobs error: Socket timed out")
    # Why a queued job waits is said, and again when it changes (a drained node: ReqNodeNotAvail).
    assert said[1:] == [
        "job 17: PENDING (Priority)",
        "job 17: PENDING (ReqNodeNotAvail,_UnavailableNodes:n2)",
        "job 17: RUNNING on n1",
    ]
    # No scontrol here at all: said at once, not asked again for a day.
    (slurm_bin / "scontrol").unlink()
    monkeypatch_path = os.environ["PATH"]
    os.environ["PATH"] = str(slurm_bin)
    try:
        with pytest.raises(slurm.SlurmError, match="scontrol not found"):
            slurm.follow("17", 30.0, said.append, poll_s=0.05)
    finally:
        os.environ["PATH"] = monkeypatch_path
    # A job slurmctld no longer knows is not asked after.
    stand_in(slurm_bin, "scontrol", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1")
    with pytest.raises(slurm.SlurmError, match="Invalid job id"):
        slurm.follow("17", 30.0, said.append, poll_s=0.05)


def test_a_launch_stopped_while_it_follows_says_which_job_runs_on(tmp_path: Path, slurm_bin: Path) -> None:
    """SIGTERM while the job waited in the queue ended the launch silently (143), the job still queued; Ctrl-C
    said "scancel it" without its id."""
    import signal
    import subprocess
    import sys

    stand_in(slurm_bin, "sbatch", "echo 17")
    stand_in(slurm_bin, "scontrol", "echo 'JobId=17 JobState=PENDING Reason=Resources'")
    argv = [sys.executable, "-m", "gpucert", *LAUNCH, "--output", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    assert proc.stderr is not None
    for line in proc.stderr:
        if "PENDING (Resources)" in line:
            break
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=30) == 143
    assert "gpucert launch: stopped by SIGTERM; job 17 keeps running: scancel 17 to stop it" in rest
