"""One request's answer pipeline, without I/O: upstream bytes (or a JSON body) in, hub events out.

    bytes ─▶ SSEDecoder ─▶ JSON ─▶ UpstreamSession.chunk ─▶ Normalizer ─▶ [Delta]      (`feed`: streams)
                      └──▶ TextLane (events that repeat a plain text event's template) ─▶ [Delta]
                                    (several in one read: one Delta each)
    JSON body ──────────▶ JSON ─▶ UpstreamSession.chunk ─▶ Normalizer ─▶ [Delta]      (`feed_body`: non-stream,
                                  (whole=True: one final chunk)                        one final chunk)

Either way `finish` ends the answer. The endpoint feeds it what it reads and gives the events to the client encoder;
tests drive the very same object in-process (cutting the upstream bytes anywhere). Failures raise `StreamTruncated`
(or the dialect's error); events produced before the failure are already in `out`, so the caller can still deliver
them ahead of the error. Except while the session is settling a stream's form (MindIE: cumulative text or deltas,
proxy/dialects/base.py `UpstreamSession.settling`) and says a text must wait (`holds()`): the events are held back
until it knows, then handed on, or dropped for the error, so that no text that is wrong under the form it turns out
to have reaches the client.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.errors import MalformedUpstream, StreamTruncated, UpstreamError
from proxy.hub.events import Answer, Delta
from proxy.hub.normalize import Normalizer
from proxy.hub.sse import SSEDecoder, SSEEvent
from proxy.stream.text_lane import TextLane

if TYPE_CHECKING:
    from proxy.dialects.base import UpstreamSession


log: Final = logging.getLogger("dialect_proxy")
_json_loads: Final = orjson.loads  # (compiled: a static, not a module attribute looked up per event)


class Pipeline:
    __slots__ = ("_chunk", "_decoder", "_envelope", "_feed", "_held", "_lane", "answer", "done", "normalizer",
                 "session")

    def __init__(self, session: UpstreamSession, answer: Answer, text_lane: bool = True) -> None:
        self.session = session
        self.answer = answer
        self.normalizer = Normalizer(session.ctx.kind, session.reasoning_source, session.starts_in_reasoning, answer)
        self._decoder = SSEDecoder()
        self._chunk = session.chunk
        self._feed = self.normalizer.feed
        self.done = False  # the answer is complete: [DONE] was seen, or a whole body was fed
        # The shortcut for plain text events (proxy/stream/text_lane.py): chat streams whose session lets a plain
        # event skip `chunk` (not the engine's). `text_lane=False` is the full path for every event
        # (tests/stream/test_text_lane.py compares the two).
        self._lane = TextLane() if text_lane and self.normalizer.chat and session.lane_open() else None
        # The normaliser's envelope_version when the lane last learned: an event answered by the lane leaves the
        # answer's envelope fields (system_fingerprint ...) as they were, so its templates hold only while those
        # have not changed since.
        self._envelope = 0
        # Events held back while the session settles the stream's form (None: none to hold, the usual case).
        self._held: list[Delta] | None = [] if session.settling else None

    def feed(self, data: bytes, out: list[Delta]) -> None:
        """Append the events that `data` completes to `out` (or hold them back while the session settles)."""
        held = self._held
        try:
            self._take(self._decoder.payloads(data), out if held is None else held)
        except MalformedUpstream as e:
            raise _bad_shape(e) from None
        if held is not None and not self.session.holds():
            out.extend(held)
            held.clear()
            if not self.session.settling:
                self._held = None

    def finish(self, out: list[Delta]) -> None:
        """The upstream body ended (or sent [DONE]): append the last events, or raise if the answer is incomplete."""
        held = self._held
        try:
            if not self.done:
                self._take(list(self._decoder.flush()), out if held is None else held)
            self.session.end()
            self.normalizer.finish(self.done)
        except MalformedUpstream as e:
            raise _bad_shape(e) from None
        if held:  # the answer is complete and nothing found its text unsound
            out.extend(held)
            self._held = None

    def feed_body(self, raw: bytes, out: list[Delta]) -> None:
        """A whole non-stream JSON body: append its events (the session's one entry and the same normaliser, one
        final chunk). `finish` follows, as after a stream."""
        try:
            data = _json_loads(raw)
        except orjson.JSONDecodeError:
            try:  # invalid UTF-8 inside the JSON: U+FFFD, as the stream decoder does (docs/behaviour.md "Streams")
                data = _json_loads(raw.decode("utf-8", "replace"))
            except orjson.JSONDecodeError:
                raise UpstreamError(
                    "The upstream answered with a body that is not JSON: " + preview(raw), 502
                ) from None
        self.done = True  # nothing follows a whole answer
        chunk = self._chunk(data, True)  # (a MalformedUpstream here is already the 502 it should be)
        if chunk is not None:
            out.extend(self._feed(chunk, True))

    def _take(self, events: list[bytes | SSEEvent], out: list[Delta]) -> None:
        lane = self._lane
        count = len(events)
        i = 0
        while i < count and not self.done:
            event = events[i]
            taken = self._by_lane(lane, events, i, out) if lane is not None and type(event) is bytes else 0
            if taken:
                i += taken
                continue
            i += 1
            parsed = _parse(event)
            if parsed is _DONE:
                self.done = True
                return
            chunk = self._chunk(parsed)
            if chunk is not None:
                deltas = self._feed(chunk)
                out.extend(deltas)
                if lane is not None and type(event) is bytes and len(deltas) == 1:
                    self._learn(lane, event, chunk, deltas[0])

    def _by_lane(self, lane: TextLane, events: list[bytes | SSEEvent], at: int, out: list[Delta]) -> int:
        """How many events from `at` on the text lane answered (0: none, the full path takes `events[at]`): that one
        and the lane events right after it in the same read. A lane event changes neither the session's nor the
        normaliser's state, so what is asked of the first holds for the run."""
        normalizer = self.normalizer
        if normalizer.envelope_version != self._envelope:
            lane.forget()
            self._envelope = normalizer.envelope_version
        run = lane.run(events, at)
        if run is None or not self.session.lane_open() or not normalizer.passes_text(run[0]):
            return 0
        index, reasoning, texts = run
        session = self.session
        rewrites = session.rewrites_text
        for text in texts:
            if rewrites:  # in order: a cumulative snapshot each
                text = session.lane_text(index, text, reasoning)
                if not text:  # a snapshot adding nothing: no event, as the full path
                    continue
            out.append(Delta(index, text, "") if reasoning else Delta(index, "", text))
        return len(texts)

    def _learn(self, lane: TextLane, data: bytes, chunk: dict[str, Any], d: Delta) -> None:
        """Teach the lane this event's template if the full path passed its one choice's text through unchanged."""
        if (d.first or d.tool_calls is not None or d.finish_reason is not None or d.logprobs is not None
                or d.extra is not None or d.choice_extra is not None or bool(d.content) == bool(d.reasoning)
                or chunk.get("usage") or not self.session.lane_open() or not self.normalizer.passes_text(d.index)):
            return
        choices = chunk.get("choices")
        if not isinstance(choices, list) or len(choices) != 1:
            return
        delta = choices[0].get("delta")
        if not isinstance(delta, dict):
            return
        if self.normalizer.envelope_version != self._envelope:  # this event changed the envelope: older templates go
            lane.forget()
            self._envelope = self.normalizer.envelope_version
        if d.content:
            if delta.get("content") == d.content:
                # A session that rewrites text: the event's own token is not what came out (the probe alone places it).
                lane.learn(data, "content", None if self.session.rewrites_text else d.content, d.index, False)
            return
        for field in ("reasoning_content", "reasoning"):
            if delta.get(field) == d.reasoning:
                lane.learn(data, field, d.reasoning, d.index, True)
                return


_DONE: Final = object()  # what `_parse` gives for the stream's `[DONE]`


def _parse(event: bytes | SSEEvent) -> Any:
    """One event's JSON value (`_DONE` for `[DONE]`): a plain `data:` event as its undecoded bytes (proxy/hub/sse.py
    SSEDecoder.payloads), any other as an `SSEEvent`."""
    if type(event) is bytes:
        if event == b"[DONE]":
            return _DONE
        try:
            return _json_loads(event)  # orjson checks the UTF-8
        except orjson.JSONDecodeError:
            return _loads(event.decode("utf-8", "replace"))  # invalid UTF-8: U+FFFD, as SSEDecoder.feed
    assert isinstance(event, SSEEvent)
    if event.garbage is not None:
        raise StreamTruncated(
            "The upstream sent data that is not an event stream: " + preview(event.garbage), reason="invalid_data"
        )
    if event.data == "[DONE]":
        return _DONE
    parsed = _loads(event.data)
    if event.event == "error" and isinstance(parsed, dict) and "error" not in parsed:
        parsed = {"error": parsed}
    return parsed


def _loads(data: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise StreamTruncated(
            "The upstream sent an event that is not valid JSON: " + preview(data), reason="invalid_data"
        ) from None


def _bad_shape(e: MalformedUpstream) -> StreamTruncated:
    """Upstream JSON of a shape the translation relies on but did not get, in a stream: the client may already have
    part of the answer, so an `invalid_data` truncation that names the field. The sessions and the normaliser check the
    shapes they read (proxy/errors.py MalformedUpstream); any other exception under them is a bug of ours and goes on
    to the endpoint as one (a 500 `internal_error`, logged with its traceback), never blamed on the upstream."""
    log.warning("upstream data of an unexpected shape: `%s`", e.field)
    return StreamTruncated(e.message, reason="invalid_data")


def preview(data: bytes | str, limit: int = 200) -> str:
    """A short, quoted sample of what the upstream sent, for error messages."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = text.strip()
    return repr(text[:limit] + ("…" if len(text) > limit else ""))
