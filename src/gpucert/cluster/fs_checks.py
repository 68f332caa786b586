"""`gpucert cluster fs PATH`: is PATH one shared filesystem on every node of the job, and how fast is it?

Run once per node, like accept: `gpucert cluster fs /shared/x --nnodes 2 --node-rank R --master-addr A`, under
`srun --ntasks-per-node=1`, or alone (then the cross-node checks are SKIP with why). Node 0 writes the report.

- `fs.mount`: the mount holding PATH (source, fstype, options) is the same on every node, and a shared type;
- `fs.consistency`: a token node 0 writes is read back on every node, and so is a rename (close-to-open);
- `fs.metadata`: create + stat + unlink of small files, every node at once, ops/s per node and in total;
- `fs.write` / `fs.read`: a checkpoint-sized file per node, every node at once, fsync'd, read past the cache.

Everything lives under `PATH/.gpucert-fs-<random>/`; each node removes its own files and node 0 the directory,
whatever happened. Rates are judged against the profile's floors where it has them; without one a rate is
INFO (shown, not judged), never PASS, and never SKIP: it was measured, and monitoring reads SKIP as "did not apply".

Collect (touch the filesystem, on every node), judge (pure, on node 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import mmap
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from gpucert.hardware.mounts import SHARED_FSTYPES, Mount, collect_mounts
from gpucert.report.schema import Result
from gpucert.status import Status

# Mount options that differ per client by design (NFSv4 names the client's own address).
PER_NODE_OPTIONS = ("clientaddr=",)
CHUNK_BYTES = 16 * 1024 * 1024
DIR_PREFIX = ".gpucert-fs-"


@dataclass(frozen=True)
class FsOptions:
    path: Path
    metadata_files: int = 2000
    size_mib: int = 1024


class Peers(Protocol):
    """What the checks need of the other nodes (RankPeers, over the job's store)."""

    @property
    def node_rank(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def labels(self) -> dict[int, str]: ...
    def put(self, key: str, value: Any) -> None: ...
    def get(self, key: str, timeout_s: float, what: str) -> Any: ...
    def barrier(self, name: str, timeout_s: float) -> None: ...


# Collect: one node's view.


def find_mount(path: Path, mounts: list[Mount]) -> Mount | None:
    """The mount holding path: the longest mount point that is a prefix of it (the last one mounted wins)."""
    best: Mount | None = None
    for m in mounts:
        target = Path(m.target)
        if (path == target or target in path.parents) and (best is None or len(m.target) >= len(best.target)):
            best = m
    return best


def collect_mount(path: Path, root: Path = Path("/")) -> dict[str, Any]:
    mounts = collect_mounts(root, include_pseudo=True)
    if not mounts:
        return {"error": f"could not read {root / 'proc/self/mounts'}"}
    found = find_mount(path.resolve(), mounts)
    if found is None:
        return {"error": f"no mount in /proc/self/mounts holds {path}"}
    return {"source": found.source, "target": found.target, "fstype": found.fstype, "options": list(found.options)}


def write_token(run_dir: Path, token: str) -> None:
    with open(run_dir / "token", "w") as f:
        f.write(token)
        f.flush()
        os.fsync(f.fileno())


def read_token(path: Path) -> dict[str, Any]:
    try:
        return {"seen": path.read_text()}
    except OSError as exc:
        return {"seen": None, "error": f"{type(exc).__name__}: {exc.strerror or exc}"}


def measure_metadata(directory: Path, files: int) -> dict[str, Any]:
    """create, stat and unlink `files` empty files in a directory of this node's own; 3 ops per file."""
    directory.mkdir(parents=True, exist_ok=True)
    names = [str(directory / f"f{i:06d}") for i in range(files)]
    t0 = time.perf_counter()
    for name in names:
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600))
    for name in names:
        os.stat(name)
    for name in names:
        os.unlink(name)
    elapsed = time.perf_counter() - t0
    return {"ops": 3 * files, "elapsed_s": elapsed}


def _aligned_buffer(size: int) -> mmap.mmap:
    # Anonymous mmap memory is page aligned, as O_DIRECT needs.
    return mmap.mmap(-1, size)


def measure_write(path: Path, size_bytes: int) -> dict[str, Any]:
    """Write size_bytes of random data and fsync; then drop the file from this node's page cache."""
    chunk = min(CHUNK_BYTES, size_bytes)
    buf = _aligned_buffer(chunk)
    buf.write(os.urandom(chunk))
    written = 0
    t0 = time.perf_counter()
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        while written < size_bytes:
            n = min(chunk, size_bytes - written)
            written += os.write(fd, memoryview(buf)[:n])
        os.fsync(fd)
        elapsed = time.perf_counter() - t0
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
        buf.close()
    return {"bytes": written, "elapsed_s": elapsed}


def measure_read(path: Path, size_bytes: int) -> dict[str, Any]:
    """Read the file back past the page cache: O_DIRECT where the filesystem takes it, else after
    posix_fadvise(DONTNEED) (which a filesystem may ignore: tmpfs is memory)."""
    try:
        return _read(path, size_bytes, direct=True)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        return _read(path, size_bytes, direct=False)


def _read(path: Path, size_bytes: int, direct: bool) -> dict[str, Any]:
    chunk = min(CHUNK_BYTES, size_bytes)
    buf = _aligned_buffer(chunk)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        done = 0
        t0 = time.perf_counter()
        while done < size_bytes:
            n = os.preadv(fd, [buf], done)
            if n == 0:
                break
            done += n
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        buf.close()
    how = "O_DIRECT" if direct else "posix_fadvise(DONTNEED), then buffered reads (no O_DIRECT here)"
    return {"bytes": done, "elapsed_s": elapsed, "cache": how}


# Judge: pure functions of every node's measurements.


def _comparable(view: dict[str, Any]) -> dict[str, Any]:
    options = sorted(o for o in view["options"] if not o.startswith(PER_NODE_OPTIONS))
    return {"source": view["source"], "fstype": view["fstype"], "options": ",".join(options)}


def judge_mounts(path: str, views: dict[str, dict[str, Any]]) -> list[Result]:
    """views: node label -> collect_mount's answer, node 0 first."""
    base: dict[str, Any] = dict(name="fs.mount", category="cluster", threshold_source="fixed: one shared mount")
    results = [
        Result(**base, subject=label, node=label, status=Status.ERROR, message=f"{label}: {v['error']}")
        for label, v in views.items()
        if "error" in v
    ]
    good = {label: v for label, v in views.items() if "error" not in v}
    if not good:
        return results
    ref_label, ref = next(iter(good.items()))
    want = _comparable(ref)
    diffs = []
    for label, v in good.items():
        got = _comparable(v)
        diffs += [f"{field} {got[field]!r} on {label}" for field in want if got[field] != want[field]]
    fstype = ref["fstype"]
    what = f"{path} is on {ref['source']} ({fstype}, mounted at {ref['target']})"
    details = {"mounts": good}
    if diffs:
        message = f"expected the same mount of {path} on every node as on {ref_label} ({want}), found " + "; ".join(
            diffs
        )
        status, fix = Status.FAIL, "mount the same export with the same options on every node (fstab, autofs)"
    elif len(good) == 1:
        message, status, fix = f"{what}; one node: nothing to compare it with", Status.SKIP, None
    elif fstype not in SHARED_FSTYPES:
        message = f"{what} on every node: {fstype} is not shared? every node sees its own disk"
        status, fix = Status.WARN, "point PATH at the shared filesystem (NFS, Lustre, GPFS, ...)"
    else:
        message, status, fix = f"{what}, the same on all {len(good)} nodes", Status.PASS, None
    results.append(
        Result(
            **base,
            subject=path,
            status=status,
            value=fstype,
            expected="same source, fstype and options on every node; a shared type "
            f"({', '.join(sorted(SHARED_FSTYPES))})",
            message=message,
            remediation=fix,
            details=details,
        )
    )
    return results


def judge_consistency(token: str, seen: dict[str, dict[str, Any]], renamed: dict[str, dict[str, Any]]) -> list[Result]:
    """seen/renamed: node label -> what it read of the token before and after node 0's rename."""
    base: dict[str, Any] = dict(name="fs.consistency", category="cluster", threshold_source="fixed: one filesystem")
    if len(seen) < 2:
        (label,) = seen or {"this node": {}}
        return [
            Result(
                **base,
                subject=label,
                node=label if seen else None,
                status=Status.SKIP,
                message="one node: whether other nodes see the same files needs a run across nodes",
            )
        ]
    results = []
    for label in seen:
        before, after = seen[label], renamed.get(label, {})
        problems = []
        if before.get("seen") != token:
            problems.append(f"the token node 0 wrote ({_what(before)})")
        if after.get("seen") != token:
            problems.append(f"the file node 0 renamed ({_what(after)})")
        if after.get("old_exists"):
            problems.append("the rename (the old name is still there)")
        results.append(
            Result(
                **base,
                subject=label,
                node=label,
                status=Status.FAIL if problems else Status.PASS,
                expected="node 0's token, before and after a rename",
                message=f"expected {label} to see what node 0 wrote, found it did not see " + " nor ".join(problems)
                if problems
                else f"{label} read node 0's token and saw its rename",
                remediation="this node does not share the filesystem (or caches it stale): check the mount and "
                "its options (actimeo, lookupcache)"
                if problems
                else None,
            )
        )
    return results


def _what(view: dict[str, Any]) -> str:
    if "error" in view:
        return view["error"]
    return "found nothing" if view.get("seen") is None else f"read {view['seen']!r}"


def judge_rate(
    name: str,
    per_node: dict[str, dict[str, Any]],
    amount_key: str,
    scale: float,
    unit: str,
    floor: float | None,
    floor_name: str,
    profile: str,
) -> list[Result]:
    """One result per node (judged against floor, a per-node figure) and one for all nodes at once."""
    results = []
    rates = {}
    for label, m in per_node.items():
        if "error" in m:
            results.append(
                Result(
                    name=name, subject=label, node=label, category="cluster", status=Status.ERROR,
                    message=f"could not measure on {label}: {m['error']}",
                )
            )  # fmt: skip
            continue
        rate = m[amount_key] * scale / m["elapsed_s"] if m["elapsed_s"] > 0 else 0.0
        rates[label] = rate
        details = {k: v for k, v in m.items() if k != "error"}
        results.append(_judged(name, label, label, round(rate, 3), unit, floor, floor_name, profile, details))
    if len(rates) > 1:
        # All nodes started together: the total done over the slowest node's time.
        slowest = max(per_node[label]["elapsed_s"] for label in rates)
        total = sum(per_node[label][amount_key] for label in rates) * scale / slowest if slowest > 0 else 0.0
        results.append(
            _judged(
                name, f"{len(rates)} nodes at once", None, round(total, 3), unit, None, f"{floor_name} (all nodes)",
                profile, {"nodes": len(rates), "slowest_s": slowest},
            )
        )  # fmt: skip
    return results


def _judged(
    name: str,
    subject: str,
    node: str | None,
    value: float,
    unit: str,
    floor: float | None,
    floor_name: str,
    profile: str,
    details: dict[str, Any],
) -> Result:
    base: dict[str, Any] = dict(name=name, subject=subject, node=node, category="cluster", value=value, unit=unit)
    if floor is None:
        return Result(
            **base,
            status=Status.INFO,
            message=f"{subject}: {value:g} {unit}; not judged: profile {profile} sets no {floor_name}",
            details=details,
        )
    ok = value >= floor
    return Result(
        **base,
        status=Status.PASS if ok else Status.FAIL,
        expected=f">= {floor:g} {unit}",
        threshold_source=f"profile {profile}: {floor_name}",
        message=f"expected >= {floor:g} {unit}, found {value:g} {unit} on {subject}",
        remediation=None if ok else "check the filesystem's load, the node's network to it, and the mount options",
        details=details,
    )


def profile_floor(profile: Any, name: str) -> float | None:
    """A floor from the profile's benchmarks section (a site profile sets them; none is built in)."""
    value = getattr(profile.benchmarks, name)
    return float(value) if value is not None else None


# The run on one node: every node's rank runs this; node 0 gets every node's measurements.


def _guard(step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A step that could not run becomes that node's ERROR, so the other nodes' barriers are still met."""
    try:
        return step()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_node(peers: Peers, options: FsOptions, runtime: Any) -> dict[str, Any] | None:
    """This node's share; node 0 returns every node's measurements by label, the others None.

    runtime: the run's RuntimeConfig (rendezvous_timeout_s bounds short waits, collective_timeout_s the
    measurements)."""
    short, long = runtime.rendezvous_timeout_s, runtime.collective_timeout_s
    me = peers.node_rank
    head = me == 0
    found: dict[str, Any] = {"mount": collect_mount(options.path)}
    run_dir: Path | None = None
    own: Path | None = None
    try:
        if head:
            run_dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=options.path))
            token = secrets.token_hex(16)
            write_token(run_dir, token)
            peers.put("fs/run", {"dir": run_dir.name, "token": token})
        else:
            run = peers.get("fs/run", short, f"node {peers.labels[me]}: node 0's run directory")
            run_dir = options.path / run["dir"]
        peers.barrier("fs/token-written", short)
        found["token"] = read_token(run_dir / "token")
        peers.barrier("fs/token-read", long)
        if head:
            os.rename(run_dir / "token", run_dir / "token.renamed")
        peers.barrier("fs/renamed", long)
        # The new name first: its lookup goes to the server, whose answer carries the directory's changed
        # attributes, and an NFS client then revalidates the old name's cached entry instead of trusting it for
        # up to acdirmin (30 s) and seeing a name that is gone.
        renamed = read_token(run_dir / "token.renamed")
        found["renamed"] = {**renamed, "old_exists": (run_dir / "token").exists()}
        own = run_dir / f"node{me}"
        peers.barrier("fs/metadata", long)
        found["metadata"] = _guard(lambda: measure_metadata(own / "meta", options.metadata_files))
        size = options.size_mib * 1024 * 1024
        peers.barrier("fs/write", long)
        found["write"] = _guard(lambda: measure_write(own / "checkpoint.bin", size))
        peers.barrier("fs/read", long)
        if "error" in found["write"]:
            # Reading back a file the write left short would time a smaller file as the checkpoint's read.
            found["read"] = {"error": f"not measured: the write before it failed ({found['write']['error']})"}
        else:
            found["read"] = _guard(lambda: measure_read(own / "checkpoint.bin", size))
        peers.barrier("fs/measured", long)
        peers.put(f"fs/found/{me}", found)
        if not head:
            return None
        return {peers.labels[r]: peers.get(f"fs/found/{r}", long, f"node rank {r}'s measurements") for r in
                range(peers.num_nodes)}  # fmt: skip
    finally:
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)
        if run_dir is not None:
            # Every node is done with the directory before node 0 removes it; bounded, and a late node does not
            # keep it there.
            with contextlib.suppress(Exception):
                peers.barrier("fs/cleaned", short)
            if head:
                shutil.rmtree(run_dir, ignore_errors=True)


def judge_all(path: str, found: dict[str, dict[str, Any]], profile: Any) -> list[Result]:
    """Every check's results from every node's measurements (node label -> run_node's answer)."""
    head = next(iter(found.values()))
    token = head["token"].get("seen") or ""
    results = judge_mounts(path, {label: f["mount"] for label, f in found.items()})
    results += judge_consistency(
        token, {label: f["token"] for label, f in found.items()}, {label: f["renamed"] for label, f in found.items()}
    )
    name = profile.name
    results += judge_rate(
        "fs.metadata", {k: f["metadata"] for k, f in found.items()}, "ops", 1.0, "ops/s",
        profile_floor(profile, "fs_metadata_ops_min"), "benchmarks.fs_metadata_ops_min", name,
    )  # fmt: skip
    results += judge_rate(
        "fs.write", {k: f["write"] for k, f in found.items()}, "bytes", 1e-9, "GB/s",
        profile_floor(profile, "fs_write_gbps_min"), "benchmarks.fs_write_gbps_min", name,
    )  # fmt: skip
    results += judge_rate(
        "fs.read", {k: f["read"] for k, f in found.items()}, "bytes", 1e-9, "GB/s",
        profile_floor(profile, "fs_read_gbps_min"), "benchmarks.fs_read_gbps_min", name,
    )  # fmt: skip
    return results


def run_job(request: Any, plan: Any, options: FsOptions, argv: list[str], say: Callable[[str], None]) -> Any:
    """This node's process: check the path, then one rank on this node (and on every other) runs the checks;
    rank 0 writes the one report (acceptance.run_on_nodes)."""
    from gpucert.acceptance import run_on_nodes

    if not options.path.is_dir():
        from gpucert.config.loader import ConfigError

        raise ConfigError(f"{options.path} is not a directory (gpucert cluster fs PATH checks a directory)")
    return run_on_nodes(request, plan, 1, argv, say)


# The share of the filesystem's free space the checkpoint-sized files may take, all nodes' together: a check must
# not fill the filesystem everybody's jobs write to.
ROOM_SHARE = 0.5


def room_problem(options: FsOptions, nodes: int) -> str | None:
    """Why the write check does not fit the filesystem's free space (every node writes --size-mib at once, on a
    shared filesystem into the same free space), or None. Asked before any node writes."""
    try:
        stat = os.statvfs(options.path)
    except OSError:
        return None  # the check itself then says what is wrong with the path
    free = stat.f_bavail * stat.f_frsize
    need = options.size_mib * 1024 * 1024 * nodes
    if need <= free * ROOM_SHARE:
        return None
    gib = 1024**3
    return (
        f"--size-mib {options.size_mib}: {nodes} node(s) would write {need / gib:,.1f} GiB into {options.path}, "
        f"which has {free / gib:,.1f} GiB free; the check takes at most {ROOM_SHARE:.0%} of it: give a smaller "
        "--size-mib (a checkpoint shard's size, 1024 by default)"
    )


class RankPeers:
    """What the checks need of the other nodes, over the job's store (one rank a node)."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.labels = {p.node_rank: p.node for p in rt.peers}

    @property
    def node_rank(self) -> int:
        return int(self.rt.node_rank)

    @property
    def num_nodes(self) -> int:
        return int(self.rt.num_nodes)

    def put(self, key: str, value: Any) -> None:
        self.rt.store.set(f"data/{key}", json.dumps(value))

    def get(self, key: str, timeout_s: float, what: str) -> Any:
        from datetime import timedelta

        from gpucert.runtime.errors import RendezvousError

        try:
            self.rt.store.wait([f"data/{key}"], timedelta(seconds=timeout_s))
        except RuntimeError:
            raise RendezvousError(f"{what}: nothing came within {timeout_s:g} s") from None
        return json.loads(self.rt.store.get(f"data/{key}"))

    def barrier(self, name: str, timeout_s: float) -> None:
        """All nodes reach `name`, or the error names the node ranks that did not within timeout_s."""
        from gpucert.runtime.errors import RendezvousError
        from gpucert.runtime.group import POLL_S

        store = self.rt.store
        store.set(f"barrier/{name}/{self.node_rank}", "1")
        deadline = time.monotonic() + timeout_s
        while True:
            late = [r for r in range(self.num_nodes) if not store.check([f"barrier/{name}/{r}"])]
            if not late:
                return
            if time.monotonic() > deadline:
                names = ", ".join(f"{self.labels.get(r, r)} (node rank {r})" for r in late)
                raise RendezvousError(f"{names} did not reach {name} within {timeout_s:g} s: node lost?")
            time.sleep(POLL_S)


def run_in_ranks(request: Any, options: FsOptions, say: Callable[[str], None]) -> Any:
    """One rank a node: every node checks the path; rank 0 judges every node's measurements and writes the
    report; every rank ends with its verdict (gpucert's launcher: through write_verdict)."""
    from datetime import timedelta

    from gpucert.acceptance import RunOutcome, build_report, collect_node, load_run_config, rank_run_dir
    from gpucert.report.store import write_report
    from gpucert.runtime.group import fail, leave_failed, start_runtime, stop_runtime
    from gpucert.runtime.launch_env import launched_by_gpucert
    from gpucert.runtime.launcher import write_verdict

    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    rt = start_runtime(load_run_config(request).runtime)
    try:
        rt.set_phase("cluster fs")
        work = collect_node(request, rt.me.node)
        peers = RankPeers(rt)
        peers.put(f"part/{rt.node_rank}", work.part())
        if rt.is_main:
            # Progress only: a reader gone already (`2>&1 | head`) ends nothing here; the report's print then
            # finds it gone and the CLI exits 141 quietly, as for accept.
            with contextlib.suppress(BrokenPipeError):
                say(f"checking {options.path} on {rt.num_nodes} node(s)...")
        found = run_node(peers, options, work.config.runtime)
        if found is None:
            rt.store.wait(["verdict"], timedelta(seconds=work.config.runtime.collective_timeout_s))
            outcome = RunOutcome(None, None, int(rt.store.get("verdict")))
        else:
            wait = work.config.runtime.collective_timeout_s
            parts = [peers.get(f"part/{r}", wait, f"node rank {r}'s inventory") for r in range(rt.num_nodes)]
            results = judge_all(str(options.path), found, work.profile)
            report = build_report(request, started, t0, work, parts, results)
            with rank_run_dir(request, work, started) as run_dir:
                path = write_report(report, run_dir.path)
            rt.store.set("verdict", str(report.status.exit_code))
            outcome = RunOutcome(report, path, report.status.exit_code)
        write_verdict(outcome.exit_code)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        record = fail(rt, exc)
        with contextlib.suppress(BrokenPipeError):  # the line is lost with its reader; the exit below is not
            say(record.message() if record.rank == rt.rank else f"{rt.me.describe()} stops: {record.message()}")
        leave_failed(rt, Status.ERROR.exit_code)
    stop_runtime(rt)
    return dataclasses.replace(outcome, exit_code=0) if launched_by_gpucert() else outcome
