"""The hub form: OpenAI Chat Completions as plain dicts, and the per-request context.

Client dialects (proxy/clients) decode their requests into a ChatRequest; upstream dialects (proxy/dialects) build
their bodies from it and turn their answers into ChatChunks with true deltas, which proxy/hub/normalize.py turns into
the typed events of proxy/hub/events.py. They are plain dicts at run time; the aliases below document intent for
readers and mypy, and `check_chunk` holds an upstream's chunk to the types the translation reads (once per chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from proxy.errors import MalformedUpstream
from proxy.settings import UpstreamSettings

# POST /v1/chat/completions body (or /v1/completions: `prompt` instead of messages)
ChatRequest = dict[str, Any]
# {"id", "object", "created", "model", "choices": [{"index", "message", "finish_reason"}], "usage"}
ChatCompletion = dict[str, Any]
# {"id", "object", "created", "model", "choices": [{"index", "delta", "finish_reason"}], "usage"?}
ChatChunk = dict[str, Any]
Usage = dict[str, Any]  # {"prompt_tokens","completion_tokens","total_tokens","prompt_tokens_details"?,...}

CHAT: Final = "chat"
COMPLETIONS: Final = "completions"


@dataclass(slots=True)
class RequestContext:
    """What one request's translation needs to know; created by the handler, read by dialect and transforms."""

    kind: str  # CHAT or COMPLETIONS
    request_id: str
    client_model: str  # the name the client sent (maybe an alias)
    upstream_model: str  # the name sent upstream
    upstream: UpstreamSettings
    stream: bool
    response_id: str  # the client dialect's id for this answer (chatcmpl-…, resp_…)
    created: int
    attempt: int = 0

    # Written out, as Delta's (proxy/hub/events.py): a generated one runs interpreted even compiled, once per request.
    def __init__(self, kind: str, request_id: str, client_model: str, upstream_model: str,
                 upstream: UpstreamSettings, stream: bool, response_id: str, created: int, attempt: int = 0) -> None:
        self.kind = kind
        self.request_id = request_id
        self.client_model = client_model
        self.upstream_model = upstream_model
        self.upstream = upstream
        self.stream = stream
        self.response_id = response_id
        self.created = created
        self.attempt = attempt

    @property
    def response_model(self) -> str:
        return self.upstream_model if self.upstream.response_model == "upstream" else self.client_model


# The fields of a chat delta the translation reads, and their JSON type (null is always allowed).
_DELTA_TYPES: Final[dict[str, type]] = {"content": str, "reasoning_content": str, "reasoning": str, "tool_calls": list}


def check_chunk(chunk: ChatChunk, chat: bool) -> list[Any] | None:
    """The chunk's choices, once each field the translation reads (the upstream sessions, proxy/hub/normalize.py) has
    the type it relies on; else MalformedUpstream naming the first field that has not. Other fields pass as they are.
    (Per upstream event: the checks build no text unless one fails.)"""
    choices = chunk.get("choices")
    if choices is None:
        return None
    if type(choices) is not list:
        raise MalformedUpstream("choices", "an array")
    for n, choice in enumerate(choices):
        if type(choice) is not dict:
            raise MalformedUpstream(f"choices[{n}]", "an object")
        index = choice.get("index")
        if index is not None and type(index) is not int:
            raise MalformedUpstream(f"choices[{n}].index", "an integer")
        finish = choice.get("finish_reason")
        if finish is not None and type(finish) is not str:
            raise MalformedUpstream(f"choices[{n}].finish_reason", "a string")
        if chat:
            delta = choice.get("delta")
            if delta is not None:
                _check_delta(delta, n)
        else:
            text = choice.get("text")
            if text is not None and type(text) is not str:
                raise MalformedUpstream(f"choices[{n}].text", "a string")
    return choices


def _check_delta(delta: Any, n: int) -> None:
    if type(delta) is not dict:
        raise MalformedUpstream(f"choices[{n}].delta", "an object")
    for field, value in delta.items():  # (a delta has a field or two: fewer lookups than asking for each)
        expected = _DELTA_TYPES.get(field)
        if expected is not None and value is not None and type(value) is not expected:
            raise MalformedUpstream(f"choices[{n}].delta.{field}", "an array" if expected is list else "a string")
