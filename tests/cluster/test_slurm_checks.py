"""What `gpucert health --drain` tells Slurm, on results and on `scontrol` answers (the real daemons take these
same paths in test_slurm_cluster.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucert.cluster.slurm_checks import (
    REASON_CHARS,
    apply_drain,
    drain_reason,
    drain_result,
    parse_gres_gpus,
    run_checks,
)
from gpucert.report.schema import Result
from gpucert.status import Status, worst


def result(name: str, status: Status, message: str = "m") -> Result:
    return Result(name=name, subject="gpu07 GPU 3", status=status, message=message, expected="x")


def test_only_a_fail_drains_and_the_reason_is_one_short_line_naming_the_check() -> None:
    assert drain_reason([result("gpu.idle", Status.WARN), result("gpu.liveness", Status.ERROR)]) is None
    long = "expected 0 uncorrectable ECC errors,\nfound 12 " + "x" * 400
    reason = drain_reason([result("gpu.ecc", Status.FAIL, long), result("gpu.xid", Status.FAIL)])
    assert reason is not None and reason.startswith("gpucert: gpu.ecc gpu07 GPU 3: expected 0 uncorrectable ECC")
    assert "\n" not in reason and len(reason) <= REASON_CHARS and reason.endswith("... (+1 more)")


class Scontrol:
    """Answers as scontrol gave them on the test cluster; records what it was asked."""

    def __init__(self, node_line: str = "", fail: str | None = None) -> None:
        self.node_line, self.fail, self.asked = node_line, fail, []

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[str | None, str | None]:
        self.asked.append(argv)
        if self.fail is not None:
            return None, self.fail
        return (self.node_line if argv[1] == "show" else ""), None


IDLE = "NodeName=gpu07 Arch=x86_64 State=IDLE Partitions=gpu"


def test_a_fail_drains_a_pass_resumes_only_a_drain_of_gpucerts_own() -> None:
    ask = Scontrol(IDLE)
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.FAIL)], 5.0, ask)
    assert ok and said.startswith("drained gpu07: gpucert: gpu.ecc")
    assert ask.asked == [
        ["scontrol", "show", "node", "gpu07", "-o"],
        ["scontrol", "update", "NodeName=gpu07", "State=DRAIN", "Reason=gpucert: gpu.ecc gpu07 GPU 3: m"],
    ]
    ours = (
        "NodeName=gpu07 Arch=x86_64 State=IDLE+DRAIN Partitions=gpu "
        "Reason=gpucert: gpu.ecc gpu07 GPU 3: m [root@2026-11-22T19:40:01]"
    )
    ask = Scontrol(ours)
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.PASS)], 5.0, ask)
    assert ok and said.startswith("resumed gpu07") and ask.asked[-1][-1] == "State=RESUME"
    theirs = ours.replace("gpucert: gpu.ecc gpu07 GPU 3: m", "cable swap")
    ask = Scontrol(theirs)
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.PASS)], 5.0, ask)
    assert ok and "drained by someone else: cable swap" in said and len(ask.asked) == 1


def test_a_drain_scontrol_refuses_is_reported_as_not_done() -> None:
    def refuses(argv: list[str], timeout_s: float) -> tuple[str | None, str | None]:
        return (IDLE, None) if argv[1] == "show" else (None, "Invalid node name")

    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.FAIL)], 5.0, refuses)
    assert not ok and said == "could not drain gpu07: Invalid node name"
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.FAIL)], 5.0, Scontrol(fail="Unable to contact"))
    assert not ok and said == "could not read Slurm node gpu07: Unable to contact"


def test_a_fail_leaves_a_drain_or_down_set_by_someone_else_as_it_is() -> None:
    """An operator's drain overwritten by gpucert's reason would later be resumed as gpucert's own."""
    theirs = IDLE.replace("State=IDLE", "State=IDLE+DRAIN") + " Reason=cable swap [root@2026-11-22T19:40:01]"
    ask = Scontrol(theirs)
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.FAIL)], 5.0, ask)
    assert ok and said == (
        "gpu07 is already drained by someone else (Reason=cable swap, set by root at 2026-11-22T19:40:01): left as "
        "it is; gpucert's FAIL: gpu.ecc gpu07 GPU 3: m"
    )
    assert len(ask.asked) == 1  # read, nothing updated
    down = IDLE.replace("State=IDLE", "State=DOWN") + " Reason=Not responding [slurm@2026-11-22T19:40:01]"
    ask = Scontrol(down)
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.FAIL)], 5.0, ask)
    assert ok and said.startswith("gpu07 is already down by someone else (Reason=Not responding, set by slurm")
    assert len(ask.asked) == 1
    # gpucert's own drain takes the new FAIL's reason (and a fresh count of passes).
    ours = IDLE.replace("State=IDLE", "State=IDLE+DRAIN") + " Reason=gpucert: gpu.xid x [passes 1 of 3] [root@t]"
    ask = Scontrol(ours)
    said, ok = apply_drain("gpu07", [result("gpu.ecc", Status.FAIL)], 5.0, ask)
    assert ok and said.startswith("drained gpu07: gpucert: gpu.ecc") and ask.asked[-1][1] == "update"


def test_a_node_slurm_does_not_know_is_neither_drained_nor_resumed_and_the_fix_names_the_node_flag() -> None:
    """`scontrol update NodeName=vm` of an unknown name can match another node by its host name and drain it."""
    said_by_scontrol = "`scontrol show node` exited 1: Node vm not found"
    for status, left in ((Status.FAIL, "still in service"), (Status.PASS, "whether gpucert drained it before")):
        ask = Scontrol(fail=said_by_scontrol)
        drained = drain_result("vm", [result("gpu.ecc", status)], 5.0, ask, environ={})
        assert drained.status is Status.ERROR and drained.subject == "vm"
        assert drained.message.startswith(f"Slurm knows no node vm ({said_by_scontrol})"), drained.message
        assert "--slurm-node NAME" in (drained.remediation or "") and "SLURMD_NODENAME" in (drained.remediation or "")
        assert [argv[1] for argv in ask.asked] == ["show"] and left in drained.message


def test_an_unreadable_slurm_conf_is_said_at_once_and_nothing_is_asked_of_slurm(tmp_path: Path) -> None:
    """scontrol retries a SLURM_CONF it cannot stat for 60 s in silence, then says only `Unable to process`."""
    for conf, why in ((tmp_path / "nonexistent", "does not exist"), (tmp_path, "is not a file")):
        ask = Scontrol()
        (checked,) = run_checks(None, 1, 0, 64, 5.0, ["gpucert"], ask, environ={"SLURM_CONF": str(conf)})
        assert checked.status is Status.ERROR and f"SLURM_CONF={conf}, which {why}" in checked.message
        assert "point SLURM_CONF at the cluster's slurm.conf" in (checked.remediation or "")
        assert "unset SLURM_CONF" in (checked.remediation or "")
        assert ask.asked == []


def test_health_drain_with_an_unreadable_slurm_conf_asks_nothing_of_slurm(tmp_path: Path) -> None:
    ask = Scontrol(IDLE)
    conf = {"SLURM_CONF": str(tmp_path / "nonexistent")}
    drained = drain_result("gpu07", [result("gpu.ecc", Status.FAIL)], 5.0, ask, environ=conf)
    assert drained.status is Status.ERROR and f"SLURM_CONF={tmp_path / 'nonexistent'}" in drained.message
    assert "still in service" in drained.message and "unset SLURM_CONF" in (drained.remediation or "")
    assert ask.asked == []
    readable = tmp_path / "slurm.conf"
    readable.write_text("ClusterName=c\n")
    drain_result("gpu07", [result("gpu.ecc", Status.FAIL)], 5.0, ask, environ={"SLURM_CONF": str(readable)})
    assert [argv[1] for argv in ask.asked] == ["show", "update"]


def test_cluster_slurm_with_an_unreadable_slurm_conf_exits_3_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpucert.cli import main
    from gpucert.cluster import slurm_checks

    asked: list[list[str]] = []
    monkeypatch.setattr(slurm_checks, "_ask", lambda argv, timeout_s: (asked.append(argv), (None, "not run"))[1])
    monkeypatch.setenv("SLURM_CONF", "/nonexistent")
    code = main(["cluster", "slurm", "--json", "--output", str(tmp_path / "run")])
    report = json.loads(capsys.readouterr().out)
    assert code == 3 and asked == []
    (said,) = report["results"]
    assert said["status"] == "ERROR" and "SLURM_CONF=/nonexistent, which does not exist" in said["message"]


# `scontrol show partition -o` and `scontrol show node -o` from Slurm 22.05.8 on the harness's cluster (cut).
PARTITIONS = (
    "PartitionName=debug AllowGroups=ALL Default=YES QoS=N/A Nodes=node[1-2] OverSubscribe=YES:4 State=UP "
    "TotalCPUs=4 TotalNodes=2 TRES=cpu=4,mem=36156M,node=2,billing=4\n"
)
NODES = "".join(
    f"NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.93 "
    f"AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=vm Port=31232 "
    f"RealMemory=18078 AllocMem=0 FreeMem=21950 State=IDLE Partitions=debug  CfgTRES=cpu=2,mem=18078M,billing=2\n"
    for name in ("node1", "node2")
)
PROBE = '{"node": "node1", "cpus": 2, "cuda_visible_devices": null, "gpus": 0, "memory_limit_bytes": null}'


class Slurm:
    """The answers of a cluster's clients, by command; records every command asked."""

    def __init__(self, partitions: str = PARTITIONS, nodes: str = NODES, sbatch: str | None = "17\n") -> None:
        self.partitions, self.nodes, self.sbatch, self.asked = partitions, nodes, sbatch, []

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[str | None, str | None]:
        self.asked.append(argv)
        if argv[:2] == ["scontrol", "ping"]:
            return "Slurmctld(primary) at vm is UP\n", None
        if argv[:3] == ["scontrol", "show", "partition"]:
            return self.partitions, None
        if argv[:3] == ["scontrol", "show", "node"]:
            return self.nodes, None
        if argv[0] == "srun":
            return PROBE + "\n", None
        if self.sbatch is None:
            return None, "`sbatch --wait --parsable` exited 1: sbatch: error: Batch job submission failed: x"
        return self.sbatch, None

    def submitted(self) -> list[str]:
        return [argv[0] for argv in self.asked if argv[0] in ("srun", "sbatch")]


def checks(ask: Slurm, partition: str | None = None, cpus: int = 1, gpus: int = 0, mem_mb: int = 64) -> list[Result]:
    return run_checks(partition, cpus, gpus, mem_mb, 5.0, ["gpucert"], ask, environ={})


def by_name(results: list[Result]) -> dict[tuple[str, str], Result]:
    return {(r.name, r.subject): r for r in results}


def test_a_partition_the_cluster_does_not_have_is_an_error_listing_those_it_has_and_nothing_is_submitted() -> None:
    ask = Slurm()
    results = checks(ask, partition="gpu", cpus=16, gpus=8, mem_mb=64000)
    unknown = by_name(results)[("slurm.partition", "gpu")]
    assert unknown.status is Status.ERROR and worst(r.status for r in results) is Status.ERROR
    assert "--partition gpu" in unknown.message and "found only: debug (default, UP)" in unknown.message
    assert unknown.remediation is not None and "--partition debug" in unknown.remediation
    # The partitions that do exist are not judged in its place: the run was about gpu.
    assert ("slurm.partition", "debug") not in by_name(results)
    assert ask.submitted() == []


def test_a_named_partition_is_the_one_judged_with_its_nodes_only() -> None:
    two = PARTITIONS + PARTITIONS.replace("debug", "gpu").replace("Default=YES", "Default=NO").replace(
        "node[1-2]", "node3"
    )
    three = NODES + NODES.splitlines()[0].replace("node1", "node3").replace("Partitions=debug", "Partitions=gpu")
    ask = Slurm(two, three)
    found = by_name(checks(ask, partition="gpu"))
    assert {key for key in found if key[0] in ("slurm.partition", "slurm.node")} == {
        ("slurm.partition", "gpu"),
        ("slurm.node", "node3"),
    }
    assert ask.asked[3][5:7] == ["--partition", "gpu"] and ask.submitted() == ["srun", "sbatch"]


def test_a_partition_that_is_not_up_fails_and_gets_no_job_that_would_wait_in_its_queue() -> None:
    ask = Slurm(PARTITIONS.replace("State=UP", "State=DOWN"))
    found = by_name(checks(ask, partition="debug"))
    assert found[("slurm.partition", "debug")].status is Status.FAIL
    assert ask.submitted() == []


def test_gpus_no_node_is_configured_with_are_said_as_such_and_the_step_is_not_run() -> None:
    ask = Slurm()
    results = checks(ask, gpus=8, cpus=16, mem_mb=64000)
    request = by_name(results)[("slurm.request", "debug")]
    assert request.status is Status.ERROR
    assert "--gpus 8: no GPU is configured in Slurm on any of its nodes" in request.message
    assert "--cpus 16: its nodes have at most 2 CPUs" in request.message
    assert "--mem 64000: its nodes have at most 18078 MB" in request.message
    assert request.remediation is not None and "--cpus 2 --mem 18078 --gpus 0" in request.remediation
    # The batch job asks for none of it: it still says whether sbatch works.
    assert ask.submitted() == ["sbatch"] and by_name(results)[("slurm.sbatch", "sbatch --wait")].status is Status.PASS


def test_gpus_in_gres_are_counted_and_a_request_within_them_is_run() -> None:
    assert parse_gres_gpus("gpu:h100:8(S:0-1)") == 8
    assert parse_gres_gpus("gpu:a100:4(S:0),gpu:v100:2,shard:8") == 6
    assert parse_gres_gpus("(null)") == parse_gres_gpus(None) == 0
    ask = Slurm(nodes=NODES.replace("Gres=(null)", "Gres=gpu:2"))
    assert ("slurm.request", "debug") not in by_name(checks(ask, gpus=2))
    assert ask.submitted() == ["srun", "sbatch"] and "--gpus-per-node=2" in ask.asked[3]
    too_many = by_name(checks(Slurm(nodes=NODES.replace("Gres=(null)", "Gres=gpu:2")), gpus=8))
    assert "--gpus 8: its nodes give at most 2 GPUs" in too_many[("slurm.request", "debug")].message


def test_a_job_its_client_gave_up_on_is_cancelled_by_its_name_and_a_finished_one_is_not() -> None:
    """srun or sbatch killed at --timeout leaves its job queued (a partition whose nodes are all busy): it ran
    later, on a cluster the check had left."""
    ask = Slurm(sbatch=None)
    checks(ask)
    [sbatch] = [argv for argv in ask.asked if argv[0] == "sbatch"]
    [name] = [a for a in sbatch if a.startswith("--job-name=gpucert-check-")]
    assert [argv for argv in ask.asked if argv[0] == "scancel"] == [["scancel", name.replace("--job-name", "--name")]]
    assert name in next(argv for argv in ask.asked if argv[0] == "srun")
    ask = Slurm()
    checks(ask)
    assert [argv[0] for argv in ask.asked if argv[0] == "scancel"] == []


def test_no_message_says_none() -> None:
    results = checks(Slurm(sbatch=None))
    sbatch = by_name(results)[("slurm.sbatch", "sbatch --wait")]
    assert sbatch.status is Status.FAIL and sbatch.message.startswith("a one-line batch job did not run: `sbatch")
    bare = "NodeName=node1 State=IDLE Partitions=debug\n"
    results = checks(Slurm(PARTITIONS.replace(" State=UP", ""), bare))
    assert not [r.message for r in results if "None" in r.message]


def test_a_host_without_slurm_configuration_is_told_to_run_on_a_login_node_or_set_slurm_conf() -> None:
    """scontrol's own words (a failed DNS SRV lookup) were the whole message, with nothing to do."""
    from gpucert.cluster.slurm_checks import judge_controller

    no_config = (
        "`scontrol ping` exited 1: scontrol: error: fetch_config: DNS SRV lookup failed; scontrol: fatal: Could not "
        "establish a configuration source"
    )
    result = judge_controller(None, no_config)
    assert result.status is Status.ERROR and "SLURM_CONF" in (result.remediation or "")
    # SLURM_CONF naming a file that is not there, after scontrol's 60 s of retries.
    unstated = (
        "`scontrol ping` exited 1: scontrol: error: s_p_parse_file: cannot stat file /nonexistent: No such file or "
        "directory, retrying in 1sec up to 60sec; scontrol: fatal: Unable to process configuration file"
    )
    assert "SLURM_CONF" in (judge_controller(None, unstated).remediation or "")
    down = judge_controller(None, "slurm_load_ctl_conf error: Unable to contact slurm controller")
    assert "slurmctld runs and answers" in (down.remediation or "")


@pytest.mark.parametrize(
    ("state", "usable"),
    [
        ("IDLE", True),
        ("MIXED+COMPLETING", True),
        ("ALLOCATED+PLANNED", True),
        ("IDLE+DRAIN", False),
        ("DOWN", False),
        ("FUTURE", False),  # declared in slurm.conf, not yet in service
        ("UNKNOWN", False),
        ("IDLE*", False),  # an older Slurm's mark of a node that does not answer
        ("DOWN*+DRAIN", False),
        ("IDLE+NOT_RESPONDING", False),
        ("COMPLETING", True),  # an older Slurm's base state for a node whose job is ending
        ("IDLE-", True),  # planned for a job
        ("IDLE~", False),  # powered down
        ("IDLE#", False),  # powering up
    ],
)
def test_a_node_passes_only_in_a_state_that_takes_jobs(state: str, usable: bool) -> None:
    """The result's own expected is "IDLE, MIXED or ALLOCATED": a state outside it (FUTURE, UNKNOWN, DOWN*) is
    not a usable node, though no bad flag is joined to it."""
    from gpucert.cluster.slurm_checks import judge_nodes, parse_nodes

    (node,) = judge_nodes(parse_nodes(IDLE.replace("State=IDLE", f"State={state}")))
    assert node.status is (Status.PASS if usable else Status.FAIL), node.message
    if not usable:
        assert node.message.startswith(f"expected a usable node, found gpu07 {state}")


def test_the_memory_limit_is_the_smallest_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    """Slurm's cgroup v2 plugin sets the job's limit on job_N and runs the task in job_N/step_0/user/task_0, whose
    own memory.max is "max": reading only the task's cgroup said Slurm enforced no --mem."""
    from gpucert.cluster.slurm_checks import cgroup_memory_limit

    task = "system.slice/slurmstepd.scope/job_42/step_0/user/task_0"
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(f"0::/{task}\n")
    cgroup = tmp_path / "sys/fs/cgroup"
    for level, value in [
        ("", None),
        ("system.slice", "max"),
        ("system.slice/slurmstepd.scope", "max"),
        ("system.slice/slurmstepd.scope/job_42", str(1000 << 20)),
        ("system.slice/slurmstepd.scope/job_42/step_0", str(2000 << 20)),
        ("system.slice/slurmstepd.scope/job_42/step_0/user", "max"),
        (task, "max"),
    ]:
        (cgroup / level).mkdir(parents=True, exist_ok=True)
        if value is not None:
            (cgroup / level / "memory.max").write_text(f"{value}\n")
    assert cgroup_memory_limit(tmp_path) == 1000 << 20
    (cgroup / "system.slice/slurmstepd.scope/job_42/memory.max").write_text("max\n")
    assert cgroup_memory_limit(tmp_path) == 2000 << 20
    (cgroup / "system.slice/slurmstepd.scope/job_42/step_0/memory.max").write_text("max\n")
    assert cgroup_memory_limit(tmp_path) is None
