"""The compile cache (finetune/train/compile_cache.py): where it lives, and the warm-up's order over ranks.

The multi-process test starts two gloo ranks (a file store: no port to race for) running this file as a
script, `python test_compile_cache.py RANK WORLD STORE CACHE OUT`: the warm-up compiles a small function with
inductor (a forward and a backward, as the trainer's warm-up does), and torch's own counters say what each rank
compiled and what it loaded. `python test_compile_cache.py function CACHE OUT` compiles a graph that calls a
custom autograd.Function, as FP8's layers do, for the test that a warm start loads it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpucert.config.loader import ConfigError
from gpucert.finetune.train.compile_cache import (
    CUSTOM_FUNCTIONS_FLAG,
    INDUCTOR_ENV,
    TRITON_ENV,
    default_cache_dir,
    resolve_cache_dir,
    signature,
    use_cache_dir,
)

SIG = "test-signature"


def test_cache_dir_setting_then_environment_then_per_user_default(tmp_path: Path) -> None:
    env = {INDUCTOR_ENV: str(tmp_path / "from-env"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert resolve_cache_dir(str(tmp_path / "set"), env) == tmp_path / "set"
    assert resolve_cache_dir(None, env) == tmp_path / "from-env"
    assert resolve_cache_dir(None, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}) == tmp_path / "xdg/gpucert/compile"
    assert default_cache_dir({}) == Path.home() / ".cache/gpucert/compile"
    with pytest.raises(ConfigError, match=r"train\.compile_cache_dir must be a directory or null"):
        resolve_cache_dir(" ", env)


def test_cache_dir_points_inductor_and_triton_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._functorch.config as functorch_config

    monkeypatch.delenv(INDUCTOR_ENV, raising=False)
    monkeypatch.delenv(TRITON_ENV, raising=False)
    monkeypatch.setattr(functorch_config, CUSTOM_FUNCTIONS_FLAG, False)  # put back after the test
    use_cache_dir(tmp_path / "cache")
    assert os.environ[INDUCTOR_ENV] == str(tmp_path / "cache")
    assert os.environ[TRITON_ENV] == str(tmp_path / "cache/triton")
    assert (tmp_path / "cache/triton").is_dir()
    assert getattr(functorch_config, CUSTOM_FUNCTIONS_FLAG) is True


def test_unwritable_cache_dir_names_the_key_and_path(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match=r"train.compile_cache_dir: cannot create .*a-file/cache"):
        use_cache_dir(tmp_path / "a-file" / "cache")


def test_signature_changes_with_what_decides_the_graphs() -> None:
    base = {"model": {"compile": True, "precision": "bf16"}, "micro_batch": 2}
    assert signature(base) == signature(json.loads(json.dumps(base)))
    assert signature(base) != signature({**base, "micro_batch": 3})


def test_compile_summary_takes_the_slowest_rank() -> None:
    from gpucert.finetune.train.compile_cache import WarmUp
    from gpucert.finetune.train.summary import compile_summary

    alone: Any = SimpleNamespace(rank=0, world_size=1)
    warm = WarmUp(0, "cpu", "alone", seconds=3.0, counters={"fxgraph_cache_miss": 2})
    first = {"time_to_first_step_s": 9.0, "first_step_s": 1.5}
    got = compile_summary(alone, Path("/cache"), warm, first)
    assert (got["time_to_first_step_s"], got["first_step_s"]) == (9.0, 1.5)
    assert got["compile"]["warm_up_s"] == 3.0
    assert got["compile"]["ranks"][0]["warm_up"]["counters"] == {"fxgraph_cache_miss": 2}
    assert compile_summary(alone, None, None, first)["compile"] is None


def test_the_warm_up_line_says_who_compiled_beside_this_rank_and_who_waited() -> None:
    """One node of 4 GPUs (4 x H200, 2026-11-29): inductor keys graphs by device index, so each GPU's rank compiled
    at once, none waiting; the line said "compiled first, the other ranks waiting"."""
    from gpucert.finetune.train.compile_cache import WarmUp
    from gpucert.finetune.train.loop import warm_up_line

    node = WarmUp(0, "cuda:0", "first", seconds=20.7, counters={"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 4},
                  first_ranks=4)  # fmt: skip
    said = warm_up_line(node, Path("/c"))
    assert said.startswith("compile warm-up 20.7 s on rank 0 (compiled first, as did the first rank of each of 3 ")
    assert "waiting" not in said
    # Two nodes of one GPU each: every rank sees cuda:0, rank 0 compiles and rank 1 loads after.
    nodes = dataclasses.replace(node, device="cuda:0", first_ranks=1, waiting_ranks=1)
    assert "(compiled first, 1 other rank(s) waiting to load)" in warm_up_line(nodes, Path("/c"))


def test_the_first_step_result_says_where_the_start_up_went() -> None:
    from gpucert.finetune.train import loop
    from gpucert.finetune.train.compile_cache import WarmUp
    from gpucert.finetune.train.report import _first_step
    from gpucert.finetune.train.summary import compile_summary

    marks = {"imported": 108.5, "joining": 108.5, "joined": 109.0}
    split = loop.start_up_split(marks, 100.0, 109.25)
    assert split == {"imports": 8.5, "join": 0.5, "run_setup": 0.25}
    assert loop.start_up_split(None, 100.0, 109.25) == {}
    assert loop.start_up_split(marks, None, 109.25) == {}  # no /proc
    alone: Any = SimpleNamespace(rank=0, world_size=1)
    warm = WarmUp(0, "cpu", "alone", seconds=6.0, counters={"fxgraph_cache_hit": 5})
    first = {"time_to_first_step_s": 19.0, "first_step_s": 2.0, "setup_s": {**split, "data": 0.4, "model_load": 1.5}}
    metrics = compile_summary(alone, Path("/cache"), warm, first)
    message = _first_step(metrics).message
    assert "5 loaded from /cache" in message
    assert "before it imports 8.5 s, join 0.5 s, run setup 0.2 s, data 0.4 s, model load 1.5 s" in message
    assert "bytecode" not in message
    reason = "PYTHONDONTWRITEBYTECODE is set"
    first["bytecode"] = {"cache": "/h/.cache/gpucert/bytecode", "state": "read", "reason": reason}
    message = _first_step(compile_summary(alone, Path("/cache"), warm, first)).message
    assert "(Python's bytecode from /h/.cache/gpucert/bytecode, read: PYTHONDONTWRITEBYTECODE is set)" in message
    # Uncompiled (the offline default on a CPU): no compile block, and still where the start-up went.
    plain = _first_step(compile_summary(alone, None, None, first)).message
    assert "compile warm-up" not in plain and "before it imports 8.5 s, join 0.5 s" in plain, plain


# --- Two ranks ------------------------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """This environment without what would choose the child's caches for it (use_cache_dir sets them there)."""
    chosen = (INDUCTOR_ENV, TRITON_ENV, "TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD")
    return {k: v for k, v in os.environ.items() if k not in chosen}


def run_job(tmp_path: Path, job: str, cache: Path) -> list[dict[str, Any]]:
    """Two gloo ranks through one warm-up each; what each reported."""
    store = tmp_path / f"{job}.store"
    outs = [tmp_path / f"{job}-{rank}.json" for rank in range(2)]
    env = child_env()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(rank), "2", str(store), str(cache), str(outs[rank])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, output
    return [json.loads(out.read_text()) for out in outs]


@pytest.mark.slow
def test_rank_1_loads_what_rank_0_compiled_and_compiles_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, second = run_job(tmp_path, "job1", cache)
    assert first["order"] == "first"
    assert first["counters"]["fxgraph_cache_miss"] >= 2  # a forward and a backward graph
    assert first["counters"]["fxgraph_cache_hit"] == 0
    assert first["after_step"] == first["counters"]  # the step after rank 0's warm-up compiled nothing more
    # Rank 1 waited for rank 0's warm-up to end, then torch's own counters say it loaded every graph from rank
    # 0's artifacts and compiled none, in its warm-up or in the step after.
    assert second["order"] == "after"
    assert second["began"] >= first["ended"]
    assert second["counters"]["fxgraph_cache_miss"] == 0
    assert second["counters"]["fxgraph_cache_hit"] == first["counters"]["fxgraph_cache_miss"]
    assert second["after_step"]["fxgraph_cache_miss"] == 0
    assert (cache / "gpucert-warm" / f"{SIG}-cpu.json").is_file()
    # The marker says the cache is warm: the next job's ranks warm up at once, and both only load.
    again = run_job(tmp_path, "job2", cache)
    assert [r["order"] for r in again] == ["together", "together"]
    assert [r["waited_s"] for r in again] == [0.0, 0.0]
    assert [r["counters"]["fxgraph_cache_miss"] for r in again] == [0, 0]


def worker(rank: int, world: int, store: str, cache: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from gpucert.finetune.train.compile_cache import cache_counters, warm_up

    use_cache_dir(Path(cache))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    times: dict[str, float] = {}
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 16)
    compiled = torch.compile(lambda x: torch.nn.functional.gelu(layer(x)).sum())

    def step() -> None:
        times["began"] = time.time()
        compiled(torch.randn(4, 16)).backward()
        times["ended"] = time.time()

    record = warm_up(step, rank, world, torch.device("cpu"), Path(cache), SIG).to_dict()
    compiled(torch.randn(4, 16)).backward()  # the run's first step
    Path(out).write_text(json.dumps({**record, **times, "after_step": cache_counters()}))
    dist.destroy_process_group()


# --- A graph that calls a custom autograd.Function ----------------------------------------------------------------


def run_function_graph(cache: Path, out: Path) -> dict[str, int]:
    """One process that compiles `function_graph` with its cache at `cache`; torch's counters after its backward."""
    proc = subprocess.run(
        [sys.executable, __file__, "function", str(cache), str(out)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout
    return json.loads(out.read_text())


@pytest.mark.slow
def test_a_warm_start_loads_a_graph_that_calls_an_autograd_function(tmp_path: Path) -> None:
    # FP8's projections and fused MLP are autograd.Functions: torch bypasses AOTAutograd's cache for such a graph
    # unless use_cache_dir allows it, and every warm start traced and partitioned the decoder layer again.
    cold = run_function_graph(tmp_path / "cache", tmp_path / "cold.json")
    assert cold["autograd_cache_bypass"] == 0 and cold["autograd_cache_miss"] >= 1, cold
    warm = run_function_graph(tmp_path / "cache", tmp_path / "warm.json")
    assert warm["autograd_cache_bypass"] == 0 and warm["autograd_cache_miss"] == 0, warm
    assert warm["autograd_cache_hit"] == cold["autograd_cache_miss"] and warm["fxgraph_cache_miss"] == 0, warm


def function_graph(cache: str, out: str) -> None:
    import torch

    from gpucert.finetune.train.compile_cache import cache_counters

    use_cache_dir(Path(cache))

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(w)
            return x @ w * 0.5

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            (w,) = ctx.saved_tensors
            return grad @ w.t() * 0.5, None

    torch.manual_seed(0)
    w = torch.randn(16, 16)
    compiled = torch.compile(lambda x: torch.nn.functional.gelu(Scaled.apply(x, w)).sum())
    compiled(torch.randn(4, 16, requires_grad=True)).backward()
    Path(out).write_text(json.dumps(cache_counters()))


if __name__ == "__main__":
    if sys.argv[1] == "function":
        function_graph(*sys.argv[2:])
    else:
        rank_, world_, store_, cache_, out_ = sys.argv[1:]
        worker(int(rank_), int(world_), store_, cache_, out_)
