"""Config ranges and names are refused at load, before any worker starts or any run directory is made.

Each bad `--set` goes through the CLI on the cpu profile: exit 3, the key named on stderr, nothing written.
Bad flags, paths and files of every verb are in tests/test_bad_input.py.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from gpucert.acceptance import RunRequest, load_run_config
from gpucert.cli import main
from gpucert.config.loader import ConfigError, load_config
from gpucert.config.profiles import available_profiles, load_profile
from gpucert.config.run import (
    COLLECTIVE_DTYPES,
    COLLECTIVE_OPS,
    MATMUL_DTYPES,
    TRAIN_MIN_STEPS,
    TRAIN_MODELS,
    RunConfig,
)

# (verb, --set value, the key the message must name)
BAD = [
    ("bench memory", "bench.memory.size_mib=0", "bench.memory.size_mib"),
    ("bench memory", "bench.memory.size_mib=-64", "bench.memory.size_mib"),
    ("bench memory", "bench.memory.pcie_size_mib=40000", "bench.memory.pcie_size_mib"),
    ("bench memory", "bench.memory.warmup=-1", "bench.memory.warmup"),
    ("bench memory", "bench.memory.repeats=0", "bench.memory.repeats"),
    ("bench collectives", "bench.collectives.max_bytes=1099511627776", "bench.collectives.max_bytes"),
    ("bench collectives", "bench.collectives.dtype=bf61", "bench.collectives.dtype"),
    ("bench collectives", "bench.collectives.ops=[all_reduce,allreduce]", "bench.collectives.ops"),
    ("bench collectives", "bench.collectives.ops=[]", "bench.collectives.ops"),
    ("bench collectives", "bench.collectives.intra_node_ops=[gather]", "bench.collectives.intra_node_ops"),
    ("bench collectives", "bench.collectives.min_bytes=0", "bench.collectives.min_bytes"),
    ("bench collectives", "bench.collectives.min_bytes=8388608", "bench.collectives.min_bytes"),
    ("bench collectives", "bench.collectives.gate_bytes=512", "bench.collectives.gate_bytes"),
    ("bench collectives", "bench.collectives.gate_bytes=8388608", "bench.collectives.gate_bytes"),
    ("bench collectives", "bench.collectives.warmup=-1", "bench.collectives.warmup"),
    ("bench collectives", "bench.collectives.graph_calls=0", "bench.collectives.graph_calls"),
    ("bench collectives", "bench.collectives.buffers=cuda", "bench.collectives.buffers"),
    ("bench collectives", "bench.collectives.repeats=0", "bench.collectives.repeats"),
    ("bench matmul", "bench.matmul.dtypes=[bf16,int4]", "bench.matmul.dtypes"),
    ("bench matmul", "bench.matmul.dtypes=[]", "bench.matmul.dtypes"),
    ("bench matmul", "bench.matmul.sizes=[256,0]", "bench.matmul.sizes"),
    ("bench matmul", "bench.matmul.sizes=[]", "bench.matmul.sizes"),
    ("bench matmul", "bench.matmul.sizes=[1000000]", "bench.matmul.sizes"),
    ("bench matmul", "bench.matmul.sweep_budget_s=-1", "bench.matmul.sweep_budget_s"),
    ("bench matmul", "bench.matmul.warmup_s=-0.5", "bench.matmul.warmup_s"),
    ("bench matmul", "bench.matmul.repeats=0", "bench.matmul.repeats"),
    ("bench matmul", "bench.nproc=0", "bench.nproc"),
    ("bench matmul", "bench.timeout_s=0", "bench.timeout_s"),
    ("bench p2p", "bench.p2p.size_mib=0", "bench.p2p.size_mib"),
    ("bench p2p", "bench.p2p.repeats=0", "bench.p2p.repeats"),
    ("bench train", "bench.train.model=7b", "bench.train.model"),
    ("bench train", "bench.train.seq_len=0", "bench.train.seq_len"),
    ("bench train", "bench.train.micro_batch=0", "bench.train.micro_batch"),
    ("bench train", "bench.train.warmup_steps=-1", "bench.train.warmup_steps"),
    ("bench train", "bench.train.steps=2", "bench.train.steps"),
    ("bench train", f"bench.train.steps={TRAIN_MIN_STEPS - 1}", "bench.train.steps"),
    ("health", "health.expected_gpus=-1", "health.expected_gpus"),
    ("health", "health.xid_window_h=0", "health.xid_window_h"),
    ("health", "health.command_timeout_s=-3", "health.command_timeout_s"),
    ("accept", "localize.matmul_dtype=int4", "localize.matmul_dtype"),
]


@pytest.fixture(scope="module", autouse=True)
def _imports_done() -> None:
    """The bench verbs import the bench suite (torch) first: not part of the time a refusal takes."""
    with contextlib.suppress(ImportError):
        import gpucert.bench.suite  # noqa: F401


def refuse(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI, assert a quick exit 3 with nothing written, return stderr."""
    out = tmp_path / "run"
    t0 = time.perf_counter()
    code = main([*argv, "--profile", "cpu", "--output", str(out)])
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert code == 3, err
    assert err.startswith("gpucert: error: "), err
    assert "Traceback" not in err
    assert elapsed < 2, f"refused after {elapsed:.1f} s: something ran first"
    assert not out.exists()
    return err


@pytest.mark.parametrize(("verb", "value", "key"), BAD, ids=[value for _, value, _ in BAD])
def test_a_bad_value_is_refused_naming_its_key(verb: str, value: str, key: str, tmp_path: Path, capsys) -> None:
    err = refuse([*verb.split(), "--set", value], tmp_path, capsys)
    assert key in err
    assert "found" in err or "unknown" in err


def test_every_problem_is_named_at_once(tmp_path: Path, capsys) -> None:
    argv = ["accept", "--set", "bench.memory.size_mib=0", "--set", "bench.train.model=7b"]
    err = refuse([*argv, "--set", "health.xid_window_h=0"], tmp_path, capsys)
    for key in ("bench.memory.size_mib", "bench.train.model", "health.xid_window_h"):
        assert key in err


def test_a_wrong_type_and_a_bad_range_are_named_at_once_under_the_named_profile(tmp_path: Path, capsys) -> None:
    """The range was said only once the type was fixed; judged with the cpu profile's run defaults, as the run's."""
    argv = ["accept", "--profile", "cpu", "--set", "bench.timeout_s=abc", "--set", "bench.memory.size_mib=0"]
    err = refuse([*argv, "--set", "bench.collectives.max_bytes=8388608"], tmp_path, capsys)
    assert "2 problems:" in err and "bench.timeout_s: expected float" in err and "bench.memory.size_mib" in err, err
    assert "gate_bytes" not in err  # under the cpu profile's 4 MiB gate, an 8 MiB max_bytes is fine


def test_an_unknown_profile_beside_a_wrong_type_is_named_in_the_same_run() -> None:
    request = RunRequest("accept", [], None, ["profile=nope", "bench.timeout_s=abc"], None, None, [])
    with pytest.raises(ConfigError) as caught:
        load_run_config(request)
    assert [p.split(";")[0] for p in caught.value.problems] == [
        "--set bench.timeout_s=abc: bench.timeout_s: expected float, found 'abc'",
        "--set profile=nope: unknown profile 'nope'",
    ]


def test_under_auto_a_wrong_type_hides_no_value_out_of_range_for_every_profile(tmp_path: Path) -> None:
    """With the profile chosen by the hardware later, a wrong type said alone: size_mib 0 came on the next run."""
    path = tmp_path / "br.yaml"
    path.write_text("health: {expected_gpus: x}\nbench:\n  memory: {size_mib: 0}\n")
    with pytest.raises(ConfigError) as caught:
        load_run_config(RunRequest("health", [], path, [], None, None, []))
    assert caught.value.problems == [
        f"{path}:1: health.expected_gpus: expected int, found 'x'",
        f"{path}:3: bench.memory.size_mib must be in 1..32768, found 0",
    ]


def test_an_unknown_profile_names_where_it_was_named(tmp_path: Path) -> None:
    """`profile: h500` in a config file was said with no file and line, as no other bad value is."""
    path = tmp_path / "g.yaml"
    path.write_text("health:\n  expected_gpus: 1\nprofile: h500\n")
    with pytest.raises(ConfigError) as caught:
        load_run_config(RunRequest("health", [], path, [], None, None, []))
    assert caught.value.problems[0].startswith(f"{path}:3: unknown profile 'h500'; built-in profiles: ")
    typed = RunRequest("health", [], path, ["profile=h600"], None, None, [], flags={"profile=h600": "--profile h600"})
    with pytest.raises(ConfigError) as caught:
        load_run_config(typed)
    assert caught.value.problems[0].startswith("--profile h600: unknown profile 'h600'")


def test_the_messages_name_the_allowed_values(tmp_path: Path, capsys) -> None:
    err = refuse(["bench", "collectives", "--set", "bench.collectives.dtype=bf61"], tmp_path, capsys)
    assert "bf16, fp16, fp32" in err and "'bf61'" in err
    err = refuse(["bench", "collectives", "--set", "bench.collectives.max_bytes=1099511627776"], tmp_path, capsys)
    assert "32 GiB" in err


def test_related_keys_are_judged_with_the_profiles_run_defaults() -> None:
    # Under the dataclass default gate_bytes (4 GiB) an 8 MiB max_bytes is refused; the cpu profile's run defaults
    # (gate_bytes 4 MiB) sit under the --set values, and they are what the run uses.
    smaller = "bench.collectives.max_bytes=8388608"
    named = RunRequest("bench collectives", ["collectives"], None, ["profile=cpu", smaller], None, None, [])
    assert load_run_config(named).bench.collectives.gate_bytes == 4 << 20
    auto = RunRequest("bench collectives", ["collectives"], None, [smaller], None, None, [])
    load_run_config(auto)  # "auto": judged once the hardware has chosen the profile
    with pytest.raises(ConfigError, match=r"bench\.collectives\.gate_bytes"):
        load_run_config(auto, base={})  # a profile without run defaults


@pytest.mark.parametrize("name", available_profiles())
def test_every_built_in_profile_and_the_defaults_pass(name: str) -> None:
    assert RunConfig().problems() == []
    config = load_config(RunConfig, None, [], base=load_profile(name).run_defaults)
    assert config.problems() == []


def test_the_allowed_names_are_the_bench_modules_own() -> None:
    pytest.importorskip("torch")
    from gpucert.bench import collectives, matmul, train_proxy

    assert set(MATMUL_DTYPES) == set(matmul.PEAK_RATIO)
    assert tuple(collectives.BUSBW_FACTORS) == COLLECTIVE_OPS
    assert set(COLLECTIVE_DTYPES) == set(collectives.DTYPES)
    assert set(TRAIN_MODELS) == set(train_proxy.PRESETS)
    assert TRAIN_MIN_STEPS == 2 * train_proxy.LOSS_WINDOW


def test_replaying_a_directory_that_is_no_bundle_is_refused(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code = main(["discover", "--replay", str(empty), "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 3
    assert "not a capture bundle" in err and "nvml-snapshot.json" in err
    assert not (tmp_path / "run").exists()


def test_an_output_that_cannot_be_created_is_refused_before_the_benchmarks(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "run"
    t0 = time.perf_counter()
    code = main(["bench", "memory", "--profile", "cpu", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 3
    assert time.perf_counter() - t0 < 2
    assert "--output" in err and "not a directory" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_a_read_only_output_is_refused_and_nothing_is_left(tmp_path: Path, capsys) -> None:
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        code = main(["health", "--profile", "cpu", "--output", str(parent / "run")])
        err = capsys.readouterr().err
        assert code == 3
        assert "cannot write there" in err
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o700)
