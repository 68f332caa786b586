"""Which way is better for a measured number, and how far it moves by chance.

`direction_of` is shared by run comparison and the cross-node outlier rule; `relative_spread` and
`noise_band_pct` give run comparison the noise band a change must leave before it counts. Kept apart from
compare.py (which draws rich tables) so the pure cluster judges can use it without pulling in the terminal
views, which themselves render cluster reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gpucert.report.schema import Result

HIGHER = "higher is better"
LOWER = "lower is better"

# Units whose direction is plain; a unit not listed here (GiB, links, ports) is compared but never judged.
HIGHER_IS_BETTER_UNITS = frozenset({"GB/s", "TB/s", "Gb/s", "MB/s", "TFLOP/s", "tokens/s", "samples/s", "%"})
LOWER_IS_BETTER_UNITS = frozenset(
    {"C", "W", "errors", "events", "rows", "s", "ms", "us", "relative error", "nats/token"}
)
# A fine-tuning run ("training" results): less memory needed is better. GiB has no direction elsewhere: a
# node's installed memory is a size, not a performance number.
TRAINING_LOWER_IS_BETTER_UNITS = frozenset({"GiB"})
# Results whose value is an estimate the run made, not a measurement (the memory plan's peak for the micro-batch
# it chose): a bigger estimate is a bigger plan, neither better nor worse.
ESTIMATES = frozenset({"train.memory_plan"})


def direction_of(result: Result) -> str | None:
    """Which way is better: the threshold's comparison if it has one (">= 690 W"), else the unit's.

    Only measured performance has a direction. Health readings (an idle GPU's temperature or utilisation,
    the liveness error) and telemetry move with the room and the moment: they are compared by status only.
    """
    if result.category not in ("benchmark", "evaluation", "training") or result.name in ESTIMATES:
        return None
    expected = (result.expected or "").lstrip()
    if expected.startswith(">"):
        return HIGHER
    if expected.startswith("<"):
        return LOWER
    if result.unit in HIGHER_IS_BETTER_UNITS:
        return HIGHER
    if result.unit in LOWER_IS_BETTER_UNITS or (
        result.category == "training" and result.unit in TRAINING_LOWER_IS_BETTER_UNITS
    ):
        return LOWER
    return None


# A change must exceed this many of the measurement's own spreads (coefficients of variation) to count: about
# 95 % of single repeats fall within two standard deviations of their mean.
NOISE_SIGMAS = 2.0


def _cv(timing: Any) -> float | None:
    """The coefficient of variation of a timing summary (bench/timing.py Timing.summary)."""
    cv = timing.get("cv") if isinstance(timing, dict) else None
    return float(cv) if isinstance(cv, (int, float)) and not isinstance(cv, bool) and math.isfinite(cv) else None


def _cv_at_value(values: Any, cvs: Any, value: float) -> float | None:
    """The spread of the entry of `values` the result reports (a curve's gate size, a matrix's weakest pair);
    lists of lists (a pair matrix) are searched row by row."""
    if not isinstance(values, Sequence) or not isinstance(cvs, Sequence) or len(values) != len(cvs):
        return None
    for v, c in zip(values, cvs, strict=True):
        if isinstance(v, Sequence) and not isinstance(v, str):
            found = _cv_at_value(v, c, value)
            if found is not None:
                return found
        elif v == value:
            return _cv({"cv": c})
    return None


def relative_spread(result: Result) -> float | None:
    """The spread of the repeats behind a result's value, as a coefficient of variation (0.02 = 2 %), where its
    details carry one; None where they do not.

    Read from what the benchmarks write: `timing.cv` (a fixed-size matmul, a memory bandwidth), the last phase's
    `step_timing[-1].cv` (the training proxy's tokens/s, whose value is that phase's), and the `cv` beside the
    reported figure in `busbw_gbps` (a collective at its gate size) or `matrix_gbps` (the p2p matrix's pair).
    The spread is that of single repeats, not of their median: wide enough to cover some drift between runs.
    """
    details, value = result.details, result.value
    if not isinstance(details, dict) or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if "timing" in details:
        return _cv(details["timing"])
    steps = details.get("step_timing")
    if isinstance(steps, list) and steps:
        return _cv(steps[-1])
    for values_key in ("busbw_gbps", "matrix_gbps"):
        if values_key in details:
            return _cv_at_value(details[values_key], details.get("cv"), float(value))
    return None


def noise_band_pct(results: Sequence[Result | None], tolerance_pct: float) -> float:
    """How far (in %) a number may move between two runs by chance: the tolerance, or NOISE_SIGMAS times the
    larger relative spread of the two runs' repeats where that is wider."""
    spreads = [s for r in results if r is not None and (s := relative_spread(r)) is not None]
    return max([tolerance_pct, *(100.0 * NOISE_SIGMAS * s for s in spreads)])
