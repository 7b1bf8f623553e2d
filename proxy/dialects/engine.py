"""The "engine" frontend service API (docs/upstreams.md "The engine API", treated as the whole truth).

- Routes `POST /chat` and `POST /completion`, no `/v1` prefix, no model listing (mappings/engine.yaml).
- Requests: `model` is never sent ("[won't support]"); a `response_format` that asks for JSON is a 400 naming it
  (left out instead with `response_format: drop` on the upstream; `{"type": "text"}` asks for nothing and is left
  out); `user` and `seed` are dropped, and so are
  the message `name` fields the document marks "[won't support]" and the reasoning a client round-trips on assistant
  messages (the document's assistant message has no such field). `developer` messages become `system`, and
  text-only content parts one string except in user messages (the only ones whose content may be an array).
  `temperature` keeps its name (the document's `ww` is a typo). `do_sample` is false when the client sets
  `temperature: 0` and true otherwise, including when no temperature is given (OpenAI's default of 1 samples); a
  `do_sample` the client sets itself is kept.
  `stream_options` is sent only with `stream: true` (the document: "Only set this when you set stream: true").
- Responses are filled to the OpenAI shape by the client encoder (our id, `object`, `created`, the client's model name);
  the document lists `role` and `logprobs` at the top level of the chat completion object, so those are moved into
  the (single) choice when the choice lacks them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from proxy.dialects.base import Dialect, RequestRules, UpstreamSession, join_text_parts
from proxy.dialects.probing import Probe
from proxy.dialects.readiness import Readiness
from proxy.hub.canonical import CHAT, ChatChunk, ChatRequest, RequestContext
from proxy.hub.structured import StructuredCaps

if TYPE_CHECKING:
    from proxy.settings import UpstreamSettings

_MESSAGE_DROP: Final = ("name", "reasoning_content", "reasoning")


class EngineSession(UpstreamSession):
    def lane_open(self) -> bool:
        return False  # its events are reshaped (hoisted into a choice) before the normaliser sees them

    def chunk(self, data: Any, whole: bool = False) -> ChatChunk | None:
        if whole:  # into the message, before it becomes the choice's delta
            if isinstance(data, dict):
                _hoist_into_choice(data, "message")
            return super().chunk(data, True)
        chunk = super().chunk(data)
        if chunk is not None:
            _hoist_into_choice(chunk, "delta")
        return chunk


class EngineReadiness(Readiness):
    def request(self, u: UpstreamSettings) -> tuple[str, dict[str, Any]]:
        path, body = super().request(u)
        body.pop("model", None)  # never sent: the document strikes it through
        return path, body


class EngineDialect(Dialect):
    name = "engine"
    session_class = EngineSession
    readiness_class = EngineReadiness
    # "[won't support]": a client that asked for JSON must not get prose as if it were JSON (docs/decisions.md
    # "The engine dialect"). Emulated by asking and checking (docs/structured-output.md): tools came with the
    # document's v0.2, so a forced tool call is not relied on; `reject` and `drop` stay available.
    rules = RequestRules(response_format="emulate", structured=StructuredCaps(forced_tool=False), response_format_hint=(
        "Describe the format in the prompt, or set `response_format: drop` for this upstream to have the field left "
        "out (the answer then does not follow the format)."))
    # The document strikes `model` through; no model listing: a small streamed request on /chat tells.
    probe = Probe(sends_model=False, chat_path="stream")

    # -- requests ---------------------------------------------------------------------------------------------
    def build_request(self, body: ChatRequest, ctx: RequestContext) -> dict[str, Any]:
        out = super().build_request(body, ctx)
        out.pop("model", None)
        if not ctx.stream:
            out.pop("stream_options", None)
        if "do_sample" not in out:
            out["do_sample"] = out.get("temperature") != 0
        if ctx.kind == CHAT and isinstance(out.get("messages"), list):
            out["messages"] = [_clean_message(m) for m in out["messages"]]
        return out


def _clean_message(message: Any) -> Any:
    """The document's four message shapes: `developer` -> `system`; only user content may be an array."""
    if not isinstance(message, dict):
        return message
    out = {k: v for k, v in message.items() if k not in _MESSAGE_DROP}
    if out.get("role") == "developer":
        out["role"] = "system"
    if out.get("role") != "user" and "content" in out:
        out["content"] = join_text_parts(out["content"])
    return out


def _hoist_into_choice(obj: dict[str, Any], part: str) -> None:
    """Top-level `role` / `logprobs` (as the document draws the chat completion object) -> the single choice."""
    if "role" not in obj and "logprobs" not in obj:
        return
    role = obj.pop("role", None)
    logprobs = obj.pop("logprobs", None)
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return
    choice = choices[0]
    inner = choice.get(part)
    if isinstance(role, str) and isinstance(inner, dict) and not inner.get("role") and part == "message":
        inner["role"] = role
    if logprobs is not None and choice.get("logprobs") is None:
        choice["logprobs"] = logprobs
