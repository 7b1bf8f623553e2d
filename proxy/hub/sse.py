"""Server-sent events: the one place that knows SSE framing.

`SSEDecoder` is incremental in the style of httpx's LineDecoder: `feed(bytes)` returns the events completed by
those bytes, `flush()` returns what is left when the stream ends. One upstream read may end with half a line, half
a UTF-8 character or half a CRLF; the decoder holds such tails until the next read. A UTF-8 BOM at the very start
of the stream is dropped, as the SSE spec says.

Lines that are not SSE (no known field name, e.g. MindIE's raw `Engine callback timeout: server tokenTimeout`) are
not silently ignored as the SSE spec would: they are reported in `SSEEvent.garbage` events so that the relay can
turn them into an error instead of a truncated "success".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, cast

from proxy.build import mypyc_attr

__all__ = ["DONE", "KEEPALIVE", "Event", "SSEDecoder", "SSEEvent", "encode_comment", "encode_data", "encode_event",
           "encode_events"]

DONE: Final = b"data: [DONE]\n\n"
KEEPALIVE: Final = b": keep-alive\n\n"
_BOM: Final = b"\xef\xbb\xbf"
# A line end's byte as an int: `_LF in data` is one memchr. `data.find(b"\n")` compiled is a method looked up by
# name, its arguments packed and parsed; `b"\n" in data` first tries the needle as an integer and makes and drops a
# TypeError; an int needle is what `bytes.__contains__` searches for at once.
_LF: Final = 0x0A
_CR: Final = 0x0D
_HEAD: Final = 1024  # bytes of a read looked at first for a second event (payloads: one search in a copy this long)


@dataclass(slots=True)
class SSEEvent:
    """One dispatched event. `data` joins multi-line data with "\\n" as the SSE spec says.

    `garbage` is set (and `data` empty) for a line that is not SSE at all.
    """

    data: str = ""
    event: str | None = None
    id: str | None = None
    garbage: str | None = None

    def __init__(self, data: str = "", event: str | None = None, id: str | None = None,
                 garbage: str | None = None) -> None:
        # Written out, as proxy/hub/events.py's Delta: a dataclass's generated `__init__` runs interpreted even
        # compiled.
        self.data = data
        self.event = event
        self.id = id
        self.garbage = garbage


class SSEDecoder:
    __slots__ = ("_data", "_event", "_head", "_id", "_parts", "_pending_cr")

    def __init__(self) -> None:
        # The unterminated tail of the current line, in pieces: joined only once the line ends, so a long line
        # arriving in many reads costs linear, not quadratic, time.
        self._parts: list[bytes] = []
        self._head: bytes | None = b""  # the first bytes of the stream while a UTF-8 BOM is possible; then None
        self._data: list[bytes] = []
        self._event: str | None = None
        self._id: str | None = None
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        self._feed(chunk, out, False)
        return out

    def payloads(self, chunk: bytes) -> list[bytes | SSEEvent]:
        """`feed` for the answer pipeline: a plain event (a `data: ` line and a blank line, no `event:`) comes as the
        undecoded bytes of its data, without an SSEEvent; its `id` is not reported. Any other event as in `feed`.
        A list, not a Sequence: compiled, an item of a list is read in C, one of a Sequence through `__getitem__`
        with a boxed index (proxy/stream/text_lane.py reads each event of a read this way)."""
        if self._head == b"" and chunk and chunk[0] != _BOM[0]:  # the stream's first bytes start no BOM: none to strip
            self._head = None
        if (
            self._head is None and not self._parts and not self._data and self._event is None
            and not self._pending_cr and chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
            and _CR not in chunk
        ):
            # The usual read, nothing held: one whole plain event (a paced stream) or several (a fast one), what
            # the loop below would find. Its first bytes tell which, unless the first event is long.
            end = len(chunk) - 2
            head = chunk[6:end if end <= _HEAD else _HEAD]
            if _LF not in head:
                if end <= _HEAD:
                    return [head]  # one short event: the whole payload
                payload = chunk[6:-2]
                if _LF not in payload:
                    return [payload]
            # Several events: the read itself is split, not a copy of all of it (a fast stream's read holds tens of
            # events; a full-text one's, tens of kB each); its first and last pieces lose their framing.
            events = chunk.split(b"\n\ndata: ")
            events[0] = events[0][6:]
            events[-1] = events[-1][:-2]
            # The read is only such events if none of them holds a line end of its own. One search per event
            # (memchr), not `chunk.count`: CPython counts a byte one byte at a time, several times the search's cost
            # on short events, more on long full-text ones.
            for event in events:
                if _LF in event:
                    break
            else:
                return cast("list[bytes | SSEEvent]", events)  # (only bytes: the list is not added to)
        out: list[bytes | SSEEvent] = []
        self._feed(chunk, out, True)
        return out

    def _feed(self, chunk: bytes, out: list[Any], raw: bool) -> None:
        if not chunk:
            return
        if self._head is not None:
            # The SSE spec strips one UTF-8 BOM at the start of the stream; it may arrive split across reads.
            head = self._head + chunk
            if len(head) < 3 and _BOM.startswith(head):
                self._head = head
                return
            self._head = None
            chunk = head[3:] if head.startswith(_BOM) else head
            if not chunk:
                return
        if self._pending_cr:
            # The previous read ended with "\r": a "\n" starting this read belongs to that CRLF.
            self._pending_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                if not chunk:
                    return
        parts = self._parts
        has_cr = _CR in chunk
        if not has_cr and _LF not in chunk:
            parts.append(chunk)
            return
        if parts:
            parts.append(chunk)
            buf = b"".join(parts)
            parts.clear()
        else:
            buf = chunk
        if has_cr:  # the held tail never holds a "\r": only this read can
            if buf.endswith(b"\r"):
                self._pending_cr = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        last = buf.rfind(b"\n")
        if last < len(buf) - 1:
            parts.append(buf[last + 1:])  # an unterminated line: held until its end arrives
        # Lines are found with single-byte searches (memchr): on long events (cumulative full-text chunks of tens of
        # kB) a two-byte separator search or bytes.split costs far more than the rest of the decoding. The common
        # shape, `data: {...}` followed by a blank line, becomes an event at once; anything else goes through
        # `_line`, in order.
        find = buf.find
        pos = 0
        while pos <= last:
            nl = find(b"\n", pos)
            if (nl < last and buf[nl + 1] == 0x0A and not self._data and self._event is None
                    and buf.startswith(b"data: ", pos)):
                data = buf[pos + 6:nl]
                out.append(data if raw else SSEEvent(data.decode("utf-8", "replace"), None, self._id))
                pos = nl + 2
            else:
                self._line(buf[pos:nl], out)
                pos = nl + 1

    def flush(self) -> list[SSEEvent]:
        """End of stream. A trailing unterminated line is processed; an event never closed by a blank line is
        still dispatched (servers that close right after the last `data:` line are common)."""
        out: list[SSEEvent] = []
        if self._head:  # the stream was only a partial BOM
            self._parts.append(self._head)
        self._head = None
        if self._parts:
            tail = b"".join(self._parts)
            self._parts.clear()
            self._line(tail, out)
        self._line(b"", out)
        self._pending_cr = False
        return out

    def _line(self, line: bytes, out: list[Any]) -> None:
        if not line:
            if self._data or self._event is not None:
                out.append(SSEEvent(
                    data=b"\n".join(self._data).decode("utf-8", "replace"), event=self._event, id=self._id,
                ))
            self._data = []
            self._event = None
            return
        if line[0] == 0x3A:  # ":" comment, e.g. ": keep-alive"
            return
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            self._id = value.decode("utf-8", "replace")
        elif name == b"retry":
            pass
        else:
            out.append(SSEEvent(garbage=line.decode("utf-8", "replace")))


@mypyc_attr(acyclic=True)  # compiled, made and freed per chunk without the cyclic collector: it holds only bytes
class Event:
    """One event of a client's stream as its encoder emits it, before any transport frames it: its SSE event name
    (`message_start` ...; None for a plain `data:` event, as every Chat Completions chunk) and its payload (JSON,
    already serialised: orjson never writes a raw newline). An HTTP stream frames it as SSE (`encode_events`), a
    WebSocket sends its payload as one message (proxy/server/responses_socket.py)."""

    __slots__ = ("data", "name")

    def __init__(self, name: bytes | None, data: bytes) -> None:
        self.name = name
        self.data = data

    def __repr__(self) -> str:
        return f"Event({self.name!r}, {self.data!r})"


def encode_events(events: list[Event]) -> bytes:
    """Events as one run of SSE bytes: `event: <name>` when named, `data: <payload>`, a blank line."""
    # Two pieces per event for the one join, the framing before its payload and the payload: each piece costs an
    # append and its share of the join (compiled, about 100 instructions; a zero-delay stream's read holds tens of
    # events). So the blank line that ends an event goes with the framing of the next, and a named event's framing
    # is made once for a run of events of that name (a Messages stream's are nearly all content_block_delta).
    parts: list[bytes] = []
    name: bytes | None = None
    framing = b""
    for event in events:
        if event.name is None:
            parts.append(b"\n\ndata: ")
        else:
            if event.name is not name:
                name = event.name
                framing = b"\n\nevent: " + name + b"\ndata: "
            parts.append(framing)
        parts.append(event.data)
    if not parts:
        return b""
    parts[0] = parts[0][2:]  # no event before the first to end
    parts.append(b"\n\n")
    return b"".join(parts)


def encode_data(payload: bytes) -> bytes:
    """Frame one JSON payload (already serialised, no newlines) as an SSE data event."""
    return b"data: " + payload + b"\n\n"


def encode_event(event: bytes, payload: bytes) -> bytes:
    """Frame one named event (`event: message_start` ...) with its JSON payload (already serialised, no newlines)."""
    return b"event: " + event + b"\ndata: " + payload + b"\n\n"


def encode_comment(text: str) -> bytes:
    return b": " + text.encode() + b"\n\n"
