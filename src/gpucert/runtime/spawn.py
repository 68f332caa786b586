"""No process outlives the one that started it: workers die with their launcher, and a group of processes is
stopped TERM, CONT, then KILL.

A rank started by gpucert's launcher asks the kernel to kill it when that process dies (`die_with_parent`, first
thing in start_runtime): a SIGKILLed gpucert leaves no GPU process behind. localize's pair jobs use
`term_with_parent` and `stop_all` for the processes it starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1


def exit_cause(returncode: int | None) -> str:
    """How a process gpucert started ended, in words (None: it was still running when gpucert stopped it)."""
    if returncode is None:
        return "stopped by gpucert"
    if returncode == -signal.SIGKILL:
        # A process fails before gpucert stops anyone: the SIGKILL came from elsewhere, usually the kernel.
        return "killed by SIGKILL (out of memory? the kernel's OOM killer sends it; dmesg says)"
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


# Set in the environment of a node agent localize starts over ssh, whose stdin localize holds open.
STDIN_EOF_STOPS = "GPUCERT_STDIN_EOF_STOPS"


def stop_on_stdin_eof() -> None:
    """A node agent started over ssh: the remote command gets no signal when the ssh client is killed (no pty),
    only the end of its stdin. At that end, SIGTERM this process: its handler stops its ranks, as Ctrl-C would,
    instead of holding the GPUs and the port until its own timeouts."""

    def watch() -> None:
        with contextlib.suppress(OSError, ValueError):
            while os.read(0, 65536):
                pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="stdin-eof").start()


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
