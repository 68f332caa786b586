"""Every command README.md and docs/*.md show is a test (tests/doc_commands.py collects and checks them).

Tier 1: every gpucert part of every command parses with gpucert's own parsers, its `--set` keys exist with
values of their type, its `--config` and `--profile` name something; torchrun's options parse with torch's,
`make` targets and repository paths exist. Tier 2 (slow): the commands that run here in seconds and need nothing
filled in run as printed, in document order, in a scratch directory (paths under /tmp/ moved into it), and
exit as the doc says (`# exits N`) or as the contract says (0/1/2 for a judged verb; 3 or a traceback fails).
Every command is either run or named in NOT_RUN with the reason, so a new command in the docs must be classified:

    python -m pytest -q tests/test_documented_commands.py            # all
    python -m pytest -q tests/test_documented_commands.py -m "not slow"   # parsing only, a few seconds
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_commands import (
    REPO,
    DocCommand,
    check_command,
    collect_all,
    collect_commands,
    expected_exit_codes,
    placeholders,
    run_in_order,
    segments,
    unwrap,
    words,
)

COMMANDS = collect_all()

# Commands not run, by pattern (re.search on the command; the first that matches gives the reason), each with
# where it is covered instead. Their gpucert parts are still parsed (tier 1).
NOT_RUN = {
    r"^pip install ": "installs packages: .ci/run installs the checkout this way before the suite runs; the accept "
    "after it: tests/test_cli.py::test_verbs_run_on_a_cpu_machine_and_write_a_valid_report",
    r"gpucert finetune --config qwen2-7b": "trains a 7B model on GPUs: docs/results/finetune.md has those runs",
    r"^gpucert finetune$": "trains the offline recipe (~20 s): "
    "tests/finetune/test_cli_finetune.py::test_offline_default_trains_saves_evaluates_and_renders runs it",
    r"^gpucert accept --nnodes 2": "one node of two (node-a): two nodes on localhost in "
    "tests/runtime/test_cluster_runs.py::test_two_agents_as_two_nodes_accept_into_one_cluster_report",
    r"^srun ": "runs inside a Slurm allocation: tests/cluster/test_launch_slurm.py runs the verbs under srun on a "
    "real two-node Slurm",
    r"^torchrun ": "one node of two with 8 GPUs each: an outside torchrun on localhost in "
    "tests/runtime/test_cluster_runs.py::test_an_outside_torchrun_of_two_nodes_runs_accept_without_hanging",
    r"^gpucert cluster slurm": "needs a Slurm controller: "
    "tests/cluster/test_launch_slurm.py::test_cluster_slurm_passes_on_a_working_cluster",
    r"^gpucert cluster localize --host": "pair jobs on the hosts it names (ssh, GPUs): on localhost in "
    "tests/cluster/test_localize.py::test_a_host_list_search_names_the_node_that_cannot_run_and_clears_its_partner",
    r"/var/lib/": "a node's system paths (/var/lib/gpucert, node_exporter's textfile directory): the same options "
    "on scratch paths run in docs/fleet.md's first block",
    r"^gpucert report runs/golden runs/today": "two runs of the reader's (runs/golden, runs/today): "
    "tests/test_cli.py::test_report_compares_two_runs_and_exits_on_regression compares committed ones",
    r"^kubectl ": "needs a Kubernetes cluster: tests/fleet/test_deploy.py checks the manifests (kinds, image, every "
    "gpucert command parsed)",
    r"^docker ": "needs a docker daemon (and a GPU node): tests/fleet/test_deploy.py checks the Dockerfile's "
    "sources and the wheel it installs",
    r"^bash tools/device_": "drives a GPU machine (tools/device_*.sh): the docs/results pages hold what it measured",
    r"^python -m gpucert.cluster.localize_sim ": "the planner simulated over 30-100 seeds at up to 1,024 nodes takes "
    "minutes: tests/cluster/test_localize_sim.py::test_64_nodes_with_a_bad_node_a_slow_gpu_and_a_bad_uplink_are_named_"
    "and_nothing_else runs it at 64",
    r"(^python tools/synth_cluster.py |^/usr/bin/time -v gpucert report merge /tmp/sc1024)": "a 1,024-node synthetic "
    "cluster merged (a minute, a GiB of reports): tests/report/test_cluster_scale.py::"
    "test_the_merge_names_every_fault_and_nothing_else runs the same at 64 nodes",
    r"^python tools/store_scale.py ": "1,024 store clients for minutes: docs/results/store-scale.md holds what it "
    "measured; tests/runtime/test_watchdog.py::test_a_rank_that_left_is_not_named_dead_while_rank_0_works_on runs "
    "the heartbeat path it models",
    r"^promtool ": "Prometheus's tool, not a dependency of gpucert: "
    "tests/fleet/test_metrics.py::test_alert_rules_fire_on_a_real_fail evaluates the rules where Prometheus is",
}

# Commands run as printed (tier 2), each in a second or a few on two CPU cores.
RUN = {
    r"^gpucert (discover|health)$": "this machine, on the cpu profile",
    r"^gpucert (health|report) .*tests/fixtures/": "a captured node, a committed report",
    r"^gpucert report history \S+ /tmp/": "the runs the same block copied there",
    r"^gpucert finetune --list-recipes$": "lists the recipes",
    r"^gpucert launch (torchrun|k8s) ": "prints each node's command, the Job's YAML",
    r"^gpucert launch slurm ": "prints the script (--dry-run added where the doc submits)",
    r"^(mkdir -p|cp|grep -E) ": "the doc's own steps, in its scratch directory",
}


# What a runnable command may start, in every part of a chain: anything else (sbatch, kubectl) needs NOT_RUN.
LOCAL_PROGRAMS = {"gpucert", "mkdir", "cp", "grep", "cat", "ls", "head", "tail", "echo", "cd"}


def classify(command: DocCommand) -> tuple[bool, str]:
    """(run it, why): NOT_RUN first (on the line or any part of a chain), then a placeholder to fill in, then RUN
    where every part starts a program of this machine; (False, "") is unclassified."""
    parts = [" ".join(unwrap(segment)) for segment in segments(words(command.text))]
    for pattern, reason in NOT_RUN.items():
        if any(re.search(pattern, text) for text in [command.text, *parts]):
            return False, reason
    filled = placeholders(command.text)
    if filled:
        return False, f"placeholders to fill in: {' '.join(filled)}"
    local = all(part.split(" ", 1)[0] in LOCAL_PROGRAMS for part in parts)
    for pattern, what in RUN.items():
        if local and re.search(pattern, command.text):
            return True, what
    return False, ""


def _torch_slow(line: str) -> list[pytest.MarkDecorator]:
    """torchrun's options are parsed by torch's own parser: importing torch takes seconds."""
    tokens = words(line)
    started = any(w == "torchrun" and (i == 0 or tokens[i - 1] != "launch") for i, w in enumerate(tokens))
    return [pytest.mark.slow] if started else []


def test_the_docs_show_commands() -> None:
    """The collector finds the README's commands: a change in the docs' markup does not leave this test empty."""
    readme = [c for c in COMMANDS if c.path == "README.md"]
    assert len(readme) >= 5
    assert any(c.text.startswith("gpucert launch") for c in COMMANDS)


@pytest.mark.parametrize("command", [pytest.param(c, id=c.id, marks=_torch_slow(c.text)) for c in COMMANDS])
def test_documented_command_parses(command: DocCommand) -> None:
    checked = check_command(command)
    assert not checked.problems, "\n".join(checked.problems)


def test_every_documented_command_is_run_or_has_a_reason_not_to_be() -> None:
    unclassified = [f"{c.id}: {c.text}" for c in COMMANDS if classify(c) == (False, "")]
    assert not unclassified, (
        "documented commands neither run nor in NOT_RUN (tests/test_documented_commands.py): add a RUN pattern if "
        "it runs here in seconds, else a NOT_RUN pattern with the reason and the test that covers it:\n"
        + "\n".join(unclassified)
    )


def test_every_table_entry_still_matches_a_documented_command() -> None:
    """An entry no command matches any more is dead: the table names what the docs show, nothing else."""
    dead = [p for p in [*NOT_RUN, *RUN] if not any(re.search(p, c.text) for c in COMMANDS)]
    assert not dead, f"patterns matching no documented command: {dead}"


def test_the_tests_named_as_covering_a_command_exist() -> None:
    named = [m for reason in NOT_RUN.values() for m in re.finditer(r"(tests/[\w/]+\.py)(?:::(\w+))?", reason)]
    missing = [
        m.group(0)
        for m in named
        if not (REPO / m.group(1)).is_file()
        or (m.group(2) and f"def {m.group(2)}(" not in (REPO / m.group(1)).read_text())
    ]
    assert named and not missing, f"NOT_RUN names tests that do not exist: {missing}"


RUN_FILES = sorted({c.path for c in COMMANDS if classify(c)[0]})


@pytest.mark.slow
@pytest.mark.parametrize("doc", RUN_FILES)
def test_documented_commands_run_as_printed(doc: str, tmp_path: Path) -> None:
    """A file's runnable commands in document order (a later one may read what an earlier one wrote)."""
    failures = run_in_order([c for c in COMMANDS if c.path == doc and classify(c)[0]], tmp_path)
    assert not failures, "\n\n".join(failures)


# ---------------------------------------------------------------- the checker itself


def _doc(tmp_path: Path, body: str, language: str = "") -> list[DocCommand]:
    path = tmp_path / "fake.md"
    path.write_text(f"# A page\n\n```{language}\n{body}```\n")
    return collect_commands(path, tmp_path)


def test_collection_joins_continuations_strips_comments_and_prompts(tmp_path: Path) -> None:
    commands = _doc(
        tmp_path,
        "# a comment line\n\ngpucert accept \\\n  --skip train   # exits 0\n$ gpucert profiles\n",
        "console",
    )
    assert [(c.id, c.text) for c in commands] == [("fake.md:8", "gpucert profiles")]  # console: prompts only
    commands = _doc(tmp_path, "# a comment line\n\ngpucert accept \\\n  --skip train   # exits 0\ngpucert profiles\n")
    assert [(c.id, c.text, c.comment) for c in commands] == [
        ("fake.md:6", "gpucert accept --skip train", "exits 0"),
        ("fake.md:8", "gpucert profiles", ""),
    ]
    assert expected_exit_codes(commands[0]) == {0}


def test_output_diagrams_and_other_languages_are_no_commands(tmp_path: Path) -> None:
    assert _doc(tmp_path, "rows 400, parsed 390\ntrain: 351 conversations\n") == []
    assert _doc(tmp_path, " gpucert VERB ─► acceptance.run_on_nodes\n") == []
    assert _doc(tmp_path, "gpucert: {profile: auto}\n", "yaml") == []
    assert [c.text for c in _doc(tmp_path, "gpucert profiles\n", "bash")] == ["gpucert profiles"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("gpucert accept --frobnicate", "unrecognized arguments: --frobnicate"),
        ("gpucert acept", "invalid choice: 'acept'"),
        ("gpucert health --set health.expected_gpu=8", "unknown key 'health.expected_gpu'"),
        ("gpucert health --set health.expected_gpus=eight", "health.expected_gpus: expected int"),
        ("gpucert finetune --config qwen2-7b-glaive --set train.max_step=10", "unknown key 'train.max_step'"),
        ("gpucert finetune --config no-such-recipe", "--config no-such-recipe: no such file and no recipe"),
        ("gpucert accept --config configs/no-such.yaml", "--config configs/no-such.yaml: no such file"),
        ("gpucert accept --profile h100-pcie-xl", "--profile h100-pcie-xl: no built-in profile"),
        ("gpucert accept --skip trian", "unknown benchmark(s) trian"),
        ("gpucert launch slurm accept --nodes 2 --gpu-per-node 8", "unrecognized arguments: --gpu-per-node"),
        ("gpucert launch torchrun accept --nodes 2 --head a --port 80", "--port must be in 1024..65535"),
        ("srun --ntasks-per-node=1 gpucert acept", "invalid choice: 'acept'"),
        ("env NCCL_DEBUG=INFO gpucert health --set bench.nproc=x", "bench.nproc: expected int"),
        pytest.param(
            "torchrun --nodes-count 2 --rdzv-conf=timeout=60 -m gpucert accept",
            "unrecognized arguments: --nodes-count",
            marks=_torch_slow("torchrun"),
        ),
        pytest.param(
            "torchrun --nnodes 2 --master-addr node-a -m gpucert accept",
            "torchrun --nnodes 2 with no bound on its rendezvous",
            marks=_torch_slow("torchrun"),
        ),
        pytest.param(
            "torchrun --nnodes 2 --rdzv-conf=timeout=60 -m gpucert accept --nodes 2",
            "unrecognized arguments: --nodes",
            marks=_torch_slow("torchrun"),
        ),
        ("pip install -e . && make tests", "make tests: no such target"),
        ("python -m gpucert.no_such_module", "no such module"),
        ("gpucert health --replay tests/fixtures/nodes/no-such-node", "no such file or directory"),
    ],
)
def test_a_doc_that_drifts_from_the_code_fails_naming_its_line(tmp_path: Path, line: str, message: str) -> None:
    (command,) = _doc(tmp_path, f"{line}   # a comment\n")
    problems = check_command(command).problems
    assert problems, f"{line!r} passed"
    assert problems[0].startswith(f"fake.md:4: `{line}`: ")
    assert message in "\n".join(problems)


def test_placeholders_are_parsed_not_run_and_other_programs_must_be_classified(tmp_path: Path) -> None:
    commands = _doc(
        tmp_path,
        "gpucert report history NODE [RUNS_DIR] [--threshold PCT]\n"
        "gpucert evaluate --adapter runs/<id>/adapter [--config ...]\n",
    )
    assert [check_command(c).problems for c in commands] == [[], []]
    assert all(classify(c)[1].startswith("placeholders to fill in") for c in commands)
    unclassified = _doc(
        tmp_path, "nvidia-smi topo -m\ngpucert launch slurm accept --nodes 2 --dry-run > j.sh && sbatch j.sh\n"
    )
    assert [classify(c) for c in unclassified] == [(False, ""), (False, "")]


@pytest.mark.slow
def test_a_documented_run_that_no_longer_works_fails_naming_its_line(tmp_path: Path) -> None:
    commands = _doc(
        tmp_path,
        "gpucert launch torchrun finetune --nodes 2 --head node-a\n"  # refused: no recipe named
        "gpucert report tests/fixtures/reports/accept-cpu-a.json   # exits 2\n"  # the doc's claim is wrong
        "gpucert launch k8s accept --nodes 2 --gpus-per-node 8 --image example/gpucert:1 > /tmp/job.yaml\n"
        "gpucert launch torchrun accept --nodes 2 --head node-a --set health.bogus=1\n",  # launch checks the key
    )
    failures = run_in_order(commands, tmp_path / "run")
    assert len(failures) == 3
    assert failures[2].startswith("fake.md:7: `gpucert launch torchrun accept") and "exited 3" in failures[2]
    assert "unknown key 'health.bogus'" in failures[2]
    assert failures[0].startswith("fake.md:4: `gpucert launch torchrun finetune") and "exited 3" in failures[0]
    assert "name the recipe with --config" in failures[0]
    assert failures[1].startswith("fake.md:5: ") and "expected [2]" in failures[1]
    assert "kind: Job" in (tmp_path / "run/tmp/job.yaml").read_text()  # /tmp/ moved into the scratch directory


def test_words_are_split_as_the_shell_splits_them_with_the_docs_placeholders_kept_whole() -> None:
    assert segments(words("gpucert report runs/<id>/evaluation 2>&1 > out.txt | grep '#x' && echo $(hostname)")) == [
        ["gpucert", "report", "runs/<id>/evaluation"],
        ["grep", "#x"],
        ["echo", "$(hostname)"],
    ]
    assert unwrap(words("env NCCL_DEBUG=INFO exec gpucert health")) == ["gpucert", "health"]
