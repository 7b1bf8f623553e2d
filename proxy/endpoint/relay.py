"""The answer's way to the client once the upstream answered, the same for a translated answer
(proxy/endpoint/translate.py) and a passed-through one (proxy/endpoint/passthrough.py):

- the head is committed once, lazily: with the first bytes worth it (or the first keep-alive), so that a failure
  before them is still an HTTP error in the client's dialect;
- a silence of the upstream gets the client dialect's keep-alive;
- a failure after the head ends the stream with the client dialect's error event (never a clean end), counted as a
  truncation in the metrics and the access record;
- the answer's usage goes to the metrics and the access record (`usage`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from proxy.errors import ProxyError, StreamTruncated

if TYPE_CHECKING:
    from proxy.clients.base import Headers
    from proxy.endpoint.exchange import Exchange
    from proxy.hub.events import Answer

_no_opening: Final[Callable[[], bytes]] = bytes


class Relay:
    """One answer's stream to the client's sink. `head`: the stream's headers; `opening`: the client dialect's first
    bytes, sent with the head (Responses' response.created ...); `error_event`: the in-stream error for a failure
    after the head; `native`: the bytes are the upstream's own (passthrough)."""

    __slots__ = ("committed", "error_event", "exchange", "head", "native", "opening", "pending")

    def __init__(self, exchange: Exchange, head: Headers, error_event: Callable[[ProxyError], bytes],
                 opening: Callable[[], bytes] = _no_opening, native: bool = False) -> None:
        self.exchange = exchange
        self.head = head
        self.error_event = error_event
        self.opening = opening
        self.native = native
        self.committed = False  # the head is sent: from now on an error is an in-stream event
        self.pending: list[bytes] = []  # encoded but not yet sent: still sent when a later event fails
        exchange.relay = self

    async def _commit(self) -> None:
        await self.exchange.sink.start(200, self.head)
        self.committed = True
        opening = self.opening()
        if opening:  # (none for Chat Completions: the one part of a read is sent as it is, not copied)
            self.pending.insert(0, opening)

    def _take(self) -> bytes:
        body = b"".join(self.pending)  # one part (a paced stream's chunk): that very object, no copy
        self.pending.clear()
        return body

    async def flush(self, final: bytes = b"", more: bool = True) -> None:
        """Send what is pending (and `final`), committing the head first if it is not yet sent."""
        if not self.committed:
            await self._commit()
        if final:
            self.pending.append(final)
        sink = self.exchange.sink
        body = self._take()
        await (sink.native(body, more) if self.native else sink.body(body, more))

    async def keepalive(self, data: bytes) -> None:
        """A silence of the upstream: the keep-alive `data`, after what is pending (the head goes first)."""
        if not self.committed:
            await self._commit()
        await self.exchange.sink.keepalive(self._take(), data)

    async def end(self, tail: bytes) -> int:
        """The answer is complete: its last bytes."""
        self.exchange.complete()
        await self.flush(tail, more=False)
        return 200

    async def fail(self, err: ProxyError, event: bytes | None = None) -> int:
        """A failure after the head: the stream ends with the error event (`event`, else the client dialect's),
        counted as a truncation. The status the access log and the metrics record."""
        exchange = self.exchange
        err.request_id = exchange.record.request_id  # for the envelopes that carry it (Anthropic's)
        reason = err.reason if isinstance(err, StreamTruncated) else "upstream_error"
        exchange.truncated(reason, err.code)
        exchange.complete()
        await self.flush(self.error_event(err) if event is None else event, more=False)
        return max(err.status, 500)

    def usage(self, answer: Answer) -> None:
        """The answer's usage and finish reason, for the metrics and the access record."""
        exchange = self.exchange
        if answer.usage is not None:
            if exchange.obs is not None:
                exchange.obs.usage(answer.usage)
            exchange.record.usage(answer.usage)
        exchange.record.finish_reason = answer.finish_reason
