"""Timeouts of the distributed runtime: every wait of a multi-process run is bounded by one of these."""

from __future__ import annotations

from dataclasses import dataclass

# The longest duration or timeout taken (30 days): beyond it a timer cannot be set (`threading.Timer` overflows
# time_t near 1e9 h, `timedelta` refuses inf), and no burn-in, benchmark or wait is meant to outlast it.
MAX_SECONDS = 30 * 24 * 3600.0
# A heartbeat more often than this loads the job's store with beats, not work; a timeout under a second is
# missed by a healthy rank that is busy for a moment (a GC pause, a page fault storm).
MIN_HEARTBEAT_INTERVAL_S = 0.1
MIN_HEARTBEAT_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class RuntimeConfig:
    # Seconds for every node and rank to join; past it the run fails naming the node ranks that never came.
    rendezvous_timeout_s: float = 120.0
    # A collective (or a wait for a peer's result) that takes longer fails: the process group's timeout.
    collective_timeout_s: float = 600.0
    # Every rank says it is alive this often; one silent for heartbeat_timeout_s (stopped, dead, its node
    # gone) is named and every rank of the job exits.
    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 30.0
    # After SIGTERM a worker has this long to exit before SIGKILL.
    kill_grace_s: float = 10.0

    def problems(self) -> list[str]:
        """Values that would make a wait unbounded or a watchdog fire on a healthy job."""
        found = []
        for name in ("rendezvous_timeout_s", "collective_timeout_s", "heartbeat_interval_s", "heartbeat_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                found.append(f"runtime.{name} must be > 0, found {value}")
            elif not value <= MAX_SECONDS:  # inf and nan too: a wait with no end, or a timer that cannot be set
                found.append(f"runtime.{name} must be at most 30 days ({MAX_SECONDS:g} s), found {value:g}")
        if not 0 <= self.kill_grace_s <= MAX_SECONDS:
            found.append(f"runtime.kill_grace_s must be >= 0 and at most {MAX_SECONDS:g} s, found {self.kill_grace_s}")
        if not all(0 < v <= MAX_SECONDS for v in (self.heartbeat_interval_s, self.heartbeat_timeout_s)):
            return found  # said above; nothing to compare them with
        if self.heartbeat_interval_s < MIN_HEARTBEAT_INTERVAL_S:
            found.append(
                f"runtime.heartbeat_interval_s must be >= {MIN_HEARTBEAT_INTERVAL_S:g} s, found "
                f"{self.heartbeat_interval_s:g}: beats that often load the job's store with beats"
            )
        if self.heartbeat_timeout_s < MIN_HEARTBEAT_TIMEOUT_S:
            found.append(
                f"runtime.heartbeat_timeout_s must be >= {MIN_HEARTBEAT_TIMEOUT_S:g} s, found "
                f"{self.heartbeat_timeout_s:g}: a healthy rank busy for a moment would be taken for a dead one"
            )
        if self.heartbeat_timeout_s < 3 * self.heartbeat_interval_s:
            found.append(
                f"runtime.heartbeat_timeout_s ({self.heartbeat_timeout_s}) must be at least 3 x "
                f"runtime.heartbeat_interval_s ({self.heartbeat_interval_s}), or one late beat kills the job"
            )
        return found
