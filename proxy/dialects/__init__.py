"""The upstream-dialect registry: name -> spoke class, found by declaration.

Every module `proxy/dialects/<name>.py` but those every spoke shares (SHARED: `base`, the `Dialect` and
`UpstreamSession` base classes; `mapping`, the loader of mappings/<name>.yaml; the parts a spoke composes —
`error_shape`, `readiness`, `probing` — and `templates`, the chat-template heuristics) is one upstream spoke and
defines the `Dialect` subclass whose `name` is `<name>`: that class is the registry entry. Whatever lists the upstream
dialects — the names the settings accept, the probe's steps, the metrics' `dialect` label, the compiled build
(setup.py) — reads them from here, so a new spoke is its mapping, its module and its test file (docs/dialects.md
"Declared once").

A spoke may import: proxy.errors, proxy.settings, the hub (canonical form, events, SSE, params) and the stream
transforms; the gateway only as types. Never a client spoke, the endpoint, metrics or the server.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, Final

from proxy.dialects.base import Dialect

# Modules of this package that are not spokes.
SHARED: Final = frozenset({"base", "mapping", "error_shape", "readiness", "probing", "templates", "engine_metrics"})


def _discover() -> dict[str, type[Dialect]]:
    found: dict[str, type[Dialect]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.ispkg or info.name in SHARED or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        spokes = [value for value in vars(module).values() if isinstance(value, type) and issubclass(value, Dialect)
                  and value.__module__ == module.__name__ and value.name == info.name]
        if len(spokes) != 1:
            raise ImportError(f"proxy/dialects/{info.name}.py must define one Dialect subclass with name = "
                              f"{info.name!r} (found {len(spokes)})")
        found[info.name] = spokes[0]
    return found


DIALECTS: Final[dict[str, type[Dialect]]] = _discover()


def get_dialect(name: str) -> Dialect:
    return DIALECTS[name]()


def dialect_usage_fields(name: str | None) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """What `client.usage_fields: <name>` does to the usage chat clients get (None: nothing, OpenAI's fields)."""
    return DIALECTS[name].client_usage_fields() if name else None


def family(name: str) -> str:
    """The registered spoke a dialect derives from, itself if none (hosted MindIE is MindIE's wire): one detection
    cannot tell a family's members apart before a chat answer."""
    own = DIALECTS[name]
    ancestors = [cls for cls in DIALECTS.values() if cls is not own and issubclass(own, cls)]
    return min(ancestors, key=lambda cls: len(cls.__mro__)).name if ancestors else name


__all__ = ["DIALECTS", "SHARED", "Dialect", "dialect_usage_fields", "family", "get_dialect"]
