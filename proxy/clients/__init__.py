"""Client-dialect registry: name -> implementation (the APIs clients speak to us; proxy/clients/base.py)."""

from __future__ import annotations

from .base import ClientCall, ClientDialect, Encoder
from .chat import ChatClient, CompletionsClient
from .messages import MessagesClient
from .responses import CompactClient, ResponsesClient

CLIENT_DIALECTS: dict[str, type[ClientDialect]] = {
    "chat": ChatClient,
    "completions": CompletionsClient,
    "responses": ResponsesClient,
    "responses_compact": CompactClient,
    "messages": MessagesClient,
}

__all__ = ["CLIENT_DIALECTS", "ClientCall", "ClientDialect", "Encoder"]
