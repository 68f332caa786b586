from __future__ import annotations

import itertools
import operator
from collections.abc import Callable

import pytest

from gpucert.status import Status, worst

ORDER = [Status.SKIP, Status.INFO, Status.PASS, Status.WARN, Status.FAIL, Status.ERROR]


def test_statuses_are_ordered_skip_info_pass_warn_fail_error() -> None:
    assert sorted(reversed(ORDER)) == ORDER
    assert sorted([Status.FAIL, Status.SKIP, Status.ERROR, Status.PASS, Status.INFO, Status.WARN]) == ORDER
    for lower, higher in itertools.pairwise(ORDER):
        assert lower < higher
        assert lower <= higher
        assert higher > lower
        assert higher >= lower
        assert not higher < lower
        assert not lower > higher


def test_a_status_equals_only_itself() -> None:
    for status in ORDER:
        assert status <= status
        assert status >= status
        assert not status < status
        assert [other for other in ORDER if other == status] == [status]


def test_enum_lists_every_status_in_order() -> None:
    assert list(Status) == ORDER
    assert [s.rank for s in ORDER] == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("status", "code"),
    [(Status.SKIP, 0), (Status.INFO, 0), (Status.PASS, 0), (Status.WARN, 1), (Status.FAIL, 2), (Status.ERROR, 3)],
)
def test_exit_codes_follow_nagios(status: Status, code: int) -> None:
    assert status.exit_code == code


def test_values_round_trip_through_their_names() -> None:
    assert [Status(s.value) for s in ORDER] == ORDER
    assert [s.value for s in ORDER] == ["SKIP", "INFO", "PASS", "WARN", "FAIL", "ERROR"]


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ([], Status.SKIP),
        ([Status.SKIP], Status.SKIP),
        ([Status.PASS, Status.SKIP], Status.PASS),
        ([Status.INFO, Status.SKIP], Status.INFO),
        ([Status.INFO, Status.PASS], Status.PASS),
        ([Status.PASS, Status.WARN, Status.PASS], Status.WARN),
        ([Status.WARN, Status.FAIL, Status.PASS], Status.FAIL),
        ([Status.FAIL, Status.ERROR, Status.WARN], Status.ERROR),
        ([Status.ERROR, Status.SKIP], Status.ERROR),
    ],
)
def test_worst_is_the_highest_status(statuses: list[Status], expected: Status) -> None:
    assert worst(statuses) is expected


def test_worst_accepts_a_one_shot_iterator() -> None:
    assert worst(s for s in [Status.PASS, Status.FAIL, Status.WARN]) is Status.FAIL
    assert worst(iter([])) is Status.SKIP


def test_a_status_never_equals_its_string_or_exit_code() -> None:
    assert Status.PASS != "PASS"
    assert Status.PASS != 0
    assert Status.ERROR != 3


@pytest.mark.parametrize("other", ["PASS", 1, 2.5, None])
@pytest.mark.parametrize("op", [operator.lt, operator.le, operator.gt, operator.ge])
def test_ordering_against_a_non_status_is_a_type_error(op: Callable[[object, object], bool], other: object) -> None:
    with pytest.raises(TypeError, match="not supported between instances of 'Status' and"):
        op(Status.WARN, other)
