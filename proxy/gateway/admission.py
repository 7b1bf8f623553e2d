"""Admission control for one replica: at most `max_in_flight` requests at once, then a bounded FIFO queue.

    admitted (in_flight < max_in_flight)  -> go
    else queue has room (< queue_size)    -> wait in line, at most queue_timeout
    else                                  -> QueueFull (the caller answers 429 rate_limited with Retry-After)

A freed slot is handed straight to the next waiter (the count does not drop and rise again), so no newcomer can
overtake the queue. A waiter that is cancelled (its client left) after being handed a slot passes the slot on.
`max_in_flight` 0 means unlimited: every acquire is admitted at once and only counted.

The next waiter is chosen by weighted fair queueing across API keys (start-time fair queueing): each waiter gets a
tag, its key's previous tag (or the tag last served, whichever is later) + 1 / the key's `weight`, and the smallest
tag goes first. So queued keys are served in proportion to their weights, a key that floods the queue delays only
itself, and another key's request waits behind at most about one request of each other key. Within one key the
order is first come, first served. The key and weight are the request's (`queue_as`, set by the exchange from its
key's policy, proxy/gateway/keys.py); a request without a key queues as one anonymous key of weight 1.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable
from contextvars import ContextVar

# The request's key name and weight for the fair queue (the task's context: each request runs in its own task).
_QUEUE_AS: ContextVar[tuple[str, float]] = ContextVar("dialect_proxy_queue_as", default=("", 1.0))
_FORGET_TAGS = 1024  # past this many keys remembered, those whose tag the queue has passed are forgotten


def queue_as(key: str, weight: float) -> None:
    """The current request queues as `key`, with its share `weight` (> 0)."""
    _QUEUE_AS.set((key, weight))


class QueueFull(Exception):
    """No slot and no room in the queue."""


class QueueTimeout(Exception):
    """Waited queue_timeout without getting a slot."""


class Admission:
    __slots__ = ("_ewma", "_last_tag", "_seq", "_virtual", "_waiters", "in_flight", "max_in_flight", "on_change",
                 "queue_size", "queue_timeout")

    def __init__(self, max_in_flight: int = 0, queue_size: int = 0, queue_timeout: float = 30.0) -> None:
        self.max_in_flight = max_in_flight
        self.queue_size = queue_size
        self.queue_timeout = queue_timeout
        self.in_flight = 0
        # (tag, arrival, future): a heap, the smallest tag next (docstring); cancelled waiters are taken out.
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._virtual = 0.0  # the tag last served
        self._last_tag: dict[str, float] = {}  # each key's latest tag
        self._seq = 0
        self._ewma = 0.0  # smoothed seconds a slot is held (for Retry-After)
        self.on_change: Callable[[], None] | None = None  # called when in_flight or the queue changed (gauges)

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def has_slot(self) -> bool:
        return not self.max_in_flight or (self.in_flight < self.max_in_flight and not self._waiters)

    def has_room(self) -> bool:
        return self.has_slot() or len(self._waiters) < self.queue_size

    def try_acquire(self) -> bool:
        if not self.max_in_flight or (self.in_flight < self.max_in_flight and not self._waiters):  # has_slot()
            self.in_flight += 1
            on_change = self.on_change
            if on_change is not None:
                on_change()
            return True
        return False

    async def acquire(self) -> float:
        """Take a slot, waiting in the queue if need be. Returns the seconds waited."""
        if self.try_acquire():
            return 0.0
        if len(self._waiters) >= self.queue_size:
            raise QueueFull
        started = time.monotonic()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueue(fut)
        self._changed()
        try:
            async with asyncio.timeout(self.queue_timeout):
                await asyncio.shield(fut)
        except TimeoutError:
            self._abandon(fut)
            raise QueueTimeout from None
        except asyncio.CancelledError:
            self._abandon(fut)
            raise
        return time.monotonic() - started

    def _enqueue(self, fut: asyncio.Future[None]) -> None:
        key, weight = _QUEUE_AS.get()
        last = self._last_tag
        if len(last) > _FORGET_TAGS:
            for name in [name for name, tag in last.items() if tag <= self._virtual]:
                del last[name]
        tag = max(self._virtual, last.get(key, 0.0)) + 1.0 / weight
        last[key] = tag
        self._seq += 1
        heapq.heappush(self._waiters, (tag, self._seq, fut))

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _abandon(self, fut: asyncio.Future[None]) -> None:
        if fut.done():  # the slot was handed to us just as we gave up: pass it on
            self.release()
        else:
            fut.cancel()
            waiters = self._waiters
            for i, entry in enumerate(waiters):
                if entry[2] is fut:
                    waiters[i] = waiters[-1]
                    waiters.pop()
                    heapq.heapify(waiters)
                    break
            self._changed()

    def release(self, held: float | None = None) -> None:
        """Give a slot back (to the first waiter, if any). `held`: seconds the slot was used (for Retry-After)."""
        if held is not None:
            self._ewma = held if not self._ewma else 0.8 * self._ewma + 0.2 * held
        waiters = self._waiters
        while waiters:
            tag, _, fut = heapq.heappop(waiters)
            if not fut.done():
                self._virtual = tag
                fut.set_result(None)
                self._changed()
                return
        if self.in_flight > 0:
            self.in_flight -= 1
        on_change = self.on_change
        if on_change is not None:
            on_change()

    def retry_after(self) -> int:
        """Whole seconds until a slot is likely free: the mean slot time times the queue ahead, per slot; 1..60."""
        slots = self.max_in_flight or 1
        estimate = (self._ewma or 1.0) * (len(self._waiters) + 1) / slots
        return max(1, min(60, math.ceil(estimate)))
