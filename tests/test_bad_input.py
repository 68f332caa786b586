"""Bad input to every verb is refused: exit 3, the key or path named, no traceback, nothing written.

Each case runs the CLI in a fresh working directory holding a few prepared files; afterwards that directory
must hold exactly those files (no `runs/`, no `--output`, no launch directory). The config ranges of the bench
sections are in tests/config/test_validation.py, memory that cannot hold a size in tests/bench/test_footprint.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpucert.cli import main
from tests.conftest import NODE_BUNDLES
from tests.finetune.test_checkpoint import can_mount_tmpfs

BUNDLE = str(NODE_BUNDLES / "h100")

# (argv, fragments stderr must hold); paths are relative to the prepared directory.
CASES = [
    # accept
    (["accept", "--skip", "bogus"], ["--skip: unknown benchmark(s) bogus", "known: matmul"]),
    (["accept", "--skip", "matmul,burn,memory,p2p,collectives,train"], ["--skip leaves accept no benchmark"]),
    (["accept", "--nproc", "0"], ["--nproc must be >= 1, found 0"]),
    (["accept", "--config", "nope.yaml"], ["nope.yaml: cannot read"]),
    (["accept", "--config", "bad.yaml"], ["bad.yaml: line 2"]),
    (["accept", "--set", "runs_dir=afile/x"], ["runs_dir ", "afile is not a directory"]),
    (["accept", "--replay", BUNDLE], ["--replay reads a captured node"]),
    (["accept", "--node-name", "x"], ["--node-name", "needs --nnodes"]),
    (["accept", "--nnodes", "2", "--node-rank", "5", "--master-addr", "h"], ["--node-rank must be in 0..1"]),
    # bench
    (["bench", "nosuch"], ["invalid choice: 'nosuch'"]),
    (["bench", "memory", "--set", "bench.nproc=abc"], ["bench.nproc: expected int, found 'abc'"]),
    (["bench", "matmul", "--output", "afile/x"], ["--output ", "afile is not a directory"]),
    (["bench", "p2p", "--profile", "nope"], ["unknown profile 'nope'"]),
    (["bench", "collectives", "--set", "bench.collectives.bogus=1"], ["unknown key 'bench.collectives.bogus'"]),
    (["bench", "memory", "--replay", BUNDLE], ["--replay reads a captured node"]),
    # A GPU profile on a host NVML finds no GPU on (not asked where there is one): the benchmarks ran on the CPU
    # at the GPUs' sizes (collectives for many minutes; memory FAILed "HBM below floor").
    *(
        []
        if Path("/dev/nvidiactl").exists()
        else [
            (["bench", "collectives", "--profile", "h200"], ["profile h200 is for NVIDIA GPUs, and this host has"]),
            (["accept", "--profile", "h100-sxm"], ["its benchmarks (matmul, burn, memory, p2p, collectives, train)"]),
        ]
    ),
    (["bench", "train", "--set", "runtime.heartbeat_timeout_s=0"], ["runtime.heartbeat_timeout_s must be > 0"]),
    # health and discover
    (["health", "--config", "bad.yaml"], ["bad.yaml: line 2"]),
    (["health", "--drain", "--replay", BUNDLE], ["--drain acts on this live node"]),
    (["health", "--resume-after", "3"], ["--resume-after says when --drain resumes", "give it with --drain"]),
    (["health", "--replay", "nope"], ["nope: not a capture bundle"]),
    (["health", "--set", "runtime.rendezvous_timeout_s=0"], ["runtime.rendezvous_timeout_s must be > 0"]),
    (["health", "--set", "health.liveness=maybe"], ["health.liveness: expected bool, found 'maybe'"]),
    (["health", "--profile", "/nonexistent/site.yaml"], ["/nonexistent/site.yaml: cannot read"]),
    (["health", "--output", "afile"], ["--output ", "afile is not a directory"]),
    (["health", "--output", ""], ["argument --output/-o: an empty path (an unset variable?)"]),
    # A node rank that says nothing (no --nnodes) or is out of range: it ran as node rank 0, unsaid.
    (["bench", "matmul", "--node-rank", "1"], ["--node-rank 1 says which of --nnodes this node is"]),
    (["health", "--nnodes", "1", "--node-rank", "3"], ["--node-rank must be in 0..0 for --nnodes 1, found 3"]),
    (["health", "--nnodes", "2", "--node-rank", "5"], ["--node-rank must be in 0..1 for --nnodes 2, found 5"]),
    # Refused before the capture's seconds of work, naming --output (it named a temporary directory after them).
    (["capture", "-o", "afile"], ["--output afile: ", "afile is not a directory"]),
    (["finetune", "-o", " "], ["argument --output/-o: an empty path (an unset variable?)"]),
    (["finetune", "--resume", ""], ["argument --resume: an empty path (an unset variable?)"]),
    # A negative duration is a value for its check, not an unknown flag ("expected one argument").
    (["bench", "burn", "--duration", "-5s", "--profile", "cpu"], ["--duration: expected a duration", "'-5s'"]),
    (["discover", "--replay", "afile"], ["afile: not a capture bundle"]),
    # report
    (["report", "nope"], ["nope: no such run directory or report.json"]),
    (["finetune", "prepare", "--output", "x"], ["finetune prepare writes the prepared data to data.cache_dir"]),
    # A listing reads no other argument: it listed every recipe as though --config was not there.
    (["finetune", "--list-recipes", "--config", "x"], ["--list-recipes lists and exits", "found --config"]),
    (["finetune", "prepare", "--list-recipes", "--set", "a=b"], ["reads no other argument, found prepare, --set"]),
    (["report", "corrupt.json"], ["corrupt.json: not a readable gpucert report"]),
    (["report", "a", "b", "c"], ["report takes one run (render) or two runs"]),
    (["report", "corrupt.json", "corrupt.json", "--threshold", "-5"], ["--threshold", "found -5.0"]),
    (["report", "corrupt.json", "corrupt.json", "--threshold", "nan"], ["--threshold (the % worse", "found nan"]),
    (["report", "corrupt.json", "corrupt.json", "--threshold", "1e309"], ["--threshold (the % worse", "found inf"]),
    (["report", "merge", "a"], ["two or more per-node run directories"]),
    (["report", "merge", "corrupt.json", "afile", "-o", "afile"], ["--output afile: ", "is not a directory"]),
    (["report", "history", "n", ".", "--metrics-file", "h.prom"], ["report history does not use --metrics-file"]),
    # A flag one use of report reads, given to another: refused, not ignored.
    (["report", "corrupt.json", "--tolerance", "x=5"], ["gpucert report RUN does not use --tolerance"]),
    (["report", "corrupt.json", "-o", "out"], ["does not use --output: --output is for"]),
    (["report", "history", "n", ".", "--html"], ["report history does not use --html"]),
    (["report", "a", "b", "--metrics-file", "c.prom"], ["BASELINE CANDIDATE does not use --metrics-file"]),
    (["report", "a", "b", "-o", "out"], ["writes a file only with --html"]),
    (["report", "merge", "a", "b", "-o", "m", "--markdown"], ["report merge does not use --markdown"]),
    (["report", "merge", "a", "b"], ["report merge needs --output"]),
    (["report", "merge", "nope1", "nope2", "-o", "merged"], ["nope1: not a readable gpucert report"]),
    # cluster fs
    (["cluster", "fs", "afile"], ["afile is not a directory (gpucert cluster fs PATH"]),
    (["cluster", "fs", "fsdir", "--files", "0"], ["--files must be >= 1, found 0"]),
    (["cluster", "fs", "fsdir", "--size-mib", "0"], ["--size-mib must be >= 1, found 0"]),
    (["cluster", "fs", "fsdir", "--output", "afile/x"], ["--output ", "afile is not a directory"]),
    (["cluster", "fs", "fsdir", "--replay", "fsdir"], ["--replay reads a captured node"]),
    (["cluster", "fs", "fsdir", "--set", "runtime.heartbeat_interval_s=0"], ["runtime.heartbeat_interval_s"]),
    # cluster localize
    (["cluster", "localize", "--hosts", "a", "--profile", "cpu"], ["at least 2 nodes to pair, found 1: a"]),
    (["cluster", "localize", "--hosts", "a", "a", "--profile", "cpu"], ["node(s) listed twice: a"]),
    (["cluster", "localize", "--hostfile", "nope", "--profile", "cpu"], ["--hostfile nope"]),
    (["cluster", "localize", "--hosts", "a", "b", "--profile", "cpu", "-o", "afile/x"], ["--output ", "afile"]),
    (["cluster", "localize", "--hosts", "bad!", "b", "--profile", "cpu"], ["host 'bad!'"]),
    (["cluster", "localize", "--hosts", "a", "b", "--set", "localize.base_port=80"], ["localize.base_port"]),
    (["cluster", "localize", "--hosts", "a:3-1", "b", "--profile", "cpu"], ["GPU range '3-1' runs backwards"]),
    (["cluster", "localize", "--hosts", "a", "b", "--replay", BUNDLE], ["--replay reads a captured node"]),
    # cluster slurm
    (["cluster", "slurm", "--cpus", "0"], ["--cpus must be > 0, found 0"]),
    (["cluster", "slurm", "--gpus", "-1"], ["--gpus must be >= 0, found -1"]),
    # launch (without --dry-run the job would be written and submitted: it must be refused first)
    (["launch", "slurm", "accept", "--nodes", "0"], ["--nodes must be >= 1, found 0"]),
    (["launch", "slurm", "accept", "--nodes", "2", "--gpus-per-node", "-1"], ["--gpus-per-node must be >= 0"]),
    (["launch", "slurm", "accept", "--nodes", "2", "--preset", "bogus", "--dry-run"], ["--preset 'bogus'"]),
    (["launch", "slurm", "accept", "--nodes", "2", "--port", "99999", "--dry-run"], ["--port must be in 1024..65535"]),
    (["launch", "slurm", "fs", "--nodes", "2", "--cpus-per-task", "0"], ["--cpus-per-task must be >= 1"]),
    (["launch", "torchrun", "accept", "--nodes", "2"], ["required: --head"]),
    (["launch", "slurm", "accept", "--nodes", "2", "--port", "80", "--dry-run"], ["--port must be in 1024..65535"]),
    (["launch", "k8s", "accept", "--nodes", "2", "--port", "80", "--image", "i"], ["--port must be in 1024..65535"]),
    (
        ["launch", "torchrun", "accept", "--nodes", "2", "--head", "h", "--rendezvous-timeout", "0"],
        ["--rendezvous-timeout must be a positive number"],
    ),
    (["launch", "slurm", "accept", "--nodes", "2", "--time", "abc"], ["--time 'abc': expected sbatch's format"]),
    (["launch", "slurm", "accept", "--nodes", "2", "--follow-timeout", "-1"], ["--follow-timeout must be a positive"]),
    (["launch", "slurm", "bogus", "--nodes", "2"], ["invalid choice: 'bogus'"]),
    # capture: refused before any work, naming --output
    (["capture", "-o", "afile/x"], ["--output afile/x: ", "afile is not a directory"]),
    # finetune and evaluate (tests/test_recipes.py: the same through a fresh process, nothing heavy imported)
    (["finetune", "--config", "nope.yaml"], ["--config nope.yaml: no such file", "recipes shipped with gpucert: "]),
    (["finetune", "--config", "bad.yaml"], ["bad.yaml: line 2"]),
    (["finetune", "--config", "fsdir"], ["--config fsdir: is a directory"]),
    (["finetune", "--set", "lora.bogus=1"], ["--set lora.bogus=1: unknown key 'lora.bogus'"]),
    (["finetune", "--output", "afile"], ["output_dir must be a directory", "afile"]),
    (["finetune", "prepare", "--set", "data.source=nope.jsonl"], ["data.source nope.jsonl: no such file"]),
    (["evaluate", "--adapter", "fsdir", "--data", "/nonexistent.jsonl"], ["data.source /nonexistent.jsonl: no such"]),
    (["evaluate", "--adapter", "fsdir", "--data", "fsdir"], ["data.source fsdir: is a directory"]),
]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a directory\n")
    (tmp_path / "bad.yaml").write_text("health: [\n")
    (tmp_path / "corrupt.json").write_text('{"schema_version": "2.1",')
    (tmp_path / "fsdir").mkdir()
    return tmp_path


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_there_are_more_than_30_cases_across_every_verb() -> None:
    assert len(CASES) > 30
    verbs = {" ".join(argv[:2]) if argv[0] in ("cluster", "launch") else argv[0] for argv, _ in CASES}
    assert {"accept", "bench", "health", "report", "cluster fs", "cluster localize", "launch slurm"} <= verbs


@pytest.mark.parametrize(("argv", "fragments"), CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_bad_input_exits_3_naming_it_with_nothing_written(
    argv: list[str], fragments: list[str], workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = listing(workdir)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 3, err
    for fragment in fragments:
        assert fragment in err, err
    assert "error: " in err
    assert "Traceback" not in err
    assert listing(workdir) == before  # no runs/, no --output, no job directory


@pytest.mark.slow
@pytest.mark.skipif(not can_mount_tmpfs(), reason="no unprivileged user+mount namespace to mount a small tmpfs in")
def test_a_data_cache_on_a_full_filesystem_is_named_in_one_line(tmp_path: Path) -> None:
    """`finetune prepare` into a 64 KiB tmpfs (its own mount namespace): datasets' writer fails with a bare
    `[Errno 28] No space left on device` naming no path; gpucert says which cache filled, without a traceback."""
    cache = tmp_path / "cache"
    cache.mkdir()
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {cache} && cd {tmp_path} && "
        f"exec {sys.executable} -m gpucert finetune prepare --set data.cache_dir={cache}/data"
    )
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-3000:]
    assert f"gpucert: error: no space left on {cache}/data (" in done.stderr, done.stderr[-3000:]
    assert "set data.cache_dir to a larger filesystem" in done.stderr
    assert "Traceback" not in done.stderr
