"""Tool-call ids between an upstream (`call_…`, any string) and Anthropic clients (`toolu_…`, `[A-Za-z0-9_-]+`).

The mapping is a pure function both ways, so no state is needed: the `tool_use` id a client received comes back in
its `tool_result.tool_use_id`, and the next upstream request carries the upstream's own id again.

    "call_abc"      <-> "toolu_call_abc"          (ids of safe characters not starting with "_": the id itself)
    "call:7/x"      <-> "toolu__Y2FsbDo3L3g"      (anything else: "_" + unpadded urlsafe base64)

An id that does not start with `toolu_` (from a client's own history) goes upstream unchanged; one starting with
`toolu_` that this module did not make (a real Anthropic id) loses its prefix, the same way in the assistant turn
and in the tool result, so the pair still matches.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Final

PREFIX: Final = "toolu_"
_SAFE: Final = re.compile(r"[A-Za-z0-9-][A-Za-z0-9_-]*")


def to_client(upstream_id: str) -> str:
    if _SAFE.fullmatch(upstream_id):
        return PREFIX + upstream_id
    return PREFIX + "_" + base64.urlsafe_b64encode(upstream_id.encode()).rstrip(b"=").decode()


def to_upstream(client_id: str) -> str:
    if not client_id.startswith(PREFIX):
        return client_id
    rest = client_id[len(PREFIX):]
    if rest.startswith("_"):
        encoded = rest[1:]
        try:
            return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (binascii.Error, ValueError):
            return client_id
    return rest or client_id
