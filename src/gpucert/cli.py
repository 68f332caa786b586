"""The `gpucert` command line: a thin layer that composes the library.

    gpucert discover            what is in this node (--json for the machine-readable form)
    gpucert health              is every GPU healthy? exit code 0 PASS, 1 WARN, 2 FAIL, 3 ERROR
    gpucert accept              discover + health + every benchmark, one report, one verdict
    gpucert bench NAME          one benchmark: matmul, burn, memory, p2p, collectives, train
    gpucert report RUN [RUN2]   re-render a run (--html), or compare a run with a baseline
    gpucert capture -o DIR      save the node's raw hardware answers (a bundle --replay can re-read)
    gpucert profiles            list the built-in hardware profiles
    gpucert finetune [prepare]  LoRA SFT (offline default: tiny model + bundled data); see finetune/commands.py
    gpucert evaluate --adapter  function-calling accuracy of a trained adapter

Every verb that judges writes runs/<timestamp>-<host>/report.json and report.md (--output DIR chooses).
Usage and config errors exit 3 (ERROR: nothing was judged) with the file and key named.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

import gpucert
from gpucert.bench.catalog import BENCHMARKS
from gpucert.bytecode import use_cache
from gpucert.config.loader import ConfigError, describe_os_error, error_text
from gpucert.config.profiles import available_profiles, load_profile
from gpucert.fleet.options import metrics_path
from gpucert.report.terminal import FORMATS, make_console, set_format
from gpucert.runtime.errors import BROKEN_PIPE_EXIT
from gpucert.runtime.launch_env import launched_by_gpucert, read_rank_env
from gpucert.runtime.spawn import STDIN_EOF_STOPS
from gpucert.status import Status

if TYPE_CHECKING:
    from gpucert.acceptance import RunOutcome
    from gpucert.report.schema import Report
    from gpucert.runtime.launch_env import NodeEnv

ERROR_EXIT = Status.ERROR.exit_code


class UsageError(SystemExit):
    """The command line was refused: said on stderr, exit 3. A SystemExit, as argparse's own exits are, carrying
    the message for health --npd, whose contract answers on stdout (main)."""

    def __init__(self, message: str) -> None:
        super().__init__(ERROR_EXIT)
        self.message = message


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A negative number with a unit (`--duration -5s`) is a value, as argparse already takes `-5`: it was read
        # as an unknown flag ("expected one argument"), never reaching the check that says why -5s is refused.
        self._negative_number_matcher = re.compile(r"^-\d*\.?\d+(e[+-]?\d+)?[a-z]*$", re.IGNORECASE)

    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse exits 2 on usage errors, which our contract reserves for FAIL.
        self.print_usage(sys.stderr)
        print(f"gpucert: error: {message}", file=sys.stderr)
        raise UsageError(message)


def nonempty(text: str) -> str:
    """An --output that is a path: `-o ''` (an unset shell variable) wrote the report into the current directory,
    beside whatever was there."""
    if not text.strip():  # --resume "" too: it started a fresh run without a word
        raise argparse.ArgumentTypeError("an empty path (an unset variable?): name a directory")
    return text


def output_dir(text: str) -> Path:
    return Path(nonempty(text))


def _common_options() -> _Parser:
    common = _Parser(add_help=False)
    common.add_argument("--config", type=Path, help="run config YAML (defaults < file < --set)")
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. --set health.expected_gpus=8 (repeatable)",
    )
    common.add_argument("--profile", help="hardware profile name or YAML path (default: chosen by GPU name)")
    common.add_argument("--output", "-o", type=output_dir, help="directory for report.json and report.md")
    common.add_argument("--json", action="store_true", help="print the JSON report to stdout instead of tables")
    common.add_argument(
        "--replay",
        type=Path,
        metavar="BUNDLE",
        help="read the node from a `gpucert capture` bundle instead of this machine",
    )
    common.add_argument(
        "--metrics-file",
        type=metrics_path,
        metavar="PATH",
        help="also write the report as Prometheus metrics (node_exporter textfile format, e.g. "
        "/var/lib/node_exporter/textfile/gpucert-health.prom)",
    )
    return common


def _cluster_options() -> _Parser:
    cluster = _Parser(add_help=False)
    group = cluster.add_argument_group("several nodes (gpucert starts each node's GPU workers itself)")
    group.add_argument("--nnodes", type=int, help="nodes in the run; run gpucert once per node, same flags")
    group.add_argument("--node-rank", type=int, help="this node's rank, 0..nnodes-1 (0 writes the report)")
    group.add_argument("--master-addr", help="node rank 0's address, reachable from every node")
    group.add_argument("--master-port", type=int, default=29500, help="node rank 0's port (default 29500)")
    group.add_argument("--node-name", help="this node's name in the report (default: its hostname)")
    return cluster


def build_parser() -> argparse.ArgumentParser:
    from gpucert.finetune import commands  # its options only: no torch until a finetune runs
    from gpucert.finetune.eval.bfcl import add_suite_arguments

    parser = _Parser(prog="gpucert", description="Acceptance testing for NVIDIA GPU nodes and clusters.")
    parser.add_argument("--version", action="version", version=f"gpucert {gpucert.__version__}")
    output_format = "results as tables (terminal) or one line each (pipes, files); auto: tables on a terminal"
    parser.add_argument("--format", choices=FORMATS, default="auto", help=output_format)
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    common = _common_options()
    verbs.add_parser("discover", parents=[common], help="inventory of this node")
    cluster = _cluster_options()
    health = verbs.add_parser("health", parents=[common, cluster], help="GPU and node health checks")
    health.add_argument(
        "--drain",
        action="store_true",
        help="as Slurm's HealthCheckProgram: drain this node on FAIL (reason: the failing check), resume it when "
        "it passes again and gpucert had drained it; WARN and ERROR change nothing",
    )
    health.add_argument(
        "--slurm-node", help="this node's Slurm name (default: $SLURMD_NODENAME, else the short hostname)"
    )
    health.add_argument(
        "--npd",
        action="store_true",
        help="as a node-problem-detector custom plugin: one line on stdout, exit 0 OK, 1 a FAIL, 2 unknown (ERROR)",
    )
    health.add_argument(
        "--resume-after",
        type=int,
        default=1,
        metavar="N",
        help="with --drain: resume a node gpucert drained after N passing runs in a row (default 1); a FAIL drains "
        "only when the checks run again at once FAIL too",
    )
    accept = verbs.add_parser(
        "accept", parents=[common, cluster], help="the acceptance suite: discover + health + benchmarks"
    )
    accept.add_argument("--nproc", type=int, help="benchmark processes per node (default: one per GPU; 2 on CPU)")
    accept.add_argument("--skip", default="", help=f"comma-separated benchmarks to leave out ({', '.join(BENCHMARKS)})")
    bench = verbs.add_parser("bench", parents=[common, cluster], help="run one benchmark and judge it")
    bench.add_argument("benchmark", choices=BENCHMARKS)
    bench.add_argument("--nproc", type=int, help="processes per node (default: one per GPU; 2 gloo ranks on CPU)")
    bench.add_argument("--duration", help="burn only: how long every GPU stays under load, e.g. 90s, 10m, 1h")
    report = verbs.add_parser("report", help="render a run's report, or compare two runs")
    report.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run directory or report.json (two: compare); `merge DIR... -o OUT` joins per-node reports; "
        "`history NODE [RUNS_DIR]`: a node's figures over time, drift against its first run",
    )
    report.add_argument(
        "--html",
        action="store_true",
        help="write report.html in the run directory, or X.html beside a report file X.json (two runs: "
        "comparison.html)",
    )
    report.add_argument("--markdown", action="store_true", help="print Markdown instead of tables")
    report.add_argument(
        "--metrics-file", type=metrics_path, metavar="PATH", help="one run or merge: also write Prometheus metrics"
    )
    report.add_argument(
        "--threshold",
        type=float,
        help="compare: %% worse that counts as a regression; history: %% worse than the baseline that is a drift "
        "(default 5)",
    )
    report.add_argument(
        "--tolerance",
        action="append",
        default=[],
        metavar="NAME=PCT",
        help="compare: a per-metric tolerance in %%, e.g. matmul.bf16.max=8 (repeatable; see docs/reports.md)",
    )
    report.add_argument(
        "--output",
        "-o",
        type=output_dir,
        help="merge: directory for the cluster report; compare --html: for comparison.html",
    )
    capture = verbs.add_parser("capture", help="save raw hardware answers as a bundle for --replay and support")
    capture.add_argument("--output", "-o", type=output_dir, required=True, help="bundle directory to create")
    verbs.add_parser("profiles", help="list built-in hardware profiles")
    cluster = verbs.add_parser("cluster", help="checks of the cluster around the GPUs")
    cluster_checks = cluster.add_subparsers(dest="check", required=True, parser_class=_Parser)
    slurm = cluster_checks.add_parser(
        "slurm", parents=[common], help="Slurm smoke checks: controller, partitions, nodes, a job's resources"
    )
    slurm.add_argument(
        "--partition",
        help="the partition to check and send the test jobs to (default: every partition is checked, the jobs go "
        "to the default one)",
    )
    slurm.add_argument("--cpus", type=int, default=1, help="CPUs the probe step asks for (--cpus-per-task)")
    slurm.add_argument("--gpus", type=int, default=0, help="GPUs the probe step asks for (--gpus-per-node)")
    slurm.add_argument("--mem", type=int, default=256, help="MB the probe step asks for (--mem)")
    slurm.add_argument("--timeout", type=float, default=120.0, help="seconds each Slurm command may take")
    slurm.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # what the probe step runs
    fs = cluster_checks.add_parser(
        "fs",
        parents=[common, _cluster_options()],
        help="shared filesystem: same mount everywhere, a token seen on every node, metadata and I/O rates",
    )
    fs.add_argument("path", type=Path, help="a directory on the shared filesystem (files go in a subdirectory)")
    fs.add_argument("--files", type=int, default=2000, help="small files each node creates, stats and unlinks")
    fs.add_argument("--size-mib", type=int, default=1024, help="MiB of the checkpoint-sized file each node writes")
    localize = cluster_checks.add_parser(
        "localize",
        parents=[common],
        help="find the slow node or link: pairwise all_gather + per-GPU matmul jobs, suspects re-paired",
        description="Runs disjoint pair jobs (two-node gpucert accept: matmul on every GPU, Ring all_gather "
        "across the pair), then re-pairs suspects with known-good nodes. Nodes come from --hosts/--hostfile "
        "(ssh to other hosts) or, inside a Slurm allocation, from the allocation (one srun step per pair). "
        "The run directory (--output) must be on a filesystem every node shares.",
    )
    where = localize.add_mutually_exclusive_group()
    where.add_argument(
        "--hosts", nargs="+", metavar="HOST[:GPUS][@RACK]", help="the nodes, e.g. gpu01 gpu02, h:0 h:1, gpu01@r1"
    )
    where.add_argument("--hostfile", type=Path, help="a file of nodes, one per line (MPI's `host slots=8` works)")
    # Parsed by gpucert.launch.command (its unknown options pass through to the launched verb).
    verbs.add_parser("launch", help="a multi-node job: Slurm (submitted and followed), torchrun commands, Kubernetes")
    finetune = verbs.add_parser(
        "finetune", parents=[_cluster_options()], help="LoRA fine-tuning (offline default: tiny model, bundled data)"
    )
    finetune.add_argument("--nproc", type=int, help="training processes per node (default: one per GPU; 1 on CPU)")
    # No argparse `choices`: a mistyped flag's value (`--outptu x`) would be refused as the stage, the flag unnamed;
    # argparse names the flag, and finetune() any other word.
    finetune.add_argument("stage", nargs="?", help="prepare: build the data cache only")
    finetune.add_argument("--list-recipes", action="store_true", help="the recipes --config takes by name, and exit")
    commands.add_arguments(finetune)
    finetune.add_argument(
        "--resume", type=nonempty, help="none, auto (latest complete checkpoint) or a checkpoint directory"
    )
    finetune.add_argument("--output", "-o", type=nonempty, help="run directory (default runs/<time>-finetune)")
    evaluate = verbs.add_parser("evaluate", help="function-calling accuracy of a trained adapter")
    commands.add_arguments(evaluate, config_help=commands.EVALUATE_CONFIG_HELP)
    evaluate.add_argument("--adapter", type=Path, required=True, help="adapter directory (PEFT format)")
    evaluate.add_argument("--data", help="held-out data source (default: the config's data.source)")
    evaluate.add_argument(
        "--output", "-o", type=nonempty, help="report directory (default: evaluation/ beside the adapter)"
    )
    add_suite_arguments(evaluate)
    for verb in [*verbs.choices.values(), *cluster_checks.choices.values()]:  # after the verb too; SUPPRESS: no reset
        verb.add_argument("--format", choices=FORMATS, default=argparse.SUPPRESS, help=output_format)
    return parser


def _flag_plan(args: argparse.Namespace) -> NodeEnv | None:
    """The node plan of --nnodes/--node-rank/--master-addr/--master-port/--node-name; None without --nnodes."""
    from gpucert.runtime.launch_env import node_env_from_flags

    if getattr(args, "nnodes", None) is None:
        if getattr(args, "node_name", None) is not None:
            raise ConfigError("--node-name names this node among others: it needs --nnodes (and --node-rank)")
        if getattr(args, "node_rank", None) is not None:
            raise ConfigError(f"--node-rank {args.node_rank} says which of --nnodes this node is: give --nnodes too")
        return None
    return node_env_from_flags(args.nnodes, args.node_rank, args.master_addr, args.master_port, args.node_name)


def _progress(args: argparse.Namespace) -> Callable[[str], None]:
    """Where progress goes ("running benchmark matmul...", a node that joined): stderr, as git, curl and make
    put theirs, so stdout carries the results alone and `| head` or `| grep '^FAIL'` read only those. Nothing
    with --json: a program reads that, and its stderr then holds only what went wrong."""
    console = make_console(stderr=True)

    def say(line: str) -> None:
        if not args.json:
            console.print(line, style="dim")

    return say


def _benchmarks_of(args: argparse.Namespace) -> list[str]:
    if args.verb == "bench":
        return [args.benchmark]
    if args.verb == "accept":
        skipped = {s.strip() for s in args.skip.split(",") if s.strip()}
        unknown = skipped - set(BENCHMARKS)
        if unknown:
            raise ConfigError(
                f"--skip: unknown benchmark(s) {', '.join(sorted(unknown))}; known: {', '.join(BENCHMARKS)}"
            )
        kept = [b for b in BENCHMARKS if b not in skipped]
        if not kept:
            raise ConfigError(
                "--skip leaves accept no benchmark: that is `gpucert health` (the node checks alone), whose report "
                "says so; an accept report would read as an acceptance"
            )
        return kept
    return []


def _duration_override(args: argparse.Namespace) -> dict[str, str]:
    """`bench burn --duration 10m` as its config key, with the flag as typed; a bad duration or one given to another
    benchmark exits 3."""
    from gpucert.config.run import parse_duration_s

    if getattr(args, "duration", None) is None:
        return {}
    if args.benchmark != "burn":
        raise ConfigError(f"--duration sets how long `gpucert bench burn` runs; `bench {args.benchmark}` has none")
    try:
        return {f"bench.burn.duration_s={parse_duration_s(args.duration)}": f"--duration {args.duration}"}
    except ValueError as exc:
        raise ConfigError(f"--duration: {exc}") from None


# The verbs run_suite runs: their flags are checked by suite_args, here and by `gpucert launch` before it submits.
SUITE_VERBS = ("discover", "health", "accept", "bench")


def suite_args(args: argparse.Namespace) -> tuple[list[str], list[str], dict[str, str]]:
    """A suite verb's flags as (config overrides, benchmarks, each override a flag made -> the flag as typed, for
    messages), each refused with a ConfigError where it cannot run: --nproc, --skip, --duration, --resume-after and
    --drain."""
    flags = {f"profile={args.profile}": f"--profile {args.profile}"} if args.profile else {}
    nproc = getattr(args, "nproc", None)
    if nproc is not None:
        if nproc < 1:
            raise ConfigError(f"--nproc must be >= 1, found {nproc}")
        flags[f"bench.nproc={nproc}"] = f"--nproc {nproc}"
    benchmarks = _benchmarks_of(args)
    flags.update(_duration_override(args))
    if getattr(args, "resume_after", 1) < 1:
        raise ConfigError(f"--resume-after counts passing runs: it must be >= 1, found {args.resume_after}")
    if getattr(args, "resume_after", 1) != 1 and not getattr(args, "drain", False):
        raise ConfigError("--resume-after says when --drain resumes a node it drained: give it with --drain")
    if getattr(args, "drain", False) and (args.replay or getattr(args, "nnodes", None) not in (None, 1)):
        raise ConfigError("--drain acts on this live node: not with --replay or --nnodes (run it on every node)")
    if benchmarks and args.replay:
        raise ConfigError("--replay reads a captured node: benchmarks need the live node")
    return [*args.overrides, *flags], benchmarks, flags


def run_suite(args: argparse.Namespace, console: Console) -> int:
    from gpucert.acceptance import RunRequest, run_in_ranks, run_local, run_on_nodes
    from gpucert.runtime.launch_env import NodeEnv, read_node_env

    overrides, benchmarks, flags = suite_args(args)
    request = RunRequest(
        verb=args.verb if args.verb != "bench" else f"bench {args.benchmark}",
        benchmarks=benchmarks,
        config_path=args.config,
        overrides=overrides,
        output=args.output,
        replay=args.replay,
        command=["gpucert", *sys.argv[1:]],
        flags=flags,
    )

    say = _progress(args)
    nnodes = getattr(args, "nnodes", None)
    multi = nnodes not in (None, 1) or read_rank_env(os.environ) is not None or read_node_env(os.environ) is not None
    if multi and args.verb != "discover" and importlib.util.find_spec("torch") is None:
        raise ConfigError(
            f"`gpucert {args.verb}` across nodes meets them through torch.distributed, which a light install lacks: "
            "install gpucert[bench], or run `gpucert health` on each node and join the reports with "
            "`gpucert report merge`"
        )
    if args.verb != "discover" and read_rank_env(os.environ) is not None:
        # One rank of the job: started by gpucert's launcher below, or by an outside torchrun or srun.
        return _show(run_in_ranks(request, say), args, console)
    plan = _flag_plan(args)
    if plan is None and not args.replay:
        plan = read_node_env(os.environ)
    if args.verb == "discover" or (not benchmarks and (plan is None or plan.num_nodes == 1)):
        outcome = run_local(request)
    else:
        # This node's process: its ranks run this same command on torchrun's engine (runtime/launcher.py).
        ranks = [sys.executable, "-m", "gpucert", *args.argv]
        nproc = getattr(args, "nproc", None)
        outcome = run_on_nodes(request, plan or NodeEnv("local", 0, 1, "127.0.0.1", 0), nproc, ranks, say)
    if getattr(args, "drain", False) and outcome.report is not None:
        from gpucert.fleet.recheck import keeping_first_reading, recheck

        first = outcome.path

        def again() -> RunOutcome:
            if request.output is not None and first is not None:  # the re-run writes in the same --output
                return keeping_first_reading(first.parent, lambda: run_local(request))
            return run_local(request)

        outcome = recheck(outcome, again)  # one noisy reading never drains a node
        outcome = _drain(outcome, args)  # before it is shown: one verdict, the exit code's
    return _show(outcome, args, console)


def _drain(outcome: RunOutcome, args: argparse.Namespace) -> RunOutcome:
    """The health report with what --drain did as one more result (slurm.drain, ERROR when the node should have
    been drained or checked and could not be), written again."""
    import dataclasses
    import socket

    from gpucert.acceptance import RunOutcome
    from gpucert.cluster.slurm_checks import drain_result
    from gpucert.report.store import write_report

    assert outcome.report is not None
    report = outcome.report
    node = args.slurm_node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    timeout_s = float(report.meta.config.get("health", {}).get("command_timeout_s", 20.0))
    result = drain_result(node, list(report.results), timeout_s, resume_after=args.resume_after)
    print(f"gpucert: {result.message}", file=sys.stderr)
    report = dataclasses.replace(report, results=[*report.results, result])
    path = write_report(report, outcome.path.parent) if outcome.path is not None else None
    return RunOutcome(report, path, report.status.exit_code)


def _show(outcome: RunOutcome, args: argparse.Namespace, console: Console) -> int:
    from gpucert.report.terminal import print_report

    report, path, code = outcome.report, outcome.path, outcome.exit_code
    if getattr(args, "metrics_file", None) and not launched_by_gpucert():
        # Once a run, by the process the operator started: under gpucert's launcher the node process, which reads
        # back the report its rank 0 wrote (a rank that failed to write it said so once per rank and process).
        from gpucert.fleet.metrics import write_metrics
        from gpucert.report.store import load_report

        written = report or (load_report(path) if path is not None else None)
        if written is not None:
            write_metrics(written, args.metrics_file)
    if report is not None and getattr(args, "npd", False):
        from gpucert.fleet.npd import plugin_answer

        message, npd_code = plugin_answer(report)
        print(message)
        return npd_code
    if report is not None:
        if args.json:
            print(json.dumps(report.to_dict(), indent=1))
        else:
            show = args.verb in ("discover", "accept")
            print_report(report, console, show_inventory=show, report_path=str(path.absolute()) if path else None)
    return int(code)


def run_report(args: argparse.Namespace, console: Console) -> int:
    from gpucert.report.markdown import render_markdown
    from gpucert.report.store import write_html
    from gpucert.report.terminal import print_line, print_report

    mode = args.runs[0] if args.runs[0] in ("merge", "history") else "compare" if len(args.runs) == 2 else "render"
    _refuse_unused_report_flags(args, mode)
    if mode == "merge":
        return run_merge(args, console)
    args.threshold = DEFAULT_THRESHOLD_PCT if args.threshold is None else args.threshold
    if mode == "history":
        from gpucert.fleet.history import run_history

        return run_history(args.runs[1:], args.threshold, console)
    args.runs = [Path(run) for run in args.runs]
    if len(args.runs) > 2:
        raise ConfigError("report takes one run (render) or two runs (baseline, candidate)")
    if not 0 <= args.threshold < math.inf:  # nan fails both; inf would find no regression ever
        raise ConfigError(
            f"--threshold (the % worse that counts as a regression) must be a number >= 0, found {args.threshold}"
        )
    reports = [_load_run(path) for path in args.runs]
    if len(reports) == 2:
        from gpucert.report.compare import (
            compare_reports,
            comparison_status,
            mismatches,
            parse_tolerances,
            print_comparison,
            render_comparison_markdown,
        )

        try:
            tolerances = parse_tolerances(args.tolerance)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        comparisons = compare_reports(reports[0], reports[1], threshold_pct=args.threshold, tolerances=tolerances)
        base, new = (str(path) for path in args.runs)
        notes = mismatches(*reports)
        if args.markdown:
            print(
                render_comparison_markdown(
                    comparisons, base, new, threshold_pct=args.threshold, changed_only=True, notes=notes
                )
            )
        else:
            for note in notes:  # above the rows: they say how far the rows can be read as like for like
                print_line(console, f"note: {note}")
            print_comparison(console, comparisons, base, new, changed_only=True)
        if args.html:
            from gpucert.report.compare_html import render_comparison_html, write_comparison_html

            page = render_comparison_html(comparisons, base, new, args.threshold, reports[0], reports[1], notes=notes)
            directory = args.output or (args.runs[1] if args.runs[1].is_dir() else args.runs[1].parent)
            print(f"html: {write_comparison_html(page, directory)}")  # a path whole, never wrapped
        return comparison_status(comparisons).exit_code
    (report,) = reports
    if args.metrics_file:
        from gpucert.fleet.metrics import write_metrics

        write_metrics(report, args.metrics_file)
    if args.markdown:
        print(render_markdown(report))
    elif not args.html:
        print_report(report, console, show_inventory=True, report_path=None)
    if args.html:
        given = args.runs[0]
        # A report file other than a run's report.json gets its own page beside it (x.json -> x.html): six
        # example reports rendered in one directory wrote one report.html six times.
        if given.is_dir() or given.name == "report.json":
            path = write_html(report, given if given.is_dir() else given.parent)
        else:
            path = write_html(report, given.parent, given.with_suffix(".html").name)
        print(f"html: {path}")  # a path whole, never wrapped
    return report.status.exit_code


DEFAULT_THRESHOLD_PCT = 5.0

# The report verb's flags, and what each of its four uses reads: a flag given to a use that does not read it is
# refused, not ignored (a --tolerance on one run, --html on history would otherwise do nothing, silently).
REPORT_FLAGS = {
    "html": "--html",
    "markdown": "--markdown",
    "metrics_file": "--metrics-file",
    "threshold": "--threshold",
    "tolerance": "--tolerance",
    "output": "--output",
}
REPORT_USES = {
    "render": ("html", "markdown", "metrics_file"),
    "compare": ("html", "markdown", "threshold", "tolerance", "output"),
    "merge": ("metrics_file", "output"),
    "history": ("threshold",),
}
REPORT_USE_TEXT = {
    "render": "gpucert report RUN",
    "compare": "gpucert report BASELINE CANDIDATE",
    "merge": "gpucert report merge",
    "history": "gpucert report history",
}


def _refuse_flags_beside(flag: str, args: argparse.Namespace) -> None:
    """`flag` (a listing) reads no other flag of its verb: one given beside it is refused, not silently ignored
    (`finetune --list-recipes --config x` listed every recipe as though x was not there)."""
    parser = build_parser()
    defaults = vars(parser.parse_args([args.verb, f"--{flag.replace('_', '-')}"]))
    given = [key for key, value in defaults.items() if key not in (flag, "format") and getattr(args, key) != value]
    if given:
        verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        # Each as the user typed it: --set, not its dest (overrides); a positional by its value.
        named = {a.dest: max(a.option_strings, key=len) for a in verbs.choices[args.verb]._actions if a.option_strings}
        said = ", ".join(named.get(key) or str(getattr(args, key)) for key in given)
        raise ConfigError(f"{named[flag]} lists and exits: it reads no other argument, found {said}")


def _refuse_unused_report_flags(args: argparse.Namespace, mode: str) -> None:
    given = [key for key in REPORT_FLAGS if getattr(args, key) not in (None, False, [])]
    unused = [key for key in given if key not in REPORT_USES[mode]]
    if unused:
        takes = [use for use, keys in REPORT_USES.items() if unused[0] in keys]
        raise ConfigError(
            f"{REPORT_USE_TEXT[mode]} does not use {', '.join(REPORT_FLAGS[k] for k in unused)}: "
            f"{REPORT_FLAGS[unused[0]]} is for {' and '.join(REPORT_USE_TEXT[u] for u in takes)}"
        )
    if mode == "compare" and args.output is not None and not args.html:
        raise ConfigError(
            "gpucert report BASELINE CANDIDATE writes a file only with --html: --output says where its "
            "comparison.html goes (add --html, or leave --output out)"
        )


def _load_run(path: Path) -> Report:
    """The report of a run directory or file; a fine-tuning or evaluation directory from before they wrote one is
    named as such rather than as a missing file."""
    from gpucert.report.store import load_report

    if path.is_dir() and not (path / "report.json").exists():
        older = next((name for name in ("metrics.json", "evaluation.json") if (path / name).exists()), None)
        if older:
            raise ConfigError(
                f"{path}: no report.json, only {older}, written by a gpucert from before fine-tuning and evaluation "
                "wrote reports: run it again to get one that gpucert report renders"
            )
    return load_report(path)


def run_cluster(args: argparse.Namespace, console: Console) -> int:
    from gpucert.acceptance import RunRequest, run_local
    from gpucert.cluster import slurm_checks

    if args.check == "fs":
        return run_cluster_fs(args, console)
    if args.check == "localize":
        return run_cluster_localize(args, console)
    if args.probe:
        print(json.dumps(slurm_checks.probe()))
        return 0
    for name in ("cpus", "mem", "timeout"):
        if getattr(args, name) <= 0:
            raise ConfigError(f"--{name} must be > 0, found {getattr(args, name)}")
    if args.gpus < 0:
        raise ConfigError(f"--gpus must be >= 0, found {args.gpus}")
    overrides = list(args.overrides) + ([f"profile={args.profile}"] if args.profile else [])
    request = RunRequest("cluster slurm", [], args.config, overrides, args.output, None, ["gpucert", *sys.argv[1:]])
    here = [sys.executable, "-m", "gpucert"]
    outcome = run_local(
        request, lambda: slurm_checks.run_checks(args.partition, args.cpus, args.gpus, args.mem, args.timeout, here)
    )
    return _show(outcome, args, console)


def run_cluster_fs(args: argparse.Namespace, console: Console) -> int:
    from gpucert.acceptance import RunRequest
    from gpucert.cluster.fs_checks import FsOptions, room_problem, run_in_ranks, run_job
    from gpucert.runtime.launch_env import NodeEnv, read_node_env

    for name in ("files", "size_mib"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, found {getattr(args, name)}")
    if args.replay:
        raise ConfigError("--replay reads a captured node: cluster fs needs the live filesystem")
    overrides = list(args.overrides) + ([f"profile={args.profile}"] if args.profile else [])
    request = RunRequest("cluster fs", [], args.config, overrides, args.output, None, ["gpucert", *sys.argv[1:]])
    plan = _flag_plan(args) or read_node_env(os.environ) or NodeEnv("local", 0, 1, "127.0.0.1", 0)

    say = _progress(args)
    options = FsOptions(args.path.absolute(), args.files, args.size_mib)
    # Before any node writes, on either path (gpucert's node process or a rank under srun/torchrun).
    if problem := room_problem(options, plan.num_nodes):
        raise ConfigError(problem)
    if read_rank_env(os.environ) is not None:
        return _show(run_in_ranks(request, options, say), args, console)
    ranks = [sys.executable, "-m", "gpucert", *args.argv]
    return _show(run_job(request, plan, options, ranks, say), args, console)


def run_cluster_localize(args: argparse.Namespace, console: Console) -> int:
    from gpucert.acceptance import RunRequest
    from gpucert.cluster.localize import read_hostfile, run_localize

    if args.replay:
        raise ConfigError("--replay reads a captured node: localize runs jobs on live nodes")
    if importlib.util.find_spec("torch") is None:
        raise ConfigError("localize's pair jobs meet through torch.distributed: install gpucert[bench] on every node")
    hosts = read_hostfile(args.hostfile) if args.hostfile else args.hosts
    overrides = list(args.overrides) + ([f"profile={args.profile}"] if args.profile else [])
    command = ["gpucert", *sys.argv[1:]]
    request = RunRequest("cluster localize", [], args.config, overrides, args.output, None, command)

    say = _progress(args)
    return _show(run_localize(request, hosts, say, os.environ), args, console)


def run_launch(argv: list[str]) -> int:
    from gpucert.launch import command
    from gpucert.launch.slurm import SlurmError

    console = make_console(stderr=True)
    try:
        return command.run(argv, _Parser, lambda line: console.print(line, style="dim"))
    except (ConfigError, SlurmError, ValueError) as exc:
        print(f"gpucert launch: error: {error_text(exc)}", file=sys.stderr)
        return ERROR_EXIT
    except KeyboardInterrupt as exc:
        from gpucert.runtime.errors import Interrupted

        if isinstance(exc, Interrupted):  # while it followed a job it had submitted: named
            print(f"gpucert launch: {exc.line()}", file=sys.stderr)
            return exc.exit_code
        print("gpucert launch: interrupted (a submitted job keeps running: scancel it)", file=sys.stderr)
        return 130


def run_merge(args: argparse.Namespace, console: Console) -> int:
    from gpucert.report.cluster import write_merged
    from gpucert.report.terminal import print_report

    if len(args.runs) < 3:
        raise ConfigError("report merge takes two or more per-node run directories (or report.json files)")
    if args.output is None:
        raise ConfigError("report merge needs --output DIR for the cluster report")
    report = write_merged([Path(p) for p in args.runs[1:]], args.output, ["gpucert", *sys.argv[1:]])
    if args.metrics_file:
        from gpucert.fleet.metrics import write_metrics

        write_metrics(report, args.metrics_file)
    print_report(report, console, show_inventory=False, report_path=str(args.output / "report.json"))
    return report.status.exit_code


def _dispatch(args: argparse.Namespace, console: Console) -> int:
    """The verb's work; main turns what it raises into one line and an exit code."""
    if args.verb == "capture":
        from gpucert.hardware.capture import capture_node
        from gpucert.report.store import check_writable

        check_writable(args.output, "--output")  # before the capture's seconds, not after (naming a temporary)
        problems = capture_node(args.output)
        for problem in problems:
            console.print(f"not captured: {problem}", style="yellow")
        console.print(f"bundle written to {args.output} (replay: gpucert discover --replay {args.output})")
        return 0
    if args.verb in ("finetune", "evaluate"):
        from gpucert.finetune import commands
        from gpucert.finetune.config import recipe_lines, resolve_recipe

        if getattr(args, "list_recipes", False):
            _refuse_flags_beside("list_recipes", args)
            print("\n".join(recipe_lines()))
            return 0
        # A recipe name or a path; refused here if neither. evaluate keeps None: it means the adapter's run config.
        if args.config is not None or args.verb == "finetune":
            args.config = resolve_recipe(args.config)
        return commands.finetune(args) if args.verb == "finetune" else commands.evaluate(args)
    if args.verb == "report":
        return run_report(args, console)
    if args.verb == "cluster":
        return run_cluster(args, console)
    if args.verb == "profiles":
        for name in available_profiles():
            profile = load_profile(name)
            console.print(f"{name}: {profile.description} (matches {profile.match or 'by name only'})")
        return 0
    if getattr(args, "npd", False):
        from gpucert.fleet.npd import run_plugin

        def plugin() -> int:
            if args.json:
                raise ConfigError(
                    "--npd answers node-problem-detector with one line on stdout and --json prints the report "
                    "there: give one of them"
                )
            return run_suite(args, console)

        return run_plugin(plugin)
    return run_suite(args, console)


def _launch_argv(argv: list[str]) -> list[str] | None:
    """The arguments after `launch`, also behind the global --format (which launch, printing scripts, has no
    use for); None for any other verb."""
    rest = argv
    while rest[:1] and rest[0].split("=", 1)[0] == "--format":
        value = rest[0].partition("=")[2] if "=" in rest[0] else (rest[1] if len(rest) > 1 else "")
        if value not in FORMATS:
            return None  # the parser says what is wrong with it
        rest = rest[1:] if "=" in rest[0] else rest[2:]
    return rest[1:] if rest[:1] == ["launch"] else None


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a process's entry (not a caller in the same process): before torch, bytecode.py says why
        use_cache()
    argv = sys.argv[1:] if argv is None else argv
    # Before torch loads (it reads this once): c10d's C++ errors come with a stack dump of 30 frames, and every
    # one of them is said again, in one line naming the node and the address, by gpucert's own message.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    launch = _launch_argv(argv)
    if launch is not None:
        return run_launch(launch)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        if argv[:1] != ["health"] or "--npd" not in argv:
            raise
        from gpucert.fleet.npd import unknown

        # NPD's contract: one line on stdout and 2, whatever went wrong (the reason is on stderr already).
        return unknown(f"the command line was refused: {exc.message}", said=True)
    args.argv = argv  # what a node's ranks run again (runtime/launcher.py)
    if os.environ.get(STDIN_EOF_STOPS) == "1" and read_rank_env(os.environ) is None:
        from gpucert.runtime.spawn import stop_on_stdin_eof

        stop_on_stdin_eof()  # a node agent localize started over ssh: it stops when localize does
    set_format(args.format)
    console = make_console()
    try:
        code = _dispatch(args, console)
        sys.stdout.flush()  # here, not at exit: a reader that left is then the BrokenPipeError below
        return code
    except KeyboardInterrupt as exc:
        # The ranks were stopped on the way out (runtime/launcher.py); one line, the shell's code for the signal.
        from gpucert.runtime.errors import Interrupted

        if isinstance(exc, Interrupted):
            print(f"gpucert: {exc.line()}", file=sys.stderr)
            return exc.exit_code
        print("gpucert: interrupted", file=sys.stderr)
        return 130
    except (ConfigError, ValueError) as exc:
        print(f"gpucert: error: {error_text(exc)}", file=sys.stderr)
        return ERROR_EXIT
    except BrokenPipeError:
        # The reader left (`gpucert report ... | head`): what it read was right, there is nothing to say. Later
        # writes (Python's own flush at exit) go nowhere. 141 is what a shell reports for a writer that SIGPIPE
        # ended (`yes | head`): no verdict (0-3) is claimed for output nobody read.
        with contextlib.suppress(OSError, ValueError):  # a stdout with no descriptor (a test's capture)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if launched_by_gpucert():
            # Rank 0 printing the report for gpucert's node process: that process exits 141, quietly. A rank
            # exiting 141 itself would look failed to torchrun's agent, which would start another round.
            from gpucert.runtime.launcher import write_verdict  # loaded already in a rank: torch is there

            write_verdict(BROKEN_PIPE_EXIT)
            return 0
        return BROKEN_PIPE_EXIT
    except OSError as exc:
        # The environment refused (a full disk, a missing or unreadable file): one line naming the path, no traceback.
        print(f"gpucert: error: {describe_os_error(exc)}", file=sys.stderr)
        return ERROR_EXIT
    except RuntimeError as exc:
        from gpucert.runtime.errors import JobFailed, RendezvousError

        if isinstance(exc, JobFailed):
            print(f"gpucert: {exc}", file=sys.stderr)  # the cause, in one line; every rank is gone
            return ERROR_EXIT
        if not isinstance(exc, RendezvousError):
            traceback.print_exc()
        print(f"gpucert: error: {exc}", file=sys.stderr)
        return ERROR_EXIT
    except Exception as exc:
        # Whatever broke, nothing was judged: exit 3 (ERROR), never 1, which monitoring reads as WARN.
        traceback.print_exc()
        print(f"gpucert: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return ERROR_EXIT
