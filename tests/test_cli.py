"""The command line as a new user meets it: one-line failures (exit 2) for a taken port, help texts with examples,
dialect names in any case, the mock's own variables. Each case runs `python -m proxy` in a subprocess."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import answers, free_port, serve_process, wait_for


def cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DIALECT_PROXY_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "proxy", *argv], capture_output=True, text=True, timeout=timeout,
                          env=full_env, stdin=subprocess.DEVNULL)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("argv,flag", [
    (["mock", "--port", "{p}"], "--port"),
    (["serve", "--port", "{p}", "--upstream-url", "http://127.0.0.1:9", "--upstream-dialect", "mindie"], "--port"),
    (["demo", "--port", "{p}"], "--port"),
    (["demo", "--mock-port", "{p}"], "--mock-port"),
])
def test_a_taken_port_is_one_line_and_exit_2(taken_port: int, argv: list[str], flag: str) -> None:
    r = cli(*(a.format(p=taken_port) for a in argv))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        f"dialect-proxy: cannot listen on 127.0.0.1:{taken_port}: the port is already in use (choose another {flag})"]


def test_a_taken_port_from_the_environment(taken_port: int) -> None:
    r = cli("serve", env={"DIALECT_PROXY_PORT": str(taken_port), "DIALECT_PROXY_UPSTREAM_URL": "http://127.0.0.1:9",
                          "DIALECT_PROXY_UPSTREAM_DIALECT": "openai"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "already in use" in r.stderr


@pytest.mark.parametrize("command", ["serve", "mock", "demo", "probe"])
def test_help_has_a_description_and_an_example(command: str) -> None:
    r = cli(command, "--help")
    assert r.returncode == 0
    usage, _, rest = r.stdout.partition("\n\n")
    description = rest.split("\n\n")[0]
    assert usage.startswith("usage: dialect-proxy " + command) and len(description.split()) >= 8, r.stdout
    assert f"dialect-proxy {command} " in r.stdout.split("example", 1)[1], "an example invocation"


def test_bare_command_prints_help() -> None:
    r = cli(timeout=20)
    assert r.returncode == 0 and r.stdout.startswith("usage: dialect-proxy") and "serve" in r.stdout


def test_dialect_names_are_case_insensitive_with_did_you_mean() -> None:
    r = cli("serve", "--upstream-url", "http://127.0.0.1:9", "--upstream-dialect", "MindI", "--port", "0")
    assert r.returncode == 2 and "did you mean 'mindie'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("mock", "--dialect", "DeepSeak", "--port", "0")
    assert r.returncode == 2 and "did you mean 'deepseek'" in r.stderr


def test_mock_reads_its_own_variables_not_the_proxys(taken_port: int) -> None:
    """In a container where DIALECT_PROXY_PORT is the proxy's port, `dialect-proxy mock` keeps to
    DIALECT_PROXY_MOCK_PORT (and takes its dialect in any case); DIALECT_PROXY_MOCK_DIRECTIVES (`--directives`)
    sets its server-wide directives."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIALECT_PROXY_")}
    env.update({"DIALECT_PROXY_PORT": str(taken_port), "DIALECT_PROXY_DIALECT": "engine",
                "DIALECT_PROXY_MOCK_PORT": str(port), "DIALECT_PROXY_MOCK_DIALECT": "DeepSeek",
                "DIALECT_PROXY_MOCK_DIRECTIVES": "call_tool,delay_ms=1"})
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "mock"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    try:
        assert wait_for(answers(f"http://127.0.0.1:{port}/models"), timeout=20), \
            "the mock did not answer on DIALECT_PROXY_MOCK_PORT as deepseek"
        directives = httpx.get(f"http://127.0.0.1:{port}/_mock/directives", timeout=10).json()
        assert directives == {"call_tool": "", "delay_ms": "1"}
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert f"mock deepseek upstream on http://127.0.0.1:{port}" in out


def test_models_and_aliases_flags_route_list_and_bound_metric_labels(start_mock) -> None:
    """An env-only sidecar: DIALECT_PROXY_MODELS / DIALECT_PROXY_ALIASES route and list like a config file, and the
    `model` metric label keeps to them (anything else is `other`)."""
    mock = start_mock("mindie")
    environ = {"DIALECT_PROXY_UPSTREAM_URL": mock.url, "DIALECT_PROXY_UPSTREAM_DIALECT": "mindie",
               "DIALECT_PROXY_MODELS": "DeepSeek-R1,Qwen3-32B", "DIALECT_PROXY_ALIASES": "gpt-4o=DeepSeek-R1"}
    with serve_process([], environ) as base:
        listed = {m["id"] for m in httpx.get(base + "/v1/models", timeout=10).json()["data"]}
        assert listed == {"DeepSeek-R1", "Qwen3-32B", "gpt-4o"}
        say = [{"role": "user", "content": "hi"}]
        r = httpx.post(base + "/v1/chat/completions", json={"model": "gpt-4o", "messages": say}, timeout=10)
        assert r.status_code == 200 and mock.last_request()["body"]["model"] == "DeepSeek-R1"
        unknown = httpx.post(base + "/v1/chat/completions", json={"model": "llama", "messages": say}, timeout=10)
        assert unknown.status_code == 404
        metrics = httpx.get(base + "/metrics", timeout=10).text
        assert 'model="gpt-4o"' in metrics and 'model="llama"' not in metrics


def test_serve_logs_one_json_object_per_line(start_mock) -> None:
    """uvicorn's start-up and shutdown lines, a plain message of the proxy's and the access line: every line `serve`
    prints (stdout and stderr) is one JSON object, so a log pipeline parses one format."""
    mock = start_mock("openai")  # DeepSeek's model list path (/models) is not the OpenAI mock's: a plain info line
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIALECT_PROXY_")}
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream-url", mock.url,
                             "--upstream-dialect", "deepseek", "--upstream-name", "ds"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(answers(base + "/healthz"), timeout=30), "the proxy did not start"
        httpx.get(base + "/v1/models", timeout=10)
        httpx.post(base + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                   timeout=10)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    lines = [json.loads(line) for line in out.splitlines()]  # every line, or a JSONDecodeError names it
    assert lines and all(isinstance(line, dict) for line in lines), out
    messages = {(line.get("logger"), line.get("message")) for line in lines}
    assert ("uvicorn.error", "Application startup complete.") in messages, out
    assert ("uvicorn.error", "Application shutdown complete.") in messages, out
    assert ("dialect_proxy", "upstream ds: its model list answered HTTP 404") in messages, out
    assert any(line.get("event") == "upstream_check" for line in lines), out
    assert any(line.get("route") == "/v1/chat/completions" and line.get("status") == 502 for line in lines), out
