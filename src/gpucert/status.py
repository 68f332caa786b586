"""The one ordered status every check, benchmark and suite reports.

PASS < WARN < FAIL < ERROR map to the Nagios exit codes 0/1/2/3, so Slurm prologs and monitoring systems can
act on them: FAIL means the hardware is bad (drain), ERROR means the check itself could not run (do not drain
on it, investigate). SKIP marks a check that does not apply here (no InfiniBand on this node); it never hides
a failure and exits 0 on its own.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable


@functools.total_ordering
class Status(enum.Enum):
    SKIP = "SKIP"
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    ERROR = "ERROR"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def exit_code(self) -> int:
        return _EXIT_CODE[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Status):
            return NotImplemented
        return self.rank < other.rank


_RANK = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.FAIL: 3, Status.ERROR: 4}
_EXIT_CODE = {Status.SKIP: 0, Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 3}


def worst(statuses: Iterable[Status]) -> Status:
    """The worst status of a suite; an empty suite has run nothing and says so with SKIP."""
    return max(statuses, key=lambda s: s.rank, default=Status.SKIP)
