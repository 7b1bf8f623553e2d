"""In-process micro benchmark of the request checks (proxy/clients/validate.py) on the large bodies that agent clients
send.

    python tests/bench/micro_validate.py [--rounds 7]

Three bodies of ~90–120 KB, built here the way the clients shape them: a Codex CLI-like Responses request (~40
input items: messages, reasoning, function_call / function_call_output; ~20 function tools whose parameters are
nested JSON schemas), a Claude Code-like Messages request (~40 messages of content blocks: text, thinking,
tool_use, tool_result; ~15 tools) and a Chat Completions request (system/user/assistant tool_calls/tool messages,
~20 tools). Each row is the decode-time validation of one request as the proxy does it: `check_depth` on the parsed
body (proxy/endpoint/inference.py `_parse`), then `check_types` with the client spoke's compiled table (Responses:
proxy/ clients/responses.py, Chat: proxy/clients/chat.py; the Messages spoke has its own checks, so only the depth
bound). "before" is the algorithm this replaced, kept as the reference of tests/test_validate_equivalence.py; "after" is
proxy/clients/validate.py. Prints µs per request: the fastest over `rounds` alternating rounds (the machine is shared).
Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from micro import measure  # noqa: E402  (tests/bench/micro.py, next to this script)

from proxy.clients.chat import CHAT_FIELDS  # noqa: E402
from proxy.clients.responses import RESPONSES_FIELDS  # noqa: E402
from proxy.clients.validate import FieldTable, check_depth, check_types, compile_table  # noqa: E402
from tests.test_validate_equivalence import ref_check_depth, ref_check_types, ref_compile_table  # noqa: E402

WORDS = ("the file function returns value test error path config module request stream token build run check "
         "list update import class method parse line output input result server client cache index query").split()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def schema(rng: random.Random, props: int, depth: int = 0) -> dict[str, Any]:
    """A tool's JSON schema as agent clients send them: typed properties with descriptions, enums, arrays of
    objects, nested objects (a few levels)."""
    properties: dict[str, Any] = {}
    for i in range(props):
        name = f"{rng.choice(WORDS)}_{i}"
        kind = rng.random()
        if depth < 2 and kind < 0.08:
            properties[name] = {**schema(rng, 3, depth + 1), "description": text(rng, 30)}
        elif depth < 2 and kind < 0.16:
            properties[name] = {"type": "array", "description": text(rng, 30), "items": schema(rng, 3, depth + 1)}
        elif kind < 0.3:
            properties[name] = {"type": "string", "enum": [rng.choice(WORDS) for _ in range(4)],
                                "description": text(rng, 8)}
        elif kind < 0.4:
            properties[name] = {"type": ["integer", "null"], "minimum": 0, "description": text(rng, 8)}
        elif kind < 0.45:
            properties[name] = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                                "description": text(rng, 8)}
        else:
            properties[name] = {"type": rng.choice(["string", "boolean", "number"]), "description": text(rng, 40)}
    return {"type": "object", "properties": properties, "required": sorted(properties)[: props // 2],
            "additionalProperties": False}


def arguments(rng: random.Random) -> dict[str, Any]:
    return {"command": ["bash", "-lc", text(rng, 8)], "workdir": "/repo", "timeout_ms": 10000,
            "justification": text(rng, 6)}


def codex_responses(rng: random.Random) -> dict[str, Any]:
    """Codex CLI's shape: instructions, a long input of message/reasoning/function_call/function_call_output items,
    function tools with strict JSON schemas."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": text(rng, 300)}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text(rng, 200)},
                                                        {"type": "input_text", "text": text(rng, 60)}]},
    ]
    for turn in range(10):
        call_id = f"call_{turn:04d}{rng.randrange(10**8):08d}"
        items.append({"type": "reasoning", "id": f"rs_{turn}", "summary": [{"type": "summary_text",
                                                                            "text": text(rng, 30)}],
                      "content": None, "encrypted_content": "gAAAAB" + "x" * 600})
        items.append({"type": "function_call", "id": f"fc_{turn}", "name": "shell", "call_id": call_id,
                      "arguments": orjson.dumps(arguments(rng)).decode()})
        items.append({"type": "function_call_output", "call_id": call_id,
                      "output": orjson.dumps({"output": text(rng, 250), "metadata": {"exit_code": 0,
                                                                                     "duration_seconds": 0.4}}
                                             ).decode()})
        items.append({"type": "message", "role": "assistant", "id": f"msg_{turn}",
                      "content": [{"type": "output_text", "text": text(rng, 60), "annotations": []}]})
    tools = [{"type": "function", "name": f"tool_{i}", "description": text(rng, 60), "strict": False,
              "parameters": schema(rng, 6)} for i in range(20)]
    return {"model": "gpt-5-codex", "instructions": text(rng, 1200), "input": items, "tools": tools,
            "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "medium", "summary": "auto"},
            "store": False, "stream": True, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "0199a7c0-1b2c-7d3e-8f40-123456789abc", "text": {"verbosity": "medium"}}


def claude_code_messages(rng: random.Random) -> dict[str, Any]:
    """Claude Code's shape: a system prompt of text blocks with cache_control, turns of text/thinking/tool_use and
    tool_result blocks, tools with input_schema."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": text(rng, 200)},
        {"type": "text", "text": text(rng, 80), "cache_control": {"type": "ephemeral"}}]}]
    for turn in range(19):
        tool_id = f"toolu_{turn:02d}{rng.randrange(10**12):012d}"
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": text(rng, 40), "signature": "EqQBCkYIBxgCKkB" + "y" * 200},
            {"type": "text", "text": text(rng, 30)},
            {"type": "tool_use", "id": tool_id, "name": rng.choice(["Bash", "Read", "Edit", "Grep"]),
             "input": {"command": text(rng, 10), "description": text(rng, 6), "options": {"timeout": 120000}}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id,
             "content": [{"type": "text", "text": text(rng, 220)}], "is_error": False}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": text(rng, 40),
                                                  "cache_control": {"type": "ephemeral"}}]})
    tools = [{"name": f"Tool{i}", "description": text(rng, 120), "input_schema": {
        **schema(rng, 6), "$schema": "http://json-schema.org/draft-07/schema#"}} for i in range(15)]
    return {"model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": True,
            "system": [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
                       {"type": "text", "text": text(rng, 1300), "cache_control": {"type": "ephemeral"}}],
            "messages": messages, "tools": tools, "metadata": {"user_id": "user_abc_account_def_session_123"},
            "thinking": {"type": "enabled", "budget_tokens": 10000}, "temperature": 1}


def chat_completions(rng: random.Random) -> dict[str, Any]:
    """A big Chat Completions request with tools: system prompt, user turns, assistant tool_calls, tool results."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": text(rng, 1300)},
                                      {"role": "user", "content": [{"type": "text", "text": text(rng, 200)}]}]
    for turn in range(13):
        call_id = f"call_{turn:04d}{rng.randrange(10**8):08d}"
        messages.append({"role": "assistant", "content": text(rng, 40), "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "shell", "arguments": orjson.dumps(arguments(rng)).decode()}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text(rng, 280)})
        messages.append({"role": "user", "content": text(rng, 20)})
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": text(rng, 60),
                                               "parameters": schema(rng, 6), "strict": False}} for i in range(20)]
    return {"model": "gpt-4.1", "messages": messages, "tools": tools, "tool_choice": "auto",
            "parallel_tool_calls": True, "stream": True, "stream_options": {"include_usage": True},
            "temperature": 0.2, "max_completion_tokens": 8192}


SMALL_CHAT = {"model": "m", "messages": [{"role": "system", "content": "You are terse."},
                                         {"role": "user", "content": "Say hello in one word."}],
              "stream": True, "max_tokens": 64, "temperature": 0.7}


def bodies() -> dict[str, tuple[bytes, FieldTable | None]]:
    """name -> (the body's bytes, the field table its spoke checks; None: the depth bound only)."""
    rng = random.Random(14)
    return {"Responses (Codex-like)": (orjson.dumps(codex_responses(rng)), RESPONSES_FIELDS),
            "Messages (Claude Code-like)": (orjson.dumps(claude_code_messages(rng)), None),
            "Chat Completions with tools": (orjson.dumps(chat_completions(rng)), CHAT_FIELDS),
            "small chat (for comparison)": (orjson.dumps(SMALL_CHAT), CHAT_FIELDS)}


def census(value: Any) -> tuple[int, int, int]:
    """(containers, leaves, depth) of a parsed body."""
    if isinstance(value, dict | list):
        kids = [census(v) for v in (value.values() if isinstance(value, dict) else value)]
        return 1 + sum(k[0] for k in kids), sum(k[1] for k in kids), 1 + max((k[2] for k in kids), default=0)
    return 0, 1, 0


def runners(raw: bytes, fields: FieldTable | None, depth: Callable[..., None], types: Callable[..., None],
            compile: Callable[..., Any]) -> dict[str, Callable[[], None]]:
    """"both": what one request costs; "depth", "types": each check alone."""
    body = orjson.loads(raw)
    table = compile(fields) if fields is not None else None
    size = {"size": len(raw)} if depth is check_depth else {}  # as proxy/endpoint/inference.py `_parse` calls it

    def both() -> None:
        depth(body, **size)
        if table is not None:
            types(body, table)

    out = {"both": both, "depth": lambda: depth(body, **size)}
    if table is not None:
        out["types"] = lambda: types(body, table)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    cases: dict[tuple[str, str], dict[str, Callable[[], None]]] = {}
    print("decode-time validation (check_depth + check_types; each alone below), fastest request of "
          f"{args.rounds} alternating rounds")
    for name, (raw, fields) in bodies().items():
        containers, leaves, depth = census(orjson.loads(raw))
        print(f"  {name}: {len(raw) / 1024:.1f} KiB, {containers} objects/arrays, {leaves} scalars, depth {depth}")
        before = runners(raw, fields, ref_check_depth, ref_check_types, ref_compile_table)
        after = runners(raw, fields, check_depth, check_types, compile_table)
        for part in before:
            cases[name, part] = {"before": before[part], "after": after[part]}
    best: dict[tuple[str, str, str], float] = {}
    for _ in range(args.rounds):
        for (name, part), pair in cases.items():
            for which, run in pair.items():
                us = measure(run, 1, budget=0.1 if part == "both" else 0.05)
                best[name, part, which] = min(best.get((name, part, which), us), us)
    print(f"{'':<44}{'before':>10}{'after':>10}{'ratio':>8}")
    for name, part in cases:
        before_us, after_us = best[name, part, "before"], best[name, part, "after"]
        label = name if part == "both" else f"  {part} alone"
        print(f"{label:<44}{before_us:>7.1f} µs{after_us:>7.1f} µs{after_us / before_us:>8.2f}")


if __name__ == "__main__":
    main()
