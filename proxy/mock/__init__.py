"""The built-in fake upstreams: real HTTP servers speaking each upstream dialect, for demos and tests.

Independent of the proxy's own translation code by design (see proxy/mock/README.md for the directives): imports
nothing of the proxy outside proxy/mock, so a bug in a spoke cannot hide in a mock that shares it.
"""

from proxy.mock.server import DIALECTS, create_app, run

__all__ = ["DIALECTS", "create_app", "run"]
