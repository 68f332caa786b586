"""Floors that depend on how many GPUs a run spans: per GPU count, per nodes x GPUs, or one for every count.

Bus bandwidth and DDP scaling change with the number of ranks (2 H200s gather at 290 GB/s busbw, 4 at 339:
../shared/reference/cluster.md §5), so a floor set from one count fails healthy runs of another. A profile
therefore states them per count:

    busbw_gbps_min:
      all_gather: {2: 260, 4: 305, Nx8: 300}
      all_reduce: 340          # a plain number: one floor for every count (profiles written before counts)

Keys: `G` is G GPUs in one node; `MxG` is M >= 2 nodes of G GPUs each; `NxG` is any number of nodes (>= 2) of
G GPUs. `MxG` wins over `NxG`. A count with no key has no floor: the measurement is shown (INFO), never PASS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A floor field's value: one number for every count, or a number per count key.
CountFloors = float | dict[str, float]

_KEY = re.compile(r"^(?:(?P<nodes>[1-9][0-9]*|N)x)?(?P<gpus>[1-9][0-9]*)$")
KEY_FORMS = "'G' (G GPUs in one node, e.g. '8'), 'MxG' (M >= 2 nodes of G GPUs, e.g. '2x8') or 'NxG' (any nodes)"


@dataclass(frozen=True)
class Floor:
    value: float
    # The count key that applied ("2", "2x8", "Nx8"); None for a plain number that covers every count.
    key: str | None = None

    @property
    def entry(self) -> str:
        """What to append to the field name in a threshold source: `[2 GPUs]`, `[2x8]`, or nothing."""
        if self.key is None:
            return ""
        return f"[{self.key} GPUs]" if "x" not in self.key else f"[{self.key}]"


def describe_count(gpus_per_node: int, nodes: int) -> str:
    """The count a floor is looked up for, as a reader says it: `2 GPUs`, `2 nodes x 8 GPUs`."""
    gpus = f"{gpus_per_node} GPU{'s' if gpus_per_node != 1 else ''}"
    return gpus if nodes <= 1 else f"{nodes} nodes x {gpus}"


def floor_for(floors: CountFloors | None, gpus_per_node: int, nodes: int) -> Floor | None:
    """The floor for a run of `nodes` nodes with `gpus_per_node` GPUs (ranks) each; None when none applies."""
    if floors is None:
        return None
    if not isinstance(floors, dict):
        return Floor(float(floors))
    keys = [str(gpus_per_node)] if nodes <= 1 else [f"{nodes}x{gpus_per_node}", f"Nx{gpus_per_node}"]
    for key in keys:
        if key in floors:
            return Floor(floors[key], key)
    return None


def key_problem(key: str) -> str | None:
    """Why key is not a count key, or None when it is one."""
    match = _KEY.match(key)
    if match is None:
        return f"key {key!r} is not a GPU count: expected {KEY_FORMS}"
    if match["nodes"] == "1":
        return f"key {key!r} names one node: write {match['gpus']!r} for {match['gpus']} GPUs in one node"
    return None


def floor_problems(where: str, floors: CountFloors | None, low: float, high: float | None = None) -> list[str]:
    """Every bad key or value of one floor field, each naming its key (`where` is its dotted path)."""
    if floors is None:
        return []
    if not isinstance(floors, dict):
        return _value_problems(where, floors, low, high)
    found = []
    for key, value in floors.items():
        problem = key_problem(key)
        if problem is not None:
            found.append(f"{where}: {problem}")
        found += _value_problems(f"{where}.{key}", value, low, high)
    return found


def _value_problems(where: str, value: float, low: float, high: float | None) -> list[str]:
    if value <= low or (high is not None and value > high):
        bound = f"in ({low:g}, {high:g}]" if high is not None else f"> {low:g}"
        return [f"{where} must be {bound}, found {value:g}"]
    return []
