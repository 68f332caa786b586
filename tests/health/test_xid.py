from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from gpucert.health.xid import HARD_FAIL_XIDS, XidEvent, events_within, parse_xid_events

NODES = Path(__file__).resolve().parent.parent / "fixtures" / "nodes"

FALLEN_OFF = (
    "2026-11-20T10:00:00,123456+00:00 NVRM: Xid (PCI:0000:19:00): 79, pid=1234, name=python, "
    "GPU has fallen off the bus."
)
DBE_NO_TIME = (
    "NVRM: Xid (PCI:0000:9B:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) "
    "has been detected on GPU in the framebuffer at partition 0, subpartition 0."
)
SM_EXCEPTION_UPTIME = (
    "[  123.456] NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): "
    "Out Of Range Address"
)
# NVRM lines that are not XIDs, as the H200 node's kernel log has them.
NOT_XID = (
    "2026-11-21T18:50:14,005895+00:00 NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  "
    "Release Build  (nixbld@)  \n"
    "2026-11-21T18:50:14,597276+00:00 NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt "
    "detected. Clearing it.\n"
    "2026-11-21T18:50:18,365268+00:00 NVRM: Persistence mode is deprecated and will be removed in a future "
    "release. Please use nvidia-persistenced instead.\n"
    "2026-11-21T18:50:19,000000+00:00 NVRM: GPU at PCI:0000:19:00: GPU-6f1c1b0e-8d1a-4c4e-9d7f-0a1b2c3d4e5f\n"
)


def xid(code: int, time: str | None) -> XidEvent:
    return XidEvent(code=code, pci_bus="0000:19:00", text="GPU has fallen off the bus.", time=time)


def test_parses_an_iso_timestamped_xid() -> None:
    assert parse_xid_events(FALLEN_OFF) == [
        XidEvent(
            code=79,
            pci_bus="0000:19:00",
            text="pid=1234, name=python, GPU has fallen off the bus.",
            time="2026-11-20T10:00:00+00:00",
        )
    ]


def test_parses_an_xid_without_timestamp_and_lowercases_the_bus() -> None:
    assert parse_xid_events(DBE_NO_TIME) == [
        XidEvent(
            code=48,
            pci_bus="0000:9b:00",
            text="pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on "
            "GPU in the framebuffer at partition 0, subpartition 0.",
            time=None,
        )
    ]


def test_uptime_stamped_xid_has_no_wall_clock_time() -> None:
    assert parse_xid_events(SM_EXCEPTION_UPTIME) == [
        XidEvent(
            code=13,
            pci_bus="0000:3b:00",
            text="Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
            time=None,
        )
    ]


def test_syslog_prefixed_xid_is_found_without_a_time() -> None:
    line = "Nov 20 10:00:00 n1 kernel: NVRM: Xid (PCI:0000:19:00): 74, pid=0, name=, NVLink: fatal error"
    assert parse_xid_events(line) == [
        XidEvent(code=74, pci_bus="0000:19:00", text="pid=0, name=, NVLink: fatal error", time=None)
    ]


def test_timezone_offset_is_kept() -> None:
    line = "2026-11-20T12:00:00.5+02:00 NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off the bus."
    assert parse_xid_events(line) == [xid(79, "2026-11-20T12:00:00+02:00")]


def test_non_xid_nvrm_lines_are_ignored() -> None:
    assert parse_xid_events(NOT_XID) == []
    assert parse_xid_events("") == []


def test_events_come_back_in_log_order_among_other_lines() -> None:
    log = "\n".join([NOT_XID, SM_EXCEPTION_UPTIME, "random kernel line", FALLEN_OFF, DBE_NO_TIME])
    assert [(e.code, e.pci_bus) for e in parse_xid_events(log)] == [
        (13, "0000:3b:00"),
        (79, "0000:19:00"),
        (48, "0000:9b:00"),
    ]


def test_captured_h200_kernel_log_has_no_xids() -> None:
    log = (NODES / "h200x4" / "dmesg.txt").read_text()
    # The capture does have driver (NVRM) lines: the parser must look past them, not miss them all.
    assert sum("NVRM:" in line for line in log.splitlines()) == 6
    assert parse_xid_events(log) == []


def test_xid_appended_to_the_captured_log_is_the_only_event() -> None:
    log = (NODES / "h200x4" / "dmesg.txt").read_text() + FALLEN_OFF + "\n"
    assert [e.code for e in parse_xid_events(log)] == [79]


def test_hard_fail_set_has_the_fatal_codes_and_not_application_errors() -> None:
    assert {48, 74, 79, 94, 95, 119}.issubset(HARD_FAIL_XIDS)
    # 13 (SM exception) and 31 (MMU fault) are usually a user program's bug, not the node's.
    assert 13 not in HARD_FAIL_XIDS
    assert 31 not in HARD_FAIL_XIDS


NOW = datetime(2026, 11, 21, 10, 0, 0, tzinfo=timezone.utc)


def test_events_within_keeps_recent_and_untimed_and_drops_old() -> None:
    recent = xid(79, "2026-11-21T09:00:00+00:00")
    at_edge = xid(48, "2026-11-20T10:00:00+00:00")
    old = xid(94, "2026-11-20T09:59:59+00:00")
    untimed = xid(13, None)
    assert events_within([old, recent, untimed, at_edge], NOW, timedelta(hours=24)) == [recent, untimed, at_edge]


def test_events_within_honours_the_timezone_offset() -> None:
    # 11:30+02:00 is 09:30 UTC: half an hour before NOW, so inside one hour and outside a quarter hour.
    event = xid(79, "2026-11-21T11:30:00+02:00")
    assert events_within([event], NOW, timedelta(hours=1)) == [event]
    assert events_within([event], NOW, timedelta(minutes=15)) == []


def test_events_within_on_parsed_lines() -> None:
    events = parse_xid_events("\n".join([FALLEN_OFF, SM_EXCEPTION_UPTIME]))
    # FALLEN_OFF is 23 h 59 m 59.88 s old at NOW (its fraction of a second is dropped, so it counts as
    # exactly 24 h): a 23 h window keeps only the untimed event, a 24 h one keeps both.
    assert [e.code for e in events_within(events, NOW, timedelta(hours=23))] == [13]
    assert [e.code for e in events_within(events, NOW, timedelta(hours=24))] == [79, 13]
