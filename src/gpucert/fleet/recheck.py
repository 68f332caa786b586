"""A FAIL that takes a node out of service must be seen twice: one noisy reading never drains a node.

`confirm_failures(first, second)`: the results of a run measured again after its first reading FAILed. A
check (name, subject, node) stays FAIL only where both readings FAIL; a FAIL seen in one reading only is a WARN
that says so and shows both, so the flicker is on record without draining the node. Every other result is the
second reading's. A check a node cannot re-measure (ECC counters, XID events, the GPU count) reads the same twice
and so still FAILs: the recheck costs it one more run, never its verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from gpucert.acceptance import RunOutcome
from gpucert.report.schema import Result
from gpucert.report.store import FIRST_READING, RUN_ARTEFACTS, write_atomic, write_report
from gpucert.status import Status


def _key(result: Result) -> tuple[str, str, str | None]:
    return result.name, result.subject, result.node


def _reading(result: Result) -> str:
    value = "" if result.value is None else f"{result.value}{' ' + result.unit if result.unit else ''}: "
    return f"{value}{result.message}"


def confirm_failures(first: list[Result], second: list[Result]) -> list[Result]:
    """The second run's results with a FAIL kept only where the first run FAILed the same check too."""
    failed_first = {_key(r): r for r in first if r.status is Status.FAIL}
    confirmed = []
    again = "re-run it: a second FAIL in a row drains the node."
    for result in second:
        key = _key(result)
        if result.status is Status.FAIL and key not in failed_first:
            confirmed.append(
                dataclasses.replace(
                    result,
                    status=Status.WARN,
                    message=f"{result.message} (FAILed on the re-measurement only; the first reading passed)",
                    remediation=f"{again} {result.remediation or ''}".rstrip(),
                )
            )
        elif key in failed_first and result.status is not Status.FAIL:
            once = failed_first[key]
            confirmed.append(
                dataclasses.replace(
                    result,
                    status=max(result.status, Status.WARN),
                    message=f"{result.message} (FAILed once, then not when re-measured: {_reading(once)})",
                    remediation="a reading that flickers: watch it; it drains the node when it FAILs twice in a row",
                )
            )
        else:
            confirmed.append(result)
    # A FAIL of the first reading whose check the second run did not report at all was not re-measured: it stands.
    seen = {_key(r) for r in second}
    confirmed += [r for key, r in failed_first.items() if key not in seen]
    return confirmed


def keeping_first_reading(directory: Path, rerun: Callable[[], RunOutcome]) -> RunOutcome:
    """`rerun` in `directory`, where a run wrote its report, and that report then in `directory/first-reading/`:
    the re-measurement's run clears what a run there wrote (a first-reading/ included, an earlier run's), so the
    first reading is held until the second has run."""
    held = {name: (directory / name).read_text() for name in RUN_ARTEFACTS if (directory / name).is_file()}
    again = rerun()
    kept = directory / FIRST_READING
    kept.mkdir(exist_ok=True)
    for name, text in held.items():
        write_atomic(kept / name, text)
    return again


def recheck(outcome: RunOutcome, rerun: Callable[[], RunOutcome]) -> RunOutcome:
    """`health --drain`: a run with a FAIL is run once more and its FAILs confirmed (confirm_failures) before
    anything drains; the second run's report is written again with the confirmed results. A run without a FAIL
    is returned as it is."""
    if outcome.report is None or not any(r.status is Status.FAIL for r in outcome.report.results):
        return outcome
    again = rerun()
    if again.report is None:
        return outcome
    report = dataclasses.replace(again.report, results=confirm_failures(outcome.report.results, again.report.results))
    path = write_report(report, again.path.parent) if again.path is not None else None
    return RunOutcome(report, path, report.status.exit_code)
