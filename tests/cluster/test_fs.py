"""`gpucert cluster fs`: the judges on made-up measurements, the per-node run with in-memory peers (threads as
nodes: a check that raises leaves nothing behind), and the real two-node Slurm cluster (slow)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpucert.cli import main
from gpucert.cluster import fs_checks
from gpucert.cluster.fs_checks import (
    FsOptions,
    find_mount,
    judge_consistency,
    judge_mounts,
    judge_rate,
    room_problem,
    run_node,
)
from gpucert.config.profiles import load_profile
from gpucert.hardware.mounts import parse_mounts
from gpucert.runtime.errors import RendezvousError
from gpucert.status import Status
from tests.cluster.slurm import SlurmCluster, exit_code, output_of, submit, wait_job

NFS = {"source": "fs1:/export/shared", "target": "/shared", "fstype": "nfs4", "options": ["rw", "vers=4.2"]}


def test_find_mount_takes_the_longest_mount_point_prefix() -> None:
    mounts = parse_mounts(
        "/dev/vda / ext4 rw 0 0\nfs1:/export /shared nfs4 rw,vers=4.2 0 0\n/dev/vdb /sharedx xfs rw 0 0\n"
    )
    found = find_mount(Path("/shared/x/y"), mounts)
    assert found is not None and found.target == "/shared"
    found = find_mount(Path("/sharedx/a"), mounts)
    assert found is not None and found.fstype == "xfs"
    found = find_mount(Path("/home"), mounts)
    assert found is not None and found.target == "/"


def test_the_same_shared_mount_on_every_node_passes() -> None:
    # NFSv4's clientaddr names each client: it differs by design.
    other = {**NFS, "options": ["rw", "vers=4.2", "clientaddr=10.0.0.2"]}
    (result,) = judge_mounts("/shared/x", {"node1": NFS, "node2": other})
    assert result.status is Status.PASS
    assert result.value == "nfs4"


def test_a_mount_that_differs_fails_naming_the_node_and_the_field() -> None:
    other = {**NFS, "options": ["ro", "vers=4.2"]}
    (result,) = judge_mounts("/shared/x", {"node1": NFS, "node2": other, "node3": NFS})
    assert result.status is Status.FAIL
    assert "options 'ro,vers=4.2' on node2" in result.message
    assert "node3" not in result.message.split("found", 1)[1]


def test_a_local_filesystem_on_several_nodes_warns() -> None:
    local = {"source": "/dev/vda", "target": "/", "fstype": "ext4", "options": ["rw"]}
    (result,) = judge_mounts("/scratch", {"node1": local, "node2": local})
    assert result.status is Status.WARN
    assert "not shared? every node sees its own disk" in result.message


def test_an_unreadable_mount_is_error_on_that_node() -> None:
    results = judge_mounts("/shared", {"node1": NFS, "node2": {"error": "could not read /proc/self/mounts"}})
    assert [(r.status, r.node) for r in results] == [(Status.ERROR, "node2"), (Status.SKIP, None)]


def test_a_node_that_does_not_see_the_token_fails_named() -> None:
    seen = {"node1": {"seen": "abc"}, "node2": {"seen": None, "error": "FileNotFoundError: No such file"}}
    renamed = {"node1": {"seen": "abc", "old_exists": False}, "node2": {"seen": "abc", "old_exists": False}}
    results = judge_consistency("abc", seen, renamed)
    assert [(r.node, r.status) for r in results] == [("node1", Status.PASS), ("node2", Status.FAIL)]
    assert "expected node2 to see what node 0 wrote" in results[1].message
    assert "FileNotFoundError" in results[1].message


def test_a_rename_not_seen_fails() -> None:
    seen = {"node1": {"seen": "abc"}, "node2": {"seen": "abc"}}
    renamed = {"node1": {"seen": "abc", "old_exists": False}, "node2": {"seen": None, "old_exists": True}}
    results = judge_consistency("abc", seen, renamed)
    assert results[1].status is Status.FAIL
    assert "the rename" in results[1].message


def test_consistency_on_one_node_is_skip_with_why() -> None:
    (result,) = judge_consistency("abc", {"node1": {"seen": "abc"}}, {"node1": {"seen": "abc"}})
    assert result.status is Status.SKIP
    assert "one node" in result.message


def test_a_rate_without_a_floor_is_shown_not_passed() -> None:
    per_node = {"node1": {"bytes": 2e9, "elapsed_s": 1.0}, "node2": {"bytes": 2e9, "elapsed_s": 2.0}}
    results = judge_rate("fs.write", per_node, "bytes", 1e-9, "GB/s", None, "benchmarks.fs_write_gbps_min", "cpu")
    assert [(r.subject, r.value, r.status) for r in results] == [
        ("node1", 2.0, Status.INFO),
        ("node2", 1.0, Status.INFO),
        ("2 nodes at once", 2.0, Status.INFO),  # 4 GB over the slowest node's 2 s
    ]
    assert "not judged: profile cpu sets no benchmarks.fs_write_gbps_min" in results[0].message


def test_a_rate_below_its_floor_fails_naming_the_node() -> None:
    per_node = {"node1": {"ops": 3000, "elapsed_s": 1.0}, "node2": {"error": "OSError: disk full"}}
    results = judge_rate("fs.metadata", per_node, "ops", 1.0, "ops/s", 5000.0, "benchmarks.x", "site")
    assert [(r.node, r.status) for r in results] == [("node1", Status.FAIL), ("node2", Status.ERROR)]
    assert results[0].message == "expected >= 5000 ops/s, found 3000 ops/s on node1"


# The per-node run with threads as nodes: an in-memory store that behaves like the agent's.


class MemoryPeers:
    def __init__(self, rank: int, nodes: int, shared: dict[str, Any], cond: threading.Condition) -> None:
        self.node_rank, self.num_nodes = rank, nodes
        self.labels = {r: f"node{r + 1}" for r in range(nodes)}
        self.shared, self.cond = shared, cond

    def put(self, key: str, value: Any) -> None:
        with self.cond:
            self.shared[key] = json.loads(json.dumps(value))
            self.cond.notify_all()

    def get(self, key: str, timeout_s: float, what: str) -> Any:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.shared, timeout_s):
                raise RendezvousError(f"{what}: nothing came within {timeout_s:g} s")
            return self.shared[key]

    def barrier(self, name: str, timeout_s: float) -> None:
        self.put(f"barrier/{name}/{self.node_rank}", 1)
        with self.cond:
            keys = [f"barrier/{name}/{r}" for r in range(self.num_nodes)]
            if not self.cond.wait_for(lambda: all(k in self.shared for k in keys), timeout_s):
                raise RendezvousError(f"{name}: late")


RUNTIME = SimpleNamespace(rendezvous_timeout_s=5.0, collective_timeout_s=5.0)


def run_nodes(nodes: int, options: FsOptions) -> tuple[list[Any], list[BaseException]]:
    shared: dict[str, Any] = {}
    cond = threading.Condition()
    answers: list[Any] = [None] * nodes
    errors: list[BaseException] = []

    def node(rank: int) -> None:
        try:
            answers[rank] = run_node(MemoryPeers(rank, nodes, shared, cond), options, RUNTIME)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(r,)) for r in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return answers, errors


def test_two_nodes_in_one_directory_see_each_other_and_leave_nothing(tmp_path: Path) -> None:
    answers, errors = run_nodes(2, FsOptions(tmp_path, metadata_files=20, size_mib=1))
    assert errors == []
    found = answers[0]
    assert answers[1] is None and set(found) == {"node1", "node2"}
    assert found["node2"]["token"]["seen"] == found["node1"]["token"]["seen"]
    assert found["node2"]["write"]["bytes"] == 1024 * 1024
    assert "O_DIRECT" in found["node2"]["read"]["cache"] or "fadvise" in found["node2"]["read"]["cache"]
    # A site profile holds the floors: metadata easily met, a write rate no disk reaches.
    site = tmp_path.parent / f"{tmp_path.name}-site.yaml"
    site.write_text(
        "name: site\ndescription: d\nextends: cpu\nbenchmarks: {fs_metadata_ops_min: 1, fs_write_gbps_min: 1.0e+6}\n"
    )
    results = fs_checks.judge_all(str(tmp_path), found, load_profile(str(site)))
    assert {r.status for r in results if r.name == "fs.consistency"} == {Status.PASS}
    by = {(r.name, r.subject): r for r in results}
    assert by[("fs.metadata", "node1")].status is Status.PASS
    assert by[("fs.write", "node2")].status is Status.FAIL
    assert by[("fs.write", "node2")].threshold_source == "profile site: benchmarks.fs_write_gbps_min"
    assert by[("fs.read", "node1")].status is Status.INFO  # no floor for reads in this profile: shown, not judged
    assert list(tmp_path.iterdir()) == []


def test_a_check_that_raises_is_error_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(directory: Path, files: int) -> dict[str, Any]:
        (directory).mkdir(parents=True, exist_ok=True)
        (directory / "half-done").write_text("x")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fs_checks, "measure_metadata", broken)
    answers, errors = run_nodes(2, FsOptions(tmp_path, metadata_files=20, size_mib=1))
    assert errors == []
    assert "No space left on device" in answers[0]["node2"]["metadata"]["error"]
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_dies_midway_still_removes_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(path: Path, size_bytes: int) -> dict[str, Any]:
        path.write_bytes(b"x" * 1024)
        raise KeyboardInterrupt  # not a check's failure: the run stops, the files still go

    monkeypatch.setattr(fs_checks, "measure_read", interrupted)
    t0 = time.monotonic()
    _, errors = run_nodes(1, FsOptions(tmp_path, metadata_files=5, size_mib=1))
    assert [type(e) for e in errors] == [KeyboardInterrupt]
    assert time.monotonic() - t0 < 10
    assert list(tmp_path.iterdir()) == []


# The real two-node Slurm cluster: one task per node, MASTER_ADDR/MASTER_PORT exported as
# gpucert.launch.slurm renders them (tests/fixtures/launch/accept-2-nodes.sbatch); no --kill-on-bad-exit,
# since a WARN verdict (exit 1) is an expected ending here.

FS_JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=5
set -euo pipefail
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))
export MASTER_ADDR MASTER_PORT
srun --ntasks-per-node=1 {python} -m gpucert cluster fs {shared} --profile cpu \\
  --files 50 --size-mib 2 --set runtime.rendezvous_timeout_s=60 --output {out}
"""


@pytest.mark.slow
def test_cluster_fs_on_two_slurm_nodes_writes_one_report(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    shared, out = tmp_path / "shared", tmp_path / "run"
    shared.mkdir()
    script = FS_JOB.format(python=sys.executable, shared=shared, out=out)
    job = wait_job(submit(script, slurm_cluster.env, workdir=tmp_path), slurm_cluster.env, timeout_s=180)
    # WARN at worst: both slurmd nodes live on this host's local disk.
    assert exit_code(job)[0] in (0, 1), output_of(job)[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["nodes"] == ["node1", "node2"]
    found = {(r["name"], r["node"]): r["status"] for r in report["results"]}
    assert found[("fs.consistency", "node1")] == found[("fs.consistency", "node2")] == "PASS"
    assert {node for name, node in found if name == "fs.write"} == {"node1", "node2", None}
    assert list(shared.iterdir()) == []


def test_a_write_check_larger_than_half_the_free_space_is_refused_before_any_node_writes(tmp_path: Path) -> None:
    """--size-mib 100000000 (95 TiB) ran 217 s filling the root disk every job writes to."""
    free_mib = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize // 2**20
    assert room_problem(FsOptions(tmp_path, 10, 16), 2) is None
    said = room_problem(FsOptions(tmp_path, 10, free_mib), 1)
    assert said is not None and said.startswith(f"--size-mib {free_mib}: 1 node(s) would write "), said
    out = tmp_path / "run"
    assert main(["cluster", "fs", str(tmp_path), "--size-mib", str(free_mib), "-o", str(out)]) == 3
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []


def test_a_failed_write_leaves_the_read_unmeasured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk cut the file short, and its read was timed and shown as the checkpoint's read rate."""

    def short(path: Path, size_bytes: int) -> dict[str, Any]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 4096)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fs_checks, "measure_write", short)
    answers, errors = run_nodes(1, FsOptions(tmp_path, metadata_files=5, size_mib=1))
    assert errors == []
    read = answers[0]["node1"]["read"]
    assert read == {"error": "not measured: the write before it failed (OSError: [Errno 28] No space left on device)"}
