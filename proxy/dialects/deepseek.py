"""The DeepSeek API."""

from __future__ import annotations

from .base import Dialect


class DeepSeekDialect(Dialect):
    name = "deepseek"
    default_reasoning_source = "field"
