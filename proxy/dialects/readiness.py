"""How a spoke tells whether its upstream would take a request, without generating anything (proxy/gateway/health.py
asks it for /readyz): the request (a chat body every dialect's validation refuses), its headers, and the verdict on
the answer, read with the spoke's own error shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.dialects.error_shape import ErrorShape, short
from proxy.dialects.mapping import DialectMapping
from proxy.errors import ProxyError

if TYPE_CHECKING:
    from proxy.settings import UpstreamSettings

# The readiness request's `messages`: not a list, so that every dialect's validation refuses the body before any
# generation (proxy/gateway/health.py).
READINESS_MESSAGES: Final = "readiness check from dialect-proxy: an invalid body on purpose"


class Readiness:
    """One upstream's readiness check (one per `Dialect`; a spoke whose request differs subclasses it and sets
    `Dialect.readiness_class`)."""

    def __init__(self, dialect: str, mapping: DialectMapping, errors: ErrorShape) -> None:
        self.dialect = dialect
        self.chat_path: str = mapping.paths.get("chat") or "/v1/chat/completions"
        self.errors = errors

    def request(self, u: UpstreamSettings) -> tuple[str, dict[str, Any]]:
        """(path, body) of the request that tells whether a request would work, without generating anything: a chat
        body the upstream must refuse as invalid (`messages` is not a list), on the chat path."""
        return self.chat_path, {
            "model": readiness_model(u), "messages": READINESS_MESSAGES, "max_tokens": 1, "stream": False}

    def headers(self, u: UpstreamSettings) -> dict[str, str]:
        return {"Authorization": f"Bearer {u.api_key}"} if u.api_key else {}

    def verdict(self, status: int, raw: bytes, path: str, u: UpstreamSettings) -> tuple[bool, str]:
        """(ready, why) from the answer to `request`, read as a client's answer would be (this dialect's
        error shapes and mapping, errors at HTTP 200 included). Its validation error (or a model the upstream does
        not know: a per-request matter) is ready; a missing path, a refused key, a 5xx is not."""
        asked = f"POST {path} (an invalid body on purpose)"
        err: ProxyError | None
        if 200 <= status < 300:
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                data = None
            err = self.errors.in_json(data)
            if err is None:
                return True, f"{asked} answered HTTP {status}: the path and the key work"
        else:
            err = self.errors.from_body(status, raw)
        said = f"{asked} answered HTTP {status}: {short(err.message)[:160]}"
        if status in (404, 405) and err.code != "model_not_found":
            return False, (f"{said} — no such inference path: the URL (host, port, path prefix) or the dialect "
                           f"({u.dialect}) is wrong; `dialect-proxy probe URL` tells what the upstream speaks")
        if err.status in (401, 403):
            fix = "check the variable named by api_key_env" if u.api_key else "set api_key_env"
            return False, f"{said} — the upstream refused the API key ({fix})"
        if err.status in (400, 413) or err.code == "model_not_found":
            return True, f"{said} — the {self.dialect} dialect's validation error: the path and the key work"
        if err.status == 429:
            return True, f"{said} — busy, but the path and the key work"
        if err.status == 402:
            return False, f"{said} — the account's balance or quota is exhausted"
        return False, f"{said} (expected the {self.dialect} dialect's validation error)"


def readiness_model(u: UpstreamSettings) -> str:
    """A model name the upstream serves, as far as the config says (for requests that need one)."""
    for name in (*u.aliases.values(), *u.models):
        if name != "*":
            return name
    return "readiness-check"
