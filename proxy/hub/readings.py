"""Per-token numbers that an upstream reports about its own work, as its JSON carried them, and how they are read.

MindIE reports the decode time, the queue wait and the batch size of each generated token (proxy/dialects/mindie.py
`timings`): a list of numbers per answer, thousands for a long one, in the upstream's own units. The dialect wraps
each list unread in `Readings`, with what one unit of it is worth in the metric's unit (seconds, or 1 for a count);
the metrics layer reads it once, straight into a histogram (proxy/metrics/local.py `HistogramChild.observe_readings`).
Reading keeps the items that are finite non-negative numbers (a bool is not one) among the first MAX_READINGS, each
times `unit`: a value the upstream got wrong is left out, not an error.

Why the list is not converted to seconds by the dialect: that list would be made only to be read once. Compiled, its
float objects cost as much as the histogram's pass over them; read in place, the pass converts, checks, sums and
counts each item as C doubles (docs/speed.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["MAX_READINGS", "Readings", "finite", "number", "values"]

MAX_READINGS: Final = 65_536  # items read of one list: bounds the work one answer makes


@dataclass(slots=True)
class Readings:
    items: list[Any]  # as the upstream's JSON gave them: numbers, normally
    unit: float = 1.0  # what one of the upstream's units is in the metric's (1e-3: milliseconds to seconds)

    def __init__(self, items: list[Any], unit: float = 1.0) -> None:
        # Written out, as proxy/hub/events.py's classes: the generated one runs interpreted.
        self.items = items
        self.unit = unit


_INF: Final = math.inf


def finite(value: object) -> float:
    """`value` as a float if it is a finite non-negative number (a bool is not), else -1.0: compiled, a C double either
    way, so an item is never boxed on the way. One isinstance per type, so that each `float` is a C conversion of a
    narrowed value (of an `object`, a generic call of the float type). An exact int is tested first, by its type
    alone: MindIE's timings are integers, and a float test of an int walks the int type's bases."""
    if type(value) is int:
        f = float(value)
    elif isinstance(value, float):
        f = value
    elif isinstance(value, int) and not isinstance(value, bool):  # a subclass of int (not a bool)
        f = float(value)
    else:
        return -1.0
    return f if 0.0 <= f < _INF else -1.0  # finite, not negative (NaN compares false)


def number(value: object) -> float | None:
    """A single reported value (MindIE's prefill time): as `finite`, None if it is not one."""
    f = finite(value)
    return None if f < 0.0 else f


_PLAIN_NUMBERS: Final = frozenset({int, float})


def values(readings: Readings) -> list[float]:
    """What reading `readings` gives, as a list: each item that is a finite non-negative number, times the unit, among
    the first MAX_READINGS (a list of plain numbers, the usual case, converted in one pass of builtins): what a
    prometheus_client histogram is given (`Metrics(local=False)`); the local ones read the items in place
    (proxy/metrics/local.py `count_readings`)."""
    items = readings.items[:MAX_READINGS]
    unit = readings.unit
    if items and set(map(type, items)) <= _PLAIN_NUMBERS:  # no bool, None or string among them
        total = sum(items, 0.0)  # a float (int or float alike: the compiled build, setup.py, keeps the two apart)
        if math.isfinite(total) and min(items) >= 0:  # no NaN, no infinity, none negative
            return list(map(float, items)) if unit == 1 else [item * unit for item in items]
    out: list[float] = []
    for item in items:
        v = finite(item)
        if v >= 0.0:
            out.append(v * unit)
    return out
