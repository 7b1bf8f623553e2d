"""proxy/gateway/admission.py: the per-replica limiter and its FIFO queue, on a real event loop (no network)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.gateway.admission import Admission, QueueFull, QueueTimeout, queue_as


def test_fifo_handover_full_queue_and_timeout() -> None:
    async def main() -> None:
        adm = Admission(max_in_flight=1, queue_size=2, queue_timeout=5)
        assert await adm.acquire() == 0.0 and adm.in_flight == 1
        order: list[str] = []

        async def waiter(name: str) -> None:
            await adm.acquire()
            order.append(name)

        first = asyncio.create_task(waiter("first"))
        await asyncio.sleep(0)
        second = asyncio.create_task(waiter("second"))
        await asyncio.sleep(0)
        assert adm.queued == 2 and not adm.has_room()
        with pytest.raises(QueueFull):
            await adm.acquire()
        adm.release(0.5)  # handed to "first"; the count stays at 1
        await first
        assert order == ["first"] and adm.in_flight == 1 and adm.queued == 1
        adm.release(0.5)
        await second
        assert order == ["first", "second"]
        adm.release()
        assert adm.in_flight == 0 and adm.has_slot()

        short = Admission(max_in_flight=1, queue_size=1, queue_timeout=0.05)
        await short.acquire()
        with pytest.raises(QueueTimeout):
            await short.acquire()
        assert short.queued == 0 and short.in_flight == 1

    asyncio.run(main())


def test_cancelled_waiter_passes_its_slot_on() -> None:
    async def main() -> None:
        adm = Admission(max_in_flight=1, queue_size=2, queue_timeout=5)
        await adm.acquire()
        gone = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0)
        kept = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0)
        adm.release()  # handed to `gone` ...
        gone.cancel()  # ... whose client leaves before it runs: the slot goes to `kept`
        with pytest.raises(asyncio.CancelledError):
            await gone
        await kept
        assert adm.in_flight == 1 and adm.queued == 0
        adm.release()
        assert adm.in_flight == 0

    asyncio.run(main())


def test_unlimited_and_retry_after() -> None:
    adm = Admission()
    assert all(adm.try_acquire() for _ in range(1000)) and adm.in_flight == 1000
    limited = Admission(max_in_flight=2, queue_size=4)
    assert limited.retry_after() == 1  # nothing measured yet: 1 s
    limited.try_acquire()
    limited.release(10.0)
    assert limited.retry_after() == 5  # 10 s per slot, 2 slots, nobody queued


def test_queued_keys_are_served_in_proportion_to_their_weights() -> None:
    """One slot, 20 waiters of a key of weight 2 queued before 20 of a key of weight 1 and one anonymous request:
    the first 15 slots go 10 to the first, 4 to the second and one to the anonymous request that came last (its key had
waited for nothing), in arrival order within each key."""

    async def main() -> list[str]:
        adm = Admission(max_in_flight=1, queue_size=100, queue_timeout=30)
        assert adm.try_acquire()
        served: list[str] = []

        async def waiter(key: str, weight: float, n: int) -> None:
            if key:
                queue_as(key, weight)
            await adm.acquire()
            served.append(f"{key or 'none'}{n}")

        tasks = [asyncio.create_task(waiter("a", 2, i)) for i in range(20)]
        tasks += [asyncio.create_task(waiter("b", 1, i)) for i in range(20)]
        tasks.append(asyncio.create_task(waiter("", 1, 0)))
        await asyncio.sleep(0.01)
        assert adm.queued == 41
        for _ in range(41):
            adm.release()
            await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return served

    served = asyncio.run(main())
    first = served[:15]
    assert first == ["a0", "a1", "b0", "none0", "a2", "a3", "b1", "a4", "a5", "b2", "a6", "a7", "b3", "a8", "a9"]
    assert [s for s in served if s.startswith("a")] == [f"a{i}" for i in range(20)]
    assert [s for s in served if s.startswith("b")] == [f"b{i}" for i in range(20)]
