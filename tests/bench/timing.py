"""The timing loop of the in-process micro benchmarks (micro.py, micro_validate.py, micro_metrics.py,
micro_replicas.py). It imports nothing of the proxy, so micro_replicas.py can time another commit's tree with it."""

from __future__ import annotations

import time
from collections.abc import Callable


def fastest(run: Callable[[], object], budget: float = 0.2, before: Callable[[], object] | None = None) -> float:
    """Seconds: the fastest call of `run` in about `budget` seconds (on a shared machine the least disturbed call is
    the one that shows the code's own cost). `before` is called untimed before each call."""
    best = float("inf")
    clock = time.perf_counter
    deadline = clock() + budget
    for _ in range(200_000):
        if before is not None:
            before()
        t0 = clock()
        run()
        t1 = clock()
        best = min(best, t1 - t0)
        if t1 >= deadline:
            break
    return best
