"""Codex CLI (npm `@openai/codex`) through the proxy, in front of the built-in mock: a whole shell-tool turn.

`make test-cli` installs the CLI into .venv/cli and runs these (`pytest -m cli`); the normal suite leaves them out.
The binary is taken from $CODEX_BIN, else .venv/cli/node_modules/.bin/codex, else PATH; without it they skip.

The prompt carries a `[mock:call_tool=exec_command {...}]` directive: the mock answers the first request with a call
to Codex's shell tool (`exec_command`, argument `cmd`, in Codex 0.169.0: tests/fixtures/clients/README.md) whose
command writes a marker file, Codex runs it and sends the output back, and the mock's second answer quotes it.
Codex runs with a fresh CODEX_HOME, no approvals or sandbox, no update check, analytics, feedback or telemetry, and
every proxy variable pointing at a closed loopback port: only the proxy is reachable.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.clients.responses_compact import SUMMARY_PROMPT
from proxy.clients.responses_request import SUMMARY_PREFIX
from proxy.mock.textgen import REASONING
from tests.cli.clis import cli_binary, cli_marks
from tests.clients.test_responses_e2e import greeting
from tests.conftest import Mock, Proxy, wait_for

CODEX = cli_binary("codex")
pytestmark = cli_marks(CODEX, "codex")

CONFIG = """\
model = "{model}"
model_provider = "proxy"
check_for_update_on_startup = false
{top_extra}

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
trace_exporter = "none"

[model_providers.proxy]
name = "{provider_name}"
base_url = "{base_url}"
wire_api = "responses"
env_key = "DIALECT_PROXY_TEST_KEY"
request_max_retries = 0
stream_max_retries = 0
{provider_extra}
"""


def run_codex(proxy: Proxy, tmp: Path, prompt: str, model: str = "mock-gpt", options: tuple[str, ...] = (),
              provider_extra: str = "", provider_name: str = "dialect-proxy",
              top_extra: str = "") -> tuple[subprocess.CompletedProcess[str], Path]:
    home, work = tmp / "codex-home", tmp / "work"  # kept between runs: a second one may resume the session
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    (home / "config.toml").write_text(CONFIG.format(base_url=proxy.base_url, model=model, top_extra=top_extra,
                                                    provider_name=provider_name, provider_extra=provider_extra))
    dead = "http://127.0.0.1:9"  # nothing listens there: any request that is not for the proxy fails at once
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CODEX_HOME": str(home),
           "DIALECT_PROXY_TEST_KEY": "sk-client-key", "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "ALL_PROXY": dead,
           "NO_PROXY": "127.0.0.1,localhost", "NO_COLOR": "1"}
    assert CODEX is not None
    argv = [CODEX, "exec", "--strict-config", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "--color", "never", "-o", str(tmp / "last-message.txt"), *options, prompt]
    proc = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=180)
    return proc, work


DIALECTS = ["openai", "mindie", "mindie+full_text", "siliconstorm", "deepseek", "engine"]


def start(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy], dialect: str) -> tuple[Mock, Proxy]:
    name, _, mode = dialect.partition("+")
    mock = start_mock(name, full_text=bool(mode))
    return mock, start_proxy(mock=mock, **({"full_text": True} if mode else {}))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_codex_exec_runs_a_shell_tool_through_the_proxy(start_mock: Callable[..., Mock],
                                                       start_proxy: Callable[..., Proxy], tmp_path: Path,
                                                       dialect: str) -> None:
    mock, proxy = start(start_mock, start_proxy, dialect)
    marker = f"codex-marker-{uuid.uuid4().hex[:12]}"
    arguments = json.dumps({"cmd": f"echo {marker} > marker.txt && cat marker.txt"})
    proc, work = run_codex(proxy, tmp_path, f"Write the marker file. [mock:call_tool=exec_command {arguments}]")
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    # the command really ran, in Codex's working directory ...
    assert (work / "marker.txt").read_text().strip() == marker, report
    # ... and the mock's final answer quotes its output (it saw the tool result Codex sent back)
    last = (tmp_path / "last-message.txt").read_text()
    assert last.startswith("Tool exec_command returned:") and marker in last, report
    assert marker in proc.stdout, report
    stats: dict[str, Any] = mock.stats()
    assert stats["requests"] == 2 and stats["completed"] == 2, stats


@pytest.mark.parametrize("dialect", ["openai", "mindie+full_text", "deepseek"])
def test_codex_applies_a_patch_with_its_freeform_tool(start_mock: Callable[..., Mock],
                                                      start_proxy: Callable[..., Proxy], tmp_path: Path,
                                                      dialect: str) -> None:
    """With a model Codex knows (gpt-5.5) it offers `apply_patch` as a `custom` (freeform, grammar) tool: the proxy
    offers it upstream as a function with one string parameter and turns the upstream's call back into a
    `custom_tool_call` whose raw input Codex applies."""
    mock, proxy = start(start_mock, start_proxy, dialect)
    marker = f"patched-{uuid.uuid4().hex[:12]}"
    patch = f"*** Begin Patch\n*** Add File: hello.txt\n+{marker}\n*** End Patch\n"
    arguments = json.dumps({"input": patch})
    proc, work = run_codex(proxy, tmp_path, f"Add the file. [mock:call_tool=apply_patch {arguments}]", model="gpt-5.5")
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    assert (work / "hello.txt").read_text().strip() == marker, report
    assert mock.stats()["requests"] == 2, report
    # the upstream saw a function tool for it, and the call and its output came back as chat messages
    body = mock.last_request()["body"]
    offered = {t["function"]["name"]: t["function"] for t in body["tools"]}
    assert offered["apply_patch"]["parameters"]["required"] == ["input"]
    assert body["messages"][-1]["role"] == "tool"


@pytest.mark.parametrize("dialect", ["mindie+full_text", "deepseek"])
def test_codex_shows_the_models_reasoning(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy],
                                          tmp_path: Path, dialect: str) -> None:
    """Codex asks for reasoning summaries (`reasoning.summary: auto`) and shows those, not raw reasoning, unless
    told to: the upstream's reasoning comes back as the summary (docs/responses.md), so `codex exec --json` reports
    it as a reasoning item, in the tool-call turn and in the answer after it."""
    _, proxy = start(start_mock, start_proxy, dialect)
    arguments = json.dumps({"cmd": "echo thought-through"})
    proc, _ = run_codex(proxy, tmp_path, f"Think, then run it. [mock:think,call_tool=exec_command {arguments}]",
                        options=("--json",))
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    reasoning = [e["item"]["text"] for e in events
                 if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "reasoning"]
    assert reasoning and all(REASONING in text for text in reasoning), report


def test_codex_keeps_the_reasoning_out_of_view_when_told(start_mock: Callable[..., Mock],
                                                         start_proxy: Callable[..., Proxy], tmp_path: Path) -> None:
    """`model_reasoning_summary = "none"` (docs/responses.md): no summary asked for, the reasoning comes as
    reasoning_text, which Codex does not show; the turn still completes."""
    _, proxy = start(start_mock, start_proxy, "deepseek")
    arguments = json.dumps({"cmd": "echo quiet"})
    proc, _ = run_codex(proxy, tmp_path, f"Think, then run it. [mock:think,call_tool=exec_command {arguments}]",
                        options=("--json", "-c", 'model_reasoning_summary="none"'))
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert not [e for e in events if e.get("item", {}).get("type") == "reasoning"], report
    assert any(e.get("type") == "turn.completed" for e in events), report


def test_codex_runs_a_tool_turn_over_the_websocket_mode(start_mock: Callable[..., Mock],
                                                        start_proxy: Callable[..., Proxy], tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """`supports_websockets = true` on the provider: Codex speaks the Responses API's WebSocket mode
    (proxy/server/responses_socket.py) for the tool call and the answer after it."""
    mock, proxy = start(start_mock, start_proxy, "mindie+full_text")
    marker = f"codex-ws-{uuid.uuid4().hex[:12]}"
    arguments = json.dumps({"cmd": f"echo {marker}"})

    def sockets() -> list[dict[str, Any]]:  # a connection's access log line, written when it ends (Codex's exit)
        return [json.loads(r.getMessage()) for r in caplog.records if '"websocket":true' in r.getMessage()]

    with caplog.at_level("INFO", logger="dialect_proxy.access"):
        proc, _ = run_codex(proxy, tmp_path, f"Run it. [mock:call_tool=exec_command {arguments}]",
                            provider_extra="supports_websockets = true")
        report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
        assert proc.returncode == 0, report
        last = (tmp_path / "last-message.txt").read_text()
        assert last.startswith("Tool exec_command returned:") and marker in last, report
        # the tool call and the answer (Codex opens with one more, a warm-up `response.create`)
        assert mock.stats()["completed"] >= 2, report
        assert wait_for(lambda: bool(sockets()), timeout=10), report
    assert sum(s["responses"] for s in sockets()) >= 2, report


def test_codex_compacts_remotely_through_the_proxy(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy],
                                                   tmp_path: Path) -> None:
    """Codex's remote compaction (docs/responses.md "Compaction"). A provider named `OpenAI` (Codex 0.169.0 compacts
    remotely only for that name or an Azure one); a first turn with a shell-tool call; then the session resumed with a
    small `model_auto_compact_token_limit`, which the conversation so far is over (Codex's instructions alone are
    thousands of tokens, and the mock counts them). Before the new turn Codex compacts: a normal `/v1/responses`
    request ending in a `compaction_trigger` item, which must be answered with exactly one `compaction` item. Then
    it goes on from that item, and the turn completes.

    Upstream, in order: the summary request (the conversation, no tools, the summary prompt), then the new turn's
    request with the summary as input in place of the conversation it replaces (no earlier assistant turn or tool
    output is sent again). The limit is set only for the second run: compacting in the middle of the tool turn would
    resend the prompt whose `call_tool` directive the mock obeys again after every compaction (a model would read the
    summary; the mock cannot)."""
    mock, proxy = start(start_mock, start_proxy, "mindie+full_text")
    marker = f"codex-compact-{uuid.uuid4().hex[:12]}"
    arguments = json.dumps({"cmd": f"echo {marker}"})
    proc, _ = run_codex(proxy, tmp_path, f"Run it. [mock:call_tool=exec_command {arguments}]", provider_name="OpenAI")
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0 and marker in (tmp_path / "last-message.txt").read_text(), report
    first = len(mock.requests())
    assert first == 2, report  # the tool call and the answer quoting its output: no compaction yet

    proc, _ = run_codex(proxy, tmp_path, "Is it done? [mock:chunks=3]", provider_name="OpenAI",
                        options=("-c", "model_auto_compact_token_limit=500", "resume", "--last"))
    requests = [r["body"] for r in mock.requests()][first:]
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}\nupstream:\n" + \
        "\n".join(json.dumps([(m["role"], str(m.get("content"))[:60]) for m in b["messages"]])[-800:] for b in requests)
    assert proc.returncode == 0, report
    assert "context compacted" in proc.stderr + proc.stdout, report
    assert (tmp_path / "last-message.txt").read_text().strip() == "tok0 tok1 tok2", report  # the turn completed
    assert len(requests) == 2, report
    asked, then = requests
    # the summary request: the conversation so far (the tool turn included), no tools, the summary prompt last
    assert asked["messages"][-1] == {"role": "user", "content": SUMMARY_PROMPT} and not asked.get("tools"), report
    assert marker in json.dumps(asked["messages"]) and any(m["role"] == "tool" for m in asked["messages"]), report
    # the new turn: the summary (the mock's answer to the summary request) as a user message, then the new prompt
    summaries = [m["content"] for m in then["messages"] if m["role"] == "user"
                 and str(m["content"]).startswith(SUMMARY_PREFIX)]
    assert summaries == [SUMMARY_PREFIX + greeting("mindie")], report
    assert then["messages"][-1] == {"role": "user", "content": "Is it done? [mock:chunks=3]"}, report
    assert not [m for m in then["messages"] if m["role"] in ("assistant", "tool")], report
    assert then.get("tools"), report  # a normal turn again: Codex's tools are offered
