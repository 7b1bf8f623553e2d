"""Deadlines on the per-request path: many alarms, one loop timer.

Every request arms a few deadlines (the upstream's response headers, its body, the drain of a kept-alive
connection) and nearly always cancels them long before they are due. A loop timer per deadline is dear under uvloop
(a libuv timer, a context copy and a set entry per `call_at`: docs/speed.md); so an `Alarm` goes into a slot of
`RESOLUTION` seconds instead (a dict entry), and one loop timer per event loop rings for the earliest slot. A slot
emptied by cancellations stays (the next requests' alarms likely fall into it) until the ring passes it and arms the
timer for the first slot still holding an alarm: under load that is about one ring per deadline's length, not one
timer per request.

An alarm rings after its time, never before, and at most about `RESOLUTION` + 1 ms late (uvloop rounds timers to
milliseconds).
"""

from __future__ import annotations

import asyncio
import heapq
import weakref
from typing import Final

__all__ = ["RESOLUTION", "Alarm"]

RESOLUTION: Final = 0.01  # seconds: the width of a slot
_PER_SECOND: Final = 1 / RESOLUTION
_SLACK: Final = 0.001  # the timer rings this long after a slot's end, so that uvloop's rounding never rings it early
# Called per request, as statics (compiled: no module attribute looked up per call)
_current_task: Final = asyncio.current_task
_heappop: Final = heapq.heappop
_heappush: Final = heapq.heappush


class Alarm:
    """A leaner `asyncio.timeout` for the per-request path: at `when` it cancels the current task. In `except
    asyncio.CancelledError`, `expired()` says whether the cancellation was the alarm's alone (it is then undone, for
    the caller to raise its timeout error); a cancellation from anyone else (client gone, shutdown) must be
    re-raised. `cancel()` when done with it; `move(when)` sets another time."""

    __slots__ = ("_deadlines", "_slot", "_task", "fired")

    def __init__(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self._deadlines = _of(loop)
        self._task = _current_task(loop)  # given the loop, no get_running_loop (a getpid system call)
        self.fired = False
        self._slot = self._deadlines.add(self, when)

    def _ring(self) -> None:
        self._slot = 0
        self.fired = True
        if self._task is not None:
            self._task.cancel()

    def move(self, when: float) -> None:
        slot = int(when * _PER_SECOND) + 1
        if slot != self._slot:  # a move within the slot (the next read of a fast body) costs nothing
            self.cancel()
            self._slot = self._deadlines.add(self, when)

    def expired(self) -> bool:
        return self.fired and self._task is not None and self._task.uncancel() == 0

    def cancel(self) -> None:
        if self._slot:
            self._deadlines.remove(self, self._slot)
            self._slot = 0


class _Deadlines:
    """The slots of one event loop: slot number -> its alarms (in the order they were set), a heap of the slot
    numbers and the one loop timer, armed for slot `_armed`."""

    __slots__ = ("__weakref__", "_armed", "_loop", "_numbers", "_slots", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # the loop holds the timer, which holds this: no cycle through the loop
        self._slots: dict[int, dict[Alarm, None]] = {}
        self._numbers: list[int] = []
        self._timer: asyncio.TimerHandle | None = None
        self._armed = 0

    def add(self, alarm: Alarm, when: float) -> int:
        """Put `alarm` in the slot that ends at or after `when`; its number (never 0)."""
        number = int(when * _PER_SECOND) + 1
        slot = self._slots.get(number)
        if slot is None:
            slot = self._slots[number] = {}
            _heappush(self._numbers, number)
            if self._timer is None or number < self._armed:
                self._arm(number)
        slot[alarm] = None
        return number

    def remove(self, alarm: Alarm, number: int) -> None:
        slot = self._slots.get(number)
        if slot is not None:  # an emptied slot stays until the ring passes it (the next alarms likely go there)
            slot.pop(alarm, None)

    def _arm(self, number: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = number
        loop = self._loop()
        if loop is not None:
            self._timer = loop.call_at(number * RESOLUTION + _SLACK, self._ring)

    def _ring(self) -> None:
        self._timer = None
        loop = self._loop()
        if loop is None:
            return
        due = int(loop.time() * _PER_SECOND)  # slots ending at or before now
        numbers = self._numbers
        slots = self._slots
        while numbers and numbers[0] <= due:
            slot = slots.pop(_heappop(numbers), None)
            if slot:
                for alarm in list(slot):
                    alarm._ring()
        while numbers and not slots[numbers[0]]:  # emptied by cancellations
            del slots[_heappop(numbers)]
        if numbers:
            self._arm(numbers[0])


# The slots of each running loop (tests run many loops one after another); the last one looked up, at hand.
_BY_LOOP: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deadlines]] = weakref.WeakKeyDictionary()
_last: _Deadlines | None = None


def _of(loop: asyncio.AbstractEventLoop) -> _Deadlines:
    global _last
    last = _last
    if last is not None and last._loop() is loop:
        return last
    found = _BY_LOOP.get(loop)
    if found is None:
        found = _BY_LOOP[loop] = _Deadlines(loop)
    _last = found
    return found
