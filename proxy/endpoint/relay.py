"""The answer's way to the client once the upstream answered, the same for a translated answer
(proxy/endpoint/translate.py) and a passed-through one (proxy/endpoint/passthrough.py), streamed or whole:

- the head is committed once, lazily: with the first events worth it (or the first keep-alive), so that a failure
  before them is still an HTTP error in the client's dialect; a whole answer commits nothing before its one object,
  so any failure before it is an HTTP error;
- a silence of the upstream gets the client dialect's keep-alive (or the transport's own);
- a failure after the head ends the stream with the client dialect's error event (never a clean end), counted as a
  truncation in the metrics and the access record;
- a complete stream ends with what its client dialect declares (`ClientDialect.stream_end`: Chat's `[DONE]`);
- the answer's usage goes to the metrics and the access record (`usage`).

The relay hands the sink events (proxy/hub/sse.py `Event`), never framed bytes: the sink frames them for its
transport (proxy/endpoint/sink.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.errors import ProxyError, StreamTruncated
from proxy.hub.sse import Event

if TYPE_CHECKING:
    from collections.abc import Callable

    from proxy.clients.base import Headers
    from proxy.endpoint.exchange import Exchange
    from proxy.hub.events import Answer


def _no_opening() -> list[Event]:
    return []


class Relay:
    """One answer's way to the client's sink. `head`: the answer's headers; `error_event`: the in-stream error for a
    failure after the head (None: there is none to send, the stream just closes); `opening`: the client dialect's
    first events, sent with the head (Responses' response.created ...); `end`: the payload of the event after a
    complete stream's own (the client dialect's `stream_end`); `stream`: False for a whole answer, the one object
    that the encoder's fold makes, sent at the end (`Sink.whole`)."""

    __slots__ = ("committed", "end_event", "error_event", "exchange", "head", "opening", "pending", "stream")

    def __init__(self, exchange: Exchange, head: Headers, error_event: Callable[[ProxyError], Event | None],
                 opening: Callable[[], list[Event]] = _no_opening, end: bytes | None = None,
                 stream: bool = True) -> None:
        self.exchange = exchange
        self.head = head
        self.error_event = error_event
        self.opening = opening
        self.end_event = None if end is None else Event(None, end)
        self.stream = stream
        self.committed = False  # the head is sent: from now on an error is an in-stream event
        self.pending: list[Event] = []  # encoded but not yet sent: still sent when a later event fails
        exchange.relay = self

    async def _commit(self) -> None:
        await self.exchange.sink.start(200, self.head)
        self.committed = True
        opening = self.opening()
        if opening:
            self.pending[:0] = opening

    def _take(self) -> list[Event]:
        pending = self.pending
        self.pending = []
        return pending

    async def flush(self, final: Event | None = None, more: bool = True) -> None:
        """Send what is pending (and `final`), committing the head first if it is not yet sent."""
        if not self.committed:
            await self._commit()
        if final is not None:
            self.pending.append(final)
        await self.exchange.sink.events(self._take(), more)

    async def native(self, data: bytes) -> None:
        """The upstream's own bytes of a passed-through stream, committing the head first if it is not yet sent."""
        if not self.committed:
            await self._commit()
        await self.exchange.sink.native(data, True)

    async def keepalive(self, event: Event | None) -> None:
        """A silence of the upstream: the client dialect's keep-alive `event` (None: the transport's own), after
        what is pending (the head goes first)."""
        if not self.committed:
            await self._commit()
        await self.exchange.sink.keepalive(self._take(), event)

    async def end(self, tail: list[Event]) -> int:
        """The answer is complete: its last events (a whole answer: its one object)."""
        exchange = self.exchange
        exchange.complete()
        if not self.stream:
            (whole,) = tail
            await exchange.sink.whole(whole.data, self.head)
            return 200
        self.pending.extend(tail)
        await self.flush(self.end_event, more=False)
        return 200

    async def fail(self, err: ProxyError) -> int:
        """A failure after the head: the stream ends with the client dialect's error event, counted as a
        truncation. The status the access log and the metrics record."""
        exchange = self.exchange
        err.request_id = exchange.record.request_id  # for the envelopes that carry it (Anthropic's)
        reason = err.reason if isinstance(err, StreamTruncated) else "upstream_error"
        exchange.truncated(reason, err.code)
        exchange.complete()
        await self.flush(self.error_event(err), more=False)
        return max(err.status, 500)

    def usage(self, answer: Answer) -> None:
        """The answer's usage and finish reason, for the metrics and the access record."""
        exchange = self.exchange
        if answer.usage is not None:
            if exchange.obs is not None:
                exchange.obs.usage(answer.usage)
            exchange.record.usage(answer.usage)
        exchange.record.finish_reason = answer.finish_reason
