"""OpenAI (and OpenAI-compatible servers such as vLLM): the identity spoke.

Lossless: fields we do not know pass through both ways untouched. We only set the upstream model name and ask for
stream usage (metrics need tokens even when the client did not ask for them).
"""

from __future__ import annotations

from typing import Any

from proxy.dialects.base import Dialect
from proxy.dialects.probing import Probe, ProbeListing


class OpenAIProbe(Probe):
    def error_shape(self, data: dict[str, Any]) -> bool:
        return isinstance(data.get("error"), dict)  # {"error": {"message", "type", "param", "code"}}

    def listing(self, listing: ProbeListing) -> str | None:
        if listing.listed:
            return "OpenAI model list at /v1/models"
        return "OpenAI error shape" if listing.error and self.shaped(listing.body) else None


class OpenAIDialect(Dialect):
    name = "openai"
    offers_usage_fields = True  # the default: OpenAI's usage fields as they are
    probe = OpenAIProbe(generic=True, chat_path="invalid")
