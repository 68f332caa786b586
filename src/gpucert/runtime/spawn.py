"""Start a node's worker processes and make sure none outlives the run.

Each worker gets its own session (so a signal to its group reaches anything it started) and asks the kernel to
kill it when its parent dies (`die_with_parent`, called first thing in the worker): a SIGKILLed gpucert leaves
no GPU process behind. A failed worker, a timeout or Ctrl-C ends every group: SIGTERM, then SIGKILL after
runtime.kill_grace_s.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerExit:
    local_rank: int
    rank: int
    returncode: int | None  # None: still running when the others were stopped
    log: Path

    @property
    def cause(self) -> str:
        if self.returncode == -signal.SIGKILL:
            # A worker fails before gpucert stops anyone: the SIGKILL came from elsewhere, usually the kernel.
            return f"{exit_cause(self.returncode)} (out of memory? the kernel's OOM killer sends it; dmesg says)"
        return exit_cause(self.returncode)

    def last_error(self) -> str | None:
        """The last line of the worker's log that names an exception, for a one-line report."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            text = line.strip()
            if text and (
                text.split(":")[0].endswith(("Error", "Exception", "Interrupt")) or text.startswith("gpucert:")
            ):
                return text
        return None


@dataclass
class SpawnOutcome:
    exits: list[WorkerExit] = field(default_factory=list)
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(e.returncode == 0 for e in self.exits)

    @property
    def first_failure(self) -> WorkerExit | None:
        failed = [e for e in self.exits if e.returncode not in (0, None)]
        return failed[0] if failed else None


def exit_cause(returncode: int | None) -> str:
    """How a process gpucert started ended, in words (None: it was still running when gpucert stopped it)."""
    if returncode is None:
        return "stopped by gpucert"
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def die_with_parent(parent_pid: int | None) -> None:
    """In a worker: SIGKILL when the process that started us dies (Linux), and go now if it already has."""
    if parent_pid is None:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the parent's TERM/KILL of our group still applies
    if os.getppid() != parent_pid:
        os._exit(1)


def term_with_parent() -> None:
    """preexec_fn of a gpucert (or srun) process a controller starts: SIGTERM when the controller dies, so it
    stops its own workers (or srun its step) instead of running on unattended."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_all(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM every worker's group, SIGKILL what is left after grace_s; also groups whose leader exited."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
        _signal_group(proc, signal.SIGCONT)  # a stopped process (SIGSTOP, a debugger) handles SIGTERM only once woken
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)
        try:
            proc.wait(timeout=max(grace_s, 1.0))
        except subprocess.TimeoutExpired:
            # Uninterruptible sleep (a GPU fault, a hung filesystem) survives SIGKILL until the kernel lets go.
            print(
                f"gpucert: worker pid {proc.pid} did not exit after SIGKILL: stuck in the kernel (GPU Xid? hung "
                "filesystem?)",
                file=sys.stderr,
                flush=True,
            )


def run_workers(
    argv: Sequence[str],
    envs: Sequence[Mapping[str, str]],
    ranks: Sequence[int],
    log_dir: Path,
    timeout_s: float,
    grace_s: float,
    on_failure: Callable[[WorkerExit], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> SpawnOutcome:
    """Run one worker per env until all exit 0, one fails, or timeout_s passes; nothing is left running.

    on_failure sees the first failed worker while the others still run (the agent records the cause in the
    job's store so every node's workers stop). should_stop, asked twice a second, ends the workers early (the job
    was aborted on another node). Ctrl-C stops the workers and re-raises KeyboardInterrupt.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    outcome = SpawnOutcome()
    try:
        for local_rank, env in enumerate(envs):
            log = log_dir / f"rank-{ranks[local_rank]}.log"
            logs.append(log)
            with log.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        list(argv), env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        deadline = time.monotonic() + timeout_s
        next_ask = 0.0
        while True:
            codes = [p.poll() for p in procs]
            failed = [i for i, c in enumerate(codes) if c not in (0, None)]
            if failed:
                first = WorkerExit(failed[0], ranks[failed[0]], codes[failed[0]], logs[failed[0]])
                if on_failure is not None:
                    on_failure(first)
                break
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                outcome.timed_out = True
                break
            if should_stop is not None and time.monotonic() > next_ask:
                next_ask = time.monotonic() + 0.5
                if should_stop():
                    break
            time.sleep(0.1)
    finally:
        # Also on Ctrl-C and on an exception here: no worker survives this function.
        stop_all(procs, grace_s)
    outcome.exits = [
        WorkerExit(i, ranks[i], p.returncode if p.returncode is not None else None, logs[i])
        for i, p in enumerate(procs)
    ]
    return outcome
