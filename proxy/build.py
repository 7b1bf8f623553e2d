"""Which build of the package this process runs: `python` (every default install) or `mypyc` (the request path's
modules compiled, when setup.py is asked to). /healthz, `--version` and the build_info metric report it."""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from importlib.util import find_spec


def _build() -> str:
    spec = find_spec("proxy.hub.pipeline")  # one of setup.py's COMPILED, found without importing it
    origin = spec.origin if spec is not None else None
    return "mypyc" if origin is not None and origin.endswith(tuple(EXTENSION_SUFFIXES)) else "python"


BUILD = _build()
