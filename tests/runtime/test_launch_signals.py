"""A launch in-process leaves the caller's signal handlers as they were: torch's agent installs its own for
SIGHUP and SIGQUIT, gpucert its own for SIGINT and SIGTERM, and without this a test session (or a library caller)
that launched once met a later SIGTERM as an exception inside whatever ran next, instead of ending."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

import pytest

from gpucert.runtime.config import RuntimeConfig
from gpucert.runtime.launch_env import NodeEnv
from gpucert.runtime.launcher import LAUNCH_SIGNALS, OPERATOR_SIGNALS, launch_ranks

pytestmark = pytest.mark.slow  # it starts a rank


def test_a_launch_puts_back_the_callers_signal_handlers(tmp_path: Path) -> None:
    def mine(signum: int, frame: FrameType | None) -> None:  # never called: only compared
        raise AssertionError(signum)

    watched = (*LAUNCH_SIGNALS, *OPERATOR_SIGNALS)
    before = {sig: signal.getsignal(sig) for sig in watched}
    try:
        for sig in LAUNCH_SIGNALS:
            signal.signal(sig, mine)
        outcome = launch_ranks(
            NodeEnv("flags", 0, 1, "127.0.0.1", 0), 1, [sys.executable, "-c", "pass"], RuntimeConfig(), tmp_path
        )
        assert outcome.ok, outcome
        assert {sig: signal.getsignal(sig) for sig in LAUNCH_SIGNALS} == dict.fromkeys(LAUNCH_SIGNALS, mine)
        assert all(signal.getsignal(sig) == before[sig] for sig in OPERATOR_SIGNALS)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
