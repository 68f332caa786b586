"""Benchmark sizes the node's memory cannot hold are refused before any worker allocates: the pure check on
given numbers, then the node's own (a captured H100 bundle, and this host with its MemAvailable faked)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from tests.conftest import NODE_BUNDLES

import gpucert.hardware.inventory
from gpucert.acceptance import RunRequest, check_fits, collect_node
from gpucert.bench.footprint import GIB, MIB, fit_problems, footprints
from gpucert.cli import main
from gpucert.config.loader import ConfigError, load_config
from gpucert.config.profiles import available_profiles, load_profile
from gpucert.config.run import BenchConfig, CollectivesBenchConfig, MemoryBenchConfig, RunConfig
from gpucert.hardware.host import MemoryInfo


def bench(**sections: object) -> BenchConfig:
    return dataclasses.replace(BenchConfig(), **sections)


def test_a_30_gib_collective_on_a_16_gib_host_is_refused_naming_key_size_and_memory() -> None:
    config = bench(collectives=CollectivesBenchConfig(max_bytes=30 * GIB, gate_bytes=30 * GIB))
    (problem,) = fit_problems(footprints("collectives", config, on_gpu=False), 2, 16 * GIB, {})
    assert problem == (
        "bench.collectives.max_bytes=32212254720: 2 ranks hold 2 x all_to_all's input and output (30.0 GiB each) "
        "= 120.0 GiB of host memory; this node has 16.0 GiB available (MemAvailable): lower "
        "bench.collectives.max_bytes or run fewer processes (--nproc)"
    )


def test_in_place_collectives_count_one_buffer() -> None:
    config = bench(collectives=CollectivesBenchConfig(ops=["all_reduce"], max_bytes=6 * GIB, gate_bytes=6 * GIB))
    (need,) = footprints("collectives", config, on_gpu=False)
    assert need.host_bytes == 6 * GIB
    assert fit_problems([need], 2, 16 * GIB, {}) == []


def test_a_memory_buffer_larger_than_a_gpus_free_memory_is_refused_naming_the_gpu() -> None:
    config = bench(memory=MemoryBenchConfig(size_mib=8192))
    needs = footprints("memory", config, on_gpu=True)
    assert [n.gpu_bytes for n in needs] == [24 * GIB, 512 * MIB]
    free = {0: 79 * GIB, 1: 79 * GIB, 2: 20 * GIB, 3: 79 * GIB}  # another process holds 59 GiB of GPU 2
    (problem,) = fit_problems(needs, 4, 1000 * GIB, free)
    assert problem.startswith(
        "bench.memory.size_mib=8192: each GPU holds STREAM's a, b and c (3 x 8.0 GiB) = 24.0 GiB; GPU 2 has "
        "20.0 GiB free: lower bench.memory.size_mib"
    )
    assert fit_problems(needs, 3, 1000 * GIB, free) == []  # three ranks find three GPUs with room


def test_p2p_needs_room_on_every_gpu_whatever_the_rank_count() -> None:
    config = dataclasses.replace(BenchConfig(), p2p=dataclasses.replace(BenchConfig().p2p, size_mib=16384))
    needs = footprints("p2p", config, on_gpu=True)
    assert fit_problems(needs, 1, None, {0: 40 * GIB, 1: 20 * GIB})[0].startswith(
        "bench.p2p.size_mib=16384: each GPU holds a source and a target (16.0 GiB each) = 32.0 GiB; GPU 1 has"
    )
    assert footprints("p2p", config, on_gpu=False) == []  # p2p does not run without GPUs


def test_pinned_pcie_buffers_count_against_host_memory_on_a_gpu_node() -> None:
    config = bench(memory=MemoryBenchConfig(size_mib=64, pcie_size_mib=8192))
    problems = fit_problems(footprints("memory", config, on_gpu=True), 8, 32 * GIB, {i: 80 * GIB for i in range(8)})
    assert len(problems) == 1 and problems[0].startswith("bench.memory.pcie_size_mib=8192: 8 ranks hold 8 x ")


def test_matmul_counts_its_largest_size_in_its_widest_dtype() -> None:
    config = bench(matmul=dataclasses.replace(BenchConfig().matmul, sizes=[4096, 65536]))
    (need,) = footprints("matmul", config, on_gpu=True)
    assert need.key == "bench.matmul.sizes" and need.value == 65536
    assert need.gpu_bytes == (4 * 4 + 4) * 65536**2  # tf32: two fp32 (A, B) pairs and C
    (problem,) = fit_problems([need], 1, None, {0: int(79.2 * GIB)})
    assert "= 80.0 GiB; GPU 0 has 79.2 GiB free" in problem


def test_the_burn_counts_its_load_matmul() -> None:
    config = bench(burn=dataclasses.replace(BenchConfig().burn, size=65536))
    (need,) = footprints("burn", config, on_gpu=True)
    assert (need.key, need.gpu_bytes) == ("bench.burn.size", (4 * 2 + 2) * 65536**2)  # bf16
    assert footprints("burn", config, on_gpu=False) == []  # a bf16 burn is skipped on CPU ranks


def test_unknown_memory_and_benchmarks_without_sizes_judge_nothing() -> None:
    assert footprints("train", BenchConfig(), on_gpu=True) == []
    config = bench(memory=MemoryBenchConfig(size_mib=32768))
    assert fit_problems(footprints("memory", config, on_gpu=False), 2, None, {}) == []


@pytest.mark.parametrize("name", available_profiles())
def test_every_built_in_profiles_defaults_fit_its_hardware(name: str) -> None:
    """What a profile runs by default must fit the GPUs it is for (or a 16 GiB CI host for cpu)."""
    profile = load_profile(name)
    config = load_config(RunConfig, None, [], base=profile.run_defaults)
    on_gpu = name != "cpu"
    free = {i: int((profile.gpu.memory_gib_min or 0) * GIB) for i in range(profile.gpu.gpus_per_node or 0)}
    nproc = max(len(free), 2)
    names = ("matmul", "burn", "memory", "p2p", "collectives")
    needs = [n for b in names for n in footprints(b, config.bench, on_gpu)]
    assert fit_problems(needs, nproc, 16 * GIB if not on_gpu else 512 * GIB, free) == []


def test_the_captured_h100_cannot_hold_a_32_gib_stream_buffer() -> None:
    request = RunRequest("bench memory", ["memory"], None, ["bench.memory.size_mib=32768"], None, None, [])
    work = collect_node(dataclasses.replace(request, replay=NODE_BUNDLES / "h100"))
    with pytest.raises(ConfigError) as info:
        check_fits(work, ["memory"], 1)
    message = str(info.value)
    assert message.startswith(f"{work.label}: bench.memory.size_mib=32768: each GPU holds STREAM's a, b and c ")
    assert "= 96.0 GiB; GPU 0 has 79." in message and "GiB free" in message
    check_fits(work, ["p2p", "train"], 1)  # a 1 GiB source and target fit


def small_host(monkeypatch: pytest.MonkeyPatch, available_gib: float) -> None:
    """This host, as its inventory would read it with only available_gib of MemAvailable."""
    fake = MemoryInfo(total_gib=available_gib, available_gib=available_gib, hugepages_total=0, swap_total_gib=0.0)
    monkeypatch.setattr(gpucert.hardware.inventory, "collect_memory", lambda root: fake)


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["bench", "collectives", "--set", f"bench.collectives.max_bytes={30 * GIB}"], "bench.collectives.max_bytes"),
        (["bench", "memory", "--set", "bench.memory.size_mib=16384"], "bench.memory.size_mib"),
        (["bench", "matmul", "--set", "bench.matmul.sizes=[32768]"], "bench.matmul.sizes"),
        (["accept", "--nproc", "4", "--set", "bench.memory.size_mib=2048"], "bench.memory.size_mib"),
    ],
)
def test_the_cli_refuses_before_any_worker_or_run_directory(
    argv: list[str], key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    small_host(monkeypatch, 16.0)
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    code = main([*argv, "--profile", "cpu"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert key in err and "16.0 GiB available (MemAvailable)" in err
    assert "Traceback" not in err
    assert time.perf_counter() - t0 < 15  # the inventory, then the refusal: no benchmark ran
    assert not (tmp_path / "runs").exists()
