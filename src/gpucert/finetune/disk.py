"""Full-disk and quota errors named in one message, for every writer of the fine-tuning path (the prepared data,
checkpoints, the final adapter): "no space left on <dir> (N MiB free there now) while writing <what>"."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

# The errors of a write that did not fit: the disk is full, or the user's quota is.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class NoSpaceError(OSError):
    """A write that did not fit (a full disk or quota); the message names the directory and what to do."""


def is_no_space(exc: BaseException) -> bool:
    """Whether a failure (or one it came from) is a full disk or quota, as OSError or as a library's text."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in NO_SPACE:
            return True
        if any(f"(os error {code})" in str(seen) for code in NO_SPACE):  # safetensors' Rust writer
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def no_space_message(directory: Path, exc: BaseException, what: str) -> str:
    """'no space left on <directory>' with what was lost, what is free there, and what to do."""
    try:
        free = f"{shutil.disk_usage(directory).free / (1 << 20):,.1f} MiB free there now"
    except OSError:
        free = "free space unknown"
    quota = any(isinstance(e, OSError) and e.errno == errno.EDQUOT for e in (exc, exc.__cause__, exc.__context__))
    kind = "disk quota exceeded on" if quota else "no space left on"
    return f"{kind} {directory} ({free}) while writing {what}"
