"""`call_tool`: answer with a call to a tool the request offers, then quote what the tool returned.

`[mock:call_tool]`, `[mock:call_tool=NAME]` or `[mock:call_tool=NAME {"json": "arguments"}]` resolves, against the
chat request that carries it, into what the generation says (`Scenario.tool_call` / `Scenario.reply`):
  * the last message is a user message: one call to NAME (default: the first tool in `tools`; a request that offers
    no tools gets no call at all: scenario.no_tools_no_calls)
    with the given arguments, or arguments made up from the tool's JSON schema (`example`);
  * the last message is a tool result: a text answer that quotes the result(s) after the last assistant message,
    so that a test sees the tool really ran and the client's agent loop ends;
  * anything else (an assistant prefix): the directive does nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from proxy.mock.scenario import WRONG_JSON, Scenario, content_text, from_chat, wrong_json

FALLBACK_TOOL = "get_weather"
FALLBACK_ARGUMENTS = '{"city": "Paris", "unit": "celsius"}'
QUOTE_LIMIT = 1000  # characters of each tool result quoted

# plausible strings for well-known property names (anything else is "mock")
_STRINGS = {
    "cmd": "echo hello from the mock", "command": "echo hello from the mock", "script": "echo hello from the mock",
    "city": "Paris", "location": "Paris", "country": "France", "unit": "celsius", "language": "en",
    "path": "README.md", "file": "README.md", "file_path": "README.md", "filename": "README.md",
    "url": "http://127.0.0.1/", "query": "mock", "q": "mock", "name": "mock", "id": "mock-1",
}
_ARGV_NAMES = ("cmd", "command", "argv", "args")


def chat_scenario(body: Any) -> Scenario:
    """The scenario of a chat request: its directives (`scenario.from_chat`), with `call_tool` resolved."""
    return resolve(body, from_chat(body))


def resolve(body: Any, sc: Scenario) -> Scenario:
    raw = sc.get("call_tool")
    if raw is None or not isinstance(body, dict):
        return sc
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return sc
    role = messages[-1].get("role")
    if role == "user" or (role in ("tool", "function") and _forced(body)):
        # (a forced tool is called again after its result: a client that asks again after invalid arguments)
        name, arguments = _call(body, raw)
        return replace(sc, tool_call=(name, WRONG_JSON if wrong_json(sc, body) else arguments))
    if role in ("tool", "function"):
        return replace(sc, reply=_quote(messages))
    return sc


def _forced(body: dict[str, Any]) -> bool:
    choice = body.get("tool_choice")
    return isinstance(choice, dict) and choice.get("type") == "function"


def _call(body: dict[str, Any], raw: str) -> tuple[str, str]:
    name, _, given = raw.strip().partition(" ")
    offered = offered_tools(body)
    name = name or next(iter(offered), FALLBACK_TOOL)
    if given.strip():
        return name, given.strip()
    if name not in offered and name == FALLBACK_TOOL:
        return name, FALLBACK_ARGUMENTS
    schema = offered.get(name) or {}
    return name, orjson.dumps(example(schema, root=schema)).decode()


def offered_tools(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> JSON schema of the `parameters` of every function tool in the request, in order."""
    out: dict[str, dict[str, Any]] = {}
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else {}
    return out


def example(schema: Any, name: str = "", *, root: Any = None, depth: int = 0) -> Any:
    """A plausible value of the right type for `schema`: an object gets its required properties only; `default`,
    `const` and the first `enum` value win; local `$ref`s are followed; `anyOf`/`oneOf` take the first non-null
    branch."""
    if not isinstance(schema, dict) or depth > 8:
        return _string(name)
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return example(_follow(root, ref), name, root=root, depth=depth + 1)
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            usable = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")] or options
            return example(usable[0], name, root=root, depth=depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        names = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
        return {key: example(props.get(key), key, root=root, depth=depth + 1) for key in names}
    if kind == "array":
        items = schema.get("items")
        if name.lower() in _ARGV_NAMES and (not isinstance(items, dict) or items.get("type") in (None, "string")):
            return ["echo", "hello from the mock"]
        count = schema.get("minItems")
        count = min(count, 3) if isinstance(count, int) and count > 1 else 1
        return [example(items, name, root=root, depth=depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        value = 1
        if _is_number(schema.get("minimum")):
            value = schema["minimum"]
        elif _is_number(schema.get("exclusiveMinimum")):
            value = schema["exclusiveMinimum"] + 1
        if _is_number(schema.get("maximum")) and value > schema["maximum"]:
            value = schema["maximum"]
        return int(value) if kind == "integer" else value
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string(name)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _string(name: str) -> str:
    return _STRINGS.get(name.lower(), "mock")


def _follow(root: Any, ref: str) -> Any:
    """A local JSON pointer (`#/$defs/Thing`) into `root`; None when it does not resolve."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _quote(messages: list[Any]) -> str:
    """`Tool NAME returned: OUTPUT` for every tool result after the last assistant message."""
    names: dict[str, str] = {}
    results: list[Any] = []
    for message in reversed(messages):
        if not isinstance(message, dict):
            continue
        if message.get("role") in ("tool", "function"):
            results.append(message)
            continue
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(call.get("id"), str):
                    names[call["id"]] = str(fn.get("name", ""))
        break
    parts = []
    for message in reversed(results):
        name = names.get(str(message.get("tool_call_id")), "") or str(message.get("name") or "tool")
        text = content_text(message.get("content"))
        if len(text) > QUOTE_LIMIT:
            text = text[:QUOTE_LIMIT] + "…"
        parts.append(f"Tool {name} returned: {text}")
    return "\n".join(parts)
