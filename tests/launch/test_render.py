"""What `gpucert launch` renders: sbatch scripts pinned as golden files, hostile values refused or inert,
network presets, the per-node torchrun commands and the Kubernetes manifests, checked structurally."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from gpucert.cli import main
from gpucert.config.loader import ConfigError
from gpucert.launch import k8s, torchrun
from gpucert.launch.command import _slurm_minutes
from gpucert.launch.presets import preset_env
from gpucert.launch.slurm import SlurmJob, parse_job, render_sbatch

GOLDEN = Path(__file__).parents[1] / "fixtures" / "launch"


def job(nodes: int, gpus: int = 8, **extra: object) -> SlurmJob:
    fields: dict = dict(
        verb="accept",
        args=("--profile", "h200", "--output", "/shared/runs/accept"),
        nodes=nodes,
        gpus_per_node=gpus,
        run_dir="/shared/runs/accept",
        time="2:00:00",
        partition="gpu",
        setup=("source /shared/venv/bin/activate",),
        env=preset_env(["ib"], None),
    )
    fields.update(extra)
    return SlurmJob(**fields)


@pytest.mark.parametrize("nodes", [1, 2, 16])
def test_sbatch_scripts_match_the_golden_files(nodes: int) -> None:
    """Regenerate with `python -c 'from tests.launch.test_render import regenerate; regenerate()'` and review."""
    assert render_sbatch(job(nodes)) == (GOLDEN / f"accept-{nodes}-nodes.sbatch").read_text()


def test_finetune_script_runs_gpucert_on_every_node_like_every_verb() -> None:
    script = render_sbatch(job(2, verb="finetune", args=("--config", "qwen2-7b-glaive", "--output", "/shared/ft")))
    assert script == (GOLDEN / "finetune-2-nodes.sbatch").read_text()
    # gpucert reads the node rank from SLURM_NODEID in each task: no raw torchrun, one GPU process a GPU.
    assert "torchrun" not in script
    assert "gpucert finetune --config qwen2-7b-glaive --output /shared/ft" in script
    assert "gpucert finetune --config qwen2-7b-glaive --output /shared/ft --nproc 8" in script
    # No --rendezvous-timeout: the verb's own (its config file, a --set, else 120 s), not a launcher's over it.
    assert "rendezvous_timeout_s" not in script
    timed = render_sbatch(job(2, args=("--set", "runtime.rendezvous_timeout_s=300"), rendezvous_timeout_s=60))
    # Given, it comes before the user's options: their own --set comes later and wins (it used to be overridden).
    assert "gpucert accept --set runtime.rendezvous_timeout_s=60 --set runtime.rendezvous_timeout_s=300" in timed


LOCALIZE = dict(verb="localize", args=("--profile", "h200", "--output", "/shared/runs/loc"), run_dir="/shared/runs/loc")
FS = dict(verb="fs", args=("/shared/scratch", "--output", "/shared/runs/fs"), run_dir="/shared/runs/fs")


def test_localize_runs_once_in_the_batch_step_and_fs_on_every_node() -> None:
    script = render_sbatch(job(16, **LOCALIZE))
    assert script == (GOLDEN / "localize-16-nodes.sbatch").read_text()
    # localize starts one srun step per pair itself: the script must not start it on every node.
    body = [line for line in script.split("set -euo pipefail")[1].splitlines() if not line.startswith("#")]
    assert not [line for line in body if "srun" in line]
    assert "\ngpucert cluster localize --profile h200 --output /shared/runs/loc || rc=$?\n" in script
    fs = render_sbatch(job(2, **FS))
    assert fs == (GOLDEN / "fs-2-nodes.sbatch").read_text()
    assert "srun --ntasks-per-node=1 --output=/shared/runs/fs/logs/node-%n-%N.log gpucert cluster fs /shared" in fs


def test_localize_is_refused_where_it_cannot_run_once() -> None:
    with pytest.raises(ConfigError, match="runs once and starts the pair jobs itself"):
        torchrun.node_commands("localize", (), 2, "a", 29500, 8, {}, 60)


def regenerate() -> None:
    for nodes in (1, 2, 16):
        (GOLDEN / f"accept-{nodes}-nodes.sbatch").write_text(render_sbatch(job(nodes)))
    ft = job(2, verb="finetune", args=("--config", "qwen2-7b-glaive", "--output", "/shared/ft"))
    (GOLDEN / "finetune-2-nodes.sbatch").write_text(render_sbatch(ft))
    (GOLDEN / "localize-16-nodes.sbatch").write_text(render_sbatch(job(16, **LOCALIZE)))
    (GOLDEN / "fs-2-nodes.sbatch").write_text(render_sbatch(job(2, **FS)))


@pytest.mark.parametrize(
    ("field", "value"),
    [("partition", "gpu$(touch x)"), ("account", "a b"), ("time", "1:00\n#SBATCH --uid=0"), ("mem", "`id`")],
)
def test_values_sbatch_reads_unquoted_are_refused_before_anything_runs(field: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        render_sbatch(job(2, **{field: value}))
    assert f"--{field.replace('_', '-')} {value!r}" in str(info.value)


def test_the_cli_refuses_a_hostile_partition_with_exit_3(capsys) -> None:
    assert main(["launch", "slurm", "accept", "--nodes", "2", "--partition", "gpu$(touch x)", "--dry-run"]) == 3
    assert "--partition 'gpu$(touch x)'" in capsys.readouterr().err


def test_hostile_values_in_the_script_body_stay_inert(tmp_path: Path) -> None:
    """The rendered script runs under a stand-in srun/scontrol that print their arguments: the values arrive
    as written, and nothing of them was executed."""
    marker = tmp_path / "x"
    run_dir = str(tmp_path / "run $(touch x)")
    hostile = SlurmJob(
        verb="accept",
        args=("--profile", f"cpu;touch {marker}", "--output", run_dir, "--set", "note=`touch x`"),
        nodes=2,
        gpus_per_node=0,
        run_dir=run_dir,
        env={"NCCL_SOCKET_IFNAME": f"eth0$(touch {marker})"},
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (
        ("srun", 'for a in "$@"; do printf "%s\\n" "$a"; done; echo "IFNAME=$NCCL_SOCKET_IFNAME"'),
        # A long node list: the script must read it whole, or scontrol's SIGPIPE fails the job under pipefail.
        ("scontrol", "seq -f node%g 1 200000"),
    ):
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(hostile))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[1-2]"}
    env["SLURM_JOB_ID"] = "42"
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert f"cpu;touch {marker}" in printed and "note=`touch x`" in printed and run_dir in printed
    assert f"IFNAME=eth0$(touch {marker})" in printed
    assert not marker.exists() and not (tmp_path / "x").exists()
    assert Path(run_dir, "logs").is_dir()  # the directory with the odd name was made, as named


def test_presets_apply_in_order_and_say_what_is_missing() -> None:
    env = preset_env(["socket", "debug"], "ens5")
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ens5"
    assert env["NCCL_DEBUG"] == "INFO" and env["GPUCERT_NETWORK_PRESETS"] == "socket,debug"
    with pytest.raises(ConfigError, match="needs --iface"):
        preset_env(["socket"], None)
    with pytest.raises(ConfigError, match="unknown; known: infiniband, roce, socket, debug, ib"):
        preset_env(["rdma"], None)


def test_torchrun_commands_name_every_node_rank_and_bound_the_wait() -> None:
    commands = torchrun.node_commands("accept", ("--profile", "h200"), 3, "node-a", 29500, 8, {}, 60)
    assert len(commands) == 3
    for rank, command in enumerate(commands):
        assert f"--nnodes 3 --node-rank {rank} --master-addr node-a --master-port 29500" in command
        assert "--set runtime.rendezvous_timeout_s=60" in command
    [ft] = torchrun.node_commands("finetune", ("--config", "c.yaml"), 1, "h", 1234, 4, {"NCCL_DEBUG": "INFO"}, 30)
    assert ft.startswith("env NCCL_DEBUG=INFO gpucert finetune --nnodes 1 --node-rank 0 --master-addr h")
    assert "--set runtime.rendezvous_timeout_s=30 --nproc 4 --config c.yaml" in ft


def test_kubernetes_manifests_are_an_indexed_job_behind_a_headless_service() -> None:
    text = k8s.render_manifests(
        "accept",
        ("--profile", "h200"),
        4,
        8,
        "reg/gpucert:1",
        "acc",
        29400,
        {"NCCL_DEBUG": "INFO"},
        "data",
        "/shared",
        90,
    )
    service, job_ = yaml.safe_load_all(text)
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": "acc"}
    spec = job_["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed",
        4,
        4,
        0,
    )
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"]
    [container] = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MASTER_ADDR"] == f"acc-0.{service['metadata']['name']}" and env["GPUCERT_NNODES"] == "4"
    assert env["NCCL_DEBUG"] == "INFO" and container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert container["command"][:2] == ["gpucert", "accept"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"dshm": "/dev/shm", "shared": "/shared"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert volumes["shared"]["persistentVolumeClaim"] == {"claimName": "data"}
    with pytest.raises(ConfigError, match="a Kubernetes name"):
        k8s.render_manifests("accept", (), 2, 8, "img", "Bad_Name", 1, {}, None, "/s", 1)


def test_scontrol_records_and_time_limits_are_read() -> None:
    job_ = parse_job(
        "JobId=7 JobName=gpucert-accept JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 NodeList=n[1-2]"
    )
    assert (job_["JobState"], job_["ExitCode"], job_["NodeList"]) == ("FAILED", "3:0", "n[1-2]")
    assert [_slurm_minutes(t) for t in ("30", "10:30", "1:00:00", "1-02", "1-00:30:00")] == [30, 10.5, 60, 1560, 1470]


def test_options_of_the_launched_verb_are_never_taken_for_launch_s(capsys) -> None:
    """`--set` must reach the verb, not become launch's `--setup` by abbreviation."""
    argv = ["launch", "slurm", "finetune", "--nodes", "2", "--gpus-per-node", "0", "--config", "tiny.yaml"]
    assert main([*argv, "--output", "/shared/ft", "--set", "train.max_steps=8", "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "gpucert finetune --config tiny.yaml --output /shared/ft --set train.max_steps=8" in script
    assert "--setup" not in script


def test_launching_finetune_without_a_recipe_is_refused_naming_config(capsys) -> None:
    """Without --config every node would train the offline tiny recipe, with no word (the issue's case)."""
    for backend in (["slurm"], ["torchrun", "--head", "node-a"], ["k8s", "--image", "reg/gpucert:1"]):
        assert main(["launch", *backend, "finetune", "--nodes", "2", "--dry-run"][: 5 + len(backend) - 1]) == 3
        assert "name the recipe with --config" in capsys.readouterr().err


def test_a_recipe_path_becomes_absolute_and_a_recipe_name_stays_a_name(tmp_path: Path, capsys, monkeypatch) -> None:
    """Every node starts in its own directory: a path must resolve there; a name resolves from the package."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("model: {name: tiny}\n")
    argv = ["launch", "torchrun", "finetune", "--nodes", "2", "--head", "a", "-o", "/shared/ft"]
    assert main([*argv, "--config", "mine.yaml"]) == 0
    assert f"--config {tmp_path / 'mine.yaml'}" in capsys.readouterr().out
    assert main([*argv, "--config", "qwen2-7b-glaive"]) == 0
    assert "--config qwen2-7b-glaive" in capsys.readouterr().out


def test_every_path_the_nodes_read_is_absolute_in_the_script(tmp_path: Path, capsys, monkeypatch) -> None:
    """The script runs as printed from any directory: a relative --output once made the logs' directory absolute
    but left the report's relative to wherever sbatch ran, and a --profile file or fs's PATH stayed relative."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site.yaml").write_text("extends: h200\nname: site\n")
    argv = ["launch", "slurm", "accept", "--nodes", "2", "--gpus-per-node", "0", "--dry-run", "--output", "rel/out"]
    assert main([*argv, "--profile", "cpu"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("srun "))
    assert f"--output={tmp_path}/rel/out/logs/" in line and f"--output {tmp_path}/rel/out " in line, line
    assert main(["launch", "slurm", "fs", "--nodes", "2", "--gpus-per-node", "0", "--dry-run", "./scratch/"]) == 0
    assert f"gpucert cluster fs {tmp_path}/scratch --output" in capsys.readouterr().out
    assert main(["launch", "torchrun", "accept", "--nodes", "2", "--head", "a", "-o", "r", "--profile", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"-o {tmp_path}/r" in out and "--profile cpu" in out  # a profile name stays a name
    assert main(["launch", "torchrun", "accept", "--nodes", "2", "--head", "a", "--profile=site.yaml"]) == 0
    assert f"--profile={tmp_path}/site.yaml" in capsys.readouterr().out


def test_a_config_file_that_is_not_there_is_refused_before_anything_is_printed(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nothere.yaml"
    assert main(["launch", "slurm", "accept", "--nodes", "2", "--config", str(missing), "--dry-run"]) == 3
    captured = capsys.readouterr()
    assert f"{missing}: cannot read: No such file or directory" in captured.err and captured.out == ""


@pytest.mark.parametrize(
    "argv, said",
    [
        (["slurm", "accept", "--profile", "h100-sxmm"], "unknown profile 'h100-sxmm'; built-in profiles: a100-sxm, "),
        (["slurm", "health", "--set", "profile=h100-sxmm"], "unknown profile 'h100-sxmm'; built-in profiles: "),
        (["slurm", "accept", "--profile", "nothere.yaml"], "nothere.yaml: cannot read: No such file or directory"),
        (["k8s", "--image", "reg/gpucert:1", "accept", "--profile", "h100-sxmm"], "unknown profile 'h100-sxmm'"),
        (["slurm", "localize"], "a job of --gpus-per-node 0 has no GPU to choose one by: pass --profile (e.g. "),
        (["slurm", "localize", "--set", "localize.seed=3"], "has no GPU to choose one by: pass --profile"),
        (
            [
                "torchrun",
                "--head",
                "a",
                "finetune",
                "--config",
                "qwen2-7b-glaive",
                "-o",
                "/s",
                "--set",
                "train.bogus=1",
            ],
            "train.bogus",
        ),
        (["torchrun", "--head", "a", "accept", "--set", "bench.nope=3"], "bench.nope"),
        (["slurm", "accept", "--gpus-per-node", "0", "--bogus", "--dry-run"], "unrecognized arguments: --bogus"),
        (["k8s", "--image", "reg/gpucert:1", "finetune", "--config", "no-such-recipe"], "no-such-recipe"),
        # The verb's own checks of its flags, not argparse's alone: each was refused only by every node.
        (["slurm", "accept", "--skip", "foo"], "launch ... accept: --skip: unknown benchmark(s) foo"),
        (["torchrun", "--head", "a", "accept", "--nproc", "0"], "launch ... accept: --nproc must be >= 1, found 0"),
        (["slurm", "bench", "burn", "--duration", "abc"], "launch ... bench: --duration: expected a duration"),
        (["k8s", "--image", "reg/gpucert:1", "bench", "matmul", "--duration", "5s"], "`bench matmul` has none"),
    ],
)
def test_the_verbs_own_options_are_checked_before_anything_is_printed_or_submitted(argv, said, capsys) -> None:
    """A mistyped option, key or profile is refused here, not by every node of a job already submitted (on a real
    cluster: once it had queued for its nodes)."""
    slurm = ["--gpus-per-node", "0", "--dry-run"] if argv[0] == "slurm" else []
    assert main(["launch", *argv, "--nodes", "2", *slurm]) == 3
    captured = capsys.readouterr()
    assert said in captured.err and captured.out == ""


def test_a_localize_job_without_gpus_runs_with_a_profile_named(capsys) -> None:
    argv = ["launch", "slurm", "localize", "--nodes", "2", "--dry-run"]
    assert main([*argv, "--gpus-per-node", "0", "--profile", "cpu"]) == 0
    assert main([*argv, "--gpus-per-node", "0", "--set", "profile=cpu"]) == 0
    assert main([*argv, "--gpus-per-node", "8"]) == 0  # the job's host has GPUs to choose the profile by
    capsys.readouterr()


def test_torchrun_finetune_runs_on_each_nodes_own_gpus_unless_told(capsys) -> None:
    """--gpus-per-node once defaulted to 8 and printed `--nproc 8` for nodes of 4 GPUs."""
    argv = ["launch", "torchrun", "finetune", "--nodes", "2", "--head", "a", "--config", "qwen2-7b-glaive"]
    # Without --output the nodes' own `--resume auto` was refused by each of them (it needs the directory).
    assert main(argv) == 3
    assert "give --output DIR on the shared filesystem" in capsys.readouterr().err
    argv += ["--output", "/shared/runs/qwen"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "--nproc" not in out
    # A node or job started again continues from the checkpoints instead of being refused for having some.
    assert out.count("--resume auto") == 2
    assert main([*argv, "--gpus-per-node", "4"]) == 0
    assert capsys.readouterr().out.count("--nproc 4") == 2


def test_a_kubernetes_run_writes_on_the_shared_volume_and_reads_files_only_from_it(tmp_path: Path, capsys) -> None:
    """A pod sees its image and the claim: the report once went to the pod's own filesystem, lost with it, and a
    --config path of the submitting host was copied into the manifest."""
    argv = ["launch", "k8s", "accept", "--nodes", "2", "--image", "reg/gpucert:1"]
    assert main([*argv, "--pvc", "shared"]) == 0
    command = yaml.safe_load_all(capsys.readouterr().out)
    (job,) = [m for m in command if m["kind"] == "Job"]
    args = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[args.index("--output") + 1].startswith("/shared/runs/"), args
    local = tmp_path / "mine.yaml"
    local.write_text("runtime: {heartbeat_timeout_s: 40}\n")
    for extra in (["--pvc", "shared", "--config", str(local)], ["--config", "/shared/mine.yaml"], ["-o", "rel"]):
        assert main([*argv, *extra]) == 3
        captured = capsys.readouterr()
        assert "a pod sees only its image and the shared volume" in captured.err and captured.out == ""
    assert main([*argv, "--pvc", "shared", "--config", "/shared/mine.yaml", "--profile", "h100-sxm"]) == 0
    captured = capsys.readouterr()
    assert "- /shared/mine.yaml" in captured.out and "no --pvc" not in captured.err
    # Without a claim the report goes with the pod: said on stderr, the manifest on stdout as it was.
    assert main([*argv, "--profile", "h100-sxm"]) == 0
    captured = capsys.readouterr()
    assert "note: no --pvc: each pod's run directory" in captured.err and captured.out.startswith("apiVersion")
    # fine-tuning pods started again continue from the checkpoints, as on every backend
    assert main(["launch", "k8s", "finetune", "--nodes", "2", "--image", "r/g:1", "--config", "qwen2-7b-glaive"]) == 0
    assert "- --resume\n        - auto" in capsys.readouterr().out


def test_the_global_format_option_before_launch_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    """`gpucert --format plain launch ...` was refused as an unknown verb: the global option comes first."""
    for fmt in (["--format", "plain"], ["--format=table"]):
        assert main([*fmt, "launch", "torchrun", "accept", "--nodes", "2", "--head", "node-a"]) == 0
        assert "gpucert accept --nnodes 2 --node-rank 0 --master-addr node-a" in capsys.readouterr().out


def test_a_value_every_node_would_refuse_is_refused_before_the_script_is_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/cluster.md: what every node would refuse once the job had its allocation is refused before anything
    is printed: ranges too, under "auto" where the value is out of range for every built-in profile."""
    for profile in ([], ["--profile", "cpu"]):
        argv = ["launch", "slurm", "accept", "--nodes", "2", "--gpus-per-node", "0", *profile, "--dry-run"]
        assert main([*argv, "--set", "bench.memory.size_mib=0"]) == 3
        captured = capsys.readouterr()
        assert captured.out == ""
        assert "--set bench.memory.size_mib=0: bench.memory.size_mib must be in 1..32768, found 0" in captured.err
        assert main(argv) == 0
        assert capsys.readouterr().out.startswith("#!/bin/bash")
    assert main(["launch", "torchrun", "accept", "--nodes", "2", "--head", ""]) == 3
    assert "--head '': expected node rank 0's host name or address" in capsys.readouterr().err
    assert main(["launch", "torchrun", "accept", "--nodes", "2", "--head", "a", "--rendezvous-timeout", "inf"]) == 3
    assert "--rendezvous-timeout must be a positive number of seconds, at most 30 days" in capsys.readouterr().err
    # Kubernetes printed `nvidia.com/gpu: -1` and torchrun `--nproc -2` (only Slurm's job refused it).
    for backend in (["k8s", "accept", "--image", "r/x:1"], ["torchrun", "accept", "--head", "a"]):
        assert main(["launch", *backend, "--nodes", "2", "--gpus-per-node", "-1", "--profile", "cpu"]) == 3
        captured = capsys.readouterr()
        assert captured.out == "" and "--gpus-per-node must be >= 0, found -1" in captured.err


def test_launch_refuses_a_mistyped_finetune_stage_and_keeps_the_files_line_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`finetune prepar` was printed into every node's command once the parser stopped refusing it itself; the
    range problems came in string order (line 12 before line 9)."""
    argv = ["launch", "torchrun", "finetune", "prepar", "--nodes", "2", "--head", "h", "--config", "tiny"]
    assert main([*argv, "--output", str(tmp_path / "ft")]) == 3
    assert "'prepar': the only stage is `prepare`" in capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text("\n" * 8 + "runtime: {collective_timeout_s: 0}\n\n\nbench: {memory: {size_mib: 0}}\n")
    assert main(["launch", "slurm", "accept", "--nodes", "2", "--gpus-per-node", "0", "--config", str(config),
                 "--dry-run"]) == 3  # fmt: skip
    lines = [line.strip() for line in capsys.readouterr().err.splitlines()[1:]]
    assert [line.split(": ")[0] for line in lines] == [f"{config}:9", f"{config}:12"], lines
