"""The per-request observer: one `RequestObserver` per request (made by proxy/metrics/definitions.py
`Metrics.request`), which resolves its label children once (`Series`, shared by every request with the same labels)
so that the per-chunk and per-read calls touch no label."""

from __future__ import annotations

import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from proxy.hub.events import Timings
from proxy.hub.readings import Readings
from proxy.hub.readings import values as read_values
from proxy.metrics.labels import ERROR_CODES, FINISH_REASONS, OTHER, TRUNCATION_REASONS, status_class
from proxy.metrics.local import HistogramChild

if TYPE_CHECKING:
    from proxy.metrics.definitions import Metrics

_now = time.perf_counter  # the clock of every duration here; tests replace it


def _observe_readings(child: Any, readings: Readings) -> None:
    """Observe each value of an upstream's list (proxy/hub/readings.py; thousands for a long answer): read in place by a
    local histogram child, one by one by a prometheus_client one (`Metrics(local=False)`)."""
    if isinstance(child, HistogramChild):
        child.observe_readings(readings)
    else:
        for value in read_values(readings):
            child.observe(value)


class Series:
    """The metric children of one (route, upstream, model, stream, key) combination, resolved once and shared by
    every request with these labels, so a request does no label lookups. Children that depend on how a request
    ends (status and outcome, token kind, finish reason) are resolved on first use, so the exposition has the same
    series in the same order as looking each one up per request."""

    __slots__ = ("_ends", "_errors", "_finish_reasons", "_m", "_timings", "_tokens", "in_flight", "in_flight_stream",
                 "itl", "key", "model", "overhead", "route", "stream", "stream_label", "ttft", "upstream")

    def __init__(self, m: Metrics, route: str, upstream: str, model: str, stream: bool, key: str) -> None:
        self._m = m
        self.route, self.upstream, self.model, self.key = route, upstream, model, key
        self.stream = stream
        self.stream_label = "true" if stream else "false"
        self.ttft = m.child(m.ttft, route, upstream, model)
        self.itl = m.child(m.itl, route, upstream, model)
        self.in_flight = m.child(m.in_flight_requests, route, upstream, model)
        self.in_flight_stream = m.child(m.in_flight_streams, route, upstream, model) if stream else None
        self.overhead: Any = None
        self._ends: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        self._tokens: dict[str, tuple[Any, Any]] = {}
        self._finish_reasons: dict[str, Any] = {}
        self._errors: dict[str, Any] = {}
        self._timings: dict[Any, Any] = {}

    def ended(self, status: str, outcome: str) -> tuple[Any, Any, Any]:
        """requests, key_requests (None without inbound keys) and request_duration children for a request that
        ended so."""
        found = self._ends.get((status, outcome))
        if found is None:
            m = self._m
            found = self._ends[(status, outcome)] = (
                m.child(m.requests, self.route, self.upstream, self.model, self.stream_label, status, outcome),
                m.child(m.key_requests, self.key, self.upstream, self.model, status) if m.per_key else None,
                m.child(m.request_duration, self.route, self.upstream, self.model, self.stream_label, status),
            )
        return found

    def tokens(self, kind: str) -> tuple[Any, Any]:
        """tokens and key_tokens (None without inbound keys) children for a token kind."""
        found = self._tokens.get(kind)
        if found is None:
            m = self._m
            found = self._tokens[kind] = (
                m.child(m.tokens, self.upstream, self.model, kind),
                m.child(m.key_tokens, self.key, self.upstream, self.model, kind) if m.per_key else None)
        return found

    def error(self, code: str) -> Any:
        """The errors child for a client-facing error code (bounded: ERROR_CODES, else "other")."""
        found = self._errors.get(code)
        if found is None:
            m = self._m
            label = code if code in ERROR_CODES else OTHER
            found = self._errors[code] = m.child(m.errors, self.route, self.upstream, label)
        return found

    def finish_reason(self, reason: str) -> Any:
        found = self._finish_reasons.get(reason)
        if found is None:
            m = self._m
            found = self._finish_reasons[reason] = m.child(m.finish_reasons, self.upstream, self.model, reason)
        return found

    def timing(self, histogram: Any) -> Any:
        """The child of one of the upstream's own timing histograms (labels upstream and model)."""
        found = self._timings.get(histogram)
        if found is None:
            found = self._timings[histogram] = self._m.child(histogram, self.upstream, self.model)
        return found


class RequestObserver:
    """Observes one request. Create it with :meth:`Metrics.request`; call :meth:`finish` exactly once (extra calls
    are ignored), or use it as a context manager, which finishes an unfinished request as a 500 ``error``."""

    __slots__ = (
        "_chunks", "_finished", "_first_token_t", "_headers_t", "_itl", "_itl_other", "_key", "_last_token_t", "_m",
        "_model", "_route", "_s", "_stream", "_t0", "_timings_seen", "_truncated", "_upstream", "_upstream_t0",
        "_usage_seen", "_wait",
    )

    def __init__(
        self, metrics: Metrics, route: str, upstream: str, model: str, stream: bool, started_at: float | None,
        key: str | None = None,
    ) -> None:
        self._t0 = _now() if started_at is None else started_at
        self._m = metrics
        s = self._s = metrics._series_for(route, upstream, model, bool(stream), key)
        self._route, self._upstream, self._model, self._key = s.route, s.upstream, s.model, s.key
        self._stream = s.stream
        self._upstream_t0: float | None = None
        self._headers_t: float | None = None
        self._wait = 0.0
        self._first_token_t: float | None = None
        self._last_token_t: float | None = None
        self._chunks = 0
        self._truncated = False
        self._usage_seen = False
        self._timings_seen = False
        self._finished = False
        # Inter-token latencies: a local histogram child, or prometheus_client's (`Metrics(local=False)`).
        self._itl: HistogramChild | None = s.itl if self._stream and isinstance(s.itl, HistogramChild) else None
        self._itl_other: Any = s.itl if self._stream and self._itl is None else None
        s.in_flight.inc()
        if s.in_flight_stream is not None:
            s.in_flight_stream.inc()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._finished:
            self.finish(500, False, None)

    @property
    def model(self) -> str:
        """The bounded ``model`` label this request is counted under."""
        return self._model

    @property
    def ttft(self) -> float | None:
        """Seconds from the request's start to the first chunk that carried a token (None before that)."""
        return None if self._first_token_t is None else self._first_token_t - self._t0

    # -- upstream timing ----------------------------------------------------------------------------------------

    def upstream_started(self) -> None:
        """Just before the request is sent upstream: the upstream wait starts."""
        self._upstream_t0 = _now()

    def upstream_headers(self) -> None:
        """The upstream's response headers arrived: the time since :meth:`upstream_started` was upstream wait."""
        if self._upstream_t0 is not None and self._headers_t is None:
            self._headers_t = _now()
            self._wait += self._headers_t - self._upstream_t0

    def add_upstream_wait(self, seconds: float) -> None:
        """Wall time spent awaiting upstream body reads (after the headers). Counts as upstream wait."""
        if seconds > 0:
            self._wait += seconds

    # -- hot path -----------------------------------------------------------------------------------------------

    def chunk(self, has_token: bool) -> None:
        """A chunk was sent to the client. ``has_token``: it carries content, reasoning or a tool call.

        For streams, the first such chunk sets TTFT (from request start); each later one adds an inter-token
        latency sample. Non-stream requests record neither (their TTFT is their duration)."""
        self.chunks(1, 1 if has_token else 0)

    def chunks(self, n: int, tokens: int) -> None:
        """`n` chunks sent to the client at once (the events of one upstream read), `tokens` of them carrying a
        token: as `n` calls of :meth:`chunk` in the same instant (one clock read; the tokens after the read's first
        one are inter-token latency samples of 0)."""
        self._chunks += n
        if not tokens:
            return
        now = _now()
        last = self._last_token_t
        self._last_token_t = now
        zeros = tokens - 1
        if last is None:
            self._first_token_t = now
            if self._stream:
                self._s.ttft.observe(now - self._t0)
        elif self._itl is not None:
            self._itl.observe(now - last)
        elif self._itl_other is not None:
            self._itl_other.observe(now - last)
        if zeros:
            if self._itl is not None:
                self._itl.observe_many(0.0, zeros)
            elif self._itl_other is not None:
                for _ in range(zeros):
                    self._itl_other.observe(0.0)

    # -- once per response --------------------------------------------------------------------------------------

    def usage(self, usage: dict[str, Any] | None) -> None:
        """OpenAI-shaped usage from the upstream (recorded even when the client did not ask for usage). Only the
        first call counts. DeepSeek's ``prompt_cache_hit_tokens`` stands in for a missing ``cached_tokens``.
        Objects are tested as `dict` (JSON's), not `Mapping`: an ABC's isinstance runs Python code."""
        if self._usage_seen or not isinstance(usage, dict):
            return
        self._usage_seen = True
        prompt_details = usage.get("prompt_tokens_details")
        completion_details = usage.get("completion_tokens_details")
        cached = _count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else None
        if cached is None:
            cached = _count(usage.get("prompt_cache_hit_tokens"))
        reasoning = (
            _count(completion_details.get("reasoning_tokens")) if isinstance(completion_details, dict) else None
        )
        counts = (
            ("prompt", _count(usage.get("prompt_tokens"))),
            ("completion", _count(usage.get("completion_tokens"))),
            ("cached", cached),
            ("reasoning", reasoning),
        )
        s = self._s
        for kind, n in counts:
            if n is not None:
                total, per_key = s.tokens(kind)
                total.inc(n)
                if per_key is not None:
                    per_key.inc(n)

    def upstream_timings(self, timings: Timings) -> None:
        """The upstream's own timings (proxy/hub/events.py, seconds; an upstream dialect reads them from its fields).
        Only the first call counts."""
        if self._timings_seen:
            return
        self._timings_seen = True
        m, s = self._m, self._s
        if timings.prefill is not None:
            s.timing(m.prefill).observe(timings.prefill)
        if timings.decode is not None:
            _observe_readings(s.timing(m.decode), timings.decode)
        if timings.queue_wait is not None:
            _observe_readings(s.timing(m.queue_wait), timings.queue_wait)
        if timings.batch_size is not None:
            _observe_readings(s.timing(m.batch_size), timings.batch_size)

    def upstream_error(self, dialect: str, code: str) -> None:
        """An error from (or about) the upstream: the dialect's name and its own error code (e.g. an HTTP status),
        or "any" and what went wrong before any dialect answered (e.g. "connect_refused")."""
        d, c = self._m._error_code_label(dialect, code)
        self._m.child(self._m.upstream_errors, self._upstream, d, c).inc()

    def truncated(self, reason: str) -> None:
        """The stream failed after its 200 was committed. Counted once; the request ends as 5xx/truncated."""
        if self._truncated:
            return
        self._truncated = True
        label = reason if reason in TRUNCATION_REASONS else OTHER
        self._m.child(self._m.truncated_streams, self._upstream, self._model, label).inc()

    def finish(self, status: int, disconnected: bool, finish_reason: str | None, error: str | None = None) -> None:
        """The request is over. Records duration, requests_total, overhead, disconnects, finish_reason and `error`,
        the client-facing error code the request was answered with (its error body or error event), if any."""
        if self._finished:
            return
        self._finished = True
        now = _now()
        m = self._m
        s = self._s
        s.in_flight.dec()
        if s.in_flight_stream is not None:
            s.in_flight_stream.dec()

        if disconnected:
            outcome = "client_disconnect"
            status_label = status_class(status)
            stage = "mid_stream" if self._chunks else "before_first_chunk"
            m.child(m.client_disconnects, self._route, self._upstream, self._model, stage).inc()
        elif self._truncated:
            outcome, status_label = "truncated", "5xx"
        else:
            status_label = status_class(status)
            outcome = "ok" if status < 400 else "error"

        total = max(now - self._t0, 0.0)
        requests, key_requests, duration = s.ended(status_label, outcome)
        requests.inc()
        if key_requests is not None:
            key_requests.inc()
        duration.observe(total)
        if error is not None and not disconnected:
            s.error(error).inc()

        wait = self._wait
        if self._upstream_t0 is not None and self._headers_t is None:
            wait += now - self._upstream_t0  # never got headers (refused, timed out, cancelled): all of it waited
        overhead = s.overhead
        if overhead is None:
            overhead = s.overhead = m.child(m.overhead, self._route, self._upstream, s.stream_label)
        overhead.observe(min(max(total - wait, 0.0), total))

        if finish_reason is not None and outcome == "ok":
            s.finish_reason(finish_reason if finish_reason in FINISH_REASONS else OTHER).inc()


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value

