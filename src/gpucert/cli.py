"""The `gpucert` command line: a thin layer that composes the library.

    gpucert discover            what is in this node (--json for the machine-readable form)
    gpucert health              is every GPU healthy? exit code 0 PASS, 1 WARN, 2 FAIL, 3 ERROR
    gpucert accept              discover + health + every benchmark, one report, one verdict
    gpucert bench NAME          one benchmark: matmul, memory, p2p, collectives, train
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
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

import gpucert
from gpucert.bench.catalog import BENCHMARKS
from gpucert.bench.distributed import ranks_from_env
from gpucert.bench.suite import run_benchmark
from gpucert.config.loader import ConfigError, load_config
from gpucert.config.profiles import Profile, available_profiles, load_profile, select_profile
from gpucert.config.run import RunConfig
from gpucert.finetune import commands
from gpucert.hardware.capture import capture_node
from gpucert.hardware.inventory import NodeSources, bundle_sources, collect_inventory, live_sources
from gpucert.health.liveness import SubprocessLivenessProbe
from gpucert.health.suite import run_health
from gpucert.health.xid import collect_kernel_log
from gpucert.report.markdown import render_markdown
from gpucert.report.schema import Report, Result, RunMeta
from gpucert.report.store import default_run_dir, load_report, write_html, write_report
from gpucert.report.terminal import print_report
from gpucert.status import Status

ERROR_EXIT = Status.ERROR.exit_code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse exits 2 on usage errors, which our contract reserves for FAIL.
        self.print_usage(sys.stderr)
        self.exit(ERROR_EXIT, f"gpucert: error: {message}\n")


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
    common.add_argument("--output", "-o", type=Path, help="directory for report.json and report.md")
    common.add_argument("--json", action="store_true", help="print the JSON report to stdout instead of tables")
    common.add_argument(
        "--replay",
        type=Path,
        metavar="BUNDLE",
        help="read the node from a `gpucert capture` bundle instead of this machine",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpucert", description="Acceptance testing for NVIDIA GPU nodes and clusters.")
    parser.add_argument("--version", action="version", version=f"gpucert {gpucert.__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    common = _common_options()
    verbs.add_parser("discover", parents=[common], help="inventory of this node")
    verbs.add_parser("health", parents=[common], help="GPU and node health checks")
    accept = verbs.add_parser("accept", parents=[common], help="the acceptance suite: discover + health + benchmarks")
    accept.add_argument("--nproc", type=int, help="benchmark processes per node (default: one per GPU; 2 on CPU)")
    accept.add_argument("--skip", default="", help=f"comma-separated benchmarks to leave out ({', '.join(BENCHMARKS)})")
    bench = verbs.add_parser("bench", parents=[common], help="run one benchmark and judge it")
    bench.add_argument("benchmark", choices=BENCHMARKS)
    bench.add_argument("--nproc", type=int, help="processes per node (default: one per GPU; 2 gloo ranks on CPU)")
    report = verbs.add_parser("report", help="render a run's report, or compare two runs")
    report.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directory or report.json (two: compare)")
    report.add_argument("--html", action="store_true", help="write report.html next to the report and say where")
    report.add_argument("--markdown", action="store_true", help="print Markdown instead of tables")
    report.add_argument("--threshold", type=float, default=5.0, help="%% worse that counts as a regression (compare)")
    capture = verbs.add_parser("capture", help="save raw hardware answers as a bundle for --replay and support")
    capture.add_argument("--output", "-o", type=Path, required=True, help="bundle directory to create")
    verbs.add_parser("profiles", help="list built-in hardware profiles")
    finetune = verbs.add_parser("finetune", help="LoRA fine-tuning (offline default: tiny model, bundled data)")
    finetune.add_argument("stage", nargs="?", choices=["prepare"], help="prepare: build the data cache only")
    commands.add_arguments(finetune)
    finetune.add_argument("--resume", help="none, auto (latest complete checkpoint) or a checkpoint directory")
    finetune.add_argument("--output", "-o", help="run directory (default runs/<time>-finetune)")
    evaluate = verbs.add_parser("evaluate", help="function-calling accuracy of a trained adapter")
    commands.add_arguments(evaluate)
    evaluate.add_argument("--adapter", type=Path, required=True, help="adapter directory (PEFT format)")
    evaluate.add_argument("--data", help="held-out data source (default: the config's data.source)")
    evaluate.add_argument("--output", "-o", help="where evaluation.json goes (default: next to the adapter)")
    return parser


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _resolve_profile(config: RunConfig, gpu_names: list[str]) -> Profile:
    return select_profile(gpu_names) if config.profile == "auto" else load_profile(config.profile)


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
        return [b for b in BENCHMARKS if b not in skipped]
    return []


def run_suite(args: argparse.Namespace, console: Console) -> int:
    started, t0 = _now(), time.perf_counter()
    overrides = list(args.overrides) + ([f"profile={args.profile}"] if args.profile else [])
    if getattr(args, "nproc", None):
        overrides.append(f"bench.nproc={args.nproc}")
    benchmarks = _benchmarks_of(args)
    if benchmarks and args.replay:
        raise ConfigError("--replay reads a captured node: benchmarks need the live node")
    config = load_config(RunConfig, args.config, overrides)
    sources: NodeSources = bundle_sources(args.replay) if args.replay else live_sources()
    inventory = collect_inventory(sources)
    named = [g.name for g in inventory.gpu.gpus if "nvmlDeviceGetName" not in g.unreadable]
    if inventory.gpu.gpus and not named and config.profile == "auto":
        raise ConfigError("no GPU answered NVML's name query, so no profile can be chosen: name one with --profile")
    profile = _resolve_profile(config, named)
    # Now that the hardware is known, its profile's run defaults sit under the file and --set values.
    config = load_config(RunConfig, args.config, overrides, base=profile.run_defaults)
    # Under an outside torchrun/srun every rank runs this; only rank 0 checks health and writes the report.
    main_rank = int((ranks_from_env(os.environ) or {}).get("RANK", "0")) == 0
    results: list[Result] = []
    if args.verb in ("health", "accept") and main_rank:
        if sources.kernel_log is not None:
            kernel_log: tuple[str | None, str | None] = (sources.kernel_log, None)
        elif args.replay:
            kernel_log = (None, "the bundle has no dmesg.txt")
        else:
            kernel_log = collect_kernel_log(config.health.command_timeout_s)
        probe = None if args.replay else SubprocessLivenessProbe()
        results = run_health(inventory, profile, config.health, kernel_log, probe, started)
    with tempfile.TemporaryDirectory(prefix="gpucert-bench-") as workdir:
        for name in benchmarks:
            if not args.json and main_rank:
                console.print(f"[dim]running benchmark {name}...[/]")
            results += run_benchmark(name, config, profile, inventory, Path(workdir), sources.nvml)
    if not main_rank:
        return 0
    finished = _now()
    report = Report(
        meta=RunMeta(
            tool_version=gpucert.__version__,
            method_version=gpucert.METHOD_VERSION,
            verb=args.verb if args.verb != "bench" else f"bench {args.benchmark}",
            command=["gpucert", *sys.argv[1:]],
            host=inventory.hostname,
            started_at=started.isoformat(),
            finished_at=finished.isoformat(),
            duration_s=round(time.perf_counter() - t0, 3),
            profile=profile.name,
            config=dataclasses.asdict(config),
            software=inventory.to_dict()["software"],
        ),
        inventory=inventory.to_dict(),
        results=results,
    )
    out_dir = args.output or default_run_dir(Path(config.runs_dir), inventory.hostname, started)
    path = write_report(report, out_dir, html=bool(benchmarks))
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print_report(report, console, show_inventory=args.verb in ("discover", "accept"), report_path=str(path))
    return report.status.exit_code


def run_report(args: argparse.Namespace, console: Console) -> int:
    if len(args.runs) > 2:
        raise ConfigError("report takes one run (render) or two runs (baseline, candidate)")
    reports = [load_report(path) for path in args.runs]
    if len(reports) == 2:
        from gpucert.report.compare import (
            compare_reports,
            comparison_status,
            print_comparison,
            render_comparison_markdown,
        )

        comparisons = compare_reports(reports[0], reports[1], threshold_pct=args.threshold)
        base, new = (str(path) for path in args.runs)
        if args.markdown:
            print(render_comparison_markdown(comparisons, base, new, threshold_pct=args.threshold, changed_only=True))
        else:
            print_comparison(console, comparisons, base, new, changed_only=True)
        return comparison_status(comparisons).exit_code
    (report,) = reports
    if args.html:
        directory = args.runs[0] if args.runs[0].is_dir() else args.runs[0].parent
        path = write_html(report, directory)
        console.print(f"html: {path}")
    elif args.markdown:
        print(render_markdown(report))
    else:
        print_report(report, console, show_inventory=True, report_path=None)
    return report.status.exit_code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(stderr=False, highlight=False)
    try:
        if args.verb == "capture":
            problems = capture_node(args.output)
            for problem in problems:
                console.print(f"[yellow]not captured:[/] {problem}")
            console.print(f"bundle written to {args.output} (replay: gpucert discover --replay {args.output})")
            return 0
        if args.verb == "finetune":
            return commands.finetune(args)
        if args.verb == "evaluate":
            return commands.evaluate(args)
        if args.verb == "report":
            return run_report(args, console)
        if args.verb == "profiles":
            for name in available_profiles():
                profile = load_profile(name)
                console.print(f"[bold]{name}[/]: {profile.description} (matches {profile.match or 'by name only'})")
            return 0
        return run_suite(args, console)
    except (ConfigError, ValueError) as exc:
        print(f"gpucert: error: {exc}", file=sys.stderr)
        return ERROR_EXIT
    except Exception as exc:
        # Whatever broke, nothing was judged: exit 3 (ERROR), never 1, which monitoring reads as WARN.
        traceback.print_exc()
        print(f"gpucert: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return ERROR_EXIT
