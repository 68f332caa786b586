"""Errors of the runtime that torch-free code (the CLI, a light install's health) must be able to catch."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any


class RendezvousError(RuntimeError):
    """Not every rank or node joined in time; the message names the missing ones and the address."""


class JobFailed(RuntimeError):
    """A rank failed, a node was lost or the job was stopped: the message names who and why, in one line."""


class Interrupted(KeyboardInterrupt):
    """The operator stopped gpucert: Ctrl-C (SIGINT) or SIGTERM sent to its own process (a `kill`, scancel). A
    KeyboardInterrupt, so every `except KeyboardInterrupt` on the way out treats it as Ctrl-C; the CLI prints
    `line()` and exits with `exit_code` (128 + the signal, as a shell reports it)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        # What the operator has from the run, where the verb knows: the partial report rank 0 wrote (accept), the
        # checkpoint a rerun continues from (finetune).
        self.after: str | None = None

    def line(self) -> str:
        return self.message + (f"; {self.after}" if self.after else "")


def restore_handlers(handlers: dict[signal.Signals, Any]) -> None:
    """Put back signal handlers saved with signal.getsignal. None (a handler installed from C, which Python cannot
    put back) becomes the default, the nearest."""
    for sig, handler in handlers.items():
        with contextlib.suppress(ValueError, OSError, TypeError):  # ValueError: not the main thread
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def interrupting(said: Callable[[signal.Signals], str], *signals: signal.Signals) -> Iterator[None]:
    """While inside, in a process with no ranks of its own to stop (it follows a job, it evaluates): each of
    `signals` raises Interrupted(said(signal), 128 + signal), so the CLI says one line and exits with the shell's
    code, where SIGTERM ended the process without a word. The handlers before are put back after."""

    def stopped(signum: int, _frame: object) -> None:
        raise Interrupted(said(signal.Signals(signum)), 128 + signum)

    before = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        signal.signal(sig, stopped)
    try:
        yield
    finally:
        restore_handlers(before)


# 128 + SIGPIPE: what a shell reports for a writer whose reader left (`yes | head`), never a verdict (0-3).
BROKEN_PIPE_EXIT = 141


class ReaderLeft(Exception):
    """The reader of gpucert's output closed it (`gpucert accept 2>&1 | head`): the run stops before its next
    benchmark, since nobody reads what it would say. Not an OSError: a peer's broken socket is one, and is a
    failure of the job; this is not."""
