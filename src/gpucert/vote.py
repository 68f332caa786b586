"""Which of several GPUs that must agree bit for bit is the odd one: a majority vote.

GPUs of one model fed identical inputs compute identical bits (same kernels, same order of operations), so a
GPU whose answer differs from what most others computed is the faulty one (Imbue's cross-GPU check). With no
majority (two GPUs that disagree, or a 2-2 split) nobody can tell which is wrong, and every voter is a suspect.
Used by health's liveness check and the burn benchmark's silent-data-corruption check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Vote(Generic[K]):
    # The answer more than half the voters gave; None when no answer has that many (or nobody voted).
    majority: str | None
    # The voters to blame: those that differ from the majority, or every voter when they differ with no majority.
    odd: tuple[K, ...]
    voters: int

    @property
    def undecided(self) -> bool:
        """The voters differ and no answer has a majority: cannot tell which GPU is wrong."""
        return self.majority is None and bool(self.odd)


def majority_vote(answers: Mapping[K, str]) -> Vote[K]:
    """Each voter's answer (a checksum) -> the majority answer and the voters that differ from it."""
    counts = Counter(answers.values())
    if len(counts) <= 1:
        return Vote(next(iter(counts), None), (), len(answers))
    top, count = counts.most_common(1)[0]
    if 2 * count > len(answers):
        return Vote(top, tuple(k for k, v in answers.items() if v != top), len(answers))
    return Vote(None, tuple(answers), len(answers))
