"""The Vercel AI SDK (npm `ai`, `@ai-sdk/openai`, `@ai-sdk/anthropic`) through the proxy, in front of the built-in
full-text MindIE mock: tests/fixtures/clients/vercel_ai.cjs runs one scenario per call with Node and prints what the
SDK returned — text and reasoning, streamed and not, a two-step tool round trip, and a second turn that carries the
first one's messages (the Responses provider sends them as `item_reference`s, or with `store: false` the items
themselves, reasoning sealed by the proxy); the reasoning of the tool-call turn must reach the upstream again.

`make test-cli` installs the packages into .venv/cli and runs these (`pytest -m cli`); without them they skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli.clis import ROOT, cli_marks
from tests.conftest import Mock, Proxy

MODULES = ROOT / ".venv" / "cli" / "node_modules"
SCRIPT = ROOT / "tests" / "fixtures" / "clients" / "vercel_ai.cjs"
NODE = shutil.which("node")
pytestmark = cli_marks(NODE if (MODULES / "ai" / "package.json").is_file() else None, "the Vercel AI SDK")

GREETING = "Hello from the mock mindie upstream! 你好, 世界 🌍."
REASONING = "The user greets me; 先想一想 🤔 then answer politely."


def run(proxy: Proxy, scenario: str) -> dict[str, Any]:
    assert NODE is not None
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NODE_PATH": str(MODULES),
           "PROXY_URL": proxy.base_url.removesuffix("/v1"), "AI_SDK_LOG_WARNINGS": "false", "NO_COLOR": "1"}
    proc = subprocess.run([NODE, str(SCRIPT), scenario], env=env, cwd=Path(SCRIPT).parent, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in out, out
    return out


@pytest.fixture
def stack(start_mock: Callable[..., Mock], start_proxy: Callable[..., Proxy]) -> tuple[Mock, Proxy]:
    mock = start_mock("mindie", full_text=True)
    return mock, start_proxy(mock=mock, full_text=True)


@pytest.mark.parametrize("scenario", ["openai responses", "openai responses reasoning", "openai responses stateless",
                                      "openai chat", "anthropic messages"])
def test_text_tools_and_a_second_turn(stack: tuple[Mock, Proxy], scenario: str) -> None:
    mock, proxy = stack
    out = run(proxy, scenario)
    assert out["text"] == out["streamed"] == GREETING
    assert out["finish"] == out["streamFinish"] == "stop"
    assert out["usage"]["input"] > 0 and out["usage"]["output"] > 0
    # Reasoning reaches the SDK where it has a place for it: Messages thinking blocks, and Responses summaries when
    # asked for (the SDK reads no reasoning_text); its chat provider has no field for `reasoning_content`.
    shows_reasoning = scenario in ("openai responses reasoning", "openai responses stateless", "anthropic messages")
    assert (out["reasoning"], out["streamedReasoning"]) == ((REASONING, REASONING) if shows_reasoning else ("", ""))
    assert out["toolSteps"] == ["tool-calls", "stop"]
    assert out["toolText"] == "Tool weather returned: sunny in Paris"
    assert out["secondTurn"] == GREETING
    # The second turn reached the upstream with the whole first turn (Responses: by item_reference).
    messages = [m for m in mock.last_request()["body"]["messages"] if m["role"] != "system"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert messages[2]["content"] == "sunny in Paris"
    assert messages[3]["content"] == "Tool weather returned: sunny in Paris"
    assert messages[4]["content"] == "Thanks! And tomorrow?"
    if shows_reasoning:  # the reasoning came back, by reference, sealed, or as a thinking block
        assert messages[1].get("reasoning_content") == REASONING, messages[1]


FORECAST_SCHEMA = {
    "type": "object", "required": ["place", "unit", "days"], "additionalProperties": False,
    "properties": {
        "place": {"type": "object", "required": ["city", "country"],
                  "properties": {"city": {"type": "string"}, "country": {"type": "string"}}},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "array", "items": {"type": "integer"}},
        "note": {"type": "string"},
    },
}


@pytest.mark.parametrize("upstream", [("mindie", True), ("engine", False), ("deepseek", False)],
                         ids=["mindie-full-text", "engine", "deepseek"])
@pytest.mark.parametrize("scenario", ["object openai chat", "object openai responses", "object anthropic messages"])
def test_generate_object_on_upstreams_without_json_schema(start_mock: Callable[..., Mock],
                                                          start_proxy: Callable[..., Proxy], scenario: str,
                                                          upstream: tuple[str, bool]) -> None:
    """`generateObject` and `streamObject` get an object valid for their zod schema where the upstream cannot
    honour `json_schema` itself: the proxy emulates it (docs/structured-output.md)."""
    import jsonschema

    dialect, full_text = upstream
    mock = start_mock(dialect, full_text=full_text)
    model = {"deepseek": "deepseek-v4-flash", "engine": "m"}.get(dialect, "m")
    proxy = start_proxy([{"name": "up", "dialect": dialect, "url": mock.url, "full_text": full_text,
                          "aliases": {"m": model}, "models": [model]}])
    out = run(proxy, scenario)
    jsonschema.validate(out["object"], FORECAST_SCHEMA)
    jsonschema.validate(out["streamed"], FORECAST_SCHEMA)
    assert out["finish"] == "stop" and out["usage"]["output"] > 0 and "streamError" not in out
