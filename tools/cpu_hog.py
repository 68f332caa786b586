"""Run a command beside busy processes: `python tools/cpu_hog.py [--per-core 2] -- COMMAND...`.

`make test-loaded` runs the slow tier (multi-process, fault, Slurm) this way, two spinning processes a core, so a test
that holds only on a quiet machine fails on the developer's machine instead of refusing a later submission. The
hogs are niced to 0 like the tests and die with this process; the command's exit code is returned.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys

SPIN = "while True: pass"


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-core", type=int, default=2, help="spinning processes per CPU core (default 2)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    cores = len(os.sched_getaffinity(0))
    hogs = [
        subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=_die_with_parent)
        for _ in range(args.per_core * cores)
    ]
    print(f"cpu_hog: {len(hogs)} spinning processes on {cores} cores beside: {' '.join(command)}", flush=True)
    try:
        return subprocess.call(command)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
