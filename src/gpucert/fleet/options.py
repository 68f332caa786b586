"""Command-line values of the fleet integrations, checked when the command line is read (no prometheus-client
import until metrics are written)."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from gpucert.runtime.launch_env import launched_by_gpucert


def metrics_path(text: str) -> Path:
    """--metrics-file's argument: its directory must exist and be writable, so a bad path is refused (exit 3)
    before an hour of benchmarks rather than after them."""
    path = Path(text)
    if launched_by_gpucert():
        # A rank of gpucert's node process, which checked the path and writes the file after its ranks end: eight
        # ranks probing it again could only refuse, mid-run, what was fine a second before.
        return path
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a directory: name the file, e.g. {path / 'gpucert-health.prom'}")
    directory = path.parent
    if directory.exists() and not directory.is_dir():
        raise argparse.ArgumentTypeError(f"{directory} is not a directory: name a file in a directory")
    if not directory.is_dir():
        raise argparse.ArgumentTypeError(
            f"{directory} does not exist: create it, or name a file in node_exporter's textfile directory"
        )
    # A file made and removed, not os.access: root passes every permission check, and /proc or a read-only mount
    # refuses the write itself. The name does not end in .prom, so node_exporter never reads it.
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".gpucert-probe-")
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{directory}: cannot write a file there: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)
    return path
