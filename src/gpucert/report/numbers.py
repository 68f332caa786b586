"""Numbers in messages: enough significant figures that a measured value never reads as another one.

`f"{x:.0f}"` and `f"{x:.1f}"` print a CPU's 0.029 TFLOP/s as "0" and "0.0", beside a value column that says
0.029. `sig(x)` keeps three significant figures below 1000 (0.029, 0.0263, 45.7, 989) and whole numbers above
(1410, 18,084), without trailing zeros; a non-zero value never prints as 0.
"""

from __future__ import annotations

import math

SIGNIFICANT = 3


def sig(value: float, digits: int = SIGNIFICANT) -> str:
    """value with `digits` significant figures (whole from 10**digits on), trailing zeros dropped."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 10**digits:
        # Separators from five digits on, where they help: 18,084 tokens/s, but 1410 MHz.
        return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def short(value: float) -> str:
    """A value column's figure: thousands grouped from 10,000 (44,590 tokens/s, never 4.459e+04), four significant
    figures below (989.4, 0.02913), an exponent only where grouping would not help (1e15 and up)."""
    return f"{value:,.0f}" if 1e4 <= abs(value) < 1e15 else f"{value:.4g}"
