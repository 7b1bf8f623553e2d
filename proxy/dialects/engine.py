"""The "engine" frontend service API: POST /chat and POST /completion, no model field."""

from __future__ import annotations

from typing import Any

from ..canonical import ChatRequest, RequestContext
from .base import Dialect


class EngineDialect(Dialect):
    name = "engine"

    def build_request(self, body: ChatRequest, ctx: RequestContext) -> dict[str, Any]:
        out = super().build_request(body, ctx)
        out.pop("model", None)
        return out
