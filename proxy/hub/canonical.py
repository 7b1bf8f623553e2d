"""The hub form: OpenAI Chat Completions as plain dicts, and the per-request context.

Client dialects (proxy/clients) decode their requests into a ChatRequest; upstream dialects (proxy/dialects) build
their bodies from it and turn their answers into ChatChunks with true deltas, which proxy/hub/normalize.py turns into
the typed events of proxy/hub/events.py. They are plain dicts at run time (no validation per chunk); the aliases below
document intent for readers and mypy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

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
