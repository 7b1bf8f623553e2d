"""The built-in fake upstreams: real HTTP servers speaking each upstream dialect, for demos and tests.

Independent of the proxy's own translation code by design (see proxy/mock/README.md for the directives): imports
nothing of the proxy outside proxy/mock, so a bug in a spoke cannot hide in a mock that shares it.

`DIALECTS`, `create_app` and `run` load the mocks (proxy/mock/server.py imports every dialect's) on first use: the
command line names the default dialect in its help, and `serve` must not carry a dozen mock modules for that
(docs/speed.md, "Resident memory").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.mock.server import DIALECTS, create_app, run

__all__ = ["DEFAULT_DIALECT", "DIALECTS", "create_app", "run"]

# The dialect `dialect-proxy mock` and `dialect-proxy demo` serve unless told otherwise: the upstream this project
# was first written for.
DEFAULT_DIALECT = "mindie"


def __getattr__(name: str) -> Any:
    if name in ("DIALECTS", "create_app", "run"):
        from proxy.mock import server

        return getattr(server, name)
    raise AttributeError(f"module 'proxy.mock' has no attribute {name!r}")
