"""What a serving process loads: the modules of rare paths stay out of it (docs/speed.md, "Resident memory")."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A fresh interpreter: what building the command line and the app imports, as `dialect-proxy serve` does.
SERVE_IMPORTS = """
import sys
from proxy.__main__ import parser
from proxy.server.app import create_app
parser().parse_args(["serve"])
print(" ".join(sorted(sys.modules)))
"""


def test_serve_does_not_load_the_mock_upstreams() -> None:
    done = subprocess.run([sys.executable, "-c", SERVE_IMPORTS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "proxy.server.app" in loaded
    assert [m for m in loaded if m.startswith("proxy.mock.")] == []


def test_the_mock_package_still_gives_its_names() -> None:
    import proxy.mock

    assert proxy.mock.DEFAULT_DIALECT in proxy.mock.DIALECTS
    assert callable(proxy.mock.create_app) and callable(proxy.mock.run)
    with pytest.raises(AttributeError):
        proxy.mock.no_such_name  # noqa: B018
