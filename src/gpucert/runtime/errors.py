"""Errors of the runtime that torch-free code (the CLI, a light install's health) must be able to catch."""

from __future__ import annotations


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


# 128 + SIGPIPE: what a shell reports for a writer whose reader left (`yes | head`), never a verdict (0-3).
BROKEN_PIPE_EXIT = 141


class ReaderLeft(Exception):
    """The reader of gpucert's output closed it (`gpucert accept 2>&1 | head`): the run stops before its next
    benchmark, since nobody reads what it would say. Not an OSError: a peer's broken socket is one, and is a
    failure of the job; this is not."""
