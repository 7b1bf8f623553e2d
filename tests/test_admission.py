"""proxy/gateway/admission.py: the per-replica limiter and its FIFO queue, on a real event loop (no network)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.gateway.admission import Admission, QueueFull, QueueTimeout


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
