"""Compaction: the upstream model summarises a conversation, and the summary comes back sealed in a `compaction` item
that later requests hand back as input, in place of the conversation it summarises.

Two ways in, one summarisation (proxy/clients/responses.py):

- `POST /v1/responses/compact` (the Open Responses spec's endpoint; `CompactClient`): a Responses request body
  (`model` required, `input`, `previous_response_id`, `instructions`). The answer is a `response.compaction` object
  whose `output` is the conversation's user messages followed by one compaction item, as OpenAI's endpoint answers.
- `POST /v1/responses` (or a WebSocket `response.create`) whose last input item is `{"type": "compaction_trigger"}`:
  Codex CLI's remote compaction (its "v2", the only one Codex 0.169.0 uses). The answer is a response, streamed or
  not, whose one output item is the compaction item (Codex keeps its user messages itself).

The upstream is asked through the normal routing and translation path, in its own dialect: the conversation in hub
form without tools (the answer must be text), then a user message asking for the summary (SUMMARY_PROMPT). Its text
answer is the summary; reasoning is left out of it.

The compaction item's `encrypted_content` is the summary sealed with the proxy's key (proxy/clients/signature.py,
under its own domain): when it comes back in `input`, responses_request.py verifies it and sends the summary upstream
as a user message (SUMMARY_PREFIX + summary). A compaction item this proxy did not seal is a 400
(`invalid_encrypted_content`). Integrity, not secrecy: the summary is compressed, not encrypted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import orjson

from proxy.clients.base import Outcome
from proxy.clients.responses_events import ResponsesEncoder
from proxy.clients.responses_request import SUMMARY_PREFIX
from proxy.clients.signature import ThinkingSigner
from proxy.errors import ProxyError, UpstreamError
from proxy.hub.events import Delta
from proxy.hub.sse import Event

SUMMARY_PROMPT: Final = (
    "Summarise the conversation above so that the work can continue from the summary alone: it will replace the "
    "conversation. Keep the user's goals and instructions, the decisions made, facts, names, numbers and code words "
    "given, the state of the work (what is done, files and commands touched, tool results that matter) and what is "
    "left to do. Write only the summary."
)
# Hub request fields that have no place in a summary request: its answer is plain text.
_NOT_FOR_SUMMARY: Final = ("tools", "tool_choice", "parallel_tool_calls", "response_format")


def summary_request(request: dict[str, Any]) -> dict[str, Any]:
    """The hub request that asks the upstream to summarise `request`'s conversation."""
    out = {key: value for key, value in request.items() if key not in _NOT_FOR_SUMMARY}
    out["messages"] = [*request["messages"], {"role": "user", "content": SUMMARY_PROMPT}]
    return out


def retained_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation's user messages as Responses input items (what `/v1/responses/compact` keeps before its
    compaction item, as OpenAI's does). Summaries of earlier compactions are not kept: the new summary covers them."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] != "user":
            continue
        content = message["content"]
        if isinstance(content, str):
            if content.startswith(SUMMARY_PREFIX):
                continue
            parts: list[dict[str, Any]] = [{"type": "input_text", "text": content}]
        else:
            parts = [{"type": "input_text", "text": part["text"]} if part.get("type") == "text"
                     else {"type": "input_image", "image_url": part["image_url"]["url"],
                           "detail": part["image_url"].get("detail", "auto")}
                     for part in content]
        items.append({"type": "message", "role": "user", "status": "completed", "content": parts})
    return items


class CompactionEncoder:
    """Hub events of the summary -> one compaction item, answered as a `response.compaction` object (`retained` is
    set: the compact endpoint) or as a response of the Responses API (through `inner`, streamed or not). Nothing of
    the summary is streamed: the item is whole only once it is sealed."""

    keepalive: Event | None = None  # the transport's own (an SSE comment)

    def __init__(self, inner: ResponsesEncoder, sealer: ThinkingSigner,
                 retained: list[dict[str, Any]] | None = None) -> None:
        self.inner = inner
        self.ctx = inner.ctx
        self.sealer = sealer
        self.retained = retained
        self.summary = ""
        self._parts: list[str] = []

    def head(self) -> list[Event]:
        return self.inner.head()

    def feed(self, deltas: Sequence[Delta]) -> list[Event]:
        for d in deltas:
            if d.index == 0 and d.content:
                self._parts.append(d.content)
        return []

    def finish(self) -> list[Event]:
        summary = "".join(self._parts).strip()
        if not summary:
            raise UpstreamError("The upstream model answered the compaction request without a summary.")
        self.summary = summary
        fields = {"type": "compaction", "encrypted_content": self.sealer.sign_text(summary, carry=True)}
        if self.retained is None:
            self.inner.add_item("cmp", fields)
            return self.inner.finish()
        for message in self.retained:
            self.inner.add_item("msg", message)
        self.inner.add_item("cmp", fields)
        return [Event(None, orjson.dumps({"id": self.ctx.response_id, "object": "response.compaction",
                                          "created_at": self.ctx.created, "output": self.inner.items,
                                          "usage": self.inner.usage()}))]

    def error(self, err: ProxyError) -> Event:
        return self.inner.error(err)

    def outcome(self) -> Outcome | None:
        """The conversation goes on from its summary: its user messages, then the summary as one."""
        history = self.inner.history
        if history is None:
            return None
        summary = {"role": "user", "content": SUMMARY_PREFIX + self.summary}
        messages = [m for m in history if m["role"] == "user"
                    and not (isinstance(m["content"], str) and m["content"].startswith(SUMMARY_PREFIX))]
        record = {"response": self.inner.response("completed"), "messages": [*messages, summary]}
        return Outcome(self.ctx.response_id, record, self.inner.store)
