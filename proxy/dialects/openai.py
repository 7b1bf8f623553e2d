"""OpenAI (and OpenAI-compatible servers such as vLLM): the identity spoke.

Lossless: fields we do not know pass through both ways untouched. We only set the upstream model name and ask for
stream usage (metrics need tokens even when the client did not ask for them).
"""

from __future__ import annotations

from .base import Dialect


class OpenAIDialect(Dialect):
    name = "openai"
    offers_usage_fields = True  # the default: OpenAI's usage fields as they are
