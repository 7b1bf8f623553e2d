"""Helpers for the mock upstream tests: a mock server in a thread, an SSE parser, request builders."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import uvicorn

from proxy.mock import create_app


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class MockServer:
    """One mock upstream in a background thread, with an httpx client pointed at it."""

    def __init__(self, dialect: str, **options: Any) -> None:
        self.dialect = dialect
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(dialect, **options), host="127.0.0.1", port=self.port, loop="uvloop",
                                http="httptools", access_log=False, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("mock server did not start")
            time.sleep(0.01)
        self.client = httpx.Client(base_url=self.url, timeout=10)

    def stop(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)

    # ----------------------------------------------------------------------------------------------- helpers
    def stats(self) -> dict[str, int]:
        data: dict[str, int] = self.client.get("/_mock/stats").json()
        return data

    def reset(self) -> None:
        self.client.post("/_mock/reset")

    def last_request(self) -> dict[str, Any]:
        data: dict[str, Any] = self.client.get("/_mock/last_request").json()
        return data

    def post(self, path: str, body: Any, **kw: Any) -> httpx.Response:
        content = body if isinstance(body, (bytes, str)) else orjson.dumps(body)
        headers = {"content-type": "application/json", **kw.pop("headers", {})}
        return self.client.post(path, content=content, headers=headers, **kw)

    def stream(self, path: str, body: Any, **kw: Any) -> tuple[httpx.Response, list[Any]]:
        """POST and read the whole SSE body: (response, events); events are parsed JSON, "[DONE]", or
        (":comment",) / ("raw", text) for anything that is not a data line."""
        resp = self.post(path, body, **kw)
        return resp, parse_sse(resp.text)

    def wait_stats(self, predicate: Callable[[dict[str, int]], bool], timeout: float = 1.0) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        stats = self.stats()
        while not predicate(stats) and time.monotonic() < deadline:
            time.sleep(0.02)
            stats = self.stats()
        return stats


def parse_sse(text: str) -> list[Any]:
    events: list[Any] = []
    for block in text.split("\n\n"):
        if not block:
            continue
        for line in block.split("\n"):
            if not line:
                continue
            if line.startswith(":"):
                events.append((":comment", line))
            elif line.startswith("data: "):
                payload = line[6:]
                if payload == "[DONE]":
                    events.append("[DONE]")
                else:
                    try:
                        events.append(orjson.loads(payload))
                    except orjson.JSONDecodeError:
                        events.append(("bad", payload))
            else:
                events.append(("raw", line))
    return events


def chat(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}
