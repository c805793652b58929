"""Spreads of timing figures: the one ``quartiles`` every record and table uses."""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def quartiles(values: Iterable[float]) -> list[float] | None:
    """[q1, q3] of ``values`` (inclusive method; one value gives [v, v]; none gives None)."""
    values = list(values)
    if not values:
        return None
    if len(values) == 1:
        return [values[0], values[0]]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [q1, q3]
