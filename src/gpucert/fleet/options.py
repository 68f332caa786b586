"""Command-line values of the fleet integrations, checked when the command line is read (no prometheus-client
import until metrics are written)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def metrics_path(text: str) -> Path:
    """--metrics-file's argument: its directory must exist and be writable, so a bad path is refused (exit 3)
    before an hour of benchmarks rather than after them."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a directory: name the file, e.g. {path / 'gpucert-health.prom'}")
    directory = path.parent
    if not directory.is_dir():
        raise argparse.ArgumentTypeError(
            f"{directory} does not exist: create it, or name a file in node_exporter's textfile directory"
        )
    if not os.access(directory, os.W_OK):
        raise argparse.ArgumentTypeError(f"{directory} is not writable by this user")
    return path
