"""Where reports live: one directory per run, `runs/<UTC timestamp>-<host>/report.json` (+ report.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from datetime import datetime
from pathlib import Path

from gpucert.report.markdown import render_markdown
from gpucert.report.schema import Report


def default_run_dir(runs_dir: Path, host: str, started: datetime) -> Path:
    return runs_dir / f"{started.strftime('%Y%m%dT%H%M%SZ')}-{host}"


def _write_atomic(path: Path, text: str) -> None:
    # A report half-written by a killed run must never be read as a whole one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    # mkstemp makes 0600 files; reports in a shared runs/ directory must be readable as the umask allows.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def write_report(report: Report, directory: Path, html: bool = False) -> Path:
    """report.json and report.md, and report.html when asked (plots take a few seconds) and matplotlib is
    installed (gpucert[html]); `gpucert report RUN --html` draws it later where it is."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "report.json"
    _write_atomic(path, json.dumps(report.to_dict(), indent=1) + "\n")
    _write_atomic(directory / "report.md", render_markdown(report))
    if html and importlib.util.find_spec("matplotlib") is not None:
        write_html(report, directory)
    return path


def write_html(report: Report, directory: Path) -> Path:
    from gpucert.report.html import render_html  # matplotlib loads only when a page is drawn

    path = directory / "report.html"
    _write_atomic(path, render_html(report))
    return path


def load_report(path: Path) -> Report:
    """A report from its JSON file or its run directory; errors name the file."""
    if path.is_dir():
        path = path / "report.json"
    try:
        return Report.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable gpucert report: {exc}") from exc
