"""Which way is better for a measured number: shared by run comparison and the cross-node outlier rule.

Kept apart from compare.py (which draws rich tables) so the pure cluster judges can use it without pulling
in the terminal views, which themselves render cluster reports.
"""

from __future__ import annotations

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
