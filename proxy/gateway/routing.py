"""Model name -> upstream.

A client's model name is looked up, in order: an alias of some upstream (`aliases: {gpt-4o: DeepSeek-R1}` routes
`gpt-4o` there and sends `DeepSeek-R1`), a name in some upstream's `models`, then the first upstream whose
`models` has `"*"` (the default route, which passes the name through unchanged). Nothing matches: 404.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from proxy.errors import ProxyError
from proxy.settings import UpstreamSettings

_WILD_CACHE: Final = 1024  # model names of the default route remembered


@dataclass(frozen=True, slots=True)
class Route:
    upstream: UpstreamSettings
    upstream_model: str


class Router:
    def __init__(self, upstreams: tuple[UpstreamSettings, ...]) -> None:
        self._exact: dict[str, Route] = {}
        self._default: UpstreamSettings | None = None
        self._defaults: list[UpstreamSettings] = []  # every upstream with "*", in order (one per kind routes)
        # The default route's Routes by model name, made once each (compiled, a dataclass's generated `__init__`
        # runs interpreted); a bounded cache, as clients choose the names.
        self._wild: dict[str, Route] = {}
        # Aliases first so that an alias wins over a same-named model of another upstream.
        for u in upstreams:
            for client_name, upstream_name in u.aliases.items():
                self._exact.setdefault(client_name, Route(u, upstream_name))
        for u in upstreams:
            for m in u.models:
                if m == "*":
                    self._defaults.append(u)
                    if self._default is None:
                        self._default = u
                else:
                    self._exact.setdefault(m, Route(u, m))

    def resolve(self, model: str) -> Route:
        route = self._exact.get(model)
        if route is not None:
            return route
        if self._default is not None:
            route = self._wild.get(model)
            if route is None:
                if len(self._wild) >= _WILD_CACHE:
                    self._wild.clear()
                route = self._wild[model] = Route(self._default, model)
            return route
        raise ProxyError(
            f"The model `{model}` does not exist or is not served by this proxy "
            f"(configured: {', '.join(sorted(self._exact)) or 'none'}).",
            404,
            code="model_not_found",
            param="model",
        )

    def resolve_kind(self, model: str, kind: str) -> Route:
        """The route of `model` for a request of `kind` (chat, embeddings, rerank): its own upstream, which must
        serve that kind (400 naming what it serves), else the first default route ("*") whose upstream serves it,
        else 404."""
        route = self._exact.get(model)
        if route is not None:
            served = served_kinds(route.upstream)
            if kind not in served:
                raise ProxyError(
                    f"The model `{model}` is served by the upstream `{route.upstream.name}`, which serves "
                    f"{', '.join(served)} models, not {kind}.", 400, code="model_kind_mismatch", param="model")
            return route
        for u in self._defaults:
            if kind in served_kinds(u):
                return self.resolve(model) if u is self._default else Route(u, model)
        raise ProxyError(
            f"The model `{model}` does not exist or is not served by this proxy as a {kind} model "
            f"(configured: {', '.join(sorted(self._exact)) or 'none'}).", 404, code="model_not_found", param="model")

    def configured_models(self) -> list[str]:
        """Client-visible names: configured models and aliases (not "*")."""
        return list(self._exact)


def served_kinds(u: UpstreamSettings) -> tuple[str, ...]:
    """What the upstream's models do: its `kinds` (settings built by hand may leave them empty: chat alone)."""
    return u.kinds or ("chat",)
