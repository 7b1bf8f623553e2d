"""Siliconstorm: hosted MindIE with its own `{"code": N, "result": null, "message": ...}` errors.

Everything MindIE does applies (requests, responses, MindIE-shaped errors from the engine behind it). In addition,
Siliconstorm reports its own failures as a body with a numeric `code` — often with HTTP 200, also for `stream: true`
requests — so the body's code is checked whatever the status, and mapped by mappings/siliconstorm.yaml `errors.code`
(701 -> 402 insufficient_quota, 702 -> 403, 801 -> 401 invalid_api_key, 802 -> 504, 9999 -> 502, others -> 502).
The upstream's message is kept; the code is added after it.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

from proxy.dialects.mindie import MindIEDialect, MindIEErrors, MindIEProbe
from proxy.dialects.probing import ProbeListing
from proxy.errors import ProxyError, UpstreamError, error_type_for

# The document's own descriptions, used when a body carries a code without a message.
CODE_TEXT: Final = {
    701: "Insufficient balance",
    702: "Authorization not passed",
    801: "Apikey error",
    802: "Request timeout",
    9999: "Model response exception",
}


# The document's own example is not JSON (`"message": 'Insufficient balance'`); such a body is read leniently.
_LENIENT: Final = re.compile(
    r"""^\s*\{\s*"code"\s*:\s*(\d+)\s*,.*?"message"\s*:\s*(?:"([^"]*)"|'([^']*)')""", re.DOTALL)


def _lenient(raw: bytes) -> dict[str, Any] | None:
    match = _LENIENT.match(raw.decode("utf-8", "replace"))
    if match is None:
        return None
    return {"code": int(match.group(1)), "result": None, "message": match.group(2) or match.group(3) or ""}


def _code(data: Any) -> int | None:
    """The error code of a Siliconstorm error body, or None when `data` is not one."""
    if not isinstance(data, dict) or "choices" in data or "code" not in data:
        return None
    code = data["code"]
    if isinstance(code, str) and code.strip().isdigit():
        code = int(code)
    if isinstance(code, bool) or not isinstance(code, int) or code in (0, 200):
        return None
    if "message" not in data and "result" not in data and "msg" not in data:
        return None
    return code


class SiliconstormErrors(MindIEErrors):
    """Its own `{code, message}` bodies, whatever the status; MindIE's otherwise (the engine behind it)."""

    def from_body(self, status: int, raw: bytes, headers: dict[str, str] | None = None) -> ProxyError:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = _lenient(raw)
        if _code(data) is not None:
            return self._code_error(data)
        return super().from_body(status, raw, headers)

    def in_json(self, data: Any) -> ProxyError | None:
        if _code(data) is not None:
            return self._code_error(data)
        return super().in_json(data)

    def _code_error(self, data: dict[str, Any]) -> ProxyError:
        code = _code(data)
        assert code is not None
        message = data.get("message")
        if not isinstance(message, str) or not message.strip():
            message = data.get("msg") if isinstance(data.get("msg"), str) else None
        message = (message or CODE_TEXT.get(code) or "Siliconstorm reported an error").strip()
        status = self.mapping.error_code.get(code, 502)
        err_type, err_code = error_type_for(status)
        return UpstreamError(f"{message} (Siliconstorm code {code})", status, type=err_type, code=err_code,
                             upstream_code=str(code))


class SiliconstormProbe(MindIEProbe):
    def error_shape(self, data: dict[str, Any]) -> bool:
        return "code" in data and ("message" in data or "result" in data) and "choices" not in data and \
            not isinstance(data.get("error"), dict | str)

    def refused_key(self, raw: bytes) -> bool:
        return b"801" in raw  # Apikey error

    def listing(self, listing: ProbeListing) -> str | None:
        if (listing.error or listing.status == 200) and self.shaped(listing.body):
            return "Siliconstorm {code, message} error body"
        return None

    def after_chat(self, events: list[dict[str, Any]], usage_seen: bool) -> str | None:
        batch_size = any(isinstance(e.get("usage"), dict) and "batch_size" in e["usage"] for e in events)
        return None if batch_size or not usage_seen else "MindIE wire without MindIE's batch_size usage (hosted MindIE)"


class SiliconstormDialect(MindIEDialect):
    name = "siliconstorm"
    top_k_zero_ok = True
    tools_for_listed_models = False
    errors_class = SiliconstormErrors
    probe = SiliconstormProbe(structured_output=True, error_at_200=True)
