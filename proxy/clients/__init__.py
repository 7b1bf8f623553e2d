"""Client-dialect registry: name -> implementation (the APIs clients speak to us; proxy/clients/base.py), found by
declaration: every `ClientDialect` subclass with a `name` that a module of this package defines is one (a new client
spoke is its module(s) and its test file).

A client spoke decodes its requests into the hub form and encodes hub events into its own events and final object.
It may import: proxy.errors, proxy.settings, the hub, the upstream-dialect registry's client-facing helpers
(`dialect_usage_fields`), the state stores as types. Never the endpoint, the front end, an upstream spoke's module or
the gateway: a client dialect with a WebSocket mode declares it (`ClientDialect.websocket`), and the transport
(proxy/server/responses_socket.py) calls the endpoint."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Final

from proxy.clients.base import ClientCall, ClientDialect, Encoder


def _discover() -> dict[str, type[ClientDialect[Any]]]:
    found: dict[str, type[ClientDialect[Any]]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.ispkg or info.name == "base" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, ClientDialect) and value.__module__ == module.__name__:
                name = getattr(value, "name", None)
                if isinstance(name, str):
                    if name in found:
                        raise ImportError(f"two client dialects are named {name!r}: {found[name]} and {value}")
                    found[name] = value
    return found


CLIENT_DIALECTS: Final[dict[str, type[ClientDialect[Any]]]] = _discover()

__all__ = ["CLIENT_DIALECTS", "ClientCall", "ClientDialect", "Encoder"]
