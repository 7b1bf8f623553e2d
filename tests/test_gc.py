"""The proxy leaves no reference cycles behind a request, and a serving process tunes its garbage collector
(proxy/server/runtime.py): both keep the collector off the hot path.

A cycle of the proxy's own objects (a closure that calls itself, a timer bound to its owner) outlives its request
until a collection finds it; with the collector's first generation set to run rarely, such garbage would pile up.
These requests go through real servers on loopback (a mock upstream, the proxy) with the official SDK; every
object the collector then finds unreachable is checked for being the proxy's.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import types
from typing import Any

import openai
import pytest

from tests.conftest import Mock, Proxy


def _ours(obj: Any) -> bool:
    """An object the proxy's code made: an instance of one of its classes, one of its functions or coroutines."""
    if isinstance(obj, types.FunctionType | types.MethodType):
        return str(getattr(obj, "__module__", "")).startswith("proxy.")
    if isinstance(obj, types.CoroutineType | types.AsyncGeneratorType | types.GeneratorType):
        code = getattr(obj, "cr_code", None) or getattr(obj, "ag_code", None) or getattr(obj, "gi_code", None)
        return code is not None and "/proxy/" in code.co_filename and "/proxy/mock/" not in code.co_filename
    module = type(obj).__module__
    return module.startswith("proxy.") and not module.startswith("proxy.mock")


def cycles_left_by(requests: Any, proxy: Proxy) -> list[str]:
    """The names of the proxy's objects that `requests()` (run once to warm up, once measured) left in reference
    cycles: what the collector then finds unreachable."""
    requests()  # warm: first-use caches, pools
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        requests()
        proxy.close_clients()
        gc.collect()
        ours = [o for o in gc.garbage if _ours(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return sorted({getattr(o, "__qualname__", type(o).__qualname__) for o in ours})


def _requests(proxy: Proxy) -> None:
    client = proxy.client()
    for stream in (True, False):
        for _ in range(3):
            if stream:
                chunks = client.chat.completions.create(
                    model="m", stream=True, messages=[{"role": "user", "content": "hi [mock:chunks=8]"}])
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                answer = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi [mock:chunks=8]"}])
                assert answer.choices[0].message.content
    # An upstream error and a stream cut by the upstream: the error paths too.
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "[mock:error=503]"}])
    with pytest.raises(openai.APIError):
        cut = [{"role": "user", "content": "x [mock:chunks=8][mock:raw_timeout=3]"}]
        for _ in client.chat.completions.create(model="m", stream=True, messages=cut):
            pass


@pytest.mark.parametrize("dialect", ["openai", "mindie"])
def test_requests_leave_no_cycles_of_ours(start_mock: Any, start_proxy: Any, dialect: str) -> None:
    mock: Mock = start_mock(dialect, full_text=dialect == "mindie")
    proxy: Proxy = start_proxy(mock=mock, aliases={"m": "mock-model"}, full_text=dialect == "mindie")
    names = cycles_left_by(lambda: _requests(proxy), proxy)
    assert not names, f"reference cycles of the proxy's objects after its requests: {names}"


def test_serving_process_freezes_start_up_objects_and_collects_young_ones_rarely() -> None:
    """`tune_gc` (what `serve`, each worker and the demo run once the app has started): start-up objects frozen, the
    first generation's threshold raised. Run in a child process, so this test process keeps its own collector."""
    code = """
import gc, json, threading, time
from proxy.server.app import create_app
from proxy.settings import build_settings
from tests.conftest import ServerThread
before = gc.get_threshold()
settings = build_settings(config={"upstreams": [{"name": "u", "dialect": "openai", "url": "http://127.0.0.1:9"}]},
                          environ={})
srv = ServerThread(create_app(settings, tune_gc=True)).start()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
srv.stop()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    from proxy.server.runtime import GEN0_THRESHOLD

    assert result["before"][0] < GEN0_THRESHOLD
    assert result["after"][0] == GEN0_THRESHOLD
    assert result["after"][1:] == result["before"][1:]
    assert result["frozen"] > 10_000  # the modules, settings and app: out of every collection's way
