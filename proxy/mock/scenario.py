"""Scenario directives: how a request picks the mock's behaviour.

The text of the last user message (or the `prompt` of a completion request) may carry directives such as
`[mock:chunks=8]`, `[mock:think]` or `[mock:code=701,status=402]`. Several may appear, in one bracket separated by
commas or in several brackets. Keys are case-insensitive; unknown keys are ignored. See README.md for the table.
`call_tool` may carry JSON arguments after the tool name (`[mock:call_tool=shell {"command": ["ls"]}]`): the JSON
object is read whole, commas and brackets included.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

_OPEN = re.compile(r"\[mock:", re.IGNORECASE)
_CALL_TOOL = re.compile(r"\s*call_tool\s*(?:=\s*([^\s,\]{]*))?\s*", re.IGNORECASE)
_JSON = json.JSONDecoder()
_R1_NAME = re.compile(r"(?i)(^|[^a-z0-9])r1([^a-z0-9]|$)")
_THINK_FLAGS = ("think", "think_close_only", "think_unclosed")


@dataclass(frozen=True)
class Scenario:
    """The directives of one request: key -> value ("" for a bare flag such as `[mock:think]`).

    tool_call and reply are not typed by the client: they are what `call_tool` resolves to against the request
    (toolcall.py). tool_call: answer with one call to this tool, (name, arguments as a JSON text). reply: answer with
    this text instead of the default reply.
    """

    flags: dict[str, str] = field(default_factory=dict)
    tool_call: tuple[str, str] | None = None
    reply: str | None = None

    def has(self, key: str) -> bool:
        return key in self.flags

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.flags.get(key, default)

    def num(self, key: str, default: int | None = None, *, lo: int = 0, hi: int = 1 << 30) -> int | None:
        """The value as an int clamped to [lo, hi]; `default` when absent, empty or not a number."""
        raw = self.flags.get(key)
        if raw is None or raw == "":
            return default
        try:
            value = int(float(raw))
        except ValueError:
            return default
        return max(lo, min(hi, value))

    def seconds(self, key: str, default: float = 0.0, *, hi_ms: int = 120_000) -> float:
        """A `*_ms` directive as seconds (clamped to 120 s)."""
        ms = self.num(key, None, lo=0, hi=hi_ms)
        return default if ms is None else ms / 1000.0


EMPTY = Scenario()


def parse(text: str) -> Scenario:
    """All `[mock:...]` directives in `text` (a bracket that is never closed counts for nothing)."""
    if "[mock:" not in text.lower():
        return EMPTY
    flags: dict[str, str] = {}
    pos = 0
    while (match := _OPEN.search(text, pos)) is not None:
        bracket, pos = _bracket(text, match.end())
        flags.update(bracket or {})
    return Scenario(flags) if flags else EMPTY


def _bracket(text: str, pos: int) -> tuple[dict[str, str] | None, int]:
    """The directives of one bracket whose contents start at `pos`, and the position after its `]`
    (None and the end of the text when it is never closed)."""
    flags: dict[str, str] = {}
    end = len(text)
    while pos < end:
        call = _CALL_TOOL.match(text, pos)
        if call is not None and (call.end() == end or text[call.end()] in ",]{" or call.group(1) is not None):
            value, pos = call.group(1) or "", call.end()
            if pos < end and text[pos] == "{":
                try:
                    args, stop = _JSON.raw_decode(text, pos)
                except ValueError:
                    args, stop = None, pos
                if isinstance(args, dict):
                    value = f"{value} {text[pos:stop]}"
                pos = stop
            flags["call_tool"] = value
            stop = _next_separator(text, pos)  # anything else up to the next `,` or `]` is ignored
        else:
            stop = _next_separator(text, pos)
            key, _, value = text[pos:stop].strip().partition("=")
            key = key.strip().lower()
            if key:
                flags[key] = value.strip()
        if stop >= end:
            return None, end
        pos = stop + 1
        if text[stop] == "]":
            return flags, pos
    return None, end


def _next_separator(text: str, pos: int) -> int:
    """Index of the next `,` or `]` at or after `pos` (len(text) when there is none)."""
    comma, close = text.find(",", pos), text.find("]", pos)
    found = [i for i in (comma, close) if i >= 0]
    return min(found) if found else len(text)


def content_text(content: Any) -> str:
    """A message's text: the string itself, or the concatenated `text` parts of a list content."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def from_chat(body: Any) -> Scenario:
    """Directives of a chat request: those of the last message with role `user`; when it has none, those of the
    latest earlier user message of the same turn that has some (clients such as Codex put context messages around
    the prompt). A turn ends at an assistant message without tool calls, so a new question without directives after
    a finished answer gets the plain default reply."""
    if not isinstance(body, dict):
        return EMPTY
    messages = body.get("messages")
    if not isinstance(messages, list):
        return EMPTY
    last_user = next((i for i in range(len(messages) - 1, -1, -1)
                      if isinstance(messages[i], dict) and messages[i].get("role") == "user"), None)
    if last_user is None:
        return _forced_tool_choice(body, EMPTY)
    sc = parse(content_text(messages[last_user].get("content")))
    if sc.flags:
        return _forced_tool_choice(body, sc)
    for message in reversed(messages[:last_user]):
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "assistant" and not message.get("tool_calls"):
            break
        if role == "user" and (sc := parse(content_text(message.get("content")))).flags:
            return _forced_tool_choice(body, sc)
    return _forced_tool_choice(body, EMPTY)


def _forced_tool_choice(body: dict[str, Any], sc: Scenario) -> Scenario:
    """`tool_choice: "required"` (or a named function) with `tools`: a real server must call a tool, so the mock
    does, as `[mock:tool_calls]` would."""
    choice = body.get("tool_choice")
    forced = choice == "required" or (isinstance(choice, dict) and choice.get("type") == "function")
    if not forced or not body.get("tools") or any(sc.has(f) for f in ("tool_calls", "tool_calls_noindex", "call_tool")):
        return sc
    named = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(named, dict) and isinstance(named.get("name"), str):
        # One named tool: called with arguments its schema accepts, as a model made to call it does (toolcall.py).
        return Scenario({**sc.flags, "call_tool": named["name"]})
    if len(body["tools"]) == 1:  # `required` with one tool: that one, as above (a client's own JSON tool)
        return Scenario({**sc.flags, "call_tool": ""})
    return Scenario({**sc.flags, "tool_calls": ""})


# What `wrong_json` answers instead of the JSON asked for: JSON, but neither an object nor valid for any object schema.
WRONG_JSON = '["not", "what", "was", "asked"]'


def wrong_json(sc: Scenario, body: Any) -> bool:
    """Whether this answer is to be wrong JSON (`[mock:wrong_json]`): `wrong_json=always` every time; `wrong_json` or
    `wrong_json=N` while fewer than N (default 1) assistant turns follow the last user message, so that a request asked
    again after a wrong answer gets a right one."""
    value = sc.get("wrong_json")
    if value is None:
        return False
    if value.strip().lower() == "always":
        return True
    wanted = sc.num("wrong_json", 1, lo=0, hi=100) or 1
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return True
    answered = 0
    for message in reversed(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "user":
            break
        answered += role == "assistant"
    return answered < wanted


def offers_tools(body: dict[str, Any]) -> bool:
    """Whether a chat request lets the model call a tool: a non-empty `tools`, and a `tool_choice` other than `none`
    (OpenAI's Chat Completions reference, which every chat dialect here follows: with `none` "the model will not call
    any tool")."""
    tools = body.get("tools")
    return isinstance(tools, list) and bool(tools) and body.get("tool_choice") != "none"


def no_tools_no_calls(body: Any, sc: Scenario) -> Scenario:
    """A chat request that offers no tools is never answered with a tool call, whatever the directives say: a model
    can only call a tool it was given. The tool-call directives (`tool_calls`, `tool_calls_noindex`, a `call_tool`
    resolved to a call) then count for nothing and the answer is text. This matters where a directive of an earlier
    user message of the turn still counts (from_chat) but the request is one without tools, such as a client's own
    summary request (Codex's remote compaction), or for server-wide directives. A `call_tool` that quotes tool results
    (toolcall.py) is text and stays."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or offers_tools(body):
        return sc
    if sc.tool_call is None and not sc.has("tool_calls") and not sc.has("tool_calls_noindex"):
        return sc
    flags = {key: value for key, value in sc.flags.items() if key not in ("tool_calls", "tool_calls_noindex")}
    return Scenario(flags, None, sc.reply)


def from_prompt(body: Any) -> Scenario:
    """Directives of a completion request: its `prompt` (a string or a list whose strings are joined)."""
    if not isinstance(body, dict):
        return EMPTY
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = "".join(p for p in prompt if isinstance(p, str))
    return parse(prompt) if isinstance(prompt, str) else EMPTY


def r1_thinking(body: Any, sc: Scenario) -> Scenario:
    """An R1-named model on a server without a reasoning parser (MindIE, vLLM): its chat template puts `<think>` in
    the prompt, so the model always reasons and ends the reasoning with a lone `</think>` (docs/upstreams.md "MindIE
    Server"). `[mock:think]` / `[mock:think_unclosed]` keep that form (no opening tag). No thinking with
    `chat_template_kwargs.enable_thinking: false`, `[mock:no_think]`, or a reasoning parser (`reasoning_field`)."""
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or not _R1_NAME.search(model) or sc.has("reasoning_field") or sc.has("no_think"):
        return sc
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False and not any(map(sc.has, _THINK_FLAGS)):
        return sc
    return replace(sc, flags={**sc.flags, "think_close_only": ""})  # a resolved call_tool (toolcall.py) kept
