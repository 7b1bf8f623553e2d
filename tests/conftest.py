"""Real servers on loopback ports: the built-in mock upstream and the proxy, each a uvicorn server in a thread; a real
redis-server for the state store (`redis_url`, `start_redis`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from proxy.server.app import create_app
from proxy.server.frontend import frontend_options
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

    def requests(self) -> list[dict[str, Any]]:
        """The mock's most recent inference requests, oldest first (as last_request shows one)."""
        data: list[dict[str, Any]] = httpx.get(self.url + "/_mock/requests", timeout=5).json()
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


def answers(url: str) -> Callable[[], bool]:
    """For wait_for: whether a GET of `url` answers 200 now (a probe such as /healthz or /readyz)."""
    def probe() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    return probe


# The build the proxy's processes must run: `python` here, `mypyc` when `make test-compiled` runs the suite on a
# compiled copy of the tree (tests/compiled_tree.py), so that no test passes on the wrong one.
EXPECTED_BUILD = os.environ.get("PROXY_EXPECT_BUILD", "python")


@contextlib.contextmanager
def serve_process(args: list[str], environ: dict[str, str] | None = None,
                  preexec_fn: Callable[[], None] | None = None) -> Iterator[str]:
    """`python -m proxy serve ARGS` in its own process (multiprocess metrics, `--workers`): yields its base URL once
    /healthz answers; afterwards SIGTERM, and its stderr must hold no traceback. `environ` is added to this process's
    environment without its DIALECT_PROXY_* and PROMETHEUS_MULTIPROC* variables; `preexec_fn` runs in the child
    before it starts (e.g. lowering a resource limit). Its output goes to a file (a pipe nobody reads would fill up
    and stop it): the log (stdout, where a logged exception's traceback goes too, proxy/server/logs.py) and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIALECT_PROXY_", "PROMETHEUS_MULTIPROC"))}
    env.update(environ or {})
    port = free_port()
    with tempfile.TemporaryFile() as output:
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(port), *args], env=env,
                                stdout=output, stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
        url = f"http://127.0.0.1:{port}"
        try:
            assert wait_for(answers(url + "/healthz"), timeout=30), "the proxy did not start"
            assert httpx.get(url + "/healthz", timeout=5).json()["build"] == EXPECTED_BUILD
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        output.seek(0)
        out = output.read()
    assert b"Traceback" not in out, out.decode()


# ---------------------------------------------------------------------------------------------------------------
# A real redis-server (Debian package redis-server; `make system-deps` installs it) on a free loopback port, without
# persistence. `redis_url` (an emptied server shared by the session) is what most tests want; `start_redis` gives a
# test its own server to kill or restart.

REDIS_SERVER = shutil.which("redis-server")
REDIS_MISSING = "redis-server is not installed (Debian package redis-server; `make system-deps` installs it)"


class RedisServer:
    def __init__(self, directory: Path, *args: str) -> None:
        self.directory = directory
        self.args = args  # extra redis-server options, e.g. ("--requirepass", "secret")
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> RedisServer:
        """Start (or restart, on the same port once it has one). Returns when the server answers PING."""
        assert REDIS_SERVER and not self.running
        for _ in range(3):  # a free port can be taken before redis binds it: try another
            port = self.port or free_port()
            with open(self.directory / "redis.log", "ab") as log:
                self.proc = subprocess.Popen(
                    [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                     "--daemonize", "no", "--dir", str(self.directory), *self.args],
                    stdout=log, stderr=subprocess.STDOUT)
            if self._wait_ready(port):
                self.port = port
                return self
            self._reap()
        raise RuntimeError(f"redis-server did not start; see {self.directory / 'redis.log'}")

    def _wait_ready(self, port: int) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.running:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
                if reply.startswith((b"+PONG", b"-NOAUTH")):
                    return True
            time.sleep(0.02)
        return False

    def command(self, *args: Any, password: str | None = None) -> Any:
        import redis

        with redis.Redis(host="127.0.0.1", port=self.port, password=password, socket_timeout=5) as client:
            return client.execute_command(*args)

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to connected clients."""
        if self.proc is not None and self.running:
            self.proc.send_signal(signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        if self.proc is not None and self.running:
            self.proc.terminate()
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if not REDIS_SERVER:
        pytest.skip(REDIS_MISSING)
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield srv
    srv.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """redis://127.0.0.1:PORT/0 of a running, empty redis-server (shared by the session; FLUSHALL per test)."""
    if not redis_server.running:  # a test killed it
        redis_server.start()
    redis_server.command("FLUSHALL")
    return redis_server.url


@pytest.fixture
def start_redis(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """start_redis(*options) -> a redis-server of the test's own (to kill, restart, or run with --requirepass)."""
    if not REDIS_SERVER:
        pytest.skip(REDIS_MISSING)
    started: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        directory = tmp_path / f"redis{len(started)}"
        directory.mkdir()
        srv = RedisServer(directory, *args).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
