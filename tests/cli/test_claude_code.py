"""Claude Code (npm `@anthropic-ai/claude-code`) through the proxy's `/v1/messages`, in front of the built-in mock: a
whole Bash-tool turn.

`make test-cli` installs the CLI into .venv/cli and runs these (`pytest -m cli`); the normal suite leaves them out.
The binary is taken from $CLAUDE_BIN, else .venv/cli/node_modules/.bin/claude, else PATH; without it they skip.

The prompt carries a `[mock:call_tool=Bash {...}]` directive: the mock answers with a call to Claude Code's `Bash`
tool whose command writes a marker file; Claude Code runs it and sends the result back, and the mock's next answer
quotes it, which `claude -p` prints. Claude Code asks for adaptive thinking, so on the DeepSeek upstream (thinking
mode) the second request only succeeds when the thinking block Claude Code sends back reaches DeepSeek as the tool-call
turn's `reasoning_content`. Claude Code runs with a fresh HOME and config dir, telemetry, error reporting, update
checks and non-essential traffic off, and every proxy variable pointing at a closed loopback port.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.clis import cli_binary, cli_marks
from tests.conftest import Mock, Proxy

CLAUDE = cli_binary("claude")
pytestmark = cli_marks(CLAUDE, "claude")


def run_claude(proxy: Proxy, tmp: Path, prompt: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    home, work = tmp / "home", tmp / "work"
    home.mkdir()
    work.mkdir()
    dead = "http://127.0.0.1:9"  # nothing listens there: any request that is not for the proxy fails at once
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "CLAUDE_CONFIG_DIR": str(home / ".claude"),
           "ANTHROPIC_BASE_URL": proxy.url, "ANTHROPIC_API_KEY": "sk-client-key",
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
           "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1", "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
           "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "ALL_PROXY": dead, "NO_PROXY": "127.0.0.1,localhost",
           "NO_COLOR": "1"}
    assert CLAUDE is not None
    argv = [CLAUDE, "-p", "--model", "claude-sonnet-4-5", "--allowedTools", "Bash", "--max-turns", "4", prompt]
    proc = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=180)
    return proc, work


@pytest.mark.parametrize("dialect", ["openai", "mindie", "deepseek"])
def test_claude_code_runs_a_bash_tool_through_the_proxy(start_mock: Callable[..., Mock],
                                                        start_proxy: Callable[..., Proxy], tmp_path: Path,
                                                        dialect: str) -> None:
    mock = start_mock(dialect)
    proxy = start_proxy(mock=mock)
    marker = f"claude-marker-{uuid.uuid4().hex[:12]}"
    arguments = json.dumps({"command": f"echo {marker} > marker.txt && cat marker.txt",
                            "description": "Write the marker file"})
    proc, work = run_claude(proxy, tmp_path, f"Write the marker file. [mock:call_tool=Bash {arguments}]")
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    # the command really ran, in Claude Code's working directory ...
    assert (work / "marker.txt").read_text().strip() == marker, report
    # ... and the mock's final answer quotes its output (it saw the tool result Claude Code sent back)
    assert "Tool Bash returned:" in proc.stdout and marker in proc.stdout, report
    last = mock.last_request()["body"]
    tool_turns = [m for m in last["messages"] if m.get("role") == "assistant" and m.get("tool_calls")]
    assert tool_turns and tool_turns[-1]["tool_calls"][0]["function"]["name"] == "Bash", report
    if dialect == "deepseek":  # thinking mode: the reasoning the proxy signed came back as reasoning_content
        assert last.get("thinking") == {"type": "enabled"}
        assert tool_turns[-1].get("reasoning_content"), report
