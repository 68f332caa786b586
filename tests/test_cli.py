"""The CLI end to end on this machine (no GPU: the cpu profile) and on replayed node bundles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gpucert.cli import main
from tests.conftest import NODE_BUNDLES

SCHEMA = json.loads((Path(__file__).parents[1] / "src/gpucert/report/report.schema.json").read_text())


def validate(report: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(report)


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["discover", "health", "accept"])
def test_verbs_run_on_a_cpu_machine_and_write_a_valid_report(verb: str, tmp_path: Path, capfd) -> None:
    exit_code = main([verb, "--output", str(tmp_path)])
    out = capfd.readouterr().out  # accept's report is printed by its rank 0, a process of its own
    report = json.loads((tmp_path / "report.json").read_text())
    validate(report)
    assert exit_code == report["exit_code"]
    assert report["meta"]["verb"] == verb
    assert report["meta"]["profile"] == "cpu"
    assert report["inventory"]["gpus"] == []
    assert "report:" in out
    assert (tmp_path / "report.md").read_text().startswith(f"# gpucert {verb}: ")
    if verb != "discover":
        count = next(r for r in report["results"] if r["name"] == "gpu.count")
        assert count["status"] == "SKIP"
        assert "no NVIDIA GPU found" in count["message"]
        # On a GPU-less machine nothing may FAIL or ERROR: the offline default must be usable in CI.
        assert exit_code in (0, 1)
    if verb in ("discover", "accept"):
        assert "No NVIDIA GPU found" in out
    if verb == "accept":
        # The whole suite ran on two gloo processes: every benchmark judged, and the HTML page written.
        names = {r["name"].split(".")[0] for r in report["results"]}
        assert {"matmul", "memory", "p2p", "collective", "train"} <= names
        collectives = [r for r in report["results"] if r["name"].startswith("collective.")]
        assert len(collectives) == 6 and all(r["subject"] == "2 ranks (gloo)" for r in collectives)
        assert "<html" in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_benchmarks_left_out_of_accept_are_skip_rows(tmp_path: Path, capfd) -> None:
    """A verdict that does not cover a benchmark says so: the report once only lacked its rows."""
    skipped = ["matmul", "burn", "p2p", "collectives", "train"]
    main(["accept", "--skip", ",".join(skipped), "--output", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    validate(report)
    rows = {r["name"]: r for r in report["results"] if r["name"].startswith("bench.")}
    assert sorted(rows) == sorted(f"bench.{name}" for name in skipped)
    assert all(r["status"] == "SKIP" and "left out with --skip" in r["message"] for r in rows.values())
    assert any(r["name"].startswith("memory.") for r in report["results"])


def test_json_flag_prints_the_report(tmp_path: Path, capsys) -> None:
    exit_code = main(["health", "--json", "--output", str(tmp_path)])
    printed = json.loads(capsys.readouterr().out)
    validate(printed)
    assert printed == json.loads((tmp_path / "report.json").read_text())
    assert printed["exit_code"] == exit_code


def test_default_run_directory(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    main(["discover"])
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.endswith(f"-{json.loads((run_dir / 'report.json').read_text())['meta']['host']}")
    assert (run_dir / "report.json").exists()


def test_replayed_h200x4_reports_the_captured_node(tmp_path: Path, capsys) -> None:
    exit_code = main(["discover", "--replay", str(NODE_BUNDLES / "h200x4"), "-o", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    validate(report)
    assert exit_code == 0
    assert report["inventory"]["summary"].startswith("4x NVIDIA H200 | 562 GiB GPU memory | NV18 all-to-all")
    assert report["meta"]["profile"] == "h200"
    assert report["inventory"]["software"]["nccl"] == "2.28.9"


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--set", "health.bogus=1"], ["--set health.bogus=1", "unknown key 'health.bogus'"]),
        (
            ["--set", "health.expected_gpus=eight"],
            ["--set health.expected_gpus=eight", "health.expected_gpus: expected int", "'eight'"],
        ),
        (["--profile", "nope"], ["unknown profile 'nope'", "h100-sxm"]),
    ],
)
def test_bad_input_exits_3_and_names_the_key(argv: list[str], fragments: list[str], tmp_path, capsys) -> None:
    assert main(["health", "-o", str(tmp_path), *argv]) == 3
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err
    assert not (tmp_path / "report.json").exists()


def test_bad_config_file_names_file_and_key(tmp_path: Path, capsys) -> None:
    config = tmp_path / "site.yaml"
    config.write_text("health:\n  expected_gpus: 8\n  liveniss: false\n")
    assert main(["health", "--config", str(config), "-o", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert str(config) in err and "unknown key 'health.liveniss'" in err


def test_usage_errors_exit_3_not_2(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["health", "--no-such-flag"])
    assert info.value.code == 3


def test_capture_then_replay_round_trip(tmp_path: Path, capsys) -> None:
    bundle = tmp_path / "bundle"
    assert main(["capture", "--output", str(bundle)]) == 0
    assert (bundle / "software.json").exists() and (bundle / "root/proc/cpuinfo").exists()
    assert main(["discover", "--replay", str(bundle), "-o", str(tmp_path / "run"), "--json"]) == 0
    capsys.readouterr()
    report = json.loads((tmp_path / "run/report.json").read_text())
    assert report["inventory"]["replayed_from"] == str(bundle)
    assert report["inventory"]["cpu"]["logical_cpus"] >= 1


def test_profiles_lists_every_builtin(capsys) -> None:
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    for name in ("a100-sxm", "cpu", "h100-pcie", "h100-sxm", "h200"):
        assert name in out


def test_console_script_exit_code_follows_worst_status(tmp_path: Path) -> None:
    """The installed entry point, as a Slurm prolog would call it."""
    done = subprocess.run(
        [sys.executable, "-m", "gpucert", "health", "--replay", str(NODE_BUNDLES / "h200x4"), "-o", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr  # the h200 profile expects 8 GPUs; the bundle has 4
    assert "expected 8 GPUs, found 4 on h200x4" in done.stdout


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[1] / "docs/examples").glob("*.json")), ids=str)
def test_example_reports_in_docs_still_match_the_schema(path: Path) -> None:
    validate(json.loads(path.read_text()))


@pytest.mark.slow
def test_bench_joins_an_outside_torchrun_and_rank_0_writes_the_report(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "gpucert"]
    argv += ["bench", "collectives", "-o", str(tmp_path), "--set", "bench.collectives.ops=[all_reduce]"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    validate(report)
    (result,) = report["results"]
    # The cpu profile sets no busbw floor: shown, not judged (correctness is checked all the same).
    assert result["name"] == "collective.all_reduce" and result["status"] == "INFO"
    assert result["subject"] == "2 ranks (gloo)"
    assert sum(result["details"]["wrong"]) == 0
    assert (tmp_path / "report.html").exists()


def test_report_compares_two_runs_and_exits_on_regression(capsys) -> None:
    fixtures = Path(__file__).parent / "fixtures/reports"
    base, worse = fixtures / "accept-4xh200-synthetic.json", fixtures / "accept-4xh200-synthetic-regressed.json"
    assert main(["report", str(base), str(base)]) == 0
    assert main(["report", str(base), str(worse), "--markdown"]) == 2
    out = capsys.readouterr().out
    assert "collective.all_reduce" in out


def test_report_merge_builds_one_cluster_report_from_per_node_runs(tmp_path: Path, capsys) -> None:
    for node in ("a", "b"):
        assert main(["health", "--profile", "cpu", "-o", str(tmp_path / node)]) == 0
    # Both ran on this GPU-less host: b's report is made another node's, as a second machine would have written
    # it (one host's two runs are refused: nothing tells them apart).
    b = json.loads((tmp_path / "b/report.json").read_text())
    b["meta"]["host"] = b["inventory"]["hostname"] = "node-b"
    b["meta"]["nodes"] = ["node-b"]
    (tmp_path / "b/report.json").write_text(json.dumps(b))
    merged = tmp_path / "cluster"
    assert main(["report", "merge", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(merged)]) == 0
    report = json.loads((merged / "report.json").read_text())
    validate(report)
    assert len(report["meta"]["nodes"]) == 2 and len(report["nodes"]) == 2
    assert any(r["name"] == "cluster.config.kernel" and r["status"] == "PASS" for r in report["results"])
    capsys.readouterr()
    assert main(["report", "merge", str(tmp_path / "a"), "-o", str(merged)]) == 3
    assert "two or more per-node run directories" in capsys.readouterr().err


def test_report_merge_refuses_before_writing_what_would_lose_or_double_a_node(tmp_path: Path, capsys) -> None:
    """An --output that is an input's run (the merge replaced node a's report), an input given twice, and a refused
    merge into a new directory: refused, the inputs untouched and no directory left behind."""
    a, b = tmp_path / "a", tmp_path / "b"
    for node in (a, b):
        assert main(["health", "--profile", "cpu", "-o", str(node)]) == 0
    before = (a / "report.json").read_bytes()
    capsys.readouterr()
    assert main(["report", "merge", str(a), str(b), "-o", str(a)]) == 3
    assert f"--output {a} is where {a}'s report is" in capsys.readouterr().err
    assert (a / "report.json").read_bytes() == before
    assert main(["report", "merge", str(a), str(a / "report.json"), "-o", str(tmp_path / "m1")]) == 3
    assert "is given twice" in capsys.readouterr().err
    other = json.loads((b / "report.json").read_text())
    other["meta"]["method_version"] = "0"
    (tmp_path / "old.json").write_text(json.dumps(other))
    assert main(["report", "merge", str(a), str(tmp_path / "old.json"), "-o", str(tmp_path / "new" / "m2")]) == 3
    assert "method versions differ" in capsys.readouterr().err
    assert not (tmp_path / "m1").exists() and not (tmp_path / "new").exists()


def test_node_labels_with_brackets_print_as_they_are(capsys) -> None:
    """Two nodes sharing a hostname are `vm[n0]` and `vm[n1]`: rich must not read `[n1]` as a style tag."""
    report = Path(__file__).parents[1] / "docs/results/2026-11-22-h200x2-two-nodes-accept.json"
    assert main(["report", str(report)]) == 2
    out = capsys.readouterr().out
    assert "node vm[n0]" in out and "node vm[n1]" in out


def test_capture_into_a_directory_that_holds_anything_is_refused_and_the_bundle_there_kept(
    tmp_path: Path, capsys
) -> None:
    bundle = tmp_path / "bundle"
    assert main(["capture", "--output", str(bundle)]) == 0
    first = sorted(p.relative_to(bundle) for p in bundle.rglob("*"))
    hostname = (bundle / "hostname.txt").read_text()
    capsys.readouterr()
    assert main(["capture", "--output", str(bundle)]) == 3
    err = capsys.readouterr().err
    assert f"--output {bundle} is not empty (dmesg.txt, environment.json" in err and "choose a new directory" in err
    assert sorted(p.relative_to(bundle) for p in bundle.rglob("*")) == first
    assert (bundle / "hostname.txt").read_text() == hostname
    # Written whole beside it, then renamed: no partial bundle, and an empty directory is fine.
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]
    (tmp_path / "empty").mkdir()
    assert main(["capture", "--output", str(tmp_path / "empty")]) == 0
    assert (tmp_path / "empty" / "software.json").exists()


@pytest.mark.slow
def test_a_forced_ring_reaches_the_ranks_gpucert_starts(tmp_path: Path) -> None:
    """bench.collectives.force_ring under gpucert's own launcher: the ranks start with NCCL's Ring variables
    (NCCL reads them when the communicator is made), so the gate is not ERROR for a variable nobody could set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    argv = [sys.executable, "-m", "gpucert", "bench", "collectives", "--profile", "cpu", "--nproc", "2"]
    argv += ["-o", str(tmp_path), "--set", "bench.collectives.ops=[all_reduce]"]
    argv += ["--set", "bench.collectives.force_ring=true", "--set", "bench.collectives.max_bytes=65536"]
    argv += ["--set", "bench.collectives.gate_bytes=65536"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "report.json").read_text())["results"]
    assert [r["name"] for r in results if r["status"] == "ERROR"] == []
    (result,) = [r for r in results if r["name"] == "collective.all_reduce"]
    assert result["details"]["nccl_env"] == {"NCCL_ALGO": "Ring", "NCCL_COLLNET_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}


def test_the_report_path_is_printed_absolute_whichever_verb(tmp_path: Path, monkeypatch, capsys) -> None:
    """discover and health printed `report: runs/...` (relative to wherever the command ran), accept an absolute
    path: a path in a job log is read from another directory."""
    monkeypatch.chdir(tmp_path)
    assert main(["discover", "--format", "plain"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"report: {tmp_path}/runs/") and last.endswith("/report.json"), last
