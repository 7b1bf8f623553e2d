"""Structured output emulated for an upstream that cannot honour a client's `response_format` itself (the upstream's
`response_format: emulate`, docs/structured-output.md): the request rewrite and the check of each answer, without I/O.
The re-ask loop over upstream attempts is proxy/endpoint/structured.py.

Two ways, chosen per request from what the upstream's spoke declares it can do (`StructuredCaps`):

- **a forced tool call** (`tool`): a `json_schema` request becomes one call of a tool whose parameters are the schema,
  `strict` where the upstream's strict function calling accepts the schema; the call's arguments are the answer.
- **ask and check** (`json_mode`, `instruction`): the upstream's JSON mode where it has one, and in any case a system
  instruction that shows the schema. Used where no tool can be forced (no tool calling, a thinking mode that refuses a
  forced tool, the client's own tools in the request) and for `json_object` on an upstream without JSON mode.

A client that forces one tool of its own (`tool_choice` naming it, or `required` with that tool alone: pydantic-ai's
default output tool) asks for structured output too: the tool's parameters are the schema. Where the upstream calls
no tools for the model (`StructuredCaps.calls_tools`), that call is emulated by asking and checking, and the passing
JSON goes back as the call's arguments (`call_plan`).

Every answer is checked against the client's schema (`json_object`: only for being a JSON object) with the
`jsonschema` library; a failing one is asked again with the validation error, up to the upstream's
`structured_attempts`. No JSON that fails the check ever reaches the client.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any, Final

import jsonschema
import orjson
from jsonschema.exceptions import best_match

from proxy.errors import ClientRequestError, UpstreamError
from proxy.hub.events import Delta

TOOL: Final = "tool"
JSON_MODE: Final = "json_mode"
INSTRUCTION: Final = "instruction"

_TOOL_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FALLBACK_NAME: Final = "structured_answer"
_FENCE: Final = re.compile(r"^```[A-Za-z]*\s*\n?(.*?)\n?```$", re.DOTALL)
_JSON_OBJECT_SCHEMA: Final[dict[str, Any]] = {"type": "object"}
# The JSON Schema keywords DeepSeek's strict function calling accepts (its Tool Calls guide,
# https://api-docs.deepseek.com/guides/tool_calls): types string, number, integer, boolean, object, array, with enum
# and anyOf; every object closed (`additionalProperties: false`) with all its properties required. A schema outside
# this subset is sent without `strict` (the answer is checked either way).
_STRICT_KEYWORDS: Final = frozenset({"type", "properties", "required", "additionalProperties", "items", "enum",
                                     "anyOf", "description", "title", "$ref", "$defs", "definitions", "default"})


@dataclass(frozen=True, slots=True)
class StructuredCaps:
    """What an upstream offers for structured output (a spoke's `RequestRules.structured`, or its per-request
    `Dialect.structured_caps`): a tool call it can be forced to make, strict function calling, a JSON mode."""

    forced_tool: bool = True
    strict_tools: bool = False
    json_mode: bool = False
    calls_tools: bool = True  # False: the model calls no tools at all, so a client's forced tool is emulated too


@dataclass(frozen=True, slots=True)
class Ask:
    """What the client asked for: `json_object` or `json_schema`, with the schema (`{"type": "object"}` for
    `json_object`) and its name."""

    kind: str
    schema: dict[str, Any]
    name: str
    description: str | None


@dataclass(frozen=True, slots=True)
class Plan:
    """How one request's structured output is obtained: the ask, the way (TOOL, JSON_MODE, INSTRUCTION), whether the
    tool is strict, and how many upstream answers may be asked for."""

    ask: Ask
    way: str
    strict: bool
    attempts: int
    as_call: bool = False  # the answer is a call of the client's forced tool (`call_plan`), not content


@dataclass(slots=True)
class Reading:
    """One upstream answer as the check sees it: the candidate JSON text (None: the answer gave none — a client tool
    call, an empty answer), its reasoning, and the tool call it came in (for the re-ask)."""

    text: str | None
    reasoning: str
    call_id: str | None = None
    passthrough: list[Delta] | None = None  # the answer as it is: the client's own tools were called


class StructuredOutputFailed(UpstreamError):
    """The upstream's last allowed answer still failed the client's schema: never sent, this error is. The proxy has
    already asked `structured_attempts` times, so the client is told not to retry (an SDK's own retries would multiply
    the cost unseen; the operator sets how many answers one request may cost)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 502, code="structured_output_failed", headers={"x-should-retry": "false"})


def asked(body: dict[str, Any]) -> Ask | None:
    """The structured output a canonical request asks for (None: none, or `text`). A schema that is not a valid JSON
    Schema is the client's 400."""
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        return Ask("json_object", _JSON_OBJECT_SCHEMA, _FALLBACK_NAME, None)
    if kind != "json_schema":
        return None
    assert isinstance(fmt, dict)
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(schema, dict):
        raise ClientRequestError("`response_format.json_schema.schema` must be a JSON Schema object.",
                                 param="response_format.json_schema.schema")
    _check_schema(schema, "response_format.json_schema.schema")
    name = spec.get("name")
    name = name if isinstance(name, str) and _TOOL_NAME.match(name) else _FALLBACK_NAME
    description = spec.get("description")
    return Ask("json_schema", schema, name, description if isinstance(description, str) else None)


def _check_schema(schema: dict[str, Any], param: str) -> None:
    """A schema that is not a valid JSON Schema is the client's 400, before the upstream is asked."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ClientRequestError(f"`{param}` is not a valid JSON Schema: {e.message}", param=param) from None


def forced_call(body: dict[str, Any]) -> Ask | None:
    """The one tool a request forces — `tool_choice` naming it, or `required` with that tool alone — as an ask whose
    schema is the tool's parameters (None: no tool is forced, or the choice stays open among several)."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return None
    functions = {i: t["function"] for i, t in enumerate(tools) if isinstance(t, dict) and t.get("type") == "function"
                 and isinstance(t.get("function"), dict)}
    choice = body.get("tool_choice")
    if choice == "required" and len(tools) == 1 and functions:
        name = functions[0].get("name")
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
    else:
        return None
    index, fn = next(((i, f) for i, f in functions.items() if f.get("name") == name), (-1, None))
    if fn is None or not isinstance(name, str):
        return None
    schema = fn.get("parameters")
    schema = schema if isinstance(schema, dict) else _JSON_OBJECT_SCHEMA
    _check_schema(schema, f"tools[{index}].function.parameters")
    description = fn.get("description")
    return Ask("json_schema", schema, name, description if isinstance(description, str) else None)


def call_plan(body: dict[str, Any], caps: StructuredCaps, attempts: int) -> Plan | None:
    """The way to emulate the client's own forced tool call on a model that calls no tools (None: the upstream calls
    tools, or the request forces none): asked and checked, the answer given back as that tool's call."""
    if caps.calls_tools or "response_format" in body:
        return None
    ask = forced_call(body)
    if ask is None:
        return None
    _single_answer(body)
    return Plan(ask, JSON_MODE if caps.json_mode else INSTRUCTION, False, attempts, as_call=True)


def _single_answer(body: dict[str, Any]) -> None:
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        raise ClientRequestError("`n` above 1 cannot be combined with structured output on this upstream (it is "
                                 "emulated one answer at a time).", param="n")


def plan(body: dict[str, Any], caps: StructuredCaps, attempts: int) -> Plan | None:
    """The way to emulate what `body` asks (None: it asks for nothing, or the upstream's JSON mode is enough)."""
    ask = asked(body)
    if ask is None or (ask.kind == "json_object" and caps.json_mode):
        return None
    _single_answer(body)
    own_tools = bool(body.get("tools")) and body.get("tool_choice") != "none"
    if ask.kind == "json_schema" and caps.forced_tool and not own_tools:
        return Plan(ask, TOOL, caps.strict_tools and fits_strict(ask.schema), attempts)
    return Plan(ask, JSON_MODE if caps.json_mode else INSTRUCTION, False, attempts)


def fits_strict(schema: Any) -> bool:
    """Whether `schema` lies in the subset strict function calling accepts (`_STRICT_KEYWORDS`), every object closed
    with all its properties required."""
    if isinstance(schema, list):
        return all(fits_strict(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    if not set(schema) <= _STRICT_KEYWORDS or not _closed(schema):
        return False
    defs = schema.get("$defs") or schema.get("definitions") or {}
    if not isinstance(defs, dict):
        return False
    props = schema.get("properties")
    parts = [*(props.values() if isinstance(props, dict) else ()), *defs.values(), schema.get("items"),
             schema.get("anyOf")]
    return all(fits_strict(part) for part in parts)


def _closed(schema: dict[str, Any]) -> bool:
    """Not an object, or one closed (`additionalProperties: false`) with all its properties required."""
    props = schema.get("properties")
    if not isinstance(props, dict) and schema.get("type") != "object":
        return True
    names = set(props) if isinstance(props, dict) else set()
    return schema.get("additionalProperties") is False and set(schema.get("required") or ()) == names


# -- the request ----------------------------------------------------------------------------------------------------

def rewrite(body: dict[str, Any], plan: Plan, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The canonical request one attempt sends: the client's, without its `response_format`, as a forced tool call or
    with the instruction (and JSON mode), followed by the re-ask turns so far. Always a whole (non-stream) answer: it
    is checked whole before anything of it is sent."""
    out = {k: v for k, v in body.items() if k not in ("response_format", "stream", "stream_options")}
    if plan.as_call:  # the model calls no tools: it is asked for the forced tool's arguments instead
        for key in ("tools", "tool_choice", "parallel_tool_calls"):
            out.pop(key, None)
    out["stream"] = False
    messages = list(body.get("messages") or ())
    if plan.way == TOOL:
        out.pop("parallel_tool_calls", None)
        function: dict[str, Any] = {"name": plan.ask.name, "parameters": plan.ask.schema}
        function["description"] = plan.ask.description or "Give the answer: its arguments are the whole answer."
        if plan.strict:
            function["strict"] = True
        out["tools"] = [{"type": "function", "function": function}]
        out["tool_choice"] = {"type": "function", "function": {"name": plan.ask.name}}
    else:
        if plan.way == JSON_MODE:
            out["response_format"] = {"type": "json_object"}
        messages = _with_instruction(messages, plan.ask)
    out["messages"] = messages + history
    return out


def instruction(ask: Ask) -> str:
    """The system instruction of the ask-and-check way: the schema, shown whole."""
    what = "a JSON object" if ask.kind == "json_object" else "one JSON value valid against this JSON Schema"
    return (f"Answer with {what}, and nothing else: no prose, no code fence.\n```json\n"
            f"{orjson.dumps(ask.schema).decode()}\n```")


def _with_instruction(messages: list[Any], ask: Ask) -> list[Any]:
    text = instruction(ask)
    if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system" \
            and isinstance(messages[0].get("content"), str):
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{text}"
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def reask(plan: Plan, reading: Reading, error: str) -> list[dict[str, Any]]:
    """The turns that ask again after a failing answer: the answer as the model gave it, and the validation error."""
    if plan.way == TOOL and reading.call_id is not None:
        call = {"id": reading.call_id, "type": "function",
                "function": {"name": plan.ask.name, "arguments": reading.text or ""}}
        return [{"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": reading.call_id,
                 "content": f"Invalid arguments: {error}. Call {plan.ask.name} again with arguments that are valid "
                            "against its parameters schema."}]
    return [{"role": "assistant", "content": reading.text or ""},
            {"role": "user", "content": f"That answer is not valid: {error}. Answer again with only the JSON, valid "
                                        "against the schema given."}]


# -- the answer -----------------------------------------------------------------------------------------------------

def read(events: list[Delta], plan: Plan) -> Reading:
    """The candidate JSON of one whole answer's events (choice 0): the forced tool's arguments, or the content."""
    reasoning = "".join(e.reasoning for e in events if e.index == 0)
    content = "".join(e.content for e in events if e.index == 0)
    calls = [f for e in events if e.index == 0 and e.tool_calls for f in e.tool_calls]
    if calls and plan.way != TOOL:  # the client's own tools were called: that answer goes as it is
        return Reading(None, reasoning, passthrough=events)
    if calls:
        first = calls[0].get("index", 0)
        arguments = "".join(str((f.get("function") or {}).get("arguments") or "") for f in calls
                            if f.get("index", 0) == first)
        call_id = next((f["id"] for f in calls if isinstance(f.get("id"), str)), None)
        return Reading(arguments, reasoning, call_id or "call_structured")
    text = content.strip()
    fenced = _FENCE.match(text)
    return Reading(fenced.group(1).strip() if fenced else text, reasoning)


def check(reading: Reading, ask: Ask) -> str | None:
    """Why the reading fails the client's ask (None: it passes)."""
    if not reading.text:
        return "the answer is empty"
    try:
        value = orjson.loads(reading.text)
    except orjson.JSONDecodeError as e:
        return f"the answer is not JSON ({e})"
    if ask.kind == "json_object":
        return None if isinstance(value, dict) else "the answer is not a JSON object"
    error = best_match(jsonschema.validators.validator_for(ask.schema)(ask.schema).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"at `{where or '(root)'}`: {error.message}"


def answer_events(reading: Reading, plan: Plan) -> list[Delta]:
    """What the client gets for a reading that passed: its reasoning, then the JSON as the content, finish `stop` —
    or, for the client's own forced tool (`call_plan`), the JSON as that tool's call, finish `tool_calls`."""
    if reading.passthrough is not None:
        return reading.passthrough
    out: list[Delta] = []
    if reading.reasoning:
        out.append(Delta(0, reasoning=reading.reasoning, first=True))
    if plan.as_call:
        call = {"index": 0, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": plan.ask.name, "arguments": reading.text or ""}}
        out.append(Delta(0, tool_calls=[call], first=not reading.reasoning))
        out.append(Delta(0, finish_reason="tool_calls"))
        return out
    out.append(Delta(0, content=reading.text or "", first=not reading.reasoning))
    out.append(Delta(0, finish_reason="stop"))
    return out


def add_usage(total: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two usages added up, field by field (numbers, and the numbers of nested details)."""
    if more is None:
        return total
    if total is None:
        return dict(more)
    out = dict(total)
    for key, value in more.items():
        have = out.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(have, (int, float)):
            out[key] = have + value
        elif isinstance(value, dict) and isinstance(have, dict):
            out[key] = add_usage(have, value)
        elif key not in out:
            out[key] = value
    return out
