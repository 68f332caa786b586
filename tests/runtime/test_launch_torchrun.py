"""What `gpucert launch torchrun VERB` prints runs as printed: each node's command, started from a shell on two
"nodes" of 127.0.0.1, in both start orders, meets the other and ends with one report (accept) or one trained run
(finetune) naming both nodes."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.conftest import free_port, within
from tests.runtime.test_cluster_runs import clean_env

pytestmark = pytest.mark.slow

TINY = """\
model: {name: tiny, dtype: fp32, attn_implementation: sdpa}
lora: {r: 8, alpha: 16, dropout: 0.0}
data: {max_length: 256, eval_fraction: 0.1, cache_dir: CACHE}
train: {micro_batch: 2, grad_accum: 1, lr: 1.0e-3, max_steps: 4, eval_every: 100000, save_every: 100000,
        parallel: ddp, final_loss_max: 7.9}
"""


def printed_commands(verb: str, *verb_args: str, port: int) -> list[str]:
    """The commands `gpucert launch torchrun` prints, one per node rank, exactly as printed."""
    launch = ["launch", "torchrun", verb, "--nodes", "2", "--head", "127.0.0.1", "--port", str(port)]
    done = subprocess.run(
        [sys.executable, "-m", "gpucert", *launch, "--gpus-per-node", "0", *verb_args],
        capture_output=True,
        text=True,
        check=True,
    )
    commands = [line for line in done.stdout.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, done.stdout
    return commands


def run_in_order(commands: list[str], order: tuple[int, int], tmp_path: Path) -> list[subprocess.Popen[str]]:
    """Each node's command in a shell of its own, the first of `order` started a moment before the other."""
    procs: dict[int, subprocess.Popen[str]] = {}
    for rank in order:
        procs[rank] = subprocess.Popen(
            ["bash", "-c", commands[rank]],
            env=clean_env(TMPDIR=str(tmp_path)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(2)  # the other start order's node is really first
    return [procs[0], procs[1]]


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_launch_torchrun_accept_commands_run_as_printed_in_either_order(order: tuple[int, int], tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--profile", "cpu", "--nproc", "1", "--skip", "burn,p2p,train,collectives", "--output", str(out)]
    commands = printed_commands("accept", *args, port=free_port())
    assert all(shlex.split(c)[:2] == ["gpucert", "accept"] for c in commands)
    procs = run_in_order(commands, order, tmp_path)
    outputs = [p.communicate(timeout=within(240)) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        assert "Traceback" not in err
    host = socket.gethostname()
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["nodes"] == [f"{host}[n0]", f"{host}[n1]"] and report["status"] == "PASS"


def test_launch_torchrun_finetune_commands_run_as_printed(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY.replace("CACHE", str(tmp_path / "cache")))
    out = tmp_path / "ft"
    commands = printed_commands("finetune", "--config", str(config), "--output", str(out), port=free_port())
    procs = run_in_order(commands, (1, 0), tmp_path)
    outputs = [p.communicate(timeout=within(300)) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        assert "Traceback" not in err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["parallel"] == "ddp" and metrics["status"] == "PASS"
