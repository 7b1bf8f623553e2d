"""How `dialect-proxy probe` (proxy/probe/runner.py) knows a spoke's servers and talks to them: what each spoke
declares for the probe (none of it runs on requests). A spoke sets `Dialect.probe` to a `Probe` — made with the
plain attributes that differ, from a subclass where a hook differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class ProbeListing:
    """What the probe learnt from a server's model-listing paths, for each spoke to recognise its own servers by
    (`Probe.listing`). Made once per probe: its generated `__init__` may run interpreted (tests/test_build.py)."""

    status: int  # of the first listing path asked (/v1/models)
    body: Any  # its body, parsed as JSON (None when it is not JSON), whatever the status
    error: bool  # it is an error other than 404/405 (a 404's body is no evidence)
    owners: set[str]  # the `owned_by` of the models it listed
    listed: bool  # it listed models (OpenAI's list shape)
    plain_listed: bool  # `GET /models` (no /v1) listed models too


@dataclass(slots=True)
class ProbeInfo:
    """What a server said of itself on its dialect's info path (the `info` path of mappings/<dialect>.yaml, read by
    `Probe.info`): a server that runs one model and names it there. Made at most once per probe: its generated
    `__init__` may run interpreted (tests/test_build.py)."""

    evidence: str  # why it is a server of this dialect, for the report's table
    models: list[str]  # the model names it serves (the config block routes them to it)
    kinds: tuple[str, ...]  # the kinds of model they are (chat, embeddings, rerank); () none the proxy serves
    notes: list[str]  # comment lines for the config block (indented as its entry)


class Probe:
    """A spoke's part of the probe: plain attributes, and hooks that answer "no evidence" / add nothing here."""

    __slots__ = ("chat_path", "error_at_200", "generic", "sends_model", "structured_output")

    def __init__(self, *, generic: bool = False, sends_model: bool = True, chat_path: str | None = None,
                 structured_output: bool = False, error_at_200: bool = False) -> None:
        # Recognised only when no other spoke is: the OpenAI-compatible server every detection falls back to.
        self.generic = generic
        # Chat requests carry `model` (the probe's too).
        self.sends_model = sends_model
        # A server of this dialect without a model listing is recognised on its chat path: "stream" (a small streamed
        # request, kept as the probe's chat answer), "invalid" (a body invalid on purpose, whose validation error in
        # the generic spoke's shape proves the path) or None (not tried).
        self.chat_path = chat_path
        # The probe asks whether the server honours `response_format` (servers of some versions do; the config block
        # then says `response_format: pass`).
        self.structured_output = structured_output
        # This dialect's error shape is an error even in a 2xx answer.
        self.error_at_200 = error_at_200

    def error_shape(self, data: dict[str, Any]) -> bool:
        """The error body is in the shape this dialect's own servers answer with (one spoke per shape; a dialect
        whose errors look like another's claims none)."""
        return False

    def shaped(self, body: Any) -> bool:
        """`error_shape` of a parsed body of any type."""
        return isinstance(body, dict) and self.error_shape(body)

    def refused_key(self, raw: bytes) -> bool:
        """An error body of this dialect's shape says the API key was refused (whatever the HTTP status)."""
        return False

    def listing(self, listing: ProbeListing) -> str | None:
        """The evidence that the server speaks this dialect, from its model-listing paths; None: no such evidence."""
        return None

    def info(self, body: Any) -> ProbeInfo | None:
        """What the 200 answer of a `GET` of this dialect's `info` path (mappings/<dialect>.yaml; parsed as JSON, None
        when it is not JSON) says of the server; None: it is not this dialect's answer. The probe asks the path only
        when no model listing was recognised."""
        return None

    def after_chat(self, events: list[dict[str, Any]], usage_seen: bool) -> str | None:
        """The evidence, from a streamed chat answer, that a server found to speak another member of this dialect's
        family (proxy/dialects/__init__.py `family`) is this one; None: no such evidence."""
        return None

    def chat_body(self, body: dict[str, Any], tools: bool) -> None:
        """What this dialect adds to the probe's small chat request (`tools`: the one that forces a tool call)."""
        return None

    def config_notes(self, url: str) -> list[str]:
        """Comment lines for the config block the probe suggests for a server at `url` (indented as its entry)."""
        return []
