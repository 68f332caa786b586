"""The majority vote that names the GPU whose bits differ (liveness, the burn's silent-data-corruption check)."""

from __future__ import annotations

from gpucert.vote import majority_vote


def test_all_agree_names_nobody() -> None:
    vote = majority_vote({0: "a", 1: "a", 2: "a"})
    assert (vote.majority, vote.odd, vote.voters, vote.undecided) == ("a", (), 3, False)


def test_one_of_eight_differs() -> None:
    vote = majority_vote({i: "b" if i == 3 else "a" for i in range(8)})
    assert (vote.majority, vote.odd, vote.undecided) == ("a", (3,), False)


def test_two_that_disagree_cannot_be_told_apart() -> None:
    vote = majority_vote({"gpu0": "a", "gpu1": "b"})
    assert (vote.majority, vote.odd, vote.undecided) == (None, ("gpu0", "gpu1"), True)


def test_half_is_not_a_majority() -> None:
    assert majority_vote({0: "a", 1: "a", 2: "b", 3: "b"}).undecided
    assert majority_vote({0: "a", 1: "a", 2: "b", 3: "c"}).undecided
    vote = majority_vote({0: "a", 1: "a", 2: "a", 3: "b", 4: "c"})
    assert (vote.majority, vote.odd) == ("a", (3, 4))


def test_one_voter_or_none() -> None:
    assert majority_vote({0: "a"}).odd == ()
    empty = majority_vote({})
    assert (empty.majority, empty.odd, empty.voters, empty.undecided) == (None, (), 0, False)
