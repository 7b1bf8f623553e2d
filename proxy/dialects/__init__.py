"""Dialect registry: name -> implementation (uvicorn's explicit-registry style)."""

from __future__ import annotations

from .base import Dialect
from .deepseek import DeepSeekDialect
from .engine import EngineDialect
from .mindie import MindIEDialect
from .openai import OpenAIDialect
from .siliconstorm import SiliconstormDialect

DIALECTS: dict[str, type[Dialect]] = {
    "openai": OpenAIDialect,
    "deepseek": DeepSeekDialect,
    "mindie": MindIEDialect,
    "siliconstorm": SiliconstormDialect,
    "engine": EngineDialect,
}


def get_dialect(name: str) -> Dialect:
    return DIALECTS[name]()


__all__ = ["DIALECTS", "Dialect", "get_dialect"]
