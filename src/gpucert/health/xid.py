"""NVIDIA XID events from the kernel log: collect (dmesg), parse (pure), and the codes that fail a node.

An XID line looks like
  `2026-11-21T10:00:00,123456+00:00 NVRM: Xid (PCI:0000:19:00): 79, pid=1234, name=python, GPU has fallen
  off the bus.`
The hard-fail set is the one Azure NHC, Imbue and gcm agree on (../shared/reference/acceptance-testing.md §6).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from datetime import datetime, timedelta

# 48 DBE, 63/64 row remap, 74 NVLink, 79 fallen off the bus, 92 high SBE rate, 94/95 contained/uncontained
# ECC, 119/120 GSP errors.
HARD_FAIL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})

_XID = re.compile(r"NVRM: Xid \(PCI:(?P<bus>[0-9a-fA-F:.]+)\): (?P<code>\d+),\s*(?P<text>.*)")
_ISO_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})[,.]?\d*([+-]\d{2}:?\d{2})?")


@dataclass(frozen=True)
class XidEvent:
    code: int
    pci_bus: str
    text: str
    time: str | None


def parse_xid_events(log: str) -> list[XidEvent]:
    events = []
    for line in log.splitlines():
        match = _XID.search(line)
        if not match:
            continue
        stamp = _ISO_TIME.match(line)
        events.append(
            XidEvent(
                code=int(match["code"]),
                pci_bus=match["bus"].lower(),
                text=match["text"].strip(),
                time=f"{stamp[1]}{stamp[2] or '+00:00'}" if stamp else None,
            )
        )
    return events


def events_within(events: list[XidEvent], now: datetime, window: timedelta) -> list[XidEvent]:
    """Events newer than now - window; events without a timestamp count (we cannot prove they are old)."""
    kept = []
    for event in events:
        if event.time is None or datetime.fromisoformat(event.time) >= now - window:
            kept.append(event)
    return kept


def collect_kernel_log(timeout_s: float) -> tuple[str | None, str | None]:
    """(log text, None) or (None, why it could not be read): containers often forbid dmesg."""
    try:
        done = subprocess.run(
            ["dmesg", "--time-format", "iso"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"dmesg: {exc}"
    if done.returncode != 0:
        return None, f"dmesg exited {done.returncode}: {done.stderr.strip()[:200]}"
    return done.stdout, None
