"""Siliconstorm: hosted MindIE with its own `{"code": N, "result": null, "message": ...}` errors."""

from __future__ import annotations

from .mindie import MindIEDialect


class SiliconstormDialect(MindIEDialect):
    name = "siliconstorm"
