"""How a spoke reads its upstream's errors: an error status's body, an error inside a 2xx body or a stream event, and a
404 on an inference path. `ErrorShape` reads every shape we know (OpenAI's and DeepSeek's `{"error": {...}}`, MindIE's
`{"error": "...", "error_type": ...}`, `{"message"|"detail"|"msg": ...}`, plain text) with the mapping's
`errors.status` renames; a spoke whose upstream says more (Siliconstorm's numeric codes, MindIE's parameter names)
subclasses it and sets `Dialect.errors_class`.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

from proxy.dialects.mapping import DialectMapping
from proxy.errors import ProxyError, UpstreamError, error_type_for

MAX_ERROR_TEXT: Final = 500

# An upstream's 404 that is about the model, not the path: OpenAI's code, or words such as "The model `x` does not
# exist", "Model Not Exist", "model not found" (MindIE's own wording: proxy/dialects/mindie.py).
_MODEL_MISSING: Final = re.compile(r"(?i)\bmodel\b.{0,120}?(not[ _]?(found|exist)|does not exist|unknown)|"
                                   r"(unknown|invalid) model")

class ErrorShape:
    """One upstream's error reading (one per `Dialect`, made with its mapping)."""

    def __init__(self, mapping: DialectMapping) -> None:
        self.mapping = mapping

    def answer(self, status: int, raw: bytes, headers: dict[str, str], path: str, upstream: str,
                     dialect: str) -> ProxyError:
        """The error of an inference request's answer (`from_body`), except that a 404 which is not about the
        model means the path does not exist there: a 502 naming the path and the configured dialect, never a
        `model_not_found` for a model that routing found."""
        err = self.from_body(status, raw, headers)
        if status == 404 and err.code != "model_not_found":
            return UpstreamError(
                f"{err.message} — the upstream `{upstream}` answered 404 Not Found on POST {path}: there is no such "
                f"path for the configured dialect `{dialect}`. Check the upstream's URL (host, port, path prefix) "
                f"and dialect; `dialect-proxy probe URL` tells which dialect it speaks.",
                502, code="upstream_path_not_found", upstream_code="404")
        return err

    def from_body(self, status: int, raw: bytes, headers: dict[str, str] | None = None) -> ProxyError:
        """An upstream answer with an error status (or an error body at 2xx) -> our error."""
        message, upstream_code, param = _extract_error_message(raw)
        if not message:
            message = f"The upstream returned HTTP {status} with an empty body."
        our_status = self.mapping.error_status.get(status, _default_status(status))
        err_type, code = error_type_for(our_status)
        if our_status == 404 and upstream_code != "model_not_found" and not _MODEL_MISSING.search(message):
            code = "not_found"  # (the path, most likely: `answer`)
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

    def in_json(self, data: Any) -> ProxyError | None:
        """An error carried inside a 2xx JSON body or a stream event (None when `data` is not an error)."""
        if isinstance(data, dict) and "error" in data and "choices" not in data:
            raw = orjson.dumps(data)
            err = self.from_body(502, raw)
            status = _status_from_error_obj(data.get("error"))
            if status is not None:
                err.status = status
                err.type, err.code = error_type_for(status)
            return err
        return None


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
        data = orjson.loads(text.decode("utf-8", "replace"))  # invalid UTF-8 becomes U+FFFD, as everywhere
    except orjson.JSONDecodeError:
        return short(text.decode("utf-8", "replace")), None, None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):  # OpenAI / DeepSeek
            msg = err.get("message")
            code = err.get("code") if err.get("code") is not None else err.get("type")
            param = err.get("param") if isinstance(err.get("param"), str) else None
            return short(str(msg if msg is not None else err)), None if code is None else str(code), param
        if isinstance(err, str):  # MindIE {"error": "...", "error_type": "..."}
            return short(err), data.get("error_type") and str(data["error_type"]), None
        for key in ("message", "detail", "msg"):
            if isinstance(data.get(key), str):
                code = data.get("code")
                return short(data[key]), None if code is None else str(code), None
    return short(text.decode("utf-8", "replace")), None, None


def short(text: str) -> str:
    """An upstream's error text, cut to MAX_ERROR_TEXT characters."""
    text = text.strip()
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "…"
