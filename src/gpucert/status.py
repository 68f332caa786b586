"""The one ordered status every check, benchmark and suite reports.

PASS < WARN < FAIL < ERROR map to the Nagios exit codes 0/1/2/3, so Slurm prologs and monitoring systems can
act on them: FAIL means the hardware is bad (drain), ERROR means the check itself could not run (do not drain
on it, investigate). SKIP marks a check that does not apply here (no InfiniBand on this node); it never hides
a failure and exits 0 on its own. INFO is a measurement shown but not judged: nothing held it to a threshold, so
it could not have failed and must not read as PASS (a fixed-size matmul on one GPU, a metric with no floor in
the profile); it exits 0 and ranks below PASS so a run of INFO alone never claims more than it checked.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable


@functools.total_ordering
class Status(enum.Enum):
    SKIP = "SKIP"
    INFO = "INFO"
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


_RANK = {Status.SKIP: 0, Status.INFO: 1, Status.PASS: 2, Status.WARN: 3, Status.FAIL: 4, Status.ERROR: 5}
_EXIT_CODE = {Status.SKIP: 0, Status.INFO: 0, Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 3}


def worst(statuses: Iterable[Status]) -> Status:
    """The worst status of a suite; an empty suite has run nothing and says so with SKIP."""
    return max(statuses, key=lambda s: s.rank, default=Status.SKIP)
