"""Timeouts of the distributed runtime: every wait of a multi-process run is bounded by one of these."""

from __future__ import annotations

from dataclasses import dataclass


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
        found = [
            f"runtime.{name} must be > 0, found {getattr(self, name)}"
            for name in (
                "rendezvous_timeout_s",
                "collective_timeout_s",
                "heartbeat_interval_s",
                "heartbeat_timeout_s",
            )
            if not getattr(self, name) > 0
        ]
        if self.kill_grace_s < 0:
            found.append(f"runtime.kill_grace_s must be >= 0, found {self.kill_grace_s}")
        if self.heartbeat_timeout_s < 3 * self.heartbeat_interval_s:
            found.append(
                f"runtime.heartbeat_timeout_s ({self.heartbeat_timeout_s}) must be at least 3 x "
                f"runtime.heartbeat_interval_s ({self.heartbeat_interval_s}), or one late beat kills the job"
            )
        return found
