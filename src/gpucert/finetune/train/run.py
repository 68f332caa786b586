"""`gpucert finetune`: LoRA supervised fine-tuning, one process per GPU (one gloo process per rank on a CPU).

Run it:
    python -m gpucert.finetune.train configs/finetune/tiny.yaml                       # CPU, a minute
    torchrun --nproc-per-node 8 -m gpucert.finetune.train configs/finetune/qwen2-7b-glaive.yaml \
        --set output_dir=runs/qwen-glaive --resume auto                                # 8 GPUs, DDP
Precedence is config defaults < YAML file < --set key.path=value; `--resume auto` continues from the newest
complete checkpoint of output_dir as rank 0 sees it (exactly: same batches, same RNG, same loss curve), refused
when the prepared data changed since (resume_allow_data_change: true continues on the new data).

A failure on any rank ends the job on every rank, never a hang: the failing rank records the cause in the job's
store and exits 3 after one line and its traceback,
    gpucert: rank 1 (node-b, cpu local rank 0) failed during step 12: RuntimeError: ...
and every other rank's watchdog reads it within runtime.heartbeat_interval_s and exits 3 naming that rank. A rank
that dies or freezes without a word is named after runtime.heartbeat_timeout_s. Ctrl-C exits 130.

Reading the output (output_dir):
    report.json       the run in the report schema (and report.md): the success criteria judged, every other
                      number INFO, the per-step curves; `gpucert report DIR [--html]` renders it, `gpucert
                      report DIR_A DIR_B` compares two runs
    metrics.json      every number, for scripts: losses per step, eval losses, tokens/s (padded, effective,
                      supervised; total and per GPU), LoRA-aware MFU with its formula, peak memory, versions,
                      the resolved config, and the criteria (report results) with "status" the worst of them
    adapter/          the final LoRA adapter in PEFT format (PeftModel.from_pretrained) with the tokenizer
    merged/           the adapter merged into the base weights, when train.merge_adapter is set
    checkpoints/      step-N checkpoints for --resume; tensorboard/: loss, lr, grad norm, tokens/s, MFU

The run's pieces: run.py (this: the command line, the job's start and end, a failure), loop.py (the setup and the
loop, top to bottom), step.py (one optimizer step and the order of the rows), summary.py (what the run measured:
metrics.json and report.json).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from gpucert.config.loader import ConfigError, error_text
from gpucert.finetune.config import FinetuneConfig, check_data_source, load_finetune_config
from gpucert.finetune.data.formats import DataError
from gpucert.finetune.data.hub import check_model_source
from gpucert.finetune.disk import NoSpaceError
from gpucert.finetune.model.lora import check_attention
from gpucert.finetune.train import metrics as flops
from gpucert.finetune.train.checkpoint import CheckpointError, check_fresh_output, check_resume_config, what_resumes
from gpucert.finetune.train.loop import (
    train,
)
from gpucert.finetune.train.rundir import RunDir, open_run_dir
from gpucert.runtime.errors import BROKEN_PIPE_EXIT, ReaderLeft
from gpucert.runtime.group import (
    ABORTED_EXIT,
    AbortRecord,
    RendezvousError,
    Runtime,
    fail,
    leave_failed,
    say,
    say_stop,
    start_runtime,
    stop_runtime,
)
from gpucert.runtime.launch_env import launched_by_gpucert
from gpucert.runtime.launcher import write_verdict
from gpucert.runtime.sigterm import TermWatch, stopped_by_launcher
from gpucert.status import Status

# When this module's imports (torch, transformers, PEFT: most of a run's start-up) were done.
IMPORTED_AT = time.time()

# The shell's convention for a run ended by Ctrl-C (128 + SIGINT), and by SIGTERM (128 + SIGTERM).
INTERRUPTED_EXIT = 130
TERMINATED_EXIT = 143


class FinetuneFailed(RuntimeError):
    """A rank of the run failed; the cause is recorded for the job and was printed."""

    def __init__(self, record: AbortRecord) -> None:
        super().__init__(record.message())
        self.record = record


def _abandon_builds() -> None:
    """What an unfinished data preparation wrote, removed before an exit that skips its own clean-up; nothing to
    do (and nothing imported in a signal's thread) before preparation began."""
    prepare = sys.modules.get("gpucert.finetune.data.prepare")
    if prepare is not None:
        prepare.abandon_builds()


def run_finetune(cfg: FinetuneConfig, profile_peak: flops.Peak | None = None) -> dict[str, Any]:
    """Train as configured in this process (one rank of a torchrun/srun job, or alone); the metrics dict,
    also written to output_dir/metrics.json by rank 0.

    A failure is recorded for the whole job (every other rank exits within a heartbeat interval, naming this
    one) and printed. A lone process then raises FinetuneFailed (KeyboardInterrupt for Ctrl-C); a rank of a
    larger job exits at once with 3 (130 for Ctrl-C), as its peers' watchdogs do: with a peer gone, tearing
    down the process group could hang. A config with a bad value (built in code, not loaded by
    load_finetune_config) is a ConfigError before anything is created.
    """
    problems = cfg.problems()
    if problems:
        raise ConfigError(problems=problems)
    rt: Runtime | None = None
    run: RunDir | None = None

    def where_this_rank_was(_: AbortRecord) -> None:
        if rt is not None:
            say(f"{rt.me.describe()} was in {rt.phase}")
        if run is not None:
            run.close(failed=True)  # a peer failed: this process ends next, with no except clause run
        # Last, once the failure is recorded: a main thread whose files go from under it fails next, and its
        # failure must not be taken for the cause.
        _abandon_builds()

    def terminated() -> None:
        """SIGTERM (a launcher stopping every rank because one ended, a cancelled job): say who and where, and
        leave the run directory as a failure leaves it, even while the main thread is blocked in a collective.
        A lone process (no launcher, no peer) was stopped by the operator (a kill, scancel, a time limit): said as
        Ctrl-C is, with what resumes, and the shell's code for SIGTERM. An unfinished data preparation's files go
        last, once the stop is recorded (where_this_rank_was says why)."""
        # Under gpucert's own node process that process was signalled too, and says it (say_stop).
        if rt is not None and rt.world_size == 1 and not os.environ.get("GPUCERT_AGENT_PID"):
            say(f"stopped by SIGTERM (a kill, scancel, a time limit) during {rt.phase}")
            if run is not None:
                run.close(failed=True)
                hint = what_resumes(run.path, cfg)
                if hint:
                    say(hint)
            watch.exit_code = TERMINATED_EXIT
            _abandon_builds()
            return
        if rt is not None:
            record = stopped_by_launcher(rt)
            say_stop(rt, f"{rt.me.describe()} stops (SIGTERM) in {rt.phase}: {record.message()}", record)
        if run is not None:
            run.close(failed=True)
        _abandon_builds()

    joining = time.time()
    try:
        rt = start_runtime(cfg.runtime, on_abort=where_this_rank_was)
    except KeyboardInterrupt:
        say("interrupted while joining the job")
        raise
    # Where the start-up before train() goes (metrics.json setup_s): imports, then joining the job.
    marks = {"imported": IMPORTED_AT, "joining": joining, "joined": time.time()}
    watch = TermWatch(terminated, ABORTED_EXIT).start()
    try:  # the watch goes whatever ends this (a test's in-process run included)
        try:
            rt.set_phase("setup")
            # Before anything is created: a wrong model or data path, or an unreachable hub, is refused in seconds.
            # A hub dataset is not probed here: its prepared copy in data.cache_dir may be all this run needs
            # (prepared on a login node, trained offline); preparation asks the hub only for raw rows.
            check_model_source(cfg.model)
            check_data_source(cfg.data)
            check_attention(cfg.model.attn_implementation, rt.device)  # before the data is prepared
            if rt.is_main:
                check_fresh_output(cfg)
                check_resume_config(cfg)
            run = open_run_dir(cfg, rt)
            result = train(cfg, rt, run, resolve_peak(cfg, profile_peak), marks)
        except ReaderLeft as exc:
            # `gpucert finetune 2>&1 | head`: nobody reads a word more. Recorded for the peers (each leaves, naming
            # it, in its own log), said nowhere, and the exit is the shell's for a writer SIGPIPE ended. What was
            # trained stays (run.close keeps a run that took a step), its checkpoints for --resume auto.
            fail(rt, exc)
            if run is not None:
                run.close(failed=True)
            if rt.world_size > 1:
                if launched_by_gpucert() and rt.local_rank == 0:
                    write_verdict(BROKEN_PIPE_EXIT)  # the node's process exits 141 too, quietly (commands.launch)
                leave_failed(rt, BROKEN_PIPE_EXIT)
            stop_runtime(rt)
            raise BrokenPipeError(errno.EPIPE, str(exc)) from None  # the CLI's own handler: exit 141, no word
        except (Exception, KeyboardInterrupt) as exc:
            record, code = report_failure(rt, exc)
            if run is not None:
                run.close(failed=True)
            if rt.world_size > 1:
                leave_failed(rt, code)
            stop_runtime(rt)
            if isinstance(exc, KeyboardInterrupt):
                # After close: the directory of a run stopped before its first step is gone, or as it was found.
                hint = what_resumes(run.path, cfg) if rt.is_main and run else None
                if hint:
                    say(hint)
                raise
            raise FinetuneFailed(record) from exc
        run.close(failed=False)
        stop_runtime(rt)
    finally:
        watch.stop()
    return result


def report_failure(rt: Runtime, exc: BaseException) -> tuple[AbortRecord, int]:
    """Record this rank's failure for the job and say it: one line naming the rank and phase, then the
    traceback (none for bad config or data, a full disk or an unusable checkpoint, whose messages say what to
    change). An error that only followed a peer's failure (a broken collective) names that peer instead."""
    record = fail(rt, exc)
    if isinstance(exc, KeyboardInterrupt):
        say(f"{rt.me.describe()} interrupted during {rt.phase}")
        return record, INTERRUPTED_EXIT
    if record.operator:
        # Stopped by the operator elsewhere in the job: what broke here (a collective whose peer left) is only that.
        say_stop(rt, f"{rt.me.describe()} stops: {record.message()}", record)
    elif record.rank in (None, rt.rank) and rt.world_size == 1 and isinstance(exc, ConfigError):
        # Bad input a lone run met only in its start-up (the directory taken by a run that started a moment
        # before it): said as the check before the start says it, not as a rank's failure with where it was raised.
        say(f"error: {error_text(exc)}")
    elif record.rank in (None, rt.rank):
        say(record.message())
        if not isinstance(exc, (ConfigError, DataError, NoSpaceError, CheckpointError)):
            traceback.print_exception(exc)
    else:
        say(f"{rt.me.describe()} stops: {record.message()}")
        here = (str(exc).strip().splitlines() or [""])[0][:200]
        say(f"{rt.me.describe()} saw, during {rt.phase}: {type(exc).__name__}: {here}")
    return record, Status.ERROR.exit_code


def profile_peak() -> flops.Peak | None:
    """The hardware profile's dense BF16 peak for this node's GPU; None on CPUs or an unknown GPU."""
    if not torch.cuda.is_available():
        return None
    from gpucert.config.profiles import select_profile

    try:
        profile = select_profile([torch.cuda.get_device_name(0)])
    except (ConfigError, ImportError):  # an unknown GPU; a checkout run without installing has no gpucert.configs
        return None
    if not profile.bf16_peak_tflops:
        return None
    return flops.Peak(profile.bf16_peak_tflops, f"profile {profile.name}: bf16_peak_tflops", profile.name)


def resolve_peak(cfg: FinetuneConfig, from_profile: flops.Peak | None) -> flops.Peak | None:
    """train.peak_tflops when the config sets it, else the hardware profile's."""
    if cfg.train.peak_tflops:
        profile = from_profile.profile if from_profile else None
        return flops.Peak(cfg.train.peak_tflops, "config train.peak_tflops", profile)
    return from_profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpucert.finetune.train", description=__doc__.split("\n")[0])
    parser.add_argument("config", type=Path, nargs="?", help="finetune YAML (configs/finetune/*.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument("--resume", help="none, auto, or a checkpoint directory (same as --set resume=...)")
    parser.add_argument("--output-dir", help="run directory (same as --set output_dir=...)")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.resume:
        overrides.append(f"resume={json.dumps(args.resume)}")
    if args.output_dir:
        overrides.append(f"output_dir={json.dumps(args.output_dir)}")
    try:
        cfg = load_finetune_config(args.config, overrides, training=True)
    except ConfigError as exc:
        print(f"gpucert finetune: error: {error_text(exc)}", file=sys.stderr)
        return Status.ERROR.exit_code
    return finetune_exit_code(cfg)


def finetune_exit_code(cfg: FinetuneConfig) -> int:
    """Train, and say how it went as the exit code: the run's verdict, 3 when it failed, 130 on Ctrl-C."""
    try:
        result = run_finetune(cfg, profile_peak())
    except (ConfigError, RendezvousError) as exc:
        print(f"gpucert finetune: error: {error_text(exc)}", file=sys.stderr)
        return Status.ERROR.exit_code
    except FinetuneFailed:
        return Status.ERROR.exit_code  # run_finetune said which rank failed, where, and why
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT
    return Status(result["status"]).exit_code
