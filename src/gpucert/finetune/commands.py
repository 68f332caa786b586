"""What `gpucert finetune`, `gpucert finetune prepare` and `gpucert evaluate` do, called from gpucert.cli.

gpucert finetune                                   offline default: configs/finetune/tiny.yaml
gpucert finetune --config qwen2-7b-glaive                  one process per GPU, DDP or FSDP2 from train.parallel
gpucert finetune --config ... --nnodes 2 --node-rank R --master-addr A     on every node (torchrun's engine)
gpucert finetune prepare --config ...              data preparation alone (once per cluster)
gpucert evaluate --adapter runs/<id>/adapter [--config ...]       function-calling accuracy, report in
                                                   runs/<id>/evaluation/ (gpucert report renders it)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import sys
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from gpucert.config.loader import ConfigError
from gpucert.finetune.config import FinetuneConfig, check_data_source, load_finetune_config
from gpucert.finetune.data.hub import resolve_adapter
from gpucert.runtime.launch_env import NodeEnv
from gpucert.status import Status

if TYPE_CHECKING:
    from gpucert.finetune.eval.report import ThresholdSources


def default_config_path() -> Path:
    return Path(str(resources.files("gpucert.configs").joinpath("finetune/tiny.yaml")))


FINETUNE_CONFIG_HELP = "finetune YAML (default: the offline tiny recipe)"
# `gpucert evaluate --config`'s default, as evaluation_config applies it.
EVALUATE_CONFIG_HELP = (
    "finetune YAML or recipe name (default: the config.yaml of the run that wrote the adapter; the offline tiny "
    "recipe for an adapter from elsewhere)"
)


def add_arguments(parser: argparse.ArgumentParser, config_help: str = FINETUNE_CONFIG_HELP) -> None:
    parser.add_argument("--config", type=Path, help=config_help)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. --set train.max_steps=10 (repeatable)",
    )


def load(
    args: argparse.Namespace,
    extra: list[str] | None = None,
    training: bool = False,
    flags: dict[str, str] | None = None,
) -> FinetuneConfig:
    """The checked config: a bad value is a ConfigError (exit 3) before any directory, cache entry or model;
    `flags` names the command-line flag behind an override of `extra`, for the message."""
    path = args.config or default_config_path()
    return load_finetune_config(path, [*args.overrides, *(extra or [])], training, flags)


def flag_overrides(pairs: list[tuple[str, str, object]]) -> tuple[list[str], dict[str, str]]:
    """(overrides, the flag each came from) for the flags given: (flag, key, value) with value None when absent.
    json.dumps quotes the value, so YAML reads a path like 2026-01-01 or a word like "on" as a string."""
    overrides = {f"{key}={json.dumps(str(value))}": f"{flag} {value}" for flag, key, value in pairs if value}
    return list(overrides), overrides


def finetune(args: argparse.Namespace) -> int:
    if args.stage not in (None, "prepare"):
        raise ConfigError(
            f"finetune {args.stage!r}: the only stage is `prepare` (gpucert finetune prepare --config ...)"
        )
    extra, flags = flag_overrides([("--resume", "resume", args.resume), ("--output", "output_dir", args.output)])
    cfg = load(args, extra, training=args.stage != "prepare", flags=flags)
    if args.stage == "prepare":
        # Preparation writes only the data cache (data.cache_dir): a run's flags would do nothing here, silently.
        given = [flag for flag, value in (("--output", args.output), ("--resume", args.resume)) if value]
        if given:
            raise ConfigError(
                f"finetune prepare writes the prepared data to data.cache_dir and no run: {' and '.join(given)} "
                f"{'belongs' if len(given) == 1 else 'belong'} to `gpucert finetune` (set data.cache_dir to choose "
                "where preparation writes)"
            )
        check_data_source(cfg.data)  # a missing data file is named before torch and the tokenizer load
        return prepare(cfg)
    if args.nproc is not None and args.nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, found {args.nproc}")
    plan = node_plan(args)
    if not _in_a_rank() and (plan is None or plan.num_nodes == 1):
        # One node: refused here, at once. Across nodes the ranks check it: a node that refused before joining
        # would leave the others waiting out the rendezvous, where a rank's refusal ends every node, named.
        check_before_start(cfg)
    if plan is not None:
        return launch(args, cfg, plan)
    # Imported once the config is checked: torch and transformers take seconds, a bad key a few milliseconds.
    from gpucert.finetune.train.run import finetune_exit_code

    code = finetune_exit_code(cfg)
    from gpucert.runtime.launch_env import launched_by_gpucert
    from gpucert.runtime.launcher import write_verdict

    if launched_by_gpucert():
        # The node's process returns the verdict: a rank that exited non-zero would look failed to torchrun.
        if os.environ.get("LOCAL_RANK", "0") == "0":
            write_verdict(code)
        return 0 if code != Status.ERROR.exit_code else code
    return code


def _in_a_rank() -> bool:
    from gpucert.runtime.launch_env import read_rank_env

    return read_rank_env(os.environ) is not None


def check_before_start(cfg: FinetuneConfig) -> None:
    """What the ranks would refuse, refused here before any rank starts or torch loads: a local data file or model
    directory that is not there, and an output_dir that another live run holds, that holds another verb's report,
    that cannot be written, or that holds an earlier run's checkpoints for a run that does not resume. The ranks
    check again (a run may start in between); this is for the one line, at once."""
    from gpucert.finetune.config import looks_like_path
    from gpucert.report.store import UNREADABLE, check_writable, earlier_verb
    from gpucert.runtime.dirlock import check_free

    check_data_source(cfg.data)
    # A local directory, or a name no hub id can be (a/b/c): cheap to look at (a hub id is not).
    if cfg.model.name.startswith(("/", ".", "~")) or looks_like_path(cfg.model.name):
        from gpucert.finetune.data.hub import check_model_source

        check_model_source(cfg.model)
    if not cfg.output_dir:
        return
    out = Path(cfg.output_dir)
    check_writable(out, "output_dir")
    if out.is_dir():
        check_free(out, "output_dir")  # first: a live run's checkpoints are not an earlier run's
    verb = earlier_verb(out)
    if verb not in (None, "finetune"):
        what = "a report.json that is no gpucert report" if verb == UNREADABLE else f"a gpucert {verb} report"
        raise ConfigError(
            f"output_dir {out}: holds {what}, which this run's report would replace; choose another --output"
        )
    from gpucert.finetune.train.checkpoint import check_fresh_output, check_resume_config

    check_fresh_output(cfg)
    check_resume_config(cfg)


def node_plan(args: argparse.Namespace) -> NodeEnv | None:
    """This node's share of a job gpucert starts (--nnodes ..., srun one task per node, an indexed Job, or
    --nproc N on one node); None for one process, or inside a rank (torchrun's or gpucert's)."""
    from gpucert.runtime.launch_env import node_env_from_flags, read_node_env, read_rank_env

    if read_rank_env(os.environ) is not None:
        return None
    if args.nnodes is not None:
        return node_env_from_flags(args.nnodes, args.node_rank, args.master_addr, args.master_port, args.node_name)
    if args.node_name is not None:
        raise ConfigError("--node-name names this node among others: it needs --nnodes (and --node-rank)")
    plan = read_node_env(os.environ)
    if plan is None:
        from gpucert.runtime.device import gpu_count

        # One process per GPU on this node (a GPU-less machine trains in one process).
        if (args.nproc or gpu_count()) > 1:
            plan = NodeEnv("local", 0, 1, "127.0.0.1", 0)
    return plan


def launch(args: argparse.Namespace, cfg: FinetuneConfig, plan: NodeEnv) -> int:
    """This node's ranks on torchrun's engine (runtime/launcher.py), each running this same command; the exit
    code is the run's verdict, or 3 with the failed rank named in one line (on node 0, with the checkpoint a
    rerun continues from)."""
    from gpucert.finetune.train.checkpoint import what_resumes
    from gpucert.finetune.train.rundir import run_dir_name
    from gpucert.runtime.device import gpu_count
    from gpucert.runtime.errors import BROKEN_PIPE_EXIT, Interrupted, JobFailed
    from gpucert.runtime.launcher import NO_VERDICT, launch_ranks

    nproc = args.nproc or gpu_count() or 1
    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, found {nproc}")
    env = {"GPUCERT_NODE_LABEL": plan.node_name} if plan.node_name else {}
    ranks = [sys.executable, "-m", "gpucert", *args.argv]
    # Every rank but rank 0 writes its own log there (with --output; else they share this terminal).
    logs = Path(cfg.output_dir) / "logs" if cfg.output_dir else None
    # Node 0 (rank 0's, which writes the checkpoints) names the run directory when none was given, rather than
    # rank 0 (which would pick the same kind of name), so that it can say where they are when the operator stops
    # it. Another node says nothing of them: it may not share node 0's filesystem.
    run_dir = run_dir_name(cfg) if plan.node_rank == 0 else None
    if run_dir is not None and not cfg.output_dir:
        ranks += ["--output", run_dir]

    # One node only: on a shared filesystem the other nodes' rank logs are there too, their only detailed cause.
    made = run_dir is not None and not Path(run_dir).exists() and plan.num_nodes == 1

    def hint() -> str | None:
        if run_dir is None:
            return None
        if made:
            _take_back_start_up_logs(Path(run_dir))
        return what_resumes(Path(run_dir), cfg)

    try:
        outcome = launch_ranks(plan, nproc, ranks, cfg.runtime, logs, env)
    except Interrupted as exc:
        exc.after = hint()
        raise
    if outcome.verdict == BROKEN_PIPE_EXIT:
        # Rank 0 found the reader of its output gone and stopped the job (train/run.py): not a word more, and the
        # CLI exits 141 as the lone run does.
        raise BrokenPipeError(errno.EPIPE, "the reader of gpucert's output closed it")
    if not outcome.ok:
        cause, after = outcome.cause or "the job failed", hint()
        raise JobFailed(f"{cause}; {after}" if after else cause)
    if outcome.verdict is None:
        raise JobFailed(NO_VERDICT)  # exit 0 would be a run nothing judged
    return outcome.verdict


# What rank 0 makes in its run directory before the first step (its lock, the TensorBoard writer's first file).
# In a directory this node's process made (its logs/ first), rank 0 writes config.yaml at the first step
# (rundir.open_run_dir: not fresh), so a directory without it never trained.
START_UP_ONLY = (".gpucert.lock", "tensorboard")


def _take_back_start_up_logs(run_dir: Path) -> None:
    """A run directory this node's process made, whose ranks stopped before the first step: rank 0 took back what
    it wrote (rundir.RunDir.close), and what is left is the ranks' logs, made before rank 0 claimed it. They go
    with it, as a lone run leaves nothing: the cause is in the line that ends the job. A rank 0 killed outright
    (SIGKILL, the OOM killer) took nothing back: its lock and TensorBoard file go too, where nothing says the run
    reached its first step (no config.yaml, no checkpoints/, no report)."""
    import shutil

    logs = run_dir / "logs"
    others = [p for p in run_dir.iterdir() if p != logs and p.name not in START_UP_ONLY] if run_dir.is_dir() else [logs]
    if others or not logs.is_dir() or any(not p.name.startswith("rank-") for p in logs.iterdir()):
        return  # the run trained, or something else is there: left as it is
    for name in START_UP_ONLY:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    shutil.rmtree(logs, ignore_errors=True)
    with contextlib.suppress(OSError):
        run_dir.rmdir()


def prepare(cfg: FinetuneConfig) -> int:
    """Tokenize, mask, split and pack once; every later run with the same fingerprint reuses the cache."""
    from gpucert.finetune.data.prepare import prepare_dataset, report_lines
    from gpucert.finetune.data.tokenizer import load_tokenizer

    prepared = prepare_dataset(cfg, load_tokenizer(cfg.model, cfg.data))
    print(f"{'prepared' if prepared.built else 'reused'} {prepared.path} (fingerprint {prepared.fingerprint[:12]})")
    print("\n".join(report_lines(prepared.stats)))
    return 0


def evaluate(args: argparse.Namespace) -> int:
    """Generate on the held-out split with the adapter, score the function calls, and write the report
    (report.json, report.md) to --output, by default evaluation/ beside the adapter: `gpucert report DIR`
    renders it. The exit code is the report's verdict; a bad adapter or output directory exits 3 before any
    model is loaded.

    SIGTERM (a `kill`, scancel) ends it as Ctrl-C does, one line and the shell's code (143), where it died of the
    signal without a word. The report is written at the end, whole or not at all."""
    import signal

    from gpucert.runtime.errors import interrupting

    def said(sig: signal.Signals) -> str:
        return f"terminated by {sig.name} (to gpucert, pid {os.getpid()}) during the evaluation"

    with interrupting(said, signal.SIGTERM):
        return _evaluate(args)


def _evaluate(args: argparse.Namespace) -> int:
    bfcl_only = [f for f in ("compare_base", "bfcl_data", "bfcl_categories", "bfcl_limit") if getattr(args, f, None)]
    if getattr(args, "suite", "held-out") != "bfcl" and bfcl_only:
        given = ", ".join("--" + f.replace("_", "-") for f in bfcl_only)
        raise ConfigError(f"{given}: for --suite bfcl only (this evaluation is the held-out suite)")
    # A bad --set, --config or --data first, against the config given (or the default recipe), as for finetune.
    data_flag = flag_overrides([("--data", "data.source", args.data)])
    cfg = load(args, data_flag[0], flags=data_flag[1])
    check_data_source(cfg.data)  # a missing --data file is named before torch is imported
    # A run directory means its final adapter; a missing path is refused here, never tried as a hub id.
    adapter, note = resolve_adapter(args.adapter)
    if note:
        print(note, file=sys.stderr)
    run = run_of(adapter)
    cfg, config_path = evaluation_config(args, run, cfg, data_flag)
    check_data_source(cfg.data)  # the run's data file, where it has moved since training
    if getattr(args, "suite", "held-out") == "bfcl":
        from gpucert.finetune.eval.bfcl import evaluate_bfcl

        out = Path(args.output) if args.output else adapter.parent / SUITE_OUTPUTS["bfcl"]
        check_evaluation_output(out, "bfcl")
        return evaluate_bfcl(args, cfg, adapter, out, threshold_source(args, config_path))
    out = Path(args.output) if args.output else adapter.parent / SUITE_OUTPUTS["held-out"]
    check_evaluation_output(out, "held-out")
    started = datetime.now(timezone.utc)

    import torch
    from rich.console import Console

    from gpucert.finetune.data.packing import collate
    from gpucert.finetune.data.prepare import load_eval_conversations, prepare_dataset
    from gpucert.finetune.data.tokenizer import load_tokenizer
    from gpucert.finetune.eval.evaluate import evaluate as run_eval
    from gpucert.finetune.eval.evaluate import say_progress
    from gpucert.finetune.eval.report import evaluation_report, evaluation_results
    from gpucert.finetune.model.lora import adapter_for_generation
    from gpucert.hardware.inventory import collect_inventory, live_sources
    from gpucert.report.store import clear_earlier_run, write_report
    from gpucert.report.terminal import print_report

    tokenizer = load_tokenizer(cfg.model, cfg.data)
    prepared = prepare_dataset(cfg, tokenizer)
    trained_on = run_data_fingerprint(run)
    # --data names other rows on purpose (the advice below): only another split of the run's own data warns.
    if run and trained_on and trained_on != prepared.fingerprint and not args.data:
        print(split_warning(args, run, trained_on, prepared.fingerprint, cfg), file=sys.stderr)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    say_progress(f"loading {cfg.model.name} with the adapter {adapter} on {device}")
    model, attn = adapter_for_generation(cfg.model, tokenizer, adapter, device)
    conversations = [c.to_json() for c in load_eval_conversations(prepared.path)]
    pad = tokenizer.pad_token_id
    rows = list(prepared.eval)
    batches = [
        {k: v.to(device) for k, v in collate(rows[i : i + cfg.eval.batch_size], pad).items()}
        for i in range(0, len(rows), cfg.eval.batch_size)
    ]
    with torch.no_grad():
        scores, loss = run_eval(
            model, tokenizer, conversations, cfg.eval, loss_batches=batches, attn_impl=attn, say=say_progress
        )
    results = evaluation_results(scores, loss, cfg.eval.thresholds, threshold_source(args, config_path))
    report = evaluation_report(
        results,
        command=["gpucert", *sys.argv[1:]],
        config={
            **dataclasses.asdict(cfg),
            "evaluate": {
                "suite": "held-out",
                "adapter": str(adapter),
                "prepared_data": str(prepared.path),
                "trained_on_data": trained_on,
                "output": str(out),
            },
        },
        started_at=started,
        finished_at=datetime.now(timezone.utc),
        inventory=collect_inventory(live_sources()).to_dict(),
    )
    # A re-run in place (check_evaluation_output let only this suite's report be there): the earlier run's
    # report.html, if drawn, would show its scores beside these.
    clear_earlier_run(out)
    path = write_report(report, out)
    print_report(report, Console(highlight=False, markup=False), show_inventory=False, report_path=str(path))
    return report.status.exit_code


def run_of(adapter: Path) -> Path | None:
    """The run directory that wrote this adapter (RUN/adapter/, beside RUN/config.yaml), or None for an adapter
    from elsewhere."""
    return adapter.parent if (adapter.parent / "config.yaml").is_file() else None


def evaluation_config(
    args: argparse.Namespace, run: Path | None, given: FinetuneConfig, data_flag: tuple[list[str], dict[str, str]]
) -> tuple[FinetuneConfig, Path]:
    """The config to evaluate with, and its file: the run's own config.yaml unless --config names another (the
    default recipe would load the tiny model and another data split: a 7B adapter would fail to load, and a tiny
    one be scored on turns it trained on). A --config whose model is not the one the adapter was trained on is
    refused before any model is loaded. --set and --data (`data_flag`: flag_overrides') apply on top of either."""
    path = Path(args.config or default_config_path())
    if run is None:
        return given, path
    trained = run / "config.yaml"
    if args.config is None:
        print(
            f"evaluating with {trained}, the config the adapter was trained with (--config: another)", file=sys.stderr
        )
        extra, flags = data_flag
        return load_finetune_config(trained, [*args.overrides, *extra], flags=flags), trained
    base = load_finetune_config(trained, []).model.name
    if given.model.name != base:
        raise ConfigError(
            f"--config {args.config}: model.name {given.model.name!r}, but the adapter was trained on {base!r} "
            f"({trained}); drop --config to use the run's, or set model.name={base}"
        )
    return given, path


def run_data_fingerprint(run: Path | None) -> str | None:
    """The fingerprint of the prepared data the run trained on (its metrics.json), None where not recorded."""
    try:
        found = json.loads((run / "metrics.json").read_text())["dataset"]["fingerprint"] if run else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if isinstance(found, str) else None


# The data settings that decide which rows are held out (data/prepare.py's split): another value of one of them
# may put rows the adapter trained on in the held-out split.
SPLIT_KEYS = ("source", "format", "eval_fraction", "seed", "max_rows")


def split_warning(args: argparse.Namespace, run: Path, trained_on: str, found: str, cfg: FinetuneConfig) -> str:
    """The warning for a held-out split prepared otherwise than the run's (fingerprint `found`, not `trained_on`):
    which split setting differs and which option changed it (a --set, or --config), and what to do; where none
    differs, that the rows are split as in training but prepared otherwise."""
    trained = load_finetune_config(run / "config.yaml", []).data
    head = f"warning: {run} trained on prepared data {trained_on[:12]}; this held-out split comes from {found[:12]}"
    changed = [k for k in SPLIT_KEYS if getattr(trained, k) != getattr(cfg.data, k)]
    if not changed:
        return (
            f"{head}: its rows are split as in training (data.{', data.'.join(SPLIT_KEYS)} as in "
            f"{run / 'config.yaml'}) but prepared otherwise (data.max_length, data.packing, the tokenizer, or the "
            "source's contents). If the source changed since training, the held-out rows may include rows the "
            "adapter trained on: --data a file it never saw to be sure"
        )

    def by(key: str) -> str:
        named = [o for o in args.overrides if o.split("=", 1)[0].strip() in (f"data.{key}", "data")]
        return f"--set {named[-1]}" if named else f"--config {args.config}" if args.config else "the config"

    differences = "; ".join(
        f"data.{k} is {getattr(cfg.data, k)!r}, {getattr(trained, k)!r} in training ({by(k)})" for k in changed
    )
    options = " and ".join(dict.fromkeys(by(k) for k in changed))
    return (
        f"{head} and may hold rows the adapter trained on: {differences}. Drop {options} to evaluate on the turns "
        "the run held out, or --data a file it never saw"
    )


# Each suite's default --output, beside the adapter.
SUITE_OUTPUTS = {"held-out": "evaluation", "bfcl": "evaluation-bfcl"}


def check_evaluation_output(out: Path, suite: str = "held-out") -> None:
    """Refuse, before any model is loaded, an output directory that holds another verb's report (a training
    run's report.json would be overwritten) or another suite's evaluation (a BFCL report, minutes to hours of
    GPU time, replaced by a held-out one without a word), or cannot be written. The same suite's report there is
    replaced: a re-run in place."""
    from gpucert.report.store import UNREADABLE, check_writable, earlier_verb

    verb = earlier_verb(out)
    if verb not in (None, "evaluate"):
        what = "a report.json that is no gpucert evaluation" if verb == UNREADABLE else f"a gpucert {verb} report"
        raise ConfigError(
            f"--output {out}: holds {what}, which the evaluation report would replace; choose another "
            f"--output (the default is {SUITE_OUTPUTS[suite]}/ beside the adapter)"
        )
    earlier = earlier_suite(out) if verb == "evaluate" else suite
    if earlier != suite:
        raise ConfigError(
            f"--output {out}: holds a gpucert evaluate --suite {earlier} report, which this --suite {suite} "
            f"evaluation would replace; choose another --output (the default for --suite {suite} is "
            f"{SUITE_OUTPUTS[suite]}/ beside the adapter), or remove {out / 'report.json'} to replace it"
        )

    check_writable(out, "--output")


def earlier_suite(out: Path) -> str:
    """The suite of the evaluation report in `out` (its meta.config.evaluate.suite); a held-out report written
    before the key existed has none, and one gpucert cannot read is said as such."""
    try:
        meta = json.loads((out / "report.json").read_text())["meta"]
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown (a report.json gpucert cannot read)"
    evaluated = (meta.get("config") or {}).get("evaluate") if isinstance(meta, dict) else None
    suite = evaluated.get("suite", "held-out") if isinstance(evaluated, dict) else "held-out"
    return str(suite)


def threshold_source(args: argparse.Namespace, config_path: Path) -> ThresholdSources:
    """Where each eval.thresholds key came from (the config file, or a --set), for each judged result."""
    from gpucert.finetune.eval.report import ThresholdSources

    source = str(config_path)
    overridden = [o for o in args.overrides if o.split("=", 1)[0].strip().startswith("eval.thresholds")]
    return ThresholdSources(source, tuple(overridden))
