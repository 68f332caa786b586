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


def test_ranks_that_all_exit_0_without_a_verdict_are_an_error_not_a_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every worker exited 0 but local rank 0 wrote no verdict file (a TMPDIR the ranks do not share, a path that
    skips write_verdict): the node exited 0, a PASS nothing judged. Which rank does that cannot be made here for
    real, so the launch's outcome is given as it would come back."""
    import gpucert.runtime.launcher as launcher
    from gpucert.cli import main
    from gpucert.runtime.launcher import LaunchOutcome

    monkeypatch.setattr(launcher, "launch_ranks", lambda *args, **kwargs: LaunchOutcome(True, None))
    assert main(["accept", "--profile", "cpu", "-o", str(tmp_path / "run")]) == 3
    assert "local rank 0 wrote no verdict" in capsys.readouterr().err
    capsys.readouterr()
    out = tmp_path / "ft"
    assert main(["finetune", "--nproc", "2", "--set", "train.max_steps=1", "-o", str(out)]) == 3
    assert "local rank 0 wrote no verdict" in capsys.readouterr().err
