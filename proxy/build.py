"""Which build of the package this process runs: `python` (every default install) or `mypyc` (the request path's
modules compiled, when setup.py is asked to). /healthz, `--version` and the build_info metric report it."""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from importlib.util import find_spec
from typing import TYPE_CHECKING


def _build() -> str:
    spec = find_spec("proxy.hub.pipeline")  # one of setup.py's COMPILED, found without importing it
    origin = spec.origin if spec is not None else None
    return "mypyc" if origin is not None and origin.endswith(tuple(EXTENSION_SUFFIXES)) else "python"


BUILD = _build()


if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:
    def mypyc_attr(*attrs, **settings):
        """mypyc's class attributes (`acyclic=True`: no cyclic garbage collection for the class's instances) mean
        nothing to the interpreter: mypy_extensions, which defines them, is a build dependency only (setup.py)."""
        return lambda cls: cls
