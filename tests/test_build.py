"""The build this process and its children run (proxy/build.py): pure Python in `make test`, the compiled modules
in `make test-compiled`, and each says which it is."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest

from proxy import __version__
from proxy.build import BUILD
from proxy.hub.pipeline import Pipeline
from tests.conftest import EXPECTED_BUILD, serve_process


def test_the_suite_runs_the_build_it_expects() -> None:
    assert BUILD == EXPECTED_BUILD
    compiled = not hasattr(Pipeline.feed, "__code__")  # a compiled method has no bytecode
    assert compiled == (EXPECTED_BUILD == "mypyc")


def test_version_and_healthz_name_the_build(start_mock) -> None:
    for argv in (["--version"], ["serve", "--version"]):  # the second is `docker run IMAGE --version`
        out = subprocess.run([sys.executable, "-m", "proxy", *argv], capture_output=True, text=True, timeout=60,
                             check=True).stdout
        assert out.strip() == f"dialect-proxy {__version__} ({EXPECTED_BUILD})"
    with serve_process(["--upstream-url", start_mock("openai").url, "--upstream-dialect", "openai"]) as url:
        assert httpx.get(url + "/healthz", timeout=5).json() == {"status": "ok", "version": __version__,
                                                                 "build": EXPECTED_BUILD}


def _compiled_list() -> list[str]:
    """setup.py's COMPILED and the spokes its SPOKES pattern adds, read without running setup.py (which would start a
    build)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    values = {}
    for node in ast.parse(root.joinpath("setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("COMPILED", "SPOKES"):
            values[getattr(node.targets[0], "id", "")] = ast.literal_eval(node.value)
    assert set(values) == {"COMPILED", "SPOKES"}, "setup.py has no COMPILED list or SPOKES pattern"
    listed = list(values["COMPILED"])
    spokes = sorted(str(p.relative_to(root)) for p in root.glob(values["SPOKES"]))
    return listed + [s for s in spokes if s not in listed]


def test_the_compiled_list_names_modules_that_exist_and_no_async_generators() -> None:
    """A renamed module must not silently drop out of the compiled build (setup.py would fail only there), and a
    module gaining an async generator (which mypyc cannot compile) must leave the list."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    listed = _compiled_list()
    assert len(listed) == len(set(listed)) > 30
    for name in listed:
        source = root / name
        assert source.is_file(), name
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.AsyncFunctionDef):
                yields = [n for n in ast.walk(node) if isinstance(n, (ast.Yield, ast.YieldFrom))]
                assert not yields, f"{name}: async generator {node.name}"
    assert "proxy/errors.py" not in listed  # subclassed by other modules: a compiled class cannot be


# Dataclasses of compiled modules made once, at start-up or per configured route: their generated `__init__` (which
# runs interpreted even compiled) costs nothing per request.
_BUILT_AT_START = {"proxy/dialects/probing.py": {"ProbeListing", "ProbeInfo"},  # once per `dialect-proxy probe`
                   "proxy/dialects/mapping.py": {"Range", "DialectMapping"}, "proxy/hub/params.py": {"Refusal"},
                   "proxy/gateway/routing.py": {"Route"},
                   "proxy/gateway/keys.py": {"KeyPolicy", "KeyFile"},  # read from the key file, at start or change
                   "proxy/gateway/limits.py": {"LimitSettings"},
                   "proxy/dialects/engine_metrics.py": {"EngineMetricNames"},  # once per spoke, at import
                   "proxy/settings.py": {"ReplicaSettings", "UpstreamSettings", "ClientSettings", "ServerSettings",
                                         "Settings", "Setting", "Declared", "Given"}}


def test_dataclasses_made_per_request_write_out_their_init() -> None:
    """A dataclass's generated `__init__` is made by `dataclasses` with exec and runs interpreted in the compiled
    build (about 8x the time of a written-out one, docs/speed.md): one made per request or per event writes its own."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    generated = set()
    for name in _compiled_list():
        for node in ast.walk(ast.parse((root / name).read_text())):
            if isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                if not any(isinstance(b, ast.FunctionDef) and b.name == "__init__" for b in node.body):
                    generated.add((name, node.name))
    allowed = {(module, cls) for module, classes in _BUILT_AT_START.items() for cls in classes}
    assert generated <= allowed, sorted(generated - allowed)


def test_no_behaviour_forks_on_the_build() -> None:
    """The pure install and the compiled image run the same code: the build is only ever reported (/healthz,
    --version, dialect_proxy_build_info), never compared to choose a branch (docs/decisions.md "Speed")."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent / "proxy"
    forks = [str(path.relative_to(root.parent)) for path in root.rglob("*.py")
             if re.search(r"\bBUILD\s*[!=]=|[!=]=\s*BUILD\b|\bif\s+(not\s+)?BUILD\b", path.read_text())]
    assert forks == []
    reporters = sorted(str(path.relative_to(root.parent)) for path in root.rglob("*.py")
                       if "from proxy.build import BUILD" in path.read_text())
    assert reporters == ["proxy/__main__.py", "proxy/metrics/definitions.py", "proxy/server/app.py"]


def test_a_compiled_request_runs_no_interpreted_proxy_code(start_mock, start_proxy, tmp_path) -> None:
    """In the compiled build, a request of each client dialect, whole and streamed, through an OpenAI and a MindIE
    upstream, with a key under limits (the in-process counters) and passed through to vLLM's own Responses and
    Messages routes, runs no function of proxy/ interpreted (the mock's aside): a module of the request path left out
    of setup.py's COMPILED would run every request at the interpreter's pace, unnoticed by every other test."""
    import os
    import threading

    if EXPECTED_BUILD != "mypyc":
        pytest.skip("the compiled build only (make test-compiled)")
    ours = f"{os.sep}proxy{os.sep}"
    seen: set[str] = set()

    def hook(frame: Any, event: str, arg: Any) -> None:  # compiled functions make no frame, so never come here
        if event == "call":
            code = frame.f_code
            if ours in code.co_filename and f"{ours}mock{os.sep}" not in code.co_filename:
                seen.add(f"{code.co_filename.rsplit(ours, 1)[1]}:{code.co_name}")

    threading.setprofile(hook)  # the threads started from now on: the proxies' and the mocks'
    try:
        keys = tmp_path / "keys.yaml"
        keys.write_text("team-a:\n  key: sk-a\n  requests_per_minute: 1000\n  tokens_per_minute: 1000000\n"
                        "  max_concurrent: 8\n  tokens_per_day: 10000000\n")
        proxies = [start_proxy(mock=start_mock("openai")), start_proxy(mock=start_mock("mindie")),
                   start_proxy(mock=start_mock("mindie"), server={"api_keys_file": str(keys)}),
                   start_proxy(mock=start_mock("vllm"), passthrough=["responses", "messages"])]
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    requests = [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}),
        ("/v1/responses", {"model": "m", "input": "Hi"}),
        ("/v1/messages", {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}),
    ]

    def run() -> None:
        for proxy in proxies:
            for path, body in requests:
                for stream in (False, True):
                    got = httpx.post(proxy.url + path, json={**body, "stream": stream}, timeout=30,
                                     headers={"Authorization": "Bearer sk-a"})
                    assert got.status_code == 200, got.text
                    assert got.content.strip()

    run()  # the first requests may import or build what later ones reuse (a warm proxy is what is measured)
    seen.clear()
    run()
    # Not a request's: the key file's watcher, a task of its own that looks at the file once a second.
    seen.discard("server/appstate.py:_watch_keys")
    assert sorted(seen) == []
