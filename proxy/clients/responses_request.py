"""A Responses API request (`POST /v1/responses`) -> the hub's Chat Completions request. Pure: the stored history
of `previous_response_id` and the stored items that `item_reference` items name are looked up by the caller
(proxy/clients/responses.py) and handed in.

    instructions                      ─▶ a leading `system` message (not carried to later turns, as OpenAI)
    input: string                     ─▶ one `user` message
    input items  message (user/system/developer/assistant; input_text, input_image, output_text, refusal parts)
                 function_call / custom_tool_call      ─▶ the assistant turn's `tool_calls` (call_id is the id)
                 function_call_output / custom_…_output ─▶ `tool` messages
                 reasoning (our sealed encrypted_content) ─▶ that assistant turn's `reasoning_content`
                 item_reference (an output item of a response stored here) ─▶ as that item
                 compaction (our sealed summary: responses_compact.py) ─▶ a `user` message holding the summary
    tools        function ─▶ function; custom (freeform) ─▶ function with one string parameter `input`;
                 namespace ─▶ its functions; hosted tools (web_search, file_search, ...) ─▶ left out, reported
    tool_choice, parallel_tool_calls, max_output_tokens (max_tokens), temperature, top_p, user,
    reasoning.effort (reasoning_effort), text.format (response_format), top_logprobs
    stream ─▶ stream + stream_options.include_usage (Responses always carries usage)

Fields that change nothing for the upstream (store, include, metadata, prompt_cache_key, client_metadata,
text.verbosity, reasoning.summary, truncation, service_tier, safety_identifier ...) are ignored, never refused;
what we cannot do (background, conversation, prompt templates, file inputs, a forced hosted tool) is a 400 that
names the parameter. docs/responses.md has the full table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from proxy.clients.signature import COMPACTION, ThinkingSigner
from proxy.errors import ClientRequestError

# Tool types a hosted OpenAI model runs itself; no upstream here can, so they are left out of the upstream request.
HOSTED_TOOLS: Final = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26", "file_search",
    "code_interpreter", "computer_use_preview", "computer_use", "image_generation", "mcp", "local_shell", "shell",
    "apply_patch", "tool_search",
})
# Requests the proxy cannot serve (they need OpenAI-side machinery).
_UNSUPPORTED: Final = {
    "background": "background responses are not supported by this proxy; leave `background` out or false",
    "conversation": "the Conversations API is not supported by this proxy; send the history in `input` or use "
                    "`previous_response_id`",
    "prompt": "prompt templates are not supported by this proxy; send the text in `instructions` and `input`",
}
# A compaction item goes upstream as a user message: the summary, introduced as what it is. A user message (not an
# assistant or system one) because the summary is followed by the work still to do: after a compaction in the middle
# of a turn the conversation may end with it, and the model must answer it (Codex does the same with its own
# summaries).
SUMMARY_PREFIX: Final = ("The conversation so far was compacted; this is the summary the model wrote of it, to carry "
                         "on from:\n\n")
# The input item Codex appends to ask for a remote compaction (responses_compact.py).
COMPACTION_TRIGGER: Final = "compaction_trigger"
CUSTOM_PARAMETERS: Final = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The raw input for this tool, as free text."}},
    "required": ["input"],
    "additionalProperties": False,
}


@dataclass(slots=True)
class ToolName:
    """One upstream function name -> what the client declared."""

    name: str
    custom: bool = False  # a freeform (`custom`) tool: arguments are {"input": "<text>"}
    namespace: str | None = None

    def __init__(self, name: str, custom: bool = False, namespace: str | None = None) -> None:
        # Written out, as proxy/hub/events.py's Delta: a dataclass's generated `__init__` runs interpreted even compiled
        # (one per tool of every request: an agent declares dozens).
        self.name = name
        self.custom = custom
        self.namespace = namespace


@dataclass(slots=True)
class Decoded:
    request: dict[str, Any]  # the hub (chat) request
    messages: list[dict[str, Any]]  # the conversation without the instructions message (stored for the next turn)
    tools: dict[str, ToolName] = field(default_factory=dict)  # upstream function name -> client tool
    ignored_tools: list[str] = field(default_factory=list)  # hosted tool types left out

    def __init__(self, request: dict[str, Any], messages: list[dict[str, Any]],
                 tools: dict[str, ToolName] | None = None, ignored_tools: list[str] | None = None) -> None:
        # Written out, as ToolName's.
        self.request = request
        self.messages = messages
        self.tools = {} if tools is None else tools
        self.ignored_tools = [] if ignored_tools is None else ignored_tools


def to_chat(body: dict[str, Any], history: list[dict[str, Any]], signer: ThinkingSigner,
            references: dict[str, dict[str, Any]] | None = None) -> Decoded:
    """`references`: item id -> the stored output item, for the request's `item_reference` items."""
    for key, why in _UNSUPPORTED.items():
        if body.get(key) not in (None, False):
            raise ClientRequestError(f"`{key}`: {why}.", param=key, code="unsupported_parameter")
    model = body["model"]
    tools, names, ignored = _tools(body.get("tools"))
    by_client = {(t.namespace, t.name): upstream for upstream, t in names.items()}
    messages = list(history)
    messages.extend(_input(body.get("input"), by_client, signer, references or {}))
    if not messages:
        raise ClientRequestError("`input` is required (a string or a non-empty list of items).", param="input")
    _check_tool_outputs(messages)
    out: dict[str, Any] = {"model": model}
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ClientRequestError("`instructions` must be a string.", param="instructions")
    out["messages"] = ([{"role": "system", "content": instructions}] if instructions else []) + messages
    if tools:
        out["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"), by_client, out)
        if choice is not None:
            out["tool_choice"] = choice
        if isinstance(body.get("parallel_tool_calls"), bool):
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
    elif isinstance(body.get("tool_choice"), dict):
        _tool_choice(body.get("tool_choice"), by_client, out)  # a forced hosted tool is refused even alone
    _sampling(body, out)
    if body.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return Decoded(out, messages, names, ignored)


# -- input items ----------------------------------------------------------------------------------------------------
def _input(value: Any, by_client: dict[tuple[str | None, str], str], signer: ThinkingSigner,
           references: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise ClientRequestError("`input` must be a string or a list of items.", param="input")
    turns = _Turns()
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise ClientRequestError(f"`{param}` must be an object.", param=param)
        kind = item.get("type") or ("message" if "role" in item else None)
        own = False  # an item of a response this proxy stored (named by an item_reference)
        if kind == "item_reference":
            item = _referenced(item, references, param)
            kind = item.get("type")
            own = True
        if kind == "message":
            turns.message(item, param)
        elif kind in ("function_call", "custom_tool_call"):
            turns.call(item, kind == "custom_tool_call", by_client, param)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            turns.output(item, param)
        elif kind == "compaction":
            turns.close({"role": "user", "content": SUMMARY_PREFIX + _summary(item, signer, param)})
        elif kind == "reasoning":
            turns.reasoning((reasoning_of(item) or None) if own else _reasoning(item, signer))
        # Else calls of hosted tools (web_search_call, ...) from another server's history: nothing an upstream here
        # can read; leaving them out keeps the conversation usable.
    return turns.out


class _Turns:
    """The chat messages of a Responses input, item by item: consecutive assistant items (text, reasoning, tool
    calls) make one assistant turn."""

    __slots__ = ("out", "pending", "turn")

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []
        self.turn: dict[str, Any] | None = None  # the assistant turn being assembled
        self.pending: str | None = None  # a verified reasoning item waiting for its assistant turn

    def assistant(self) -> dict[str, Any]:
        if self.turn is None:
            self.turn = {"role": "assistant", "content": None}
            self.out.append(self.turn)
            if self.pending is not None:
                self.turn["reasoning_content"] = self.pending
                self.pending = None
        return self.turn

    def close(self, message: dict[str, Any]) -> None:
        """A message that is no part of an assistant turn: the turn under way is over."""
        self.turn = None
        self.out.append(message)

    def message(self, item: dict[str, Any], param: str) -> None:
        role = item.get("role")
        if role == "assistant":
            text = _text(item.get("content"), param)
            msg = self.assistant()
            if text:
                msg["content"] = (msg["content"] or "") + text
            return
        if role not in ("user", "system", "developer"):
            raise ClientRequestError(f"`{param}.role` must be user, system, developer or assistant.",
                                     param=f"{param}.role")
        # Most upstreams know no `developer` role; it is the system prompt of reasoning models.
        self.close({"role": "user" if role == "user" else "system", "content": _content(item.get("content"), param)})

    def call(self, item: dict[str, Any], custom: bool, by_client: dict[tuple[str | None, str], str],
             param: str) -> None:
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise ClientRequestError(f"`{param}` needs string `call_id` and `name`.", param=param)
        upstream = by_client.get((_namespace(item), name), name)
        if custom:
            raw = item.get("input")
            arguments = orjson.dumps({"input": raw if isinstance(raw, str) else ""}).decode()
        else:
            raw = item.get("arguments")
            arguments = raw if isinstance(raw, str) else orjson.dumps(raw or {}).decode()
        self.assistant().setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function", "function": {"name": upstream, "arguments": arguments}})

    def output(self, item: dict[str, Any], param: str) -> None:
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise ClientRequestError(f"`{param}.call_id` must be a string.", param=f"{param}.call_id")
        self.close({"role": "tool", "tool_call_id": call_id, "content": _output(item.get("output"), param)})

    def reasoning(self, sealed: str | None) -> None:
        """A reasoning item (its verified text, or None when it is left out) goes with the next assistant turn, or
        with the one under way while that has neither text nor tool calls yet."""
        if sealed is None:
            return
        turn = self.turn
        if turn is not None and "tool_calls" not in turn and not turn["content"]:
            turn["reasoning_content"] = sealed
        else:
            self.turn = None
            self.pending = sealed


def _check_tool_outputs(messages: list[dict[str, Any]]) -> None:
    """A tool output must answer a call made earlier in the conversation (as OpenAI checks): an output for a call
    the model never made is a client's mistake (a lost turn, a stale `previous_response_id`), not an upstream's."""
    calls: set[str] = set()
    for message in messages:
        made = message.get("tool_calls")
        if made:
            calls.update(call["id"] for call in made)
        elif message["role"] == "tool" and message["tool_call_id"] not in calls:
            raise ClientRequestError(
                f"No tool call found for function call output with call_id {message['tool_call_id']!r}.",
                param="input", code="tool_call_not_found")


def _summary(item: dict[str, Any], signer: ThinkingSigner, param: str) -> str:
    """The summary a compaction item carries, if this proxy sealed it; else a 400. Not left out as unsealed
    reasoning is: the item stands for the whole conversation before it, which would be lost without a word."""
    sealed = item.get("encrypted_content")
    text, verified = signer.for_domain(COMPACTION).open("", sealed) if isinstance(sealed, str) else ("", None)
    if not verified or not text:
        raise ClientRequestError(
            f"`{param}.encrypted_content` is not a compaction this proxy made (or was made with another key: set "
            "client.thinking_key_env alike on every replica).", param=f"{param}.encrypted_content",
            code="invalid_encrypted_content")
    return text


def _namespace(item: dict[str, Any]) -> str | None:
    ns = item.get("namespace")
    return ns if isinstance(ns, str) and ns else None


def _content(content: Any, param: str) -> Any:
    """A user/system message's content: a string, or chat parts when it holds images."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ClientRequestError(f"`{param}.content` must be a string or a list of parts.", param=f"{param}.content")
    parts: list[dict[str, Any]] = []
    image = False
    for j, part in enumerate(content):
        where = f"{param}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise ClientRequestError(f"`{where}`: only images given by `image_url` (a URL or a data URL) are "
                                         "supported by this proxy (no `file_id`).", param=where,
                                         code="unsupported_parameter")
            image_url: dict[str, Any] = {"url": url}
            if isinstance(part.get("detail"), str) and part["detail"] != "auto":
                image_url["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image_url})
            image = True
        elif kind == "input_file":
            raise ClientRequestError(f"`{where}`: file inputs are not supported by this proxy.", param=where,
                                     code="unsupported_parameter")
        else:
            raise ClientRequestError(f"`{where}` must be an input_text or input_image part.", param=where)
    if image:
        return parts
    return "".join(p["text"] for p in parts)


def _text(content: Any, param: str) -> str:
    """An assistant message's text (output_text and refusal parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ClientRequestError(f"`{param}.content` must be a string or a list of parts.", param=f"{param}.content")
    out = []
    for part in content:
        if isinstance(part, dict):
            text = part.get("text") if part.get("type") != "refusal" else part.get("refusal")
            if isinstance(text, str):
                out.append(text)
    return "".join(out)


def _output(value: Any, param: str) -> str:
    """A tool's output: a string, or a list of parts whose text is joined (chat tool messages are text)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    if value is None:
        return ""
    return orjson.dumps(value).decode()


def _referenced(item: dict[str, Any], references: dict[str, dict[str, Any]], param: str) -> dict[str, Any]:
    item_id = item.get("id")
    if not isinstance(item_id, str) or not item_id:
        raise ClientRequestError(f"`{param}.id` must be a string.", param=f"{param}.id")
    found = references.get(item_id)
    if found is None:
        raise ClientRequestError(
            f"Item with id '{item_id}' not found (not an output item of a response stored by this proxy, expired, or "
            "created with store: false).", param=f"{param}.id", code="item_not_found")
    return found


def reasoning_of(item: dict[str, Any]) -> str:
    """The text of a reasoning item as this proxy writes it (proxy/clients/responses_events.py): its `reasoning_text`
    content, or its one `summary_text` part when the client asked for a summary."""
    parts = item.get("content") or item.get("summary")
    if not isinstance(parts, list):
        return ""
    return "".join(part["text"] for part in parts if isinstance(part, dict) and isinstance(part.get("text"), str))


def _reasoning(item: dict[str, Any], signer: ThinkingSigner) -> str | None:
    """The text of a reasoning item this proxy produced (its sealed `encrypted_content` verifies), else None:
    reasoning a client wrote or another server made is never sent upstream as the model's own."""
    sealed = item.get("encrypted_content")
    if not isinstance(sealed, str) or not sealed:
        return None
    text, verified = signer.open("", sealed)
    return text if verified and text else None


# -- tools ----------------------------------------------------------------------------------------------------------
def _tools(value: Any) -> tuple[list[dict[str, Any]], dict[str, ToolName], list[str]]:
    """(functions for the upstream, upstream name -> the client's tool, hosted tool types left out)."""
    if value is None:
        return [], {}, []
    if not isinstance(value, list):
        raise ClientRequestError("`tools` must be a list.", param="tools")
    declared, ignored = _declared(value)
    counts: dict[str, int] = {}
    for _, tool, _ in declared:
        name = tool.get("name")
        if isinstance(name, str):
            counts[name] = counts.get(name, 0) + 1
    tools: list[dict[str, Any]] = []
    names: dict[str, ToolName] = {}
    for ns, tool, param in declared:
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise ClientRequestError(f"`{param}.name` must be a non-empty string.", param=f"{param}.name")
        # A name that two namespaces share gets the namespace in front upstream (function names are flat there).
        upstream = f"{ns}__{name}" if ns is not None and counts[name] > 1 else name
        tools.append({"type": "function", "function": _function(tool, upstream)})
        names[upstream] = ToolName(name, tool["type"] == "custom", ns)
    return tools, names, ignored


def _declared(value: list[Any]) -> tuple[list[tuple[str | None, dict[str, Any], str]], list[str]]:
    """The function and custom tools, namespaces opened, as (namespace, tool, param); the hosted tool types."""
    declared: list[tuple[str | None, dict[str, Any], str]] = []
    ignored: list[str] = []
    for i, tool in enumerate(value):
        param = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in ("function", "custom"):
            declared.append((None, tool, param))
        elif kind == "namespace":
            declared += _namespace_tools(tool, param)
        elif isinstance(kind, str) and (kind in HOSTED_TOOLS or kind.startswith(("web_search", "computer_use"))):
            ignored.append(kind)
        else:
            raise ClientRequestError(f"`{param}.type` {kind!r} is not a tool type this proxy knows.",
                                     param=f"{param}.type")
    return declared, ignored


def _namespace_tools(tool: dict[str, Any], param: str) -> list[tuple[str | None, dict[str, Any], str]]:
    ns = tool.get("name")
    inner = tool.get("tools")
    if not isinstance(ns, str) or not isinstance(inner, list):
        raise ClientRequestError(f"`{param}`: a namespace needs a `name` and a list of `tools`.", param=param)
    found: list[tuple[str | None, dict[str, Any], str]] = []
    for j, t in enumerate(inner):
        where = f"{param}.tools[{j}]"
        if not isinstance(t, dict) or t.get("type") not in ("function", "custom"):
            raise ClientRequestError(f"`{where}` must be a function or custom tool.", param=where)
        found.append((ns, t, where))
    return found


def _function(tool: dict[str, Any], upstream: str) -> dict[str, Any]:
    """A function or custom tool as the upstream's function named `upstream` (a custom tool takes free text)."""
    fn: dict[str, Any] = {"name": upstream}
    description = tool.get("description")
    if tool["type"] == "custom":
        fn["description"] = _custom_description(description, tool.get("format"))
        fn["parameters"] = CUSTOM_PARAMETERS
        return fn
    if isinstance(description, str) and description:
        fn["description"] = description
    fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    if isinstance(tool.get("strict"), bool):
        fn["strict"] = tool["strict"]
    return fn


def _custom_description(description: Any, fmt: Any) -> str:
    text = description if isinstance(description, str) else ""
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        syntax = fmt.get("syntax") or "grammar"
        text += f"\n\nThe `input` must follow this {syntax} grammar:\n{fmt['definition']}"
    return text.strip() or "A tool that takes free text as input."


def _tool_choice(choice: Any, by_client: dict[tuple[str | None, str], str], out: dict[str, Any]) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if not isinstance(choice, dict):
        raise ClientRequestError("`tool_choice` must be auto, none, required or an object.", param="tool_choice")
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = choice.get("name")
        upstream = by_client.get((_namespace(choice), name)) if isinstance(name, str) else None
        if upstream is None:
            raise ClientRequestError(f"`tool_choice` names the tool {name!r}, which is not in `tools`.",
                                     param="tool_choice")
        return {"type": "function", "function": {"name": upstream}}
    if kind == "allowed_tools":
        allowed = {t.get("name") for t in choice.get("tools") or () if isinstance(t, dict)}
        if "tools" in out:
            out["tools"] = [t for t in out["tools"] if t["function"]["name"] in allowed] or out["tools"]
        mode = choice.get("mode", "auto")
        return mode if mode in ("auto", "required") else "auto"
    raise ClientRequestError(f"`tool_choice` forces the hosted tool {kind!r}, which no upstream behind this proxy "
                             "can run.", param="tool_choice", code="unsupported_parameter")


# -- sampling and format --------------------------------------------------------------------------------------------
def _sampling(body: dict[str, Any], out: dict[str, Any]) -> None:
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("user", "user"), ("top_logprobs", "top_logprobs")):
        value = body.get(src)
        if value is not None:
            out[dst] = value
    if "top_logprobs" in out:
        out["logprobs"] = True
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise ClientRequestError("`reasoning` must be an object.", param="reasoning")
        effort = reasoning.get("effort")
        if effort is not None:
            if not isinstance(effort, str):
                raise ClientRequestError("`reasoning.effort` must be a string.", param="reasoning.effort")
            out["reasoning_effort"] = effort
    text = body.get("text")
    if text is not None:
        if not isinstance(text, dict):
            raise ClientRequestError("`text` must be an object.", param="text")
        fmt = text.get("format")
        if isinstance(fmt, dict):
            kind = fmt.get("type")
            if kind == "json_object":
                out["response_format"] = {"type": "json_object"}
            elif kind == "json_schema":
                schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
                out["response_format"] = {"type": "json_schema", "json_schema": schema}
            elif kind not in (None, "text"):
                raise ClientRequestError(f"`text.format.type` {kind!r} is not text, json_object or json_schema.",
                                         param="text.format")
