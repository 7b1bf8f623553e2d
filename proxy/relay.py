"""One request's stream pipeline, without I/O: upstream event-stream bytes in, client chunks out.

    bytes ─▶ SSEDecoder ─▶ JSON ─▶ dialect.decode_chunk ─▶ ResponseTranslator ─▶ client chunks

The handler feeds it what it reads and sends what comes out; tests drive the very same object in-process (cutting
the upstream bytes anywhere). Failures raise `StreamTruncated` (or the dialect's error); chunks translated before
the failure are already in `out`, so the caller can still deliver them ahead of the error event.
"""

from __future__ import annotations

from typing import Any

import orjson

from .canonical import ChatChunk, RequestContext
from .errors import StreamTruncated
from .sse import SSEDecoder, SSEEvent
from .translate import ResponseTranslator


class StreamRelay:
    __slots__ = ("_ctx", "_decode_chunk", "_decoder", "_feed", "done", "translator")

    def __init__(self, ctx: RequestContext, dialect: Any, translator: ResponseTranslator) -> None:
        self._ctx = ctx
        self._decoder = SSEDecoder()
        self._decode_chunk = dialect.decode_chunk
        self.translator = translator
        self._feed = translator.feed
        self.done = False  # [DONE] was seen

    def feed(self, data: bytes, out: list[ChatChunk]) -> None:
        """Append the client chunks that `data` completes to `out`."""
        self._take(self._decoder.feed(data), out)

    def finish(self, out: list[ChatChunk]) -> None:
        """The upstream body ended (or sent [DONE]): append the last chunks (usage...) to `out`, or raise if the
        answer is incomplete."""
        if not self.done:
            self._take(self._decoder.flush(), out)
        out.extend(self.translator.finish(self.done))

    def _take(self, events: list[SSEEvent], out: list[ChatChunk]) -> None:
        for event in events:
            if self.done:
                return
            if event.garbage is not None:
                raise StreamTruncated(
                    "The upstream sent data that is not an event stream: " + preview(event.garbage),
                    reason="invalid_data",
                )
            if event.data == "[DONE]":
                self.done = True
                return
            try:
                parsed = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                raise StreamTruncated(
                    "The upstream sent an event that is not valid JSON: " + preview(event.data),
                    reason="invalid_data",
                ) from None
            if event.event == "error" and isinstance(parsed, dict) and "error" not in parsed:
                parsed = {"error": parsed}
            chunk = self._decode_chunk(parsed, self._ctx)
            if chunk is not None:
                out.extend(self._feed(chunk))


def preview(data: bytes | str, limit: int = 200) -> str:
    """A short, quoted sample of what the upstream sent, for error messages."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = text.strip()
    return repr(text[:limit] + ("…" if len(text) > limit else ""))
