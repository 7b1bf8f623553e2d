"""Real servers on loopback ports: the built-in mock upstream and the proxy, each a uvicorn server in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from proxy.app import create_app
from proxy.frontend import frontend_options
from proxy.settings import Settings, build_settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerThread:
    """A uvicorn server running `app` on 127.0.0.1 in a background thread (its own event loop)."""

    def __init__(self, app: Any, port: int | None = None, **config: Any) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config.setdefault("http", "httptools")
        cfg = uvicorn.Config(app, host="127.0.0.1", port=self.port, loop="uvloop", access_log=False,
                             log_level="warning", lifespan="on", **config)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve())

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextlib.contextmanager
def running(app: Any, **config: Any) -> Iterator[ServerThread]:
    srv = ServerThread(app, **config).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def servers() -> Iterator[list[ServerThread]]:
    started: list[ServerThread] = []
    yield started
    for srv in reversed(started):
        srv.stop()


class Mock:
    def __init__(self, srv: ServerThread, dialect: str) -> None:
        self.srv = srv
        self.url = srv.url
        self.dialect = dialect

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(self.url + "/_mock/stats", timeout=5).json()
        return data

    def last_request(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(self.url + "/_mock/last_request", timeout=5).json()
        return data

    def reset(self) -> None:
        httpx.post(self.url + "/_mock/reset", timeout=5)


@pytest.fixture
def start_mock(servers: list[ServerThread]) -> Callable[..., Mock]:
    def start(dialect: str = "openai", full_text: bool = False, **kw: Any) -> Mock:
        from proxy.mock import create_app as create_mock_app

        srv = ServerThread(create_mock_app(dialect, full_text=full_text, **kw)).start()
        servers.append(srv)
        return Mock(srv, dialect)

    return start


class Proxy:
    def __init__(self, srv: ServerThread, settings: Settings) -> None:
        self.srv = srv
        self.url = srv.url
        self.base_url = srv.url + "/v1"
        self.settings = settings
        self._clients: dict[str, openai.OpenAI] = {}

    def client(self, **kw: Any) -> openai.OpenAI:
        """An official SDK client, one per option set (closed with the proxy, so no socket is left behind for a
        ResourceWarning)."""
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 30)
        key = repr(sorted(kw.items()))
        if key not in self._clients:
            self._clients[key] = openai.OpenAI(base_url=self.base_url, api_key="sk-client-key", **kw)
        return self._clients[key]

    def close_clients(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    close = close_clients

    def async_client(self, **kw: Any) -> openai.AsyncOpenAI:
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 30)
        return openai.AsyncOpenAI(base_url=self.base_url, api_key="sk-client-key", **kw)


@pytest.fixture
def start_proxy(servers: list[ServerThread]) -> Iterator[Callable[..., Proxy]]:
    proxies: list[Proxy] = []

    def start(upstreams: list[dict[str, Any]] | None = None, *, mock: Mock | None = None,
              client: dict[str, Any] | None = None, server: dict[str, Any] | None = None,
              environ: dict[str, str] | None = None, **upstream_kw: Any) -> Proxy:
        if upstreams is None:
            assert mock is not None
            upstreams = [{"name": f"mock-{mock.dialect}", "dialect": mock.dialect, "url": mock.url,
                          **upstream_kw}]
        config = {"upstreams": upstreams, "client": client or {}, "server": server or {}}
        settings = build_settings(config=config, environ=environ or {})
        srv = ServerThread(create_app(settings), **frontend_options(settings.server)).start()
        servers.append(srv)
        proxy = Proxy(srv, settings)
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.close_clients()


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
