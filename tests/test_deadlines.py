"""proxy/gateway/deadlines.py: alarms ring after their time and never before, cancelled ones never, on asyncio's loop
and on uvloop, with one loop timer for all of them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from proxy.gateway.deadlines import RESOLUTION, Alarm

LATE = RESOLUTION + 0.001 + 0.25  # the slot, uvloop's rounding, and a loaded test machine's scheduling

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def run(make_loop: Callable[[], asyncio.AbstractEventLoop], coro: Coroutine[Any, Any, Any]) -> Any:
    loop = make_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def sleep_under(delay: float, sleep: float, cancel: bool = False) -> tuple[bool, float]:
    """Sleep `sleep` s under an alarm of `delay` s (cancelled at once with `cancel`): (whether the alarm cut the
    sleep, when it did)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    alarm = Alarm(loop, start + delay)
    try:
        if cancel:
            alarm.cancel()
        await asyncio.sleep(sleep)
    except asyncio.CancelledError:
        assert alarm.expired()
        return True, loop.time() - start
    finally:
        alarm.cancel()
    return False, loop.time() - start


@pytest.mark.parametrize("loop", LOOPS)
def test_an_alarm_rings_after_its_time_and_not_much_later(loop: str) -> None:
    rang, after = run(LOOPS[loop], sleep_under(0.05, 2.0))
    assert rang and 0.05 <= after < 0.05 + LATE


@pytest.mark.parametrize("loop", LOOPS)
def test_a_cancelled_alarm_never_rings(loop: str) -> None:
    async def main() -> bool:
        loop = asyncio.get_running_loop()
        Alarm(loop, loop.time() + 0.02).cancel()
        await asyncio.sleep(0.1)  # a ring would cancel this sleep
        return True

    assert run(LOOPS[loop], main())


@pytest.mark.parametrize("loop", LOOPS)
def test_many_alarms_each_rings_after_its_own_time_unless_cancelled(loop: str) -> None:
    rng = random.Random(7)
    plan = [(rng.uniform(0.0, 0.3), rng.random() < 0.5) for _ in range(120)]  # (delay, cancelled before its time)

    async def main() -> list[tuple[bool, float]]:
        return list(await asyncio.gather(*(sleep_under(delay, 0.6, cancel) for delay, cancel in plan)))

    for (delay, cancelled), (rang, after) in zip(plan, run(LOOPS[loop], main()), strict=True):
        assert rang is not cancelled
        if rang:
            assert delay <= after < delay + LATE


@pytest.mark.parametrize("loop", LOOPS)
def test_a_moved_alarm_rings_at_its_new_time_earlier_or_later(loop: str) -> None:
    async def moved(first: float, then: float) -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        keep = Alarm(loop, start + 5.0)  # another request's alarm, due later: the timer is armed for it first
        alarm = Alarm(loop, start + first)
        alarm.move(start + then)
        try:
            await asyncio.sleep(2.0)
        except asyncio.CancelledError:
            assert alarm.expired()
            return loop.time() - start
        finally:
            alarm.cancel()
            keep.cancel()
        raise AssertionError("the alarm did not ring")

    assert 0.2 <= run(LOOPS[loop], moved(0.05, 0.2)) < 0.2 + LATE
    assert 0.03 <= run(LOOPS[loop], moved(1.0, 0.03)) < 0.03 + LATE


@pytest.mark.parametrize("loop", LOOPS)
def test_an_alarm_already_due_rings_at_once(loop: str) -> None:
    async def main() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        alarm = Alarm(loop, start - 1.0)
        try:
            await asyncio.sleep(1.0)
        except asyncio.CancelledError:
            assert alarm.expired()
            return True, loop.time() - start
        return False, 0.0

    rang, after = run(LOOPS[loop], main())
    assert rang and after < LATE


def test_a_cancellation_from_elsewhere_is_not_the_alarms() -> None:
    async def main() -> str:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        alarm = Alarm(loop, loop.time() + 5.0)
        loop.call_later(0.02, task.cancel)  # the client left
        try:
            await asyncio.sleep(1.0)
        except asyncio.CancelledError:
            return "alarm" if alarm.expired() else "someone else"
        finally:
            alarm.cancel()
        return "nothing"

    assert run(asyncio.new_event_loop, main()) == "someone else"


def test_one_loop_timer_serves_every_alarm() -> None:
    """The point of the module: a thousand requests' alarms, set and cancelled, leave at most one timer on the
    loop (asyncio's loop shows its timers in `_scheduled`)."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        before = len(loop._scheduled)  # type: ignore[attr-defined]
        rng = random.Random(3)
        alive = []
        for i in range(1000):
            alarm = Alarm(loop, loop.time() + rng.choice((1.0, 30.0, 60.0)))
            if i % 100 == 0:
                alive.append(alarm)  # a few stay set, as in-flight requests' do
            else:
                alarm.cancel()
        live_timers = sum(1 for h in loop._scheduled if not h.cancelled())  # type: ignore[attr-defined]
        for alarm in alive:
            alarm.cancel()
        assert before == 0
        return live_timers

    assert run(asyncio.new_event_loop, main()) == 1


def test_alarms_work_on_one_loop_after_another() -> None:
    for make in (asyncio.new_event_loop, uvloop.new_event_loop, asyncio.new_event_loop):
        rang, after = run(make, sleep_under(0.02, 1.0))
        assert rang and 0.02 <= after < 0.02 + LATE
