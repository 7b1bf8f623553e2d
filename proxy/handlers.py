"""Endpoints: glue only — parse, route, translate, send, transform, respond.

The inference endpoints are raw ASGI callables (not Starlette Request/Response) because they own two things the
framework does not do for us:
- cancellation: a watcher task reads `http.disconnect` and cancels the request's task, so the upstream request is
  closed at once — while waiting for response headers, while reading a non-stream body, and mid-stream;
- the stream relay: upstream bytes -> SSE events -> dialect -> translator -> SSE bytes, reading upstream only as
  fast as the client takes it (uvicorn's `send` waits while the socket's write buffer is full).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from .canonical import CHAT, RequestContext
from .errors import (
    ClientRequestError,
    ProxyError,
    StreamTruncated,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from .relay import StreamRelay, preview
from .sse import DONE, KEEPALIVE, encode_data
from .translate import ResponseTranslator
from .upstream import iter_stream, read_body, release

if TYPE_CHECKING:
    from .app import AppState
    from .metrics import RequestObserver

log = logging.getLogger("dialect_proxy")
access_log = logging.getLogger("dialect_proxy.access")

Scope = dict[str, Any]
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class _Disconnect:
    """Watches `receive()` for http.disconnect and cancels the request's task when the client goes away."""

    __slots__ = ("_task", "_watcher", "committed", "complete", "disconnected")

    def __init__(self, receive: Any) -> None:
        self.disconnected = False
        self.complete = False  # set just before the final send: uvicorn then answers receive() with a disconnect
        self.committed = False  # the 200 event-stream head has been sent
        self._task = asyncio.current_task()
        self._watcher = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self.complete and self._task is not None:
                    self.disconnected = True
                    self._task.cancel()
                return

    def stop(self) -> None:
        self._watcher.cancel()


class _ClientGone(Exception):
    """The client went away before its request body was complete."""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            text: str = value.decode("latin-1")
            return text
    return None


async def _read_request_body(scope: Scope, receive: Any, limit: int) -> bytes:
    length = _header(scope, b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ClientRequestError(
            f"The request body is {int(length)} bytes; the limit is {limit} bytes.", 413, code="request_too_large"
        )
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        body = message.get("body", b"")
        if body:
            size += len(body)
            if size > limit:
                raise ClientRequestError(
                    f"The request body is larger than the limit of {limit} bytes.", 413, code="request_too_large"
                )
            chunks.append(body)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_json(send: Any, status: int, payload: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS + extra})
    await send({"type": "http.response.body", "body": payload})


def error_headers(err: ProxyError) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode(), v.encode("latin-1")) for k, v in err.response_headers().items()]


def _substantive(chunk: dict[str, Any]) -> bool:
    """A chunk worth committing the 200 for: it carries a token, a finish_reason, or the usage."""
    choices = chunk["choices"]
    return not choices or _carries_token(chunk) or any(c.get("finish_reason") for c in choices)


def _carries_token(chunk: dict[str, Any]) -> bool:
    for choice in chunk["choices"]:
        delta = choice.get("delta")
        if delta is None:
            if choice.get("text"):
                return True
        elif delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or \
                delta.get("tool_calls"):
            return True
    return False


class CompletionsEndpoint:
    """POST /v1/chat/completions (kind "chat") and POST /v1/completions (kind "completions")."""

    def __init__(self, state: AppState, kind: str) -> None:
        self.state = state
        self.kind = kind
        self.route = "/v1/chat/completions" if kind == CHAT else "/v1/completions"

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        state = self.state
        started = time.perf_counter()
        request_id = _header(scope, b"x-request-id") or uuid.uuid4().hex
        if len(request_id) > 200:
            request_id = request_id[:200]
        rid_header = (b"x-request-id", request_id.encode("latin-1", "replace"))
        info: dict[str, Any] = {"request_id": request_id, "route": self.route}
        obs: RequestObserver | None = None
        status = 500
        watch: _Disconnect | None = None
        try:
            try:
                body = await _read_request_body(scope, receive, state.settings.server.max_body_bytes)
                if state.shutting_down:
                    raise ProxyError("The proxy is shutting down.", 503, code="upstream_unavailable")
                req = _parse(body)
                ctx = self._context(req, request_id)
                info.update(upstream=ctx.upstream.name, model=ctx.client_model, stream=ctx.stream)
                obs = state.metrics.request(self.route, ctx.upstream.name, ctx.client_model, ctx.stream,
                                            started_at=started)
                watch = _Disconnect(receive)
                status = await self._serve(req, ctx, send, watch, obs, rid_header, info)
            except ProxyError as err:
                status = err.status
                info["error"] = err.code
                if obs is None:  # refused before routing (bad JSON, 413, unknown model): still counted
                    obs = state.metrics.request(self.route, info.get("upstream", ""), info.get("model", ""),
                                                bool(info.get("stream")), started_at=started)
                if obs is not None and isinstance(err, UpstreamError | UpstreamUnreachable | UpstreamTimeout):
                    obs.upstream_error(info.get("dialect", "any"), err.upstream_code or err.code)
                if watch is not None:
                    watch.complete = True
                await send_json(send, err.status, err.body(), error_headers(err) + [rid_header])
            except _ClientGone:
                info["client_disconnected"] = True
                status = 499
            except Exception:  # a bug of ours: the client still gets an OpenAI error, never a stack trace
                log.exception("unexpected error in %s (request %s)", self.route, request_id)
                status = 500
                info["error"] = "internal_error"
                bug = ProxyError("Internal error in the proxy.", 500, type="server_error", code="internal_error")
                if watch is None or not watch.complete:
                    if watch is not None and watch.committed:
                        await send({"type": "http.response.body", "body": encode_data(bug.body()),
                                    "more_body": False})
                    else:
                        await send_json(send, 500, bug.body(), [rid_header])
        except asyncio.CancelledError as cancelled:
            if watch is not None and watch.disconnected:
                _uncancel()
                info["client_disconnected"] = True
                status = 499
            elif watch is not None and _is_shutdown_cancel(cancelled):
                # The shutdown grace period is over: end the request with an error the client can see.
                _uncancel()
                drain_err = ProxyError(
                    "The proxy is shutting down; the request was cut at the end of the grace period.", 503,
                    code="shutting_down")
                info["error"] = drain_err.code
                status = 503
                if obs is not None and watch.committed:
                    obs.truncated("shutdown")
                watch.complete = True
                with contextlib.suppress(Exception):
                    if watch.committed:
                        await send({"type": "http.response.body", "body": encode_data(drain_err.body()),
                                    "more_body": False})
                    else:
                        await send_json(send, 503, drain_err.body(), [rid_header])
            else:
                raise
        finally:
            if watch is not None:
                watch.stop()
            duration = time.perf_counter() - started
            disconnected = bool(info.get("client_disconnected"))
            if obs is not None:
                obs.finish(status, disconnected, info.get("finish_reason"))
            if access_log.isEnabledFor(logging.INFO):
                info["status"] = status
                info["duration_ms"] = round(duration * 1000, 2)
                ttft = obs.ttft if obs is not None and info.get("stream") else None
                info["ttft_ms"] = None if ttft is None else round(ttft * 1000, 2)
                info["client_disconnected"] = disconnected
                access_log.info(orjson.dumps(info).decode())

    def _context(self, req: dict[str, Any], request_id: str) -> RequestContext:
        state = self.state
        model = req.get("model")
        if not isinstance(model, str) or not model:
            raise ClientRequestError("`model` is required and must be a non-empty string.", param="model")
        if self.kind == CHAT:
            messages = req.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ClientRequestError("`messages` must be a non-empty list.", param="messages")
        elif "prompt" not in req:
            raise ClientRequestError("`prompt` is required.", param="prompt")
        route = state.router.resolve(model)
        stream = req.get("stream") is True
        opts = req.get("stream_options")
        include_usage = stream and isinstance(opts, dict) and opts.get("include_usage") is True
        prefix = "chatcmpl-" if self.kind == CHAT else "cmpl-"
        return RequestContext(
            kind=self.kind,
            request_id=request_id,
            client_model=model,
            upstream_model=route.upstream_model,
            upstream=route.upstream,
            stream=stream,
            include_usage=include_usage,
            response_id=prefix + uuid.uuid4().hex[:24],
            created=int(time.time()),
        )

    async def _serve(
        self,
        req: dict[str, Any],
        ctx: RequestContext,
        send: Any,
        watch: _Disconnect,
        obs: RequestObserver,
        rid_header: tuple[bytes, bytes],
        info: dict[str, Any],
    ) -> int:
        state = self.state
        server = state.settings.server
        upstream = ctx.upstream
        dialect = state.dialects[upstream.name]
        client = state.clients[upstream.name]
        info["dialect"] = dialect.name
        path = dialect.path(ctx.kind)
        if path is None:
            raise ClientRequestError(
                f"The upstream `{upstream.name}` ({dialect.name}) has no {self.route} equivalent.", 404,
                code="unsupported_endpoint",
            )
        upstream_body = dialect.build_request(req, ctx)
        path = dialect.request_path(path, upstream_body, ctx)
        if server.log_bodies and log.isEnabledFor(logging.DEBUG):
            log.debug(orjson.dumps({"request_id": ctx.request_id, "client_body": redact(req),
                                    "upstream_body": redact(upstream_body)}).decode())
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if ctx.stream else
                   "application/json"}
        headers.update(dialect.request_headers(ctx))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + server.total_timeout
        obs.upstream_started()
        try:
            resp = await client.open("POST", upstream.url + path, body=orjson.dumps(upstream_body),
                                     headers=headers)
        except (UpstreamUnreachable, UpstreamTimeout):
            state.metrics.upstream_up(upstream.name, False)
            raise
        state.metrics.upstream_up(upstream.name, True)
        reusable = False
        try:
            obs.upstream_headers()
            t_up = time.perf_counter()
            translator = ResponseTranslator(ctx, state.settings.client, dialect_reasoning_source(ctx, dialect))
            content_type = resp.headers.get("Content-Type", "")
            if not ctx.stream or resp.status >= 300 or "text/event-stream" not in content_type:
                raw = await read_body(resp, min(server.idle_timeout, max(deadline - loop.time(), 0.001)))
                obs.add_upstream_wait(time.perf_counter() - t_up)
                if resp.status >= 300:
                    raise dialect.error_from_body(resp.status, raw, {k.lower(): v for k, v in resp.headers.items()})
                try:
                    data = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    raise UpstreamError(
                        "The upstream answered with a body that is not JSON: " + preview(raw), 502
                    ) from None
                if ctx.stream:
                    err = dialect.error_in_json(data)
                    raise err or UpstreamError("The upstream answered a stream request without an event stream.")
                result = translator.translate_completion(dialect.decode_response(data, ctx))
                self._observe_usage(obs, translator, ctx, info)
                info["finish_reason"] = _first_finish(result)
                watch.complete = True
                await send_json(send, 200, orjson.dumps(result), [rid_header])
                reusable = True
                return 200
            status = await self._relay(resp, ctx, dialect, translator, send, watch, obs, rid_header, info, deadline)
            reusable = status == 200
            return status
        finally:
            if reusable:  # the answer is complete: keep the connection for the next request
                await release(resp)
            else:  # an error or a client that left: close, so the upstream stops generating
                resp.close()

    async def _relay(self, resp: Any, ctx: RequestContext, dialect: Any, translator: ResponseTranslator, send: Any,
                     watch: _Disconnect, obs: RequestObserver, rid_header: tuple[bytes, bytes],
                     info: dict[str, Any], deadline: float) -> int:
        """Upstream event stream -> client event stream.

        The 200 head is sent lazily: with the first client chunk, or when the first keep-alive is due. So an error
        that arrives as the stream's first event (a Siliconstorm `{"code": 701}` in an SSE line, MindIE's raw
        `Engine callback timeout` before any token) still reaches the client as an HTTP error status; only a failure
        after the head becomes an SSE error event (and the stream ends without [DONE]).
        """
        server = self.state.settings.server
        relay = StreamRelay(ctx, dialect, translator)
        dumps = orjson.dumps
        out: list[dict[str, Any]] = []  # translated but not yet sent: still sent when a later event fails

        async def commit() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + [rid_header]})
            watch.committed = True

        async def flush_out(final: bytes = b"", more: bool = True) -> None:
            body = b"".join(encode_data(dumps(c)) for c in out) + final
            for chunk in out:
                obs.chunk(_carries_token(chunk))
            out.clear()
            if not watch.committed:
                await commit()
            await send({"type": "http.response.body", "body": body, "more_body": more})

        try:
            # aclosing: the silence timer is cancelled as soon as we stop reading (e.g. right after [DONE]).
            async with contextlib.aclosing(
                    iter_stream(resp, server.idle_timeout, server.keepalive_interval, deadline)) as reads:
                async for data in reads:
                    if data is None:
                        if out or not watch.committed:
                            await flush_out()
                        await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
                        continue
                    relay.feed(data, out)
                    # Until the head is sent, role-only chunks wait for the first token (or finish), so that a failure
                    # before any generated text is still an HTTP error.
                    if out and (watch.committed or relay.done or any(map(_substantive, out))):
                        await flush_out()
                    if relay.done:
                        break
            relay.finish(out)
            self._observe_usage(obs, translator, ctx, info)
            info["finish_reason"] = translator.last_finish_reason
            watch.complete = True
            await flush_out(DONE, more=False)
            return 200
        except ProxyError as err:
            reason = err.reason if isinstance(err, StreamTruncated) else "upstream_error"
            self._observe_usage(obs, translator, ctx, info)
            if not watch.committed and not any(map(_substantive, out)):
                raise  # nothing generated reached the client yet: it gets the HTTP status and envelope
            obs.truncated(reason)
            if err.upstream_code:
                obs.upstream_error(dialect.name, err.upstream_code)
            info["error"] = err.code
            info["truncated"] = reason
            watch.complete = True
            await flush_out(encode_data(err.body()), more=False)  # what arrived before the failure, then the error
            return max(err.status, 500)

    @staticmethod
    def _observe_usage(obs: RequestObserver, translator: ResponseTranslator, ctx: RequestContext,
                       info: dict[str, Any]) -> None:
        if translator.usage is not None:
            obs.usage(translator.usage)
            info["prompt_tokens"] = translator.usage.get("prompt_tokens")
            info["completion_tokens"] = translator.usage.get("completion_tokens")
        extras = {**translator.usage_extras, **ctx.extras}
        if extras:
            obs.upstream_timings(extras)


_SECRET_KEYS = ("authorization", "api_key", "apikey", "api-key", "password", "secret", "token")


def redact(value: Any) -> Any:
    """A copy of a JSON value with credential-looking fields replaced (for --log-bodies)."""
    if isinstance(value, dict):
        return {k: "[redacted]" if isinstance(k, str) and any(s in k.lower() for s in _SECRET_KEYS)
                and not k.endswith("_tokens") else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


# uvicorn cancels the tasks still running when its graceful-shutdown timeout (our --shutdown-grace) is over, with
# this message; proxy.server.ProxyServer uses the same one.
SHUTDOWN_CANCEL_MSG = "graceful shutdown exceeded"


def _is_shutdown_cancel(exc: asyncio.CancelledError) -> bool:
    return any(isinstance(a, str) and SHUTDOWN_CANCEL_MSG in a for a in exc.args)


def dialect_reasoning_source(ctx: RequestContext, dialect: Any) -> str:
    return ctx.upstream.reasoning_source or dialect.default_reasoning_source


def _parse(body: bytes) -> dict[str, Any]:
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ClientRequestError(f"The request body is not valid JSON ({e}).", code="invalid_json") from None
    if not isinstance(req, dict):
        raise ClientRequestError("The request body must be a JSON object.", code="invalid_json")
    return req


def _first_finish(result: dict[str, Any]) -> str | None:
    choices = result.get("choices") or ()
    return choices[0].get("finish_reason") if choices else None
