"""Errors of the runtime that torch-free code (the CLI, a light install's health) must be able to catch."""

from __future__ import annotations


class RendezvousError(RuntimeError):
    """Not every rank or node joined in time; the message names the missing ones and the address."""


class JobFailed(RuntimeError):
    """A rank failed, a node was lost or the job was stopped: the message names who and why, in one line."""
