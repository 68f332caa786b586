"""Shared test plumbing: fixture paths, the `gpu` marker (skipped where no NVIDIA GPU answers), and the pace
of this machine for the latency bounds of multi-process tests."""

from __future__ import annotations

import functools
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
NODE_BUNDLES = FIXTURES / "nodes"


def _has_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return count > 0
    except Exception:
        return False


def _module_fixtures(item: pytest.Item) -> list[str]:
    """The module-scoped fixtures of the test's own files (not a plugin's) that the test uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return sorted(
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope == "module" and defs[-1].baseid and name in item.fixturenames
    )


def _group(config: pytest.Config, item: pytest.Item, name: str) -> None:
    """Send `item` to the one pytest-xdist worker of group `name` (`--dist loadgroup`).

    pytest-xdist's worker marks a group by appending `@name` to the test's nodeid (item._nodeid), which pytest 9
    no longer reads: it builds nodeid from item._id. There the suffix is set on _id, or no test is grouped (every
    module fixture below was built once per worker, the Slurm cluster started on both)."""
    item.add_marker(pytest.mark.xdist_group(name))
    if not config.getoption("loadgroup", default=False) or item.nodeid.endswith(f"@{name}") or not hasattr(item, "_id"):
        return  # no grouping asked, or a pytest whose nodeid xdist's own suffix reaches
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # a pytest with _id but no NodeId: leave the grouping to xdist
        return
    item._id = NodeId.parse(f"{item.nodeid}@{name}")


# First, so the marks are set before pytest-xdist's worker reads them in its own pytest_collection_modifyitems.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test on the one Slurm cluster goes to one pytest-xdist worker (`make test` runs `-n 2 --dist
    # loadgroup`): the cluster is a session fixture with daemons, ports and an /etc/hosts line of its own, and two
    # workers would each start one.
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            _group(config, item, "slurm")
        elif shared := _module_fixtures(item):
            # A module fixture that trains or compiles (two short runs, a compiled kernel) is built once per
            # worker that runs one of its tests: its tests on one worker build it once, not twice.
            _group(config, item, f"{item.module.__name__}::{shared[0]}")
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run them on a GPU node)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    """Each test starts with torch.compile's caches empty: dynamo counts a code object's compiles per process (8 at
    most), and every tiny model's decoder layers share one forward, so a worker that ran several compiling tests
    refused the next one ("recompile limit exceeded") by the order xdist happened to give it."""
    yield
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


@pytest.fixture
def bundle_copy(tmp_path: Path):
    """A writable copy of a captured node bundle, for scenarios that alter it."""

    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(NODE_BUNDLES / name, dst, symlinks=True)
        return dst

    return copy


# Seconds a fresh `python -c "import torch"` takes on a quiet 2-core CI machine (the median of 5, measured
# 2026-11-26 with nothing else running): what every process a multi-process test starts pays first.
QUIET_IMPORT_S = 1.6


@functools.cache
def pace() -> float:
    """How much slower this machine is now than a quiet one (>= 1): the median of three fresh torch imports over
    QUIET_IMPORT_S. A multi-process test's latency bound is written for a quiet machine and multiplied by this,
    so another job's load stretches it where it stretches every process start, and a quiet machine keeps the
    bound as tight as written. Measured once a session, so a test pays it once."""
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return max(1.0, statistics.median(times) / QUIET_IMPORT_S)


def within(seconds: float) -> float:
    """A latency bound written for a quiet machine, scaled by this machine's pace now."""
    return seconds * pace()


def kill_process_tree(pid: int) -> None:
    """SIGKILL every descendant of `pid`, then `pid`: the clean-up of a multi-process test. A process that ends
    on its own between the listing and its kill (a rank leaving as its node stops, common on a loaded machine) is
    no error."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue


def free_port(count: int = 1) -> int:
    """A TCP port on 127.0.0.1 that nothing holds now, the first of `count` consecutive ones. A localize run gives
    pair i of a round the port localize.base_port + i; at the default (29600) two tests' runs side by side take
    each other's ports (seen under make test-loaded: a pair that could not serve its store, and an extra round)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = int(s.getsockname()[1])
        if first + count > 65000:
            continue
        held = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return first
    raise RuntimeError(f"expected {count} consecutive free TCP ports, found none in 100 tries")
