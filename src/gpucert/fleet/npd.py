"""`gpucert health --npd`: a node-problem-detector custom plugin.

NPD runs the plugin every `invoke_interval` and reads two things (its pkg/custompluginmonitor/plugin/plugin.go):
the exit code, 0 OK, 1 NonOK (a problem: the node condition is set), anything else Unknown; and stdout, trimmed
and cut at `max_output_length`, as the condition's message. So:

    any FAIL result                -> 1, "FAIL <check>: <its message> (+N more)"
    else any ERROR (or no run)     -> 2, "ERROR ...": the check could not run, which is no verdict on the GPUs
    else (PASS, WARN, INFO, SKIP)  -> 0, "PASS 23 checks on <node>" (a WARN is named, but sets no condition)

A FAIL beside an ERROR is still a problem, as `health --drain` drains on it: the hardware that was read is bad.
The full report is written as for any run (--output), and the tables go nowhere: stdout is the message alone.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from gpucert.report.schema import Report, Result
from gpucert.status import Status

OK, PROBLEM, UNKNOWN = 0, 1, 2
# One line; NPD cuts it at max_output_length (80 unless its config says more; deploy/k8s asks for 256).
MESSAGE_CHARS = 256


def _named(status: Status, bad: list[Result]) -> str:
    first = bad[0]
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    # Messages say "expected X, found Y, on Z": the subject is in them already.
    text = " ".join(f"{status.value} {first.name}: {first.message}".split())
    if len(text) + len(more) > MESSAGE_CHARS:
        text = text[: MESSAGE_CHARS - len(more) - 3] + "..."
    return text + more


def plugin_answer(report: Report) -> tuple[str, int]:
    """(the one-line message, NPD's exit code) for a health report."""
    for status, code in ((Status.FAIL, PROBLEM), (Status.ERROR, UNKNOWN)):
        bad = [r for r in report.results if r.status is status]
        if bad:
            return _named(status, bad), code
    warned = [r for r in report.results if r.status is Status.WARN]
    if warned:
        return _named(Status.WARN, warned), OK
    judged = sum(r.status is Status.PASS for r in report.results)
    node = report.meta.nodes[0] if report.meta.nodes else report.meta.host
    if not judged:
        # Nothing held to a threshold (a node with no checks that apply) is no evidence of health either.
        return f"UNKNOWN no check was judged on {node}", UNKNOWN
    return f"PASS {judged} checks on {node}", OK


def run_plugin(run: Callable[[], int]) -> int:
    """Run the health verb as NPD's plugin: a run that raised (a config error, NVML missing) answers Unknown with
    the reason on stdout, and any exit code outside NPD's 0/1 becomes 2."""
    try:
        code = run()
    except Exception as exc:
        # A refusal (ValueError, ConfigError among them) is said as the CLI says it; anything else names its type.
        said = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        return unknown(said)
    return code if code in (OK, PROBLEM) else UNKNOWN


def unknown(reason: str, said: bool = False) -> int:
    """NPD's answer for a node gpucert could not check: the reason on stdout (NPD's one line) and, unless it was
    `said` there already (argparse's refusal), on stderr."""
    print(f"UNKNOWN gpucert could not check this node: {' '.join(reason.split())}"[:MESSAGE_CHARS])
    if not said:
        print(f"gpucert: error: {reason}", file=sys.stderr)
    return UNKNOWN
