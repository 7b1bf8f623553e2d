"""The proxy process's garbage collector, set for a server: `tune_gc()` runs once the app has started
(proxy/server/app.py lifespan, in processes that serve: `serve`, each `--workers` worker, the demo).

A request allocates thousands of short-lived objects that reference counting frees at once, and leaves no reference
cycles of its own behind (tests/test_gc.py). Yet at CPython's default first-generation threshold (700 net
allocations) the collector ran every few requests, and each full collection walked every object alive since
start-up (modules, settings, metric children): a few percent of the proxy's CPU, and a pause of tens of milliseconds
at each full collection (measured under load with gc.callbacks: docs/speed.md). So, after start-up, its objects are
moved out of every collection's way (`gc.freeze`) and the first generation is collected every GEN0_THRESHOLD net
allocations: in the same runs, no collection at all.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, GEN0_THRESHOLD), gen1, gen2)
