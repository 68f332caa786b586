"""The `gpucert` command line: a thin layer that composes the library.

    gpucert discover            what is in this node (--json for the machine-readable form)
    gpucert health              is every GPU healthy? exit code 0 PASS, 1 WARN, 2 FAIL, 3 ERROR
    gpucert accept              discover + health (+ benchmarks), one report, one verdict
    gpucert capture -o DIR      save the node's raw hardware answers (a bundle --replay can re-read)
    gpucert profiles            list the built-in hardware profiles

Every verb that judges writes runs/<timestamp>-<host>/report.json and report.md (--output DIR chooses).
Usage and config errors exit 3 (ERROR: nothing was judged) with the file and key named.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

import gpucert
from gpucert.config.loader import ConfigError, load_config
from gpucert.config.profiles import Profile, available_profiles, load_profile, select_profile
from gpucert.config.run import RunConfig
from gpucert.hardware.capture import capture_node
from gpucert.hardware.inventory import NodeSources, bundle_sources, collect_inventory, live_sources
from gpucert.health.liveness import SubprocessLivenessProbe
from gpucert.health.suite import run_health
from gpucert.health.xid import collect_kernel_log
from gpucert.report.schema import Report, Result, RunMeta
from gpucert.report.store import default_run_dir, write_report
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
    verbs.add_parser("accept", parents=[common], help="the acceptance suite: discover + health + benchmarks")
    capture = verbs.add_parser("capture", help="save raw hardware answers as a bundle for --replay and support")
    capture.add_argument("--output", "-o", type=Path, required=True, help="bundle directory to create")
    verbs.add_parser("profiles", help="list built-in hardware profiles")
    return parser


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _resolve_profile(config: RunConfig, gpu_names: list[str]) -> Profile:
    return select_profile(gpu_names) if config.profile == "auto" else load_profile(config.profile)


def run_suite(args: argparse.Namespace, console: Console) -> int:
    started, t0 = _now(), time.perf_counter()
    overrides = list(args.overrides) + ([f"profile={args.profile}"] if args.profile else [])
    config = load_config(RunConfig, args.config, overrides)
    sources: NodeSources = bundle_sources(args.replay) if args.replay else live_sources()
    inventory = collect_inventory(sources)
    profile = _resolve_profile(config, [g.name for g in inventory.gpu.gpus])
    results: list[Result] = []
    if args.verb in ("health", "accept"):
        if sources.kernel_log is not None:
            kernel_log: tuple[str | None, str | None] = (sources.kernel_log, None)
        elif args.replay:
            kernel_log = (None, "the bundle has no dmesg.txt")
        else:
            kernel_log = collect_kernel_log(config.health.command_timeout_s)
        probe = None if args.replay else SubprocessLivenessProbe()
        results = run_health(inventory, profile, config.health, kernel_log, probe, started)
    finished = _now()
    report = Report(
        meta=RunMeta(
            tool_version=gpucert.__version__,
            method_version=gpucert.METHOD_VERSION,
            verb=args.verb,
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
    path = write_report(report, out_dir)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print_report(report, console, show_inventory=args.verb in ("discover", "accept"), report_path=str(path))
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
        if args.verb == "profiles":
            for name in available_profiles():
                profile = load_profile(name)
                console.print(f"[bold]{name}[/]: {profile.description} (matches {profile.match or 'by name only'})")
            return 0
        return run_suite(args, console)
    except (ConfigError, ValueError) as exc:
        print(f"gpucert: error: {exc}", file=sys.stderr)
        return ERROR_EXIT
