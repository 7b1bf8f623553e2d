"""The built-in fake upstreams: real HTTP servers speaking each upstream dialect, for demos and tests.

Independent of the proxy's own translation code by design (see proxy/mock/README.md for the directives).
"""

from .server import DIALECTS, create_app, run

__all__ = ["DIALECTS", "create_app", "run"]
