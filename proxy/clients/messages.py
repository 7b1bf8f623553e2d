"""The Anthropic Messages API (`POST /v1/messages`) as a client dialect: Claude Code and Anthropic SDK apps.

    Anthropic request ─▶ decode_request() ─▶ canonical chat request (+ options the encoder needs)
    Delta events ─▶ MessagesEncoder (proxy/clients/messages_encoder.py) ─▶ Anthropic SSE events or a Message

docs/messages.md has the whole mapping table and what is not supported. Choices worth knowing here:
- `role: "system"` messages inside `messages` (Claude Code sends them): those before the first turn join the
  system prompt; a later one becomes `<system-reminder>` text on the user side at its place (Claude Code's own
  form for the same content), since many chat templates refuse a system message after the first turn.
- Anthropic-defined client tools (bash, text_editor, memory) go upstream as functions with their documented input
  schemas; server tools no upstream runs (web_search, web_fetch, code_execution, tool_search, computer, ...) are
  left out and named in the `x-dialect-proxy-dropped-tools` response header. Tools with `defer_loading` go upstream
  once a `tool_reference` block names them, or at once when the request has no way to discover them.
- Thinking blocks sent back with this proxy's signature become the assistant turn's `reasoning_content` (the
  upstream session decides whether to send it); blocks without it (another server's, made up, altered) are left out
  and counted in the access log (`unverified_thinking`). proxy/clients/signature.py has the signature.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Final

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.clients import tool_ids
from proxy.clients.base import ClientDialect, Headers
from proxy.clients.messages_encoder import MessagesCall, MessagesEncoder, messages_consumer
from proxy.clients.messages_errors import error_event, error_response
from proxy.clients.messages_native import MessagesReader
from proxy.clients.ratelimit import anthropic_headers
from proxy.clients.signature import ThinkingSigner
from proxy.errors import ClientRequestError, ProxyError

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from proxy.gateway.limits import LimitView
    from proxy.hub.canonical import ChatRequest, RequestContext
    from proxy.hub.events import Answer
    from proxy.hub.sse import Event
    from proxy.settings import Settings
    from proxy.state.base import StateStore

DROPPED_TOOLS_HEADER: Final = b"x-dialect-proxy-dropped-tools"

# Anthropic effort -> OpenAI reasoning_effort (no upstream has "max": the highest it has).
EFFORTS: Final = {"low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh", "max": "xhigh"}
THINKING_TYPES: Final = ("enabled", "disabled", "adaptive", "between_tools")

# Anthropic-defined tools that the client runs: their input schemas (Anthropic documents them; the model is trained
# on them, an upstream model needs them spelled out).
_EDIT_PROPS: Final[dict[str, Any]] = {
    "path": {"type": "string", "description": "Absolute path to the file or directory."},
    "file_text": {"type": "string", "description": "Content of the file to create."},
    "old_str": {"type": "string", "description": "Exact text to replace."},
    "new_str": {"type": "string", "description": "Replacement text."},
    "insert_line": {"type": "integer", "description": "Line number after which to insert `new_str`."},
    "view_range": {"type": "array", "items": {"type": "integer"}, "description": "[start, end] lines to view."},
}
CLIENT_TOOL_SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "bash_": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The bash command to run."},
                       "restart": {"type": "boolean", "description": "Restart the shell session."}},
    },
    "text_editor_": {
        "type": "object",
        "properties": {"command": {"type": "string",
                                   "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
                       **_EDIT_PROPS},
        "required": ["command", "path"],
    },
    "memory_": {
        "type": "object",
        "properties": {"command": {"type": "string",
                                   "enum": ["view", "create", "str_replace", "insert", "delete", "rename"]},
                       **_EDIT_PROPS, "insert_text": {"type": "string"},
                       "old_path": {"type": "string"}, "new_path": {"type": "string"}},
        "required": ["command"],
    },
}
# Assistant-side blocks only Anthropic's own servers produce (server tools, MCP connector, compaction): no upstream
# could continue them, so they are left out of the history.
SERVER_BLOCKS: Final = frozenset({
    "server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
    "bash_code_execution_tool_result", "text_editor_code_execution_tool_result", "tool_search_tool_result",
    "mcp_tool_use", "mcp_tool_result", "container_upload", "compaction",
})
_TOOL_SEARCH: Final = re.compile(r"(?i)tool.?search")
IMAGE_TOKENS: Final = 1600  # count_tokens: Anthropic's own upper estimate for one image


class MessagesClient(ClientDialect[MessagesCall]):
    name = "messages"
    path = "/v1/messages"
    id_prefix = "msg_"
    count_path = "/v1/messages/count_tokens"

    def __init__(self, settings: Settings, store: StateStore) -> None:
        super().__init__(settings, store)
        key = settings.client.thinking_key
        self.signer = ThinkingSigner(key.encode() if key else None)

    async def decode(self, body: dict[str, Any]) -> MessagesCall:
        return decode_request(body, self.signer)

    def encoder(self, call: MessagesCall, ctx: RequestContext, answer: Answer) -> MessagesEncoder:
        return MessagesEncoder(call, ctx, answer, self.signer, messages_consumer(call, ctx))

    def rate_limit_headers(self, view: LimitView) -> Headers:
        return anthropic_headers(view)

    def error_response(self, err: ProxyError) -> tuple[int, Headers, bytes]:
        return error_response(err)

    # Passthrough: the API version and beta features the client asked for go with its request.
    native_headers = (b"anthropic-version", b"anthropic-beta")

    def native_reader(self) -> MessagesReader:
        return MessagesReader()

    def native_error(self, err: ProxyError) -> Event:
        return error_event(err)

    def routes(self) -> list[BaseRoute]:
        return [Route(self.count_path, self._count_tokens, methods=["POST"])]

    async def _count_tokens(self, request: Request) -> Response:
        try:
            limit = self.settings.server.max_body_bytes
            parts: list[bytes] = []
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ClientRequestError(
                        f"The request body is larger than the limit of {limit} bytes.", 413, code="request_too_large"
                    )
                parts.append(chunk)
            try:
                body = orjson.loads(b"".join(parts))
            except orjson.JSONDecodeError as e:
                raise ClientRequestError(f"The request body is not valid JSON ({e}).", code="invalid_json") from None
            if not isinstance(body, dict):
                raise ClientRequestError("The request body must be a JSON object.", code="invalid_json")
            counted = count_tokens(body, self.signer)
        except ProxyError as err:
            status, headers, payload = error_response(err)
            return Response(payload, status, {k.decode(): v.decode("latin-1") for k, v in headers}, "application/json")
        return Response(orjson.dumps(counted), 200, media_type="application/json")


# ---------------------------------------------------------------------------------------------------- decoding

def _bad(path: str, message: str) -> ClientRequestError:
    return ClientRequestError(f"{path}: {message}", 400, param=path.split(".", 1)[0])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _blocks(value: Any, path: str) -> list[dict[str, Any]]:
    """Content as a list of blocks (a string is one text block)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise _bad(path, "Input should be a string or a list of content blocks")
    for i, block in enumerate(value):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _bad(f"{path}.{i}", "Input should be a content block object with a `type`")
    return value


def _text(block: dict[str, Any], path: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{path}.text", "Input should be a valid string")
    return text


def _system_text(value: Any, path: str) -> str:
    parts = []
    for i, block in enumerate(_blocks(value, path)):
        if block["type"] != "text":
            raise _bad(f"{path}.{i}.type", "system content blocks must be `text`")
        parts.append(_text(block, f"{path}.{i}"))
    return "\n\n".join(parts)


def _image_part(block: dict[str, Any], path: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise _bad(f"{path}.source", "Field required")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise _bad(f"{path}.source", "base64 images need string `media_type` and `data`")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str):
            raise _bad(f"{path}.source.url", "Input should be a valid string")
        return {"type": "image_url", "image_url": {"url": url}}
    raise _bad(f"{path}.source.type", f"image source {kind!r} is not supported (use base64 or url)")


def _document_text(block: dict[str, Any], path: str) -> str:
    """A document: plain-text sources become text; anything else (PDF, files) a visible note, never a silent loss."""
    source = block.get("source")
    title = block.get("title")
    head = f"[document: {title}]\n" if isinstance(title, str) and title else ""
    if isinstance(source, dict):
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            return head + str(source["data"])
        if source.get("type") == "content":
            inner = source.get("content")
            texts = [b.get("text", "") for b in _blocks(inner, f"{path}.source.content") if b["type"] == "text"]
            return head + "\n".join(t for t in texts if isinstance(t, str))
        media = source.get("media_type") or source.get("type")
        return f"{head}[document of type {media} omitted: the proxy passes only text documents upstream]"
    raise _bad(f"{path}.source", "Field required")


class _Decoder:
    """One request's decoding state."""

    def __init__(self, signer: ThinkingSigner) -> None:
        self.signer = signer
        self.system: list[str] = []
        self.out: list[dict[str, Any]] = []
        self.referenced_tools: set[str] = set()
        self.unverified_thinking = 0
        self.started = False  # a user or assistant turn has been seen

    # -- user side
    def _user_parts(self, parts: list[dict[str, Any]]) -> None:
        if not parts:
            return
        last = self.out[-1] if self.out else None
        if last is not None and last["role"] == "user":
            existing = last["content"]
            if isinstance(existing, str):
                existing = [{"type": "text", "text": existing}]
            last["content"] = existing + parts
            return
        self.out.append({"role": "user", "content": parts})

    def _tool_result(self, block: dict[str, Any], path: str, images: list[dict[str, Any]]) -> None:
        use_id = block.get("tool_use_id")
        if not isinstance(use_id, str) or not use_id:
            raise _bad(f"{path}.tool_use_id", "Input should be a non-empty string")
        content = block.get("content", "")
        texts: list[str] = []
        if content is not None:
            for i, inner in enumerate(_blocks(content, f"{path}.content")):
                kind = inner["type"]
                ipath = f"{path}.content.{i}"
                if kind == "text":
                    texts.append(_text(inner, ipath))
                elif kind == "image":
                    images.append(_image_part(inner, ipath))
                    texts.append(f"[image {len(images)} follows in the next user message]")
                elif kind == "tool_reference":
                    name = inner.get("tool_name")
                    if isinstance(name, str):
                        self.referenced_tools.add(name)
                        texts.append(f"Tool loaded: {name}")
                elif kind == "document":
                    texts.append(_document_text(inner, ipath))
                elif kind == "search_result":
                    texts.append(_search_result_text(inner, ipath))
                else:
                    raise _bad(f"{ipath}.type", f"tool_result content block {kind!r} is not supported")
        text = "\n".join(texts)
        is_error = block.get("is_error")
        if is_error is not None and not isinstance(is_error, bool):
            raise _bad(f"{path}.is_error", "Input should be a valid boolean")
        if is_error:
            text = f"Error: {text}" if text else "Error"
        self.out.append({"role": "tool", "tool_call_id": tool_ids.to_upstream(use_id), "content": text})

    def user(self, content: Any, path: str) -> None:
        blocks = _blocks(content, path)
        parts: list[dict[str, Any]] = []
        images: list[dict[str, Any]] = []  # from tool results: tool messages carry text only
        for i, block in enumerate(blocks):
            kind = block["type"]
            bpath = f"{path}.{i}"
            if kind == "text":
                parts.append({"type": "text", "text": _text(block, bpath)})
            elif kind == "image":
                parts.append(_image_part(block, bpath))
            elif kind == "tool_result":
                self._tool_result(block, bpath, images)
            elif kind == "document":
                parts.append({"type": "text", "text": _document_text(block, bpath)})
            elif kind == "search_result":
                parts.append({"type": "text", "text": _search_result_text(block, bpath)})
            elif kind in SERVER_BLOCKS:
                continue
            else:
                raise _bad(f"{bpath}.type", f"user content block {kind!r} is not supported")
        if images:
            parts = [{"type": "text", "text": "Images from the tool results above:"}, *images, *parts]
        if len(parts) == 1 and parts[0]["type"] == "text" and not (self.out and self.out[-1]["role"] == "user"):
            self.out.append({"role": "user", "content": parts[0]["text"]})
        else:
            self._user_parts(parts)

    def late_system(self, content: Any, path: str) -> None:
        text = _system_text(content, path)
        self._user_parts([{"type": "text", "text": f"<system-reminder>\n{text}\n</system-reminder>"}])

    # -- assistant side
    def assistant(self, content: Any, path: str) -> None:
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        for i, block in enumerate(_blocks(content, path)):
            kind = block["type"]
            bpath = f"{path}.{i}"
            if kind == "text":
                texts.append(_text(block, bpath))
            elif kind == "thinking":
                thinking = block.get("thinking", "")
                if not isinstance(thinking, str):
                    raise _bad(f"{bpath}.thinking", "Input should be a valid string")
                text, verified = self.signer.open(thinking, block.get("signature"))
                if verified is True:
                    reasoning.append(text)
                elif text:
                    # Not reasoning this proxy produced (another server's, made up, or altered): never sent upstream
                    # as reasoning (docs/decisions.md "Client dialects and state"); the upstream session decides what a
                    # tool-call turn without reasoning needs.
                    self.unverified_thinking += 1
            elif kind == "redacted_thinking":
                continue  # Anthropic-encrypted: no upstream can read it
            elif kind == "tool_use":
                calls.append(_tool_call(block, bpath))
            elif kind in SERVER_BLOCKS:
                continue
            else:
                raise _bad(f"{bpath}.type", f"assistant content block {kind!r} is not supported")
        text = "".join(texts)
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            message["tool_calls"] = calls
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        self.out.append(message)


def _search_result_text(block: dict[str, Any], path: str) -> str:
    texts = [b.get("text", "") for b in _blocks(block.get("content", []), f"{path}.content") if b["type"] == "text"]
    title, source = block.get("title"), block.get("source")
    return f"[search result: {title} ({source})]\n" + "\n".join(t for t in texts if isinstance(t, str))


def _tool_call(block: dict[str, Any], path: str) -> dict[str, Any]:
    use_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(use_id, str) or not use_id:
        raise _bad(f"{path}.id", "Input should be a non-empty string")
    if not isinstance(name, str) or not name:
        raise _bad(f"{path}.name", "Input should be a non-empty string")
    if not isinstance(args, dict):
        raise _bad(f"{path}.input", "Input should be an object")
    return {"id": tool_ids.to_upstream(use_id), "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(args).decode()}}


def _tools(tools: Any, referenced: set[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """(functions for the upstream, names of the tools left out)."""
    if not isinstance(tools, list):
        raise _bad("tools", "Input should be a valid list")
    out: list[dict[str, Any]] = []
    dropped: list[str] = []
    deferred: list[tuple[str, dict[str, Any]]] = []
    discoverable = False
    for i, tool in enumerate(tools):
        path = f"tools.{i}"
        kind, name = _tool_kind_name(tool, path)
        if name is None:  # e.g. an MCP toolset: nothing an upstream can call
            dropped.append(kind or "")
            continue
        if _TOOL_SEARCH.search(name) or (kind or "").startswith("tool_search"):
            discoverable = True
        function = _custom_function(tool, path, name) if kind in (None, "custom") else _client_tool(kind or "", name)
        if function is None:
            dropped.append(name)
            continue
        entry = {"type": "function", "function": function}
        if tool.get("defer_loading") is True:
            deferred.append((name, entry))
        else:
            out.append(entry)
    for name, entry in deferred:
        if name in referenced or not discoverable:
            out.append(entry)
    return out, dropped


def _tool_kind_name(tool: Any, path: str) -> tuple[str | None, str | None]:
    """A tool's (type, name); no name for a typed tool that has none (left out), else a 400."""
    if not isinstance(tool, dict):
        raise _bad(path, "Input should be an object")
    kind, name = tool.get("type"), tool.get("name")
    if kind is not None and not isinstance(kind, str):
        raise _bad(f"{path}.type", "Input should be a valid string")
    if isinstance(name, str) and name:
        return kind, name
    if kind and kind != "custom":
        return kind, None
    raise _bad(f"{path}.name", "Field required")


def _custom_function(tool: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    """A custom tool (its own input_schema) as an OpenAI function."""
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise _bad(f"{path}.input_schema", "Input should be an object (a JSON schema)")
    function: dict[str, Any] = {"name": name, "parameters": schema}
    description = tool.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise _bad(f"{path}.description", "Input should be a valid string")
        function["description"] = description
    if isinstance(tool.get("strict"), bool):
        function["strict"] = tool["strict"]
    return function


def _client_tool(kind: str, name: str) -> dict[str, Any] | None:
    """A client tool that Anthropic defines (bash, text editor ...) as a function with its known schema; None for
    one the upstream cannot be given."""
    schema = next((s for prefix, s in CLIENT_TOOL_SCHEMAS.items() if kind.startswith(prefix)), None)
    return None if schema is None else {"name": name, "parameters": schema}


def _tool_choice(choice: Any, names: set[str]) -> tuple[Any, bool]:
    """(OpenAI tool_choice, parallel calls allowed)."""
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        raise _bad("tool_choice", "Input should be an object with a `type`")
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise _bad("tool_choice.disable_parallel_tool_use", "Input should be a valid boolean")
    kind = choice["type"]
    if kind == "auto":
        return "auto", not disable
    if kind == "any":
        return "required", not disable
    if kind == "none":
        return "none", True
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise _bad("tool_choice.name", "Field required")
        if name not in names:
            raise _bad("tool_choice.name", f"no tool named {name!r} reaches the upstream")
        return {"type": "function", "function": {"name": name}}, not disable
    raise _bad("tool_choice.type", f"must be auto, any, tool or none, got {kind!r}")


def _effort(body: dict[str, Any]) -> tuple[str | None, bool]:
    """(reasoning_effort, omit the thinking text) from `thinking` and `output_config.effort`."""
    effort: str | None = None
    config = body.get("output_config")
    if config is not None:
        if not isinstance(config, dict):
            raise _bad("output_config", "Input should be an object")
        raw = config.get("effort")
        if raw is not None:
            if raw not in EFFORTS:
                raise _bad("output_config.effort", f"must be one of {', '.join(EFFORTS)}, got {raw!r}")
            effort = EFFORTS[raw]
    thinking = body.get("thinking")
    if thinking is None:
        return effort, False
    if not isinstance(thinking, dict) or thinking.get("type") not in THINKING_TYPES:
        raise _bad("thinking.type", f"must be one of {', '.join(THINKING_TYPES)}")
    kind = thinking["type"]
    if kind == "disabled":
        return "none", False
    display = thinking.get("display")
    if display is not None and display not in ("summarized", "omitted"):
        raise _bad("thinking.display", "must be summarized or omitted")
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool):
            raise _bad("thinking.budget_tokens", "Input should be a valid integer")
        if effort is None:
            effort = "low" if budget < 4096 else "medium" if budget < 16384 else "high"
    return effort or "high", display == "omitted"


def _optional(body: dict[str, Any], out: dict[str, Any]) -> None:
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None:
            if not _is_number(value):
                raise _bad(key, "Input should be a valid number")
            out[key] = value
    top_k = body.get("top_k")
    if top_k is not None:
        if not _is_int(top_k):
            raise _bad("top_k", "Input should be a valid integer")
        out["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _bad("stop_sequences", "Input should be a list of strings")
        if stops:
            out["stop"] = stops
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise _bad("metadata", "Input should be an object")
        user = metadata.get("user_id")
        if user is not None:
            if not isinstance(user, str):
                raise _bad("metadata.user_id", "Input should be a valid string")
            out["user"] = user
    fmt = (body.get("output_config") or {}).get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise _bad("output_config.format", 'must be {"type": "json_schema", "schema": {...}}')
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _required(body: dict[str, Any], count_only: bool) -> tuple[str, Any, bool, list[Any]]:
    """(model, max_tokens, stream, messages), each checked."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "Field required (a non-empty string)")
    max_tokens = body.get("max_tokens")
    if not count_only:
        if max_tokens is None:
            raise _bad("max_tokens", "Field required")
        if not _is_int(max_tokens) or max_tokens < 1:
            raise _bad("max_tokens", "Input should be an integer of at least 1")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream", "Input should be a valid boolean")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "Field required (a non-empty list)")
    return model, max_tokens, stream, messages


def _messages(messages: list[Any], system: Any, signer: ThinkingSigner) -> _Decoder:
    """The system prompt and the turns, decoded in order."""
    dec = _Decoder(signer)
    if system is not None:
        dec.system.append(_system_text(system, "system"))
    for i, message in enumerate(messages):
        path = f"messages.{i}"
        if not isinstance(message, dict):
            raise _bad(path, "Input should be an object")
        role = message.get("role")
        if "content" not in message:
            raise _bad(f"{path}.content", "Field required")
        content = message["content"]
        if role == "user":
            dec.started = True
            dec.user(content, f"{path}.content")
        elif role == "assistant":
            dec.started = True
            dec.assistant(content, f"{path}.content")
        elif role == "system":
            if dec.started:
                dec.late_system(content, f"{path}.content")
            else:
                dec.system.append(_system_text(content, f"{path}.content"))
        else:
            raise _bad(f"{path}.role", f"must be user, assistant or system, got {role!r}")
    return dec


def _apply_tools(body: dict[str, Any], referenced: set[str], out: ChatRequest) -> Headers:
    """`tools` and `tool_choice` into `out`; the response headers that name the tools left out."""
    headers: Headers = []
    tools = body.get("tools")
    if tools is None:
        if body.get("tool_choice") is not None:
            _tool_choice(body["tool_choice"], set())  # checked all the same
        return headers
    functions, dropped = _tools(tools, referenced)
    if dropped:
        headers.append((DROPPED_TOOLS_HEADER, ",".join(dropped).encode()))
    if functions:
        out["tools"] = functions
    choice = body.get("tool_choice")
    if choice is not None:
        mapped, parallel = _tool_choice(choice, {f["function"]["name"] for f in functions})
        if functions:
            out["tool_choice"] = mapped
            if not parallel:
                out["parallel_tool_calls"] = False
    return headers


def decode_request(body: dict[str, Any], signer: ThinkingSigner, *, count_only: bool = False) -> MessagesCall:
    """An Anthropic Messages request -> the canonical chat request (`count_only`: the count_tokens body, which
    needs no `max_tokens`)."""
    model, max_tokens, stream, messages = _required(body, count_only)
    dec = _messages(messages, body.get("system"), signer)
    out: ChatRequest = {"model": model, "messages": dec.out}
    if dec.system:
        out["messages"] = [{"role": "system", "content": "\n\n".join(dec.system)}, *dec.out]
    if not count_only:
        out["max_completion_tokens"] = max_tokens
    out["stream"] = stream
    if stream:
        out["stream_options"] = {"include_usage": True}
    _optional(body, out)
    effort, omit = _effort(body)
    if effort is not None:
        out["reasoning_effort"] = effort
    headers = _apply_tools(body, dec.referenced_tools, out)
    thinking = body.get("thinking")
    call = MessagesCall(out, model, stream, omit_thinking=omit, stop_sequences=out.get("stop") or (),
                        show_thinking=isinstance(thinking, dict) and thinking.get("type") != "disabled",
                        headers=headers)
    if dec.unverified_thinking:
        call.log_note = ("unverified_thinking", dec.unverified_thinking)  # the access log says how many were left out
    return call


# ---------------------------------------------------------------------------------------------------- count_tokens

def count_tokens(body: dict[str, Any], signer: ThinkingSigner | None = None) -> dict[str, int]:
    """`POST /v1/messages/count_tokens`: an estimate, since no tokenizer of the upstream model is available to the
    proxy. Over the canonical request's messages and tools: one token per 4 ASCII bytes, one per other character
    (CJK text runs at about one token per character), 4 per message, and a flat 1,600 per image (Anthropic's own
    estimate for a large image) instead of its bytes. Raises ClientRequestError like `decode` for a bad body."""
    call = decode_request(body, signer or ThinkingSigner(), count_only=True)
    request = call.request
    ascii_bytes = 0
    other = 0
    images = 0

    def walk(value: Any) -> None:
        nonlocal ascii_bytes, other, images
        if isinstance(value, str):
            encoded = len(value.encode())
            if encoded == len(value):
                ascii_bytes += encoded
            else:
                n_ascii = sum(1 for ch in value if ch < "\x80")
                ascii_bytes += n_ascii
                other += len(value) - n_ascii
        elif isinstance(value, dict):
            if value.get("type") == "image_url":
                images += 1
                return
            for key, item in value.items():
                ascii_bytes += len(key)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(request["messages"])
    walk(request.get("tools", []))
    total = math.ceil(ascii_bytes / 4) + other + 4 * len(request["messages"]) + IMAGE_TOKENS * images
    return {"input_tokens": total}
