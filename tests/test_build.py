"""The build this process and its children run (proxy/build.py): pure Python in `make test`, the compiled modules
in `make test-compiled`, and each says which it is."""

from __future__ import annotations

import subprocess
import sys

import httpx

from proxy import __version__
from proxy.build import BUILD
from proxy.pipeline import Pipeline
from tests.conftest import EXPECTED_BUILD, serve_process


def test_the_suite_runs_the_build_it_expects() -> None:
    assert BUILD == EXPECTED_BUILD
    compiled = not hasattr(Pipeline.feed, "__code__")  # a compiled method has no bytecode
    assert compiled == (EXPECTED_BUILD == "mypyc")


def test_version_and_healthz_name_the_build(start_mock) -> None:
    out = subprocess.run([sys.executable, "-m", "proxy", "--version"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert out.strip() == f"dialect-proxy {__version__} ({EXPECTED_BUILD})"
    with serve_process(["--upstream-url", start_mock("openai").url, "--upstream-dialect", "openai"]) as url:
        assert httpx.get(url + "/healthz", timeout=5).json() == {"status": "ok", "version": __version__,
                                                                 "build": EXPECTED_BUILD}
