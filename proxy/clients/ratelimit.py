"""How each client API tells a client of its key's limits (proxy/gateway/limits.py `LimitView`), on every answer to a
limited key:

- OpenAI (Chat, Completions, Responses, embeddings): `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, the
  reset as a duration (`1s`, `6m0s`, `250ms`): https://platform.openai.com/docs/guides/rate-limits
- Anthropic (Messages): `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`, the reset as an RFC 3339
  time: https://docs.anthropic.com/en/api/rate-limits

A limit the key does not have is left out.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.clients.base import Headers
    from proxy.gateway.limits import LimitView


def openai_headers(view: LimitView) -> Headers:
    out: Headers = []
    for unit, limit, remaining, reset in (("requests", view.requests_limit, view.requests_remaining,
                                           view.requests_reset),
                                          ("tokens", view.tokens_limit, view.tokens_remaining, view.tokens_reset)):
        if limit:
            out += [(b"x-ratelimit-limit-" + unit.encode(), str(limit).encode()),
                    (b"x-ratelimit-remaining-" + unit.encode(), str(remaining).encode()),
                    (b"x-ratelimit-reset-" + unit.encode(), duration(reset).encode())]
    return out


def anthropic_headers(view: LimitView) -> Headers:
    out: Headers = []
    now = datetime.datetime.now(datetime.UTC)
    for unit, limit, remaining, reset in (("requests", view.requests_limit, view.requests_remaining,
                                           view.requests_reset),
                                          ("tokens", view.tokens_limit, view.tokens_remaining, view.tokens_reset)):
        if limit:
            at = (now + datetime.timedelta(seconds=reset)).replace(microsecond=0)
            prefix = b"anthropic-ratelimit-" + unit.encode()
            out += [(prefix + b"-limit", str(limit).encode()), (prefix + b"-remaining", str(remaining).encode()),
                    (prefix + b"-reset", at.strftime("%Y-%m-%dT%H:%M:%SZ").encode())]
    return out


def duration(seconds: float) -> str:
    """OpenAI's duration form: `250ms`, `6s`, `1m30s`, `2h0m0s`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
