"""The base of the readers that read an answer given in a client's own dialect, for native passthrough
(proxy/endpoint/passthrough.py). Not compiled (setup.py): each client spoke's reader subclasses it, and an interpreted
class cannot subclass a compiled one."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.hub.events import Answer
from proxy.hub.sse import SSEDecoder, SSEEvent


class NativeReader:
    """Reads an answer given in the client's own dialect (native passthrough) on the side, never changing a byte:
    usage (OpenAI-shaped, in `answer`, for metrics), the finish reason, which stream events carry a generated token
    (TTFT, inter-token latency), whether the stream reached its end and any error the upstream reported in it. A
    client spoke subclasses it with its event and body readers."""

    __slots__ = ("answer", "done", "error", "_sse")

    def __init__(self) -> None:
        self.answer = Answer()
        self.done = False  # the stream's terminal event arrived
        self.error: str | None = None  # the code of an error the upstream reported in the stream
        self._sse = SSEDecoder()

    def feed(self, data: bytes) -> int:
        """Stream bytes as they arrive (events may be cut anywhere): how many of the events they complete carry a
        generated token."""
        return self._events(self._sse.feed(data))

    def flush(self) -> int:
        return self._events(self._sse.flush())

    def _events(self, events: list[SSEEvent]) -> int:
        tokens = 0
        for sse in events:
            payload = _json(sse.data) if sse.data else None
            if isinstance(payload, dict) and self.event(payload):
                tokens += 1
        return tokens

    def body(self, raw: bytes) -> None:
        """A whole (non-stream) answer."""
        payload = _json(raw)
        if isinstance(payload, dict):
            self.read_body(payload)

    def event(self, payload: dict[str, Any]) -> bool:
        """One stream event's JSON: True when it carries a generated token."""
        raise NotImplementedError

    def read_body(self, payload: dict[str, Any]) -> None:
        raise NotImplementedError


def _json(data: str | bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
