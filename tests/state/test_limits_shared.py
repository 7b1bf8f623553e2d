"""Per-key limits exact across processes: three `dialect-proxy serve` processes sharing one real redis-server on
loopback, in front of a mock MindIE. The token-limit run is short here (a 10 s window, the limit scaled to it);
`make test-limits` runs the issue's two minutes with the 60 s window and tokens_per_minute 2000
(LIMITS_RUN_SECONDS, LIMITS_WINDOW, LIMITS_TPM)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.conftest import Mock, RedisServer, serve_process

RUN_SECONDS = float(os.environ.get("LIMITS_RUN_SECONDS", "20"))
WINDOW = float(os.environ.get("LIMITS_WINDOW", "10"))
TPM = int(os.environ.get("LIMITS_TPM", str(round(2000 * WINDOW / 60))))
CHAT = {"model": "DeepSeek-R1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}


@contextlib.contextmanager
def proxies(n: int, mock: Mock, redis_url: str, keys: Path, *extra: str) -> Iterator[list[str]]:
    args = ["--upstream-url", mock.url, "--upstream-dialect", "mindie", "--log-level", "warning", "--state-store",
            redis_url, "--api-keys-file", str(keys), "--limits-window", str(WINDOW), "--limits-processes", str(n),
            *extra]
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(serve_process(args)) for _ in range(n)]


def post(url: str, key: str, body: dict[str, Any] = CHAT) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json=body, timeout=30)


def test_three_processes_are_one_limiter(start_mock: Callable[..., Mock], redis_url: str, tmp_path: Path) -> None:
    mock = start_mock("mindie")
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"""
counted:
  key: sk-r
  requests_per_minute: 10
tokens:
  key: sk-t
  tokens_per_minute: {TPM}
other: sk-o
""")
    created = keys_cli(redis_url, "create", "team-k", "--requests-per-minute", "100", "--models", "DeepSeek-*")
    key = created.stdout.strip()
    assert key.startswith("sk-dp-") and key not in keys_cli(redis_url, "show", "team-k").stdout
    with proxies(3, mock, redis_url, keys, "--api-keys-store", "true") as urls:
        requests_exact(urls)
        token_limit_holds(urls)
        revoked_everywhere_within_a_second(urls, keys)
        assert {post(url, key).status_code for url in urls} == {200}
        assert post(urls[0], key, {**CHAT, "model": "qwen"}).status_code == 403
        usage = json.loads(keys_cli(redis_url, "usage", "team-k").stdout)
        assert usage["tokens_day"] > 0
        keys_cli(redis_url, "revoke", "team-k")
        revoked = time.monotonic()
        pending = set(urls)
        while pending and time.monotonic() - revoked < 5:
            pending = {url for url in pending if post(url, key).status_code != 401}
        assert not pending and time.monotonic() - revoked <= 1.0
    assert "team-k" not in keys_cli(redis_url, "list").stdout


def keys_cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "proxy", "keys", "--state-store", redis_url, *args],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done


def requests_exact(urls: list[str]) -> None:
    """15 requests at once, spread over the three processes: exactly 10 admitted."""
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda i=i: statuses.append(post(urls[i % 3], "sk-r").status_code))
               for i in range(15)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(statuses) == [200] * 10 + [429] * 5
    remaining = {post(url, "sk-r").headers["x-ratelimit-remaining-requests"] for url in urls}
    assert remaining == {"0"}  # every process sees the same count


def token_limit_holds(urls: list[str]) -> None:
    """8 openai SDK callers over the three processes for RUN_SECONDS: in any window, the tokens of the answers
    admitted in it stay within the limit plus one request's worth, and the limit is used (not starved)."""
    done: list[tuple[float, float, int]] = []  # (sent, answered, tokens the mock reported)
    lock = threading.Lock()
    stop = time.monotonic() + RUN_SECONDS

    def caller(i: int) -> None:
        client = openai.OpenAI(base_url=urls[i % 3] + "/v1", api_key="sk-t", max_retries=0, timeout=30)
        while time.monotonic() < stop:
            sent = time.monotonic()
            try:
                reply = client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
            except openai.RateLimitError:
                time.sleep(0.2)
                continue
            assert reply.usage is not None
            with lock:
                done.append((sent, time.monotonic(), reply.usage.total_tokens))
        client.close()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RUN_SECONDS + 60)
    biggest = max(tokens for _, _, tokens in done)
    worst = 0
    for start, _, _ in done:  # every answer that was both sent and answered inside [start, start + WINDOW)
        inside = sum(tokens for sent, answered, tokens in done if sent >= start and answered < start + WINDOW)
        worst = max(worst, inside)
    assert worst <= TPM + biggest, (worst, TPM, biggest)
    total = sum(tokens for _, _, tokens in done)
    print(f"token limit run: {len(done)} answers, {total} tokens in {RUN_SECONDS:g} s; the fullest {WINDOW:g} s held "
          f"{worst} tokens (limit {TPM}, largest request {biggest})")
    assert total >= 0.5 * TPM * RUN_SECONDS / WINDOW, (total, TPM)  # the limit is used, not starved


def revoked_everywhere_within_a_second(urls: list[str], keys: Path) -> None:
    assert {post(url, "sk-o").status_code for url in urls} == {200}
    text = keys.read_text().replace("other: sk-o\n", "")
    keys.write_text(text)
    os.utime(keys, (time.time() + 5, time.time() + 5))  # a new modification time, whatever the clock's grain
    revoked = time.monotonic()
    pending = set(urls)
    while pending and time.monotonic() - revoked < 5:
        pending = {url for url in pending if post(url, "sk-o").status_code != 401}
    assert not pending and time.monotonic() - revoked <= 1.0


def test_redis_killed_mid_run(start_mock: Callable[..., Mock], start_redis: Callable[..., RedisServer],
                              tmp_path: Path) -> None:
    """limits_fail open: still served, each process on its share, /readyz says so; closed: 503 at once. Nothing
    hangs; when Redis is back the open one counts there again."""
    mock = start_mock("mindie")
    srv = start_redis()
    keys = tmp_path / "keys.yaml"
    keys.write_text("team:\n  key: sk-a\n  requests_per_minute: 300\n")
    with proxies(1, mock, srv.url, keys, "--limits-fail", "open") as (open_url,), \
            proxies(1, mock, srv.url, keys, "--limits-fail", "closed") as (closed_url,):
        assert post(open_url, "sk-a").status_code == 200 and post(closed_url, "sk-a").status_code == 200
        srv.kill()
        started = time.monotonic()
        assert [post(open_url, "sk-a").status_code for _ in range(3)] == [200] * 3
        closed = post(closed_url, "sk-a")
        assert closed.status_code == 503 and closed.json()["error"]["code"] == "limits_unavailable"
        assert time.monotonic() - started < 5  # nothing hung
        ready = httpx.get(open_url + "/readyz", timeout=10).json()
        assert ready["limits"]["failing_open"] is True
        metrics = httpx.get(open_url + "/metrics", timeout=10).text
        assert 'dialect_proxy_limits_fail_open_total{key="team"} 3.0' in metrics
        srv.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "failing_open" in httpx.get(open_url + "/readyz", timeout=10).json()[
                "limits"]:
            post(open_url, "sk-a")
            time.sleep(0.3)
        assert "failing_open" not in httpx.get(open_url + "/readyz", timeout=10).json()["limits"]
        assert post(closed_url, "sk-a").status_code == 200
