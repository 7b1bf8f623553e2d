"""Deterministic "generation": what the fake model says, token by token.

A generation is a list of tokens (raw UTF-8 bytes, or tool-call events). Like a real server, the mock runs them
through an incremental detokeniser, which gives every token both
  * `text`: the new text in delta mode (the default wire of every dialect), and
  * `full`: the cumulative text in MindIE's `fullTextEnabled` mode.
The detokeniser holds back text that ends in an incomplete UTF-8 sequence (it would decode to U+FFFD) until the
character completes, except at the very end of the generation. So the default reply, whose emoji is split over two
byte-level tokens, yields one token with an empty delta (and an unchanged snapshot), exactly as a byte-level BPE model
on MindIE would. `split_utf8` lets one half-decoded snapshot through, `split_utf8_end` cuts the generation
mid-character, `rewrite` emits a snapshot that revises earlier text.

Each token counts as one completion token, whatever it decodes to.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from proxy.mock.scenario import WRONG_JSON, Scenario, content_text, wrong_json

DEFAULT_REPLY = "Hello from the mock {dialect} upstream! 你好, 世界 🌍."
REASONING = "The user greets me; 先想一想 🤔 then answer politely."
TOOL_ARGUMENTS = ['{"city": ', '"Paris", ', '"unit": ', '"celsius"}']
REWRITE = (("Hello", "Hello"), (",", "Hello wor"), (" world", "Hello, world"), ("!", "Hello, world!"))

_WORD = re.compile(r"\s?\w+|\s?[^\w\s]|\s+")
_ALNUM = string.ascii_letters + string.digits


class Piece(NamedTuple):
    """One generated token as the wire shows it.

    kind: "content", "reasoning" or "tool".
    text: the delta-mode text (for "tool": the arguments fragment, "" on the call's first piece).
    full: the cumulative text of this kind in full-text mode (for "tool": "").
    tool: for "tool" pieces, {"index", "id", "name"} on a call's first piece, {"index", "arguments"} after.
    """

    kind: str
    text: str
    full: str
    tool: dict[str, Any] | None = None


@dataclass
class Generation:
    pieces: list[Piece]
    finish_reason: str | None
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces)

    @property
    def reasoning_tokens(self) -> int:
        return sum(1 for p in self.pieces if p.kind == "reasoning")


class _Tok(NamedTuple):
    kind: str
    data: bytes = b""
    force: bool = False  # full-text mode: emit the snapshot even if it ends half-decoded
    override: tuple[str, str] | None = None  # (delta text, full snapshot) given outright (`rewrite`)
    tool: dict[str, Any] | None = None


def tokenize(text: str) -> list[bytes]:
    """Words (with their leading space) and punctuation; a 4-byte character is split over two tokens."""
    out: list[bytes] = []
    for match in _WORD.finditer(text):
        data = match.group(0).encode()
        cut = _wide_char_split(match.group(0))
        if cut is None:
            out.append(data)
        else:
            out.extend((data[:cut], data[cut:]))
    return out


def _wide_char_split(word: str) -> int | None:
    """Byte offset that splits the first 4-byte character of `word` in half, or None."""
    offset = 0
    for ch in word:
        size = len(ch.encode())
        if size == 4:
            return offset + 2
        offset += size
    return None


def call_id() -> str:
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(8))


def fragments(text: str, parts: int = 4) -> list[str]:
    """`text` cut into at most `parts` consecutive non-empty pieces (one piece when it is short)."""
    size = max(1, -(-len(text) // parts))
    return [text[i:i + size] for i in range(0, len(text), size)] or [text]


def tool_names(body: dict[str, Any]) -> list[str]:
    choice = body.get("tool_choice")
    named = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(named, dict) and isinstance(named.get("name"), str):
        return [named["name"]]  # a named tool_choice: that tool is the one called
    names: list[str] = []
    tools = body.get("tools")
    if isinstance(tools, list):
        for tool in tools:
            fn = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names.append(fn["name"])
    return names or ["get_weather"]


def generate(sc: Scenario, *, dialect: str, max_tokens: int | None = None, reasoning_field: bool = False,
             tools: list[str] | None = None, id_factory: Any = call_id, cut_reason: str | None = None,
             reply: str | None = None) -> Generation:
    """The generation a request gets, from its directives (treat the result as read-only: it may be shared).

    reasoning_field: the dialect always puts reasoning in a separate field (DeepSeek reasoner / thinking mode);
      otherwise `reasoning_field`, `think`, `think_close_only` and `think_unclosed` decide.
    cut_reason: cut the generation halfway with this finish_reason (DeepSeek `insufficient_system_resource`).
    reply: the answer instead of the default reply (structured output: see `structured_reply`).
    """
    if sc.has("tool_calls") or sc.has("tool_calls_noindex") or sc.has("call_tool"):  # fresh ids, request text
        return _generate(sc, dialect, max_tokens, reasoning_field, tools, id_factory, cut_reason, reply)
    key = (tuple(sorted(sc.flags.items())), dialect, max_tokens, reasoning_field, cut_reason, reply)
    gen = _CACHE.get(key)
    if gen is None:
        if len(_CACHE) >= 256:
            _CACHE.clear()
        gen = _CACHE[key] = _generate(sc, dialect, max_tokens, reasoning_field, tools, id_factory, cut_reason,
                                      reply)
    return gen


_CACHE: dict[tuple[Any, ...], Generation] = {}


def _generate(sc: Scenario, dialect: str, max_tokens: int | None, reasoning_field: bool, tools: list[str] | None,
              id_factory: Any, cut_reason: str | None, reply: str | None = None) -> Generation:
    toks: list[_Tok] = []
    finish = "stop"
    split = sc.has("split_tags")
    open_tag = [b"<th", b"ink>"] if split else [b"<think>"]
    close_tag = [b"</", b"think>"] if split else [b"</think>"]

    # reasoning part
    unclosed = sc.has("think_unclosed")
    if reasoning_field or sc.has("reasoning_field"):
        toks += [_Tok("reasoning", t) for t in tokenize(REASONING)]
    elif sc.has("think") or sc.has("think_close_only") or unclosed:
        if not sc.has("think_close_only"):
            toks += [_Tok("content", t) for t in open_tag]
        toks += [_Tok("content", t) for t in tokenize(REASONING)]
        if not unclosed:
            toks += [_Tok("content", t) for t in close_tag] + [_Tok("content", b"\n\n")]

    # answer part
    if unclosed:
        finish = "length"
    elif sc.tool_call is not None:
        name, arguments = sc.tool_call
        toks.append(_Tok("tool", tool={"index": 0, "id": id_factory(), "name": name}))
        toks += [_Tok("tool", tool={"index": 0, "arguments": frag}) for frag in fragments(arguments)]
        finish = "tool_calls"
    elif sc.reply is not None:
        toks += [_Tok("content", t) for t in tokenize(sc.reply)]
    elif sc.has("tool_calls") or sc.has("tool_calls_noindex"):
        count = sc.num("tool_calls", 1, lo=1, hi=8) or 1
        names = tools or ["get_weather"]
        for index in range(count):
            toks.append(_Tok("tool", tool={"index": index, "id": id_factory(), "name": names[index % len(names)]}))
            toks += [_Tok("tool", tool={"index": index, "arguments": frag}) for frag in TOOL_ARGUMENTS]
        finish = "tool_calls"
    elif sc.has("chunks"):
        n = sc.num("chunks", 8, lo=0, hi=100_000) or 0
        toks += [_Tok("content", (f"tok{i}" if i == 0 else f" tok{i}").encode()) for i in range(n)]
    elif sc.has("rewrite"):
        toks += [_Tok("content", override=pair) for pair in REWRITE]
    else:
        words = tokenize(reply if reply is not None else DEFAULT_REPLY.format(dialect=dialect))
        if sc.has("split_utf8_end"):
            first_half = next(i for i, w in enumerate(words) if _incomplete(w))
            words = words[:first_half + 1]
            finish = "length"
        forced = sc.has("split_utf8")
        toks += [_Tok("content", w, force=forced and _incomplete(w)) for w in words]

    if cut_reason is not None and len(toks) > 1:
        toks = toks[:max(1, len(toks) // 2)]
        finish = cut_reason
    if max_tokens is not None and max_tokens >= 0 and len(toks) > max_tokens:
        toks = toks[:max_tokens]
        finish = "length"
    return _detokenize(toks, finish)


def _incomplete(data: bytes) -> bool:
    return data.decode("utf-8", "replace").endswith("\ufffd")


def _detokenize(toks: list[_Tok], finish: str) -> Generation:
    cum = {"content": b"", "reasoning": b""}
    delta_seen = {"content": "", "reasoning": ""}  # text emitted so far in delta mode
    full_seen = {"content": "", "reasoning": ""}   # latest snapshot in full-text mode
    pieces: list[Piece] = []
    calls: dict[int, dict[str, Any]] = {}
    last = len(toks) - 1
    for i, tok in enumerate(toks):
        if tok.kind == "tool":
            info = dict(tok.tool or {})
            idx = int(info["index"])
            if "id" in info:
                calls[idx] = {"id": info["id"], "type": "function",
                              "function": {"name": info["name"], "arguments": ""}}
                pieces.append(Piece("tool", "", "", info))
            else:
                calls[idx]["function"]["arguments"] += info["arguments"]
                pieces.append(Piece("tool", info["arguments"], "", info))
            continue
        kind = tok.kind
        if tok.override is not None:
            text, full = tok.override
            delta_seen[kind] += text
            full_seen[kind] = full
            pieces.append(Piece(kind, text, full))
            continue
        cum[kind] += tok.data
        decoded = cum[kind].decode("utf-8", "replace")
        held = decoded.endswith("\ufffd") and i != last
        delta_text = delta_seen[kind] if held else decoded
        new = delta_text[len(delta_seen[kind]):]
        delta_seen[kind] = delta_text
        if not held or tok.force:
            full_seen[kind] = decoded
        pieces.append(Piece(kind, new, full_seen[kind]))
    return Generation(pieces=pieces, finish_reason=finish, content=delta_seen["content"],
                      reasoning=delta_seen["reasoning"], tool_calls=[calls[k] for k in sorted(calls)])


def prompt_tokens_chat(messages: Any) -> int:
    """A deterministic stand-in for the tokenised prompt length: ~4 bytes a token, plus 4 per message."""
    if not isinstance(messages, list):
        return 1
    total = 2
    for message in messages:
        if isinstance(message, dict):
            total += 4 + len(content_text(message.get("content")).encode()) // 4
            for call in message.get("tool_calls") or ():
                if isinstance(call, dict):
                    total += len(str(call.get("function", "")).encode()) // 4
    return total


def prompt_tokens_text(prompt: Any) -> int:
    if isinstance(prompt, list):
        if all(isinstance(p, int) for p in prompt):
            return max(1, len(prompt))
        prompt = "".join(p for p in prompt if isinstance(p, str))
    return max(1, len(str(prompt or "").encode()) // 4)


JSON_OBJECT_REPLY = '{"greeting": "Hello from the mock", "language": "en"}'


def structured_reply(body: Any, kinds: tuple[str, ...], sc: Scenario | None = None) -> str | None:
    """The answer to a request whose `response_format` type is one of `kinds` (what the imitated server honours):
    a JSON object for `json_object` (an instance of the schema its prompt shows, if any), an instance of the schema
    for `json_schema`; a prompt that shows a JSON schema (a ```json fenced block), as a model that follows the
    instruction does, an instance of it. `[mock:wrong_json]` (scenario.wrong_json): JSON that is none of these.
    None otherwise."""
    fmt = body.get("response_format") if isinstance(body, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    shown = prompt_schema(body)
    if kind not in kinds or kind == "text":
        kind = None
    if kind is None and shown is None:
        return None
    if sc is not None and wrong_json(sc, body):
        return WRONG_JSON
    if kind in (None, "json_object"):
        return json.dumps(schema_instance(shown, shown, 0), ensure_ascii=False) if shown else JSON_OBJECT_REPLY
    spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        return JSON_OBJECT_REPLY
    return json.dumps(schema_instance(schema, schema, 0), ensure_ascii=False)


_FENCED_JSON = re.compile(r"```json\s*\n(.*?)\n```", re.DOTALL)


def prompt_schema(body: Any) -> dict[str, Any] | None:
    """The last JSON schema the request's messages show in a ```json fenced block (an object with `type` or
    `properties`); None when there is none."""
    messages = body.get("messages") if isinstance(body, dict) else None
    found: dict[str, Any] | None = None
    for message in messages if isinstance(messages, list) else ():
        text = content_text(message.get("content")) if isinstance(message, dict) else ""
        for block in _FENCED_JSON.findall(text):
            try:
                value = json.loads(block)
            except ValueError:
                continue
            if isinstance(value, dict) and ("type" in value or "properties" in value):
                found = value
    return found


def schema_instance(schema: Any, root: dict[str, Any], depth: int) -> Any:
    """A small value that the JSON schema accepts (objects get every listed property, as strict mode wants)."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        return schema_instance(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema_instance(schema[key][0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props: dict[str, Any] = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        return {name: schema_instance(sub, root, depth + 1) for name, sub in props.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems") or 1))
        return [schema_instance(schema.get("items"), root, depth + 1) for _ in range(min(count, 3))]
    if kind == "string":
        return "Paris"
    if kind == "integer":
        return max(1, int(schema.get("minimum", 1)))
    if kind == "number":
        return max(1.5, float(schema.get("minimum", 1.5)))
    if kind == "boolean":
        return True
    return None
