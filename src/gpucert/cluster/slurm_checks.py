"""`gpucert cluster slurm`: does Slurm work, and does a job get what it asks for? Judged like any report.

Collect (scontrol, sinfo, srun, sbatch), parse (pure: the text those print), judge (pure):
- the controller answers `scontrol ping`;
- the partition the jobs go to (`--partition`, else every partition) is UP and every node of it is usable (a
  drained, down or failing node FAILs with its reason); a `--partition` the cluster does not have is an ERROR
  naming the partitions it has, and nothing is submitted to it;
- what the probe asks for (CPUs, GPUs, memory) is what some node of the partition is configured with; a request
  no node can give is an ERROR saying which (no GPUs in Slurm at all is named as such) and the step is not run;
- a one-node step with `--cpus-per-task`, `--mem` and `--gpus-per-node` gets them: the probe it runs
  (`gpucert cluster slurm --probe`) reports its CPU affinity, CUDA_VISIBLE_DEVICES and cgroup memory limit;
- `sbatch --wait` runs a batch job to completion.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucert.report.schema import Result
from gpucert.status import Status

# A node takes jobs only in one of these base states (the first word of scontrol's State=); FUTURE, UNKNOWN,
# DOWN, ERROR and any state a later Slurm adds do not. COMPLETING: an older Slurm's base state for a node whose job
# is ending (a later one writes +COMPLETING), which takes the next job once it has.
USABLE_BASE_STATES = ("IDLE", "MIXED", "ALLOCATED", "COMPLETING")
# The one-character marks older Slurm (and sinfo) put after a state (sinfo(1) "NODE STATE CODES"), as the flag each
# stands for; '-' (planned for a job) keeps a node usable.
STATE_MARKS = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "!": "POWER_DOWN",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "$": "MAINT",
    "-": "PLANNED",
}
# Flags (joined to the base state with '+') that keep a node in a usable base state from taking jobs (sinfo(1)
# "NODE STATE CODES").
BAD_NODE_STATES = (
    "DOWN",
    "DRAIN",
    "FAIL",
    "NOT_RESPONDING",
    "INVALID",
    "MAINT",
    "REBOOT_REQUESTED",
    "REBOOT_ISSUED",
    "POWERED_DOWN",
    "POWERING_UP",
    "POWERING_DOWN",
    "POWER_DOWN",
)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str
    reason: str | None
    partitions: str | None
    cpus: int | None
    memory_mb: int | None
    # GPUs Slurm can give on this node (its Gres= line); 0 where none are configured (`Gres=(null)`).
    gpus: int = 0

    def in_partition(self, partition: str) -> bool:
        return partition in (self.partitions or "").split(",")


def _fields(line: str) -> dict[str, str]:
    """One `scontrol show ... -o` line as Key=Value pairs; Reason (free text, last) is kept whole."""
    line, _, reason = line.partition(" Reason=")
    fields = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    if reason:
        fields["Reason"] = reason.strip()
    return fields


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


# One gpu entry of a Gres= line: `gpu:2`, `gpu:h100:8(S:0-1)`; the count is the last field before any socket list.
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[\w.-]+)?:(\d+)")


def parse_gres_gpus(gres: str | None) -> int:
    """The GPUs a node's Gres= field gives (`gpu:a100:4(S:0),gpu:v100:2` gives 6); 0 for `(null)` or none."""
    return sum(int(n) for n in _GPU_GRES.findall(gres or ""))


def parse_nodes(text: str) -> list[SlurmNode]:
    nodes = []
    for line in text.splitlines():
        f = _fields(line)
        if "NodeName" in f:
            nodes.append(
                SlurmNode(
                    name=f["NodeName"],
                    state=f.get("State", "UNKNOWN"),
                    reason=f.get("Reason") or None,
                    partitions=f.get("Partitions"),
                    cpus=_int(f.get("CPUTot")),
                    memory_mb=_int(f.get("RealMemory")),
                    gpus=parse_gres_gpus(f.get("Gres")),
                )
            )
    return nodes


def parse_partitions(text: str) -> list[dict[str, str]]:
    return [f for f in (_fields(line) for line in text.splitlines()) if "PartitionName" in f]


def judge_controller(ping: str | None, error: str | None) -> Result:
    base: dict[str, Any] = dict(name="slurm.controller", subject="slurmctld", category="cluster")
    if ping is None:
        said = error or ""
        config_said = ("configuration source", "fetch_config", "slurm.conf", "cannot stat file", "Unable to process")
        if any(words in said for words in config_said):
            # scontrol found no slurm.conf and no DNS SRV record for slurmctld: this host is not set up as a
            # client of the cluster, whatever slurmctld's state.
            fix = (
                "this host has no Slurm configuration: run on a login node of the cluster, or point SLURM_CONF at "
                "the cluster's slurm.conf (export SLURM_CONF=/etc/slurm/slurm.conf)"
            )
        else:
            fix = "check that slurmctld runs and answers from this host (`scontrol ping`), then rerun"
        return Result(**base, status=Status.ERROR, message=f"could not ask the controller: {error}", remediation=fix)
    up = re.search(r"is UP", ping) is not None
    return Result(
        **base,
        status=Status.PASS if up else Status.FAIL,
        expected="UP",
        threshold_source="fixed: the controller answers",
        message=ping.strip().splitlines()[0] if ping.strip() else "no answer",
        remediation=None if up else "start slurmctld (systemctl start slurmctld) and check its log",
    )


def slurm_conf_unreadable(environ: Mapping[str, str] | None = None) -> Result | None:
    """An ERROR when SLURM_CONF is set and names no file this process can read, else None. Said before any
    scontrol: scontrol retries such a file for 60 s in silence, then says only that it could not process it."""
    path = (os.environ if environ is None else environ).get("SLURM_CONF")
    if not path or (os.path.isfile(path) and os.access(path, os.R_OK)):
        return None
    why = "is not readable" if os.path.isfile(path) else "is not a file" if os.path.exists(path) else "does not exist"
    return Result(
        name="slurm.controller",
        subject="slurmctld",
        category="cluster",
        status=Status.ERROR,
        expected="SLURM_CONF names a readable slurm.conf",
        message=f"expected SLURM_CONF to name this cluster's slurm.conf, found SLURM_CONF={path}, which {why}: "
        "no Slurm command can run; nothing was asked of Slurm",
        remediation="point SLURM_CONF at the cluster's slurm.conf (export SLURM_CONF=/etc/slurm/slurm.conf), or "
        "unset it (unset SLURM_CONF) for Slurm's default",
    )


def judge_partitions(partitions: list[dict[str, str]]) -> list[Result]:
    results = []
    for p in partitions:
        state = p.get("State", "of unknown state")
        up = state == "UP"
        results.append(
            Result(
                name="slurm.partition",
                subject=p["PartitionName"],
                category="cluster",
                status=Status.PASS if up else Status.FAIL,
                value=state,
                expected="UP",
                threshold_source="fixed: a partition takes jobs",
                message=f"partition {p['PartitionName']} is {state} (nodes {p.get('Nodes', 'none')})",
                remediation=None if up else f"scontrol update PartitionName={p['PartitionName']} State=UP",
            )
        )
    return results


def _partition_list(partitions: list[dict[str, str]]) -> str:
    """`debug (default, UP), gpu (DOWN)`: what a user can pass to --partition."""
    said = []
    for p in partitions:
        notes = (["default"] if p.get("Default") == "YES" else []) + [p.get("State", "state unknown")]
        said.append(f"{p['PartitionName']} ({', '.join(notes)})")
    return ", ".join(said) or "none"


def judge_unknown_partition(name: str, partitions: list[dict[str, str]]) -> Result:
    """--partition names no partition of this cluster: a command-line mistake (ERROR), said before any job."""
    names = [p["PartitionName"] for p in partitions]
    return Result(
        name="slurm.partition",
        subject=name,
        category="cluster",
        status=Status.ERROR,
        expected="a partition of this cluster",
        threshold_source="--partition",
        message=f"expected --partition {name} to be a partition of this cluster, found only: "
        f"{_partition_list(partitions)}; no job was submitted",
        remediation=(f"pass --partition {' or '.join(names)}" if names else "define a partition in slurm.conf")
        + ", or leave --partition out for the default partition",
    )


def choose_partition(partitions: list[dict[str, str]], name: str | None) -> dict[str, str] | None:
    """The partition the test jobs go to: the one named, else the default (Default=YES); None if there is none."""
    for p in partitions:
        if (p["PartitionName"] == name) if name is not None else p.get("Default") == "YES":
            return p
    return None


def judge_request(partition: str, nodes: list[SlurmNode], cpus: int, gpus: int, mem_mb: int) -> Result | None:
    """What the probe step asks for against what the partition's nodes are configured with: None when some node
    has each, else an ERROR naming what no node can give. Slurm would refuse the step (`Invalid generic resource
    (gres) specification`, `Requested node configuration is not available`), which says the request is wrong but
    not that the cluster has no GPUs in Slurm at all, nor which figure is too big."""
    if not nodes:
        return Result(
            name="slurm.request",
            subject=partition,
            category="cluster",
            status=Status.ERROR,
            expected="a node in the partition",
            message=f"partition {partition} has no nodes: no job can run there",
            remediation=f"add nodes to partition {partition} (its Nodes= in slurm.conf) or pass another --partition",
        )
    most_cpus = max(n.cpus or 0 for n in nodes)
    most_mem = max(n.memory_mb or 0 for n in nodes)
    most_gpus = max(n.gpus for n in nodes)
    short, fix = [], []
    if most_cpus < cpus:
        short.append(f"--cpus {cpus}: its nodes have at most {most_cpus} CPUs")
        fix.append(f"--cpus {max(most_cpus, 1)}")
    if most_mem < mem_mb:
        short.append(f"--mem {mem_mb}: its nodes have at most {most_mem} MB (RealMemory)")
        fix.append(f"--mem {max(most_mem, 1)}")
    if most_gpus < gpus:
        short.append(
            f"--gpus {gpus}: no GPU is configured in Slurm on any of its nodes (Gres=(null): no GresTypes=gpu and "
            "Gres=gpu:N), so Slurm cannot schedule GPUs there"
            if most_gpus == 0
            else f"--gpus {gpus}: its nodes give at most {most_gpus} GPUs (Gres=gpu:{most_gpus})"
        )
        fix.append(f"--gpus {most_gpus}")
    if not short:
        return None
    names = ", ".join(n.name for n in nodes)
    return Result(
        name="slurm.request",
        subject=partition,
        category="cluster",
        status=Status.ERROR,
        value=f"{most_cpus} CPUs, {most_gpus} GPUs, {most_mem} MB",
        expected=f"{cpus} CPUs, {gpus} GPUs, {mem_mb} MB on one node",
        threshold_source="--cpus, --gpus, --mem",
        message=f"no node of partition {partition} ({names}) can give what the probe step asks for: "
        + "; ".join(short)
        + "; the step was not submitted",
        remediation=f"ask for what a node has ({' '.join(fix)}), or, if the nodes have more, declare it in "
        "slurm.conf (the node's CPUs=, RealMemory=, Gres=gpu:N with GresTypes=gpu, and gres.conf) and "
        "`scontrol reconfigure`",
    )


def _count(value: int | None, unit: str) -> str:
    return f"{value} {unit}" if value is not None else f"{unit} unknown"


def judge_nodes(nodes: list[SlurmNode]) -> list[Result]:
    results = []
    for n in nodes:
        base, *rest = n.state.split("+")
        flags = set(rest)
        # An older Slurm marks a node that does not answer with a '*' after its state (IDLE*, DOWN*), one powered
        # down with '~', and so on (STATE_MARKS).
        while base and base[-1] in STATE_MARKS:
            flags.add(STATE_MARKS[base[-1]])
            base = base[:-1]
        bad = sorted(flags & set(BAD_NODE_STATES)) or (["DRAINING"] if "DRAINING" in n.state else [])
        if base not in USABLE_BASE_STATES:
            bad = [base, *bad]
        reason = f" (reason: {n.reason})" if n.reason else ""
        results.append(
            Result(
                name="slurm.node",
                subject=n.name,
                node=n.name,
                category="cluster",
                status=Status.FAIL if bad else Status.PASS,
                value=n.state,
                expected="IDLE, MIXED or ALLOCATED",
                threshold_source="fixed: a node takes jobs",
                message=f"expected a usable node, found {n.name} {n.state}{reason}"
                if bad
                else f"{n.name} {n.state}, {_count(n.cpus, 'CPUs')}, {_count(n.memory_mb, 'MB')}, "
                f"{n.gpus} GPUs in Slurm, partitions {n.partitions or 'none'}",
                remediation=f"fix what the reason says, then scontrol update NodeName={n.name} State=RESUME"
                if bad
                else None,
            )
        )
    return results


# The probe: what a task sees of the resources its step was given.


def probe(environ: dict[str, str] | None = None, root: Path = Path("/")) -> dict[str, Any]:
    """Run inside the step: CPU affinity, visible GPUs, the cgroup memory limit and the Slurm view."""
    env = dict(os.environ if environ is None else environ)
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    return {
        "node": env.get("SLURMD_NODENAME"),
        "cpus": len(os.sched_getaffinity(0)),
        "cuda_visible_devices": cvd,
        "gpus": len([d for d in cvd.split(",") if d.strip()]) if cvd else 0,
        "memory_limit_bytes": cgroup_memory_limit(root),
        "slurm_cpus_per_task": env.get("SLURM_CPUS_PER_TASK"),
        "slurm_mem_per_node": env.get("SLURM_MEM_PER_NODE"),
    }


def cgroup_memory_limit(root: Path = Path("/")) -> int | None:
    """The memory limit this process runs under: the smallest of its cgroup's and every ancestor's (v2
    memory.max, v1 memory.limit_in_bytes); None if none sets one.

    The ancestors count: Slurm's cgroup v2 plugin puts the job's limit on job_N (and the step's on step_N) while
    the task runs in a child (job_N/step_0/user/task_0) whose own memory.max is "max"."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for base, name in (("sys/fs/cgroup", "memory.max"), ("sys/fs/cgroup/memory", "memory.limit_in_bytes")):
            if controllers in ("", "memory") or "memory" in controllers.split(","):
                directory = root / base / path.lstrip("/")
                for level in (directory, *directory.parents):
                    try:
                        value = (level / name).read_text().strip()
                    except OSError:
                        value = ""
                    # "max" (v2) or a near-2^63 number (v1) mean no limit.
                    if value.isdigit() and int(value) < 1 << 60:
                        limits.append(int(value))
                    if level == root / base:
                        break
    return min(limits, default=None)


def judge_probe(seen: dict[str, Any] | None, error: str | None, cpus: int, gpus: int, mem_mb: int) -> list[Result]:
    base: dict[str, Any] = dict(category="cluster", subject=(seen or {}).get("node") or "srun step")
    if seen is None:
        return [
            Result(
                name="slurm.srun",
                **base,
                status=Status.FAIL,
                message=f"a one-node step did not run the probe: {error}",
                remediation="run `srun -N1 hostname` by hand; check slurmd's log on the node it chose",
            )
        ]
    results = [
        Result(
            name="slurm.srun",
            **base,
            status=Status.PASS,
            expected="the probe step runs",
            threshold_source="fixed: a one-node step must run",
            message="a one-node step ran the probe",
        )
    ]
    results.append(
        Result(
            name="slurm.job.cpus",
            **base,
            status=Status.PASS if seen["cpus"] >= cpus else Status.FAIL,
            value=seen["cpus"],
            unit="CPUs",
            expected=f">= {cpus}",
            threshold_source="the probe's --cpus-per-task",
            message=f"expected >= {cpus} CPUs in the task's affinity, found {seen['cpus']}",
        )
    )
    results.append(
        Result(
            name="slurm.job.gpus",
            **base,
            status=Status.PASS if seen["gpus"] == gpus else Status.FAIL,
            value=seen["gpus"],
            unit="GPUs",
            expected=f"{gpus}",
            threshold_source="the probe's --gpus-per-node",
            message=f"expected {gpus} GPUs in CUDA_VISIBLE_DEVICES, found {seen['gpus']} "
            + (f"({seen['cuda_visible_devices']!r})" if seen["cuda_visible_devices"] is not None else "(unset)"),
            remediation=None if seen["gpus"] == gpus else "check GresTypes, gres.conf and the node's Gres= line",
        )
    )
    limit = seen.get("memory_limit_bytes")
    if limit is None:
        results.append(
            Result(
                name="slurm.job.memory",
                **base,
                status=Status.SKIP,
                message="no cgroup memory limit visible to the task (TaskPlugin without cgroup, or cgroup v1 "
                "memory not delegated): Slurm does not enforce --mem here",
            )
        )
    else:
        want = mem_mb * (1 << 20)
        ok = want <= limit <= want * 1.1
        results.append(
            Result(
                name="slurm.job.memory",
                **base,
                status=Status.PASS if ok else Status.FAIL,
                value=round(limit / (1 << 20)),
                unit="MB",
                expected=f"{mem_mb} MB (to +10 %)",
                threshold_source="the probe's --mem",
                message=f"expected a {mem_mb} MB cgroup limit, found {limit / (1 << 20):.0f} MB",
            )
        )
    return results


def judge_sbatch(state: str | None, error: str | None) -> Result:
    ok = state == "COMPLETED"
    return Result(
        name="slurm.sbatch",
        subject="sbatch --wait",
        category="cluster",
        status=Status.PASS if ok else Status.FAIL,
        value=state,
        expected="COMPLETED",
        threshold_source="fixed: a one-line batch job completes",
        message="a one-line batch job completed"
        if ok
        else (f"a one-line batch job ended {state}" if state else "a one-line batch job did not run")
        + (f": {error}" if error else ""),
    )


# Collect: the commands, each bounded.


def _ask(argv: list[str], timeout_s: float) -> tuple[str | None, str | None]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return None, f"{argv[0]} not found (is slurm-client installed?)"
    except subprocess.TimeoutExpired:
        return None, f"`{' '.join(argv)}` gave no answer within {timeout_s:g} s"
    if done.returncode != 0:
        # One line: Slurm's clients say one error over several (`error: ...` then `submission failed: ...`).
        said = "; ".join(line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip())
        return None, f"`{' '.join(argv[:3])}` exited {done.returncode}: {said[:300]}"
    return done.stdout, None


def run_checks(
    partition: str | None,
    cpus: int,
    gpus: int,
    mem_mb: int,
    timeout_s: float,
    gpucert_argv: list[str],
    ask: Any = None,
    environ: Mapping[str, str] | None = None,
) -> list[Result]:
    """The checks in order; each job check runs only where its failure would say something new: nothing is
    submitted to a partition that does not exist or is not UP, and no step asks for what no node has."""
    ask = ask or _ask
    unreadable = slurm_conf_unreadable(environ)
    if unreadable is not None:
        return [unreadable]
    ping, error = ask(["scontrol", "ping"], timeout_s)
    results = [judge_controller(ping, error)]
    if ping is None:
        return results
    parts_text, error = ask(["scontrol", "show", "partition", "-o"], timeout_s)
    nodes_text, nodes_error = ask(["scontrol", "show", "node", "-o"], timeout_s)
    for text, what, said in ((parts_text, "partition", error), (nodes_text, "node", nodes_error)):
        if text is None:
            unread = Result(
                name=f"slurm.{what}",
                subject="scontrol",
                category="cluster",
                status=Status.ERROR,
                message=f"could not read the cluster's {what}s: {said}",
                remediation="check that this host's slurm.conf (SLURM_CONF) is the cluster's and slurmctld answers",
            )
            return [*results, unread]
    assert parts_text is not None and nodes_text is not None
    partitions, nodes = parse_partitions(parts_text), parse_nodes(nodes_text)
    chosen = choose_partition(partitions, partition)
    if partition is not None and chosen is None:
        return [*results, judge_unknown_partition(partition, partitions)]
    if partition is not None and chosen is not None:
        partitions, nodes = [chosen], [n for n in nodes if n.in_partition(partition)]
    results += judge_partitions(partitions)
    results += judge_nodes(nodes)
    if chosen is not None and chosen.get("State") != "UP":
        # A job there would wait in the queue until --timeout and stay queued after: the FAIL above says why.
        return results
    where = ["--partition", partition] if partition else []
    # Its jobs carry a name of their own: one its client gave up on (the timeout) is still queued or running,
    # and would run later on a cluster the run has left; it is cancelled by that name.
    job_name = f"gpucert-check-{secrets.token_hex(4)}"
    failed = False
    request = None
    if chosen is not None:
        name = chosen["PartitionName"]
        request = judge_request(name, [n for n in nodes if n.in_partition(name)], cpus, gpus, mem_mb)
    if request is not None:
        results.append(request)
    else:
        step = ["srun", "-N1", "-n1", f"--cpus-per-task={cpus}", f"--mem={mem_mb}M", *where, f"--job-name={job_name}"]
        step += [f"--gpus-per-node={gpus}"] if gpus else []
        out, error = ask([*step, *gpucert_argv, "cluster", "slurm", "--probe"], timeout_s)
        failed = out is None
        seen = None
        if out is not None:
            try:
                seen = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                error = f"the probe printed no JSON: {out[-300:]!r}"
        results += judge_probe(seen, error, cpus, gpus, mem_mb)
    wait = ["sbatch", "--wait", "--parsable", "-N1", "-n1", *where, f"--job-name={job_name}", "--output=/dev/null"]
    wait += ["--wrap", "true"]
    out, error = ask(wait, timeout_s)
    results.append(judge_sbatch("COMPLETED" if out is not None else None, error))
    if failed or out is None:
        ask(["scancel", f"--name={job_name}"], timeout_s)
    return results


# `gpucert health --drain`: Slurm's HealthCheckProgram (or a prolog) that drains a failing node.

DRAIN_PREFIX = "gpucert: "
# Slurm keeps the reason whole, but sinfo -R and most dashboards show a line: keep it one, and short.
REASON_CHARS = 200


def drain_reason(results: list[Result]) -> str | None:
    """The reason a FAIL verdict drains the node with: the first failing check, named. WARN and ERROR drain
    nothing (ERROR means the check could not run: investigate, do not take the node away)."""
    failed = [r for r in results if r.status is Status.FAIL]
    if not failed:
        return None
    first = failed[0]
    more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
    text = " ".join(f"{DRAIN_PREFIX}{first.name} {first.subject}: {first.message}".split())
    if len(text) + len(more) > REASON_CHARS:
        text = text[: REASON_CHARS - len(more) - 3] + "..."
    return text + more


# How many consecutive passing runs a gpucert drain has seen is kept in its reason (`gpucert: gpu.ecc ... [passes
# 1 of 3]`): where operators look (sinfo -R), and surviving any restart of gpucert or of the node.
_PASSES = re.compile(r" \[passes (\d+) of \d+\]$")
# What `scontrol show node` appends to a reason: who set it and when (` [root@2026-11-22T19:40:01]`).
_SET_BY = re.compile(r" \[[^\[\]@ ]+@[^\[\] ]+\]$")


def passes_so_far(reason: str) -> tuple[str, int]:
    """(the drain reason as gpucert set it, the consecutive passes counted in it) from scontrol's Reason."""
    reason = _SET_BY.sub("", reason)
    match = _PASSES.search(reason)
    return (reason[: match.start()], int(match.group(1))) if match else (reason, 0)


def _set_by(reason: str) -> str:
    """`cable swap, set by root at 2026-11-22T19:40:01` from scontrol's `cable swap [root@2026-11-22T19:40:01]`."""
    match = _SET_BY.search(reason)
    if match is None:
        return reason
    who, _, when = match.group(0).strip(" []").partition("@")
    return f"{reason[: match.start()]}, set by {who} at {when}"


# Said when scontrol has no node of that name; drain_result then says how to name the node.
UNKNOWN_NODE = "Slurm knows no node"


def _out_of_service(state: str) -> str | None:
    """How a node Slurm keeps from jobs is said (`drained`, `down`), None for a node that takes jobs."""
    flags = set(state.split("+"))
    if "DRAIN" in state:
        return "drained"
    if flags & {"DOWN", "FAIL"}:
        return "down"
    return None


def apply_drain(
    node: str, results: list[Result], timeout_s: float, ask: Any = None, resume_after: int = 1
) -> tuple[str, bool]:
    """Drain `node` on a FAIL (a drain of gpucert's own restarts its count); resume it when gpucert drained it
    (reason starting `gpucert: `) and `resume_after` consecutive runs have passed, each pass before the last
    counted in the reason; a run with an ERROR (a check that could not run) is no pass and changes nothing. A
    drain (or down) set by anyone else is left alone, on a FAIL too. (what was done, succeeded)"""
    ask = ask or _ask
    reason = drain_reason(results)
    # Read the node before changing it, on a FAIL as on a pass: an operator's drain must keep its reason, or a
    # later pass would take it for gpucert's and resume it; and `scontrol update NodeName=` of a name Slurm does
    # not have can match another node by its host name and drain that one.
    out, error = ask(["scontrol", "show", "node", node, "-o"], timeout_s)
    if error is not None or out is None:
        if error is not None and re.search(rf"Node {re.escape(node)} not found", error):
            return f"{UNKNOWN_NODE} {node} ({error})", False
        return f"could not read Slurm node {node}: {error}", False
    found = parse_nodes(out)
    if not found:
        return f"{UNKNOWN_NODE} {node}", False
    state, was = found[0].state, found[0].reason or ""
    held = _out_of_service(state)
    if reason is not None:
        if held is not None and not was.startswith(DRAIN_PREFIX):
            return (
                f"{node} is already {held} by someone else (Reason={_set_by(was) or 'none'}): left as it is; "
                f"gpucert's FAIL: {reason.removeprefix(DRAIN_PREFIX)}"
            ), True
        _, error = ask(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], timeout_s)
        if error is not None:
            return f"could not drain {node}: {error}", False
        return f"drained {node}: {reason}", True
    if "DRAIN" in state and was.startswith(DRAIN_PREFIX):
        base, passes = passes_so_far(was)
        if any(r.status is Status.ERROR for r in results):
            return f"{node} stays drained: a check could not run, which is no pass ({base})", True
        passes += 1
        if passes < resume_after:
            counted = f"{base} [passes {passes} of {resume_after}]"
            _, error = ask(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={counted}"], timeout_s)
            if error is not None:
                return f"could not count the pass on {node}: {error}", False
            return f"{node} stays drained: its checks pass, {passes} of {resume_after} runs in a row ({base})", True
        _, error = ask(["scontrol", "update", f"NodeName={node}", "State=RESUME"], timeout_s)
        if error is not None:
            return f"could not resume {node}: {error}", False
        return f"resumed {node}: its checks pass now (gpucert had drained it: {was})", True
    return f"{node} left {state}: nothing failed" + (
        f" (drained by someone else: {was})" if "DRAIN" in state else ""
    ), True


def drain_result(
    node: str,
    results: list[Result],
    timeout_s: float,
    ask: Any = None,
    resume_after: int = 1,
    environ: Mapping[str, str] | None = None,
) -> Result:
    """What `health --drain` did, as one more result of the health report, so that the report's one verdict is
    the exit code: INFO when Slurm did what the verdict asked (drained, resumed, left an operator's drain, or
    nothing to do), ERROR when it could not be done or checked (SLURM_CONF unreadable, slurmctld unreachable, the
    node unknown)."""
    base: dict[str, Any] = dict(name="slurm.drain", subject=node)
    should_drain = drain_reason(results) is not None
    left = "this failing node is still in service" if should_drain else "whether gpucert drained it before is unknown"
    unreadable = slurm_conf_unreadable(environ)
    if unreadable is not None:
        return Result(
            **base, status=Status.ERROR, message=f"{unreadable.message}; {left}", remediation=unreadable.remediation
        )
    said, ok = apply_drain(node, results, timeout_s, ask, resume_after)
    if ok:
        return Result(**base, status=Status.INFO, message=said)
    unknown = said.startswith(UNKNOWN_NODE)
    name = "NAME" if unknown else node
    by_hand = f"; drain it by hand: scontrol update NodeName={name} State=DRAIN Reason=..." if should_drain else ""
    if unknown:
        fix = (
            f"give this node's Slurm name, not {node} (its NodeName in slurm.conf; `sinfo -N` lists them): "
            "--slurm-node NAME, or SLURMD_NODENAME=NAME (slurmd sets it for its HealthCheckProgram); without either "
            "it is the short host name"
        )
    else:
        fix = f"check that slurmctld answers (`scontrol ping`) and that {node} is the node's Slurm name (--slurm-node)"
    return Result(**base, status=Status.ERROR, message=f"{said}; {left}", remediation=fix + by_hand)
