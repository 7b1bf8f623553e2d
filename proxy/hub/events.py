"""The hub's typed events: what an upstream answer says once every upstream quirk is undone, before any client
format is applied.

    upstream session ─▶ canonical chunks ─▶ proxy.hub.normalize.Normalizer ─▶ Delta events ─▶ client encoder

A `Delta` is what one upstream chunk adds to one choice: true deltas of reasoning and content (never cumulative,
never with `<think>` tags), tool-call fragments already normalised (the first fragment of each call carries `index`,
`id`, `type` and `function.name`; later ones only `index` and `function.arguments`), and the finish reason. An
`Answer` holds what belongs to the whole answer (usage, unknown envelope fields); the normalizer fills it, client
encoders, metrics and the access log read it. Neither knows any upstream or client dialect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.build import mypyc_attr
from proxy.hub.readings import Readings

# {"index": int, "id"?: str, "type"?: "function", "function": {"name"?: str, "arguments": str}} — the Chat
# Completions wire form of a streamed tool-call delta (what the chat encoder sends as is).
ToolCallFragment = dict[str, Any]
Usage = dict[str, Any]  # OpenAI-shaped: prompt_tokens, completion_tokens, total_tokens, *_tokens_details


@mypyc_attr(acyclic=True)  # compiled, made and freed per chunk without the cyclic collector: it holds JSON values
@dataclass(slots=True)
class Delta:
    index: int = 0
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallFragment] | None = None
    finish_reason: str | None = None
    logprobs: Any = None
    # Fields the hub does not know, for clients that pass them on (Chat Completions is lossless for an OpenAI
    # upstream): delta-level (refusal, audio, vendor extras) and choice-level (vLLM's stop_reason, ...).
    extra: dict[str, Any] | None = None
    choice_extra: dict[str, Any] | None = None
    first: bool = False  # the first event of this choice (the chat encoder puts `role` on it)

    # Written out, not generated: a dataclass's own `__init__` is made by `dataclasses` at import time and runs
    # interpreted even in the compiled build (setup.py), several times the cost of this one per event (docs/speed.md).
    # `dataclass` keeps an `__init__` the class defines; the fields above stay the reference for equality, repr and
    # `replace`.
    def __init__(self, index: int = 0, reasoning: str = "", content: str = "",
                 tool_calls: list[ToolCallFragment] | None = None, finish_reason: str | None = None,
                 logprobs: Any = None, extra: dict[str, Any] | None = None,
                 choice_extra: dict[str, Any] | None = None, first: bool = False) -> None:
        self.index = index
        self.reasoning = reasoning
        self.content = content
        self.tool_calls = tool_calls
        self.finish_reason = finish_reason
        self.logprobs = logprobs
        self.extra = extra
        self.choice_extra = choice_extra
        self.first = first

    @property
    def has_token(self) -> bool:
        """Generated output: content, reasoning or a tool call (TTFT counts to the first such event)."""
        return bool(self.content or self.reasoning or self.tool_calls)


@dataclass(slots=True)
class Answer:
    """Per-request facts about the whole answer."""

    usage: Usage | None = None  # the upstream's own counts, OpenAI-shaped (None until the upstream reports them)
    usage_extras: dict[str, Any] = field(default_factory=dict)  # upstream-only usage fields (metrics)
    envelope_extra: dict[str, Any] = field(default_factory=dict)  # unknown top-level fields (system_fingerprint)
    finish_reason: str | None = None  # the last finish reason seen
    upstream_id: str | None = None  # the upstream's own response id (keep_upstream_id)
    upstream_model: str | None = None  # the model the upstream says answered (read with upstream_id: traces)

    def __init__(self, usage: Usage | None = None, usage_extras: dict[str, Any] | None = None,
                 envelope_extra: dict[str, Any] | None = None, finish_reason: str | None = None,
                 upstream_id: str | None = None, upstream_model: str | None = None) -> None:  # compiled, as Delta's
        self.usage = usage
        self.usage_extras = {} if usage_extras is None else usage_extras
        self.envelope_extra = {} if envelope_extra is None else envelope_extra
        self.finish_reason = finish_reason
        self.upstream_id = upstream_id
        self.upstream_model = upstream_model


@dataclass(slots=True)
class Timings:
    """What an upstream reports about its own work on one answer (an upstream dialect's `timings` reads it from its
    own fields; the metrics layer records it): the prompt's processing time in seconds, and per generated token lists
    as the upstream gave them, each with its unit (proxy/hub/readings.py)."""

    prefill: float | None = None  # time to process the prompt
    decode: Readings | None = None  # per generated token
    queue_wait: Readings | None = None  # per generated token, waiting in the scheduler's queue
    batch_size: Readings | None = None  # per generated token, the batch it was decoded in

    def __init__(self, prefill: float | None = None, decode: Readings | None = None,
                 queue_wait: Readings | None = None, batch_size: Readings | None = None) -> None:
        # Written out, as Delta's (above): the generated one runs interpreted.
        self.prefill = prefill
        self.decode = decode
        self.queue_wait = queue_wait
        self.batch_size = batch_size
