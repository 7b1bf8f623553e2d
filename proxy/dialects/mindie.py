"""Huawei MindIE (OpenAI-style routes of MindIE Server)."""

from __future__ import annotations

from .base import Dialect


class MindIEDialect(Dialect):
    name = "mindie"
    # MindIE does not read stream_options; usage rides on its finish chunk anyway.
    stream_usage_option = False
