"""Reading kernel-provided files (/proc, /sys, /etc) the way every host collector needs to."""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str | None:
    """The file's text, or None when it is missing or refuses reads.

    sysfs attributes fail in ordinary ways (`speed` of a down link gives EINVAL, some are write-only), and
    a collector must keep going with what it can read.
    """
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
