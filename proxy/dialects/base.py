"""The Dialect protocol, and the behaviour shared by OpenAI-like dialects.

A dialect is a spoke of the hub: it turns a canonical (OpenAI) request into the upstream's body, and the upstream's
answers — JSON bodies, stream events, errors in any shape — into canonical ones. It holds no per-request state;
per-request stream state lives in `proxy.translate.ResponseTranslator`.

Subclasses override only what differs; the data that differs lives in mappings/<name>.yaml.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from ..canonical import CHAT, ChatChunk, ChatCompletion, ChatRequest, RequestContext
from ..errors import ClientRequestError, ProxyError, StreamTruncated, UpstreamError, error_type_for
from ..mapping import DialectMapping, load_mapping

MAX_ERROR_TEXT = 500


class Dialect:
    name: ClassVar[str] = "openai"
    # Where the upstream keeps reasoning unless the config says otherwise (DECISIONS.md "Reasoning").
    default_reasoning_source: ClassVar[str] = "auto"
    # Ask the upstream for usage on streams even when the client did not (metrics need tokens).
    stream_usage_option: ClassVar[bool] = True
    # DeepSeek's assistant-prefix continuation (`prefix: true` on the last message); refused with a 400 elsewhere.
    supports_prefix: ClassVar[bool] = False

    def __init__(self) -> None:
        self.mapping: DialectMapping = load_mapping(self.name)

    # -- requests ---------------------------------------------------------------------------------------------
    def path(self, kind: str) -> str | None:
        return self.mapping.paths.get(kind)

    def build_request(self, body: ChatRequest, ctx: RequestContext) -> dict[str, Any]:
        if not self.supports_prefix and ctx.kind == CHAT:
            _refuse_prefix(body, ctx)
        out = self.mapping.apply_request(body)
        out["model"] = ctx.upstream_model
        if ctx.stream and self.stream_usage_option:
            opts = dict(out.get("stream_options") or {})
            opts["include_usage"] = True
            out["stream_options"] = opts
        return out

    def request_path(self, path: str, body: dict[str, Any], ctx: RequestContext) -> str:
        """The upstream path for this request's built body (DeepSeek sends prefix continuations to /beta)."""
        return path

    def request_headers(self, ctx: RequestContext) -> dict[str, str]:
        headers = {"x-request-id": ctx.request_id}
        if ctx.upstream.api_key:
            headers["Authorization"] = f"Bearer {ctx.upstream.api_key}"
        return headers

    # -- errors -----------------------------------------------------------------------------------------------
    def error_from_body(self, status: int, raw: bytes, headers: dict[str, str] | None = None) -> ProxyError:
        """An upstream answer with an error status (or an error body at 2xx) -> our error."""
        message, upstream_code, param = _extract_error_message(raw)
        if not message:
            message = f"The upstream returned HTTP {status} with an empty body."
        our_status = self.mapping.error_status.get(status, _default_status(status))
        err_type, code = error_type_for(our_status)
        out_headers = {}
        if headers and our_status == 429 and headers.get("retry-after"):
            out_headers["Retry-After"] = headers["retry-after"]
        return UpstreamError(
            message,
            our_status,
            type=err_type,
            code=code,
            param=param,
            headers=out_headers,
            upstream_code=upstream_code or str(status),
        )

    def error_in_json(self, data: Any) -> ProxyError | None:
        """An error carried inside a 2xx JSON body or a stream event (None when `data` is not an error)."""
        if isinstance(data, dict) and "error" in data and "choices" not in data:
            raw = orjson.dumps(data)
            err = self.error_from_body(502, raw)
            status = _status_from_error_obj(data.get("error"))
            if status is not None:
                err.status = status
                err.type, err.code = error_type_for(status)
            return err
        return None

    # -- responses --------------------------------------------------------------------------------------------
    def decode_response(self, data: Any, ctx: RequestContext) -> ChatCompletion:
        err = self.error_in_json(data)
        if err is not None:
            raise err
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise UpstreamError("The upstream answered with JSON that is not a completion.", 502)
        for key in self.mapping.strip:
            if key in data:
                ctx.extras[key] = data.pop(key)
        self._map_finish(data["choices"])
        return data

    def decode_chunk(self, data: Any, ctx: RequestContext) -> ChatChunk | None:
        err = self.error_in_json(data)
        if err is not None:
            raise StreamTruncated(err.message, reason="upstream_error", status=err.status, type=err.type,
                                  code=err.code, upstream_code=err.upstream_code)
        if not isinstance(data, dict):
            raise StreamTruncated("The upstream sent a stream event that is not a JSON object.",
                                  reason="invalid_data")
        strip = self.mapping.strip
        if strip:
            for key in strip:
                if key in data:
                    ctx.extras[key] = data.pop(key)
        choices = data.get("choices")
        if choices:
            self._map_finish(choices)
        return data

    def _map_finish(self, choices: list[dict[str, Any]]) -> None:
        fmap = self.mapping.finish_reason
        if not fmap:
            return
        for ch in choices:
            fr = ch.get("finish_reason")
            if isinstance(fr, str) and fr in fmap:
                ch["finish_reason"] = fmap[fr]

    def decode_models(self, data: Any) -> list[dict[str, Any]]:
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            return [m for m in data["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
        return []


def join_text_parts(content: Any) -> Any:
    """OpenAI content parts that are all text -> one string (joined with newlines, as chat templates do); any other
    content is returned unchanged. For upstreams whose messages take string content only."""
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    return content


def _refuse_prefix(body: ChatRequest, ctx: RequestContext) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("prefix") is True:
            raise ClientRequestError(
                f"messages[{i}].prefix: the assistant-prefix continuation (DeepSeek's `prefix: true`) is not "
                f"supported by the upstream `{ctx.upstream.name}` ({ctx.upstream.dialect} dialect).",
                param=f"messages[{i}].prefix",
            )


def _default_status(status: int) -> int:
    if status == 422:
        return 400
    if status in (400, 401, 402, 403, 404, 408, 409, 413, 429):
        return status
    if 400 <= status < 500:
        return 400
    if status in (503, 504):
        return status
    return 502


def _status_from_error_obj(err: Any) -> int | None:
    if isinstance(err, dict):
        for key in ("status", "status_code", "code"):
            v = err.get(key)
            if isinstance(v, int) and 400 <= v <= 599:
                return _default_status(v)
    return None


def _extract_error_message(raw: bytes) -> tuple[str, str | None, str | None]:
    """(message, upstream code, param) from any error body shape we know; raw text is kept, shortened."""
    text = raw.strip()
    if not text:
        return "", None, None
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return _short(text.decode("utf-8", "replace")), None, None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):  # OpenAI / DeepSeek
            msg = err.get("message")
            code = err.get("code") if err.get("code") is not None else err.get("type")
            param = err.get("param") if isinstance(err.get("param"), str) else None
            return _short(str(msg if msg is not None else err)), None if code is None else str(code), param
        if isinstance(err, str):  # MindIE {"error": "...", "error_type": "..."}
            return _short(err), data.get("error_type") and str(data["error_type"]), None
        for key in ("message", "detail", "msg"):
            if isinstance(data.get(key), str):
                code = data.get("code")
                return _short(data[key]), None if code is None else str(code), None
    return _short(text.decode("utf-8", "replace")), None, None


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "…"
