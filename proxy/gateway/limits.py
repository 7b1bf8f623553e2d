"""The per-key limiter: a request of a limited key (proxy/gateway/keys.py `KeyPolicy`) is admitted against its
counters before it goes upstream (`Limiter.admit`: the tokens reserved, a concurrency lease taken) and settled with
the tokens it really used when its answer is over (`Limiter.settle`), whatever the way it ended.

    reservation = the input counted from the request (its bytes / 4, rounded up)
                  + its max_tokens (max_completion_tokens, max_output_tokens), or server.limits_output_estimate

The counters are shared (Redis: proxy/state/counters_redis.py, one round trip per admission and one per settle) or
this process's own (proxy/state/counters.py). When the shared ones do not answer within server.limits_timeout:
- `limits_fail: open` (the default) counts in this process, each limit divided by server.limits_processes (its share),
  logs once, counts dialect_proxy_limits_fail_open_total, /readyz says so, and tries Redis again a second later;
- `limits_fail: closed` answers 503 limits_unavailable.

Refusals are ProxyErrors the client dialect writes (`LimitRefused`): 429 rate_limit_exceeded with Retry-After over a
per-minute or concurrency limit; 429 insufficient_quota with x-should-retry: false once a day's or month's quota is
used up (waiting a minute will not help); 403 for a model the key may not use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import math
import secrets
import time
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson

from proxy.errors import ProxyError
from proxy.gateway.keys import KeyPolicy
from proxy.state.counters import Counters, CountersUnavailable, LimitAsk, MemoryCounters, Verdict, whole_seconds

log: Final = logging.getLogger("dialect_proxy")
RETRY_SHARED: Final = 1.0  # seconds between tries of unanswering shared counters while failing open
_OUTPUT_FIELDS: Final = ("max_completion_tokens", "max_tokens", "max_output_tokens")
_UNITS: Final = {"requests": "requests", "tokens": "tokens", "concurrent": "concurrent requests",
                 "too_large": "tokens"}


class LimitMetrics(Protocol):
    """What the limiter counts (proxy/metrics/definitions.py `Metrics`)."""

    def limited(self, key: str, reason: str) -> None: ...

    def quota_remaining(self, key: str, period: str, quota: int, tokens: int) -> None: ...

    def limits_fail_open(self, key: str) -> None: ...


@dataclass(slots=True)
class LimitView:
    """What the rate-limit headers tell a client of its key (0 limit: that limit is not set)."""

    requests_limit: int
    requests_remaining: int
    requests_reset: float  # seconds until the window is whole again
    tokens_limit: int
    tokens_remaining: int
    tokens_reset: float

    # Written out (made per keyed request): a generated one runs interpreted even compiled (docs/speed.md).
    def __init__(self, requests_limit: int, requests_remaining: int, requests_reset: float, tokens_limit: int,
                 tokens_remaining: int, tokens_reset: float) -> None:
        self.requests_limit = requests_limit
        self.requests_remaining = requests_remaining
        self.requests_reset = requests_reset
        self.tokens_limit = tokens_limit
        self.tokens_remaining = tokens_remaining
        self.tokens_reset = tokens_reset


class LimitRefused(ProxyError):
    """A refusal by the limiter, with what the headers say (`view`: None when no counted limit applies)."""

    def __init__(self, message: str, status: int, *, code: str, type: str | None = None,
                 headers: dict[str, str] | None = None, view: LimitView | None = None) -> None:
        super().__init__(message, status, code=code, type=type, headers=headers)
        self.view = view


@dataclass(slots=True)
class Grant:
    """An admitted request's reservation, on the counters that admitted it."""

    ask: LimitAsk
    counters: Counters

    # Written out (made per keyed request): a generated one runs interpreted even compiled (docs/speed.md).
    def __init__(self, ask: LimitAsk, counters: Counters) -> None:
        self.ask = ask
        self.counters = counters


@dataclass(frozen=True, slots=True)
class LimitSettings:
    fail: str = "open"  # open | closed
    processes: int = 1  # how many processes share the limits (each one's share when failing open)
    window: float = 60.0  # the "minute" of the per-minute limits
    lease_ttl: float = 1900.0  # a concurrency lease's longest life (a stream's total_timeout, and some)
    output_estimate: int = 1024  # tokens reserved for the output of a request that names no max_tokens


class Limiter:
    def __init__(self, shared: Counters | None, settings: LimitSettings, metrics: LimitMetrics | None = None,
                 describe: str = "memory") -> None:
        self.shared = shared
        self.local = MemoryCounters()
        self.settings = settings
        self.metrics = metrics
        self.describe = describe
        self.failing_open = False
        self._retry_at = 0.0
        self._settling: set[asyncio.Task[None]] = set()

    def status(self) -> dict[str, Any]:
        """For /readyz: where the counters are, and whether this process counts alone because they are not there."""
        out: dict[str, Any] = {"counters": self.describe, "fail": self.settings.fail}
        if self.failing_open:
            out["failing_open"] = True
            out["detail"] = (f"the shared counters do not answer: counting in this process, each limit divided by "
                             f"{self.settings.processes}")
        return out

    async def admit(self, policy: KeyPolicy, model: str, request: dict[str, Any], size: int,
                    generates: bool) -> tuple[Grant | None, LimitView | None]:
        """Admit a request of `policy`'s key (`size`: its body's bytes; `generates`: it asks for output tokens), or
        raise LimitRefused. (None, None) when the key has no counted limit."""
        if not policy.allows(model):
            self._count(policy.name, "model")
            raise LimitRefused(f"The API key {policy.name!r} may not use the model {model!r}.", 403,
                               code="model_not_allowed", type="permission_error")
        if not policy.limited:
            return None, None
        ask = self._ask(policy, reservation(request, size, self.settings.output_estimate if generates else 0))
        verdict, counters = await self._verdict(ask)
        view = view_of(ask, verdict)
        if self.metrics is not None:
            for period, quota, used in (("day", ask.tokens_per_day, verdict.day_used),
                                        ("month", ask.tokens_per_month, verdict.month_used)):
                if quota:
                    self.metrics.quota_remaining(policy.name, period, quota, max(0, quota - used))
        if not verdict.allowed:
            self._count(policy.name, verdict.reason)
            raise refusal(policy.name, ask, verdict, view)
        return Grant(ask, counters), view

    def settle(self, grant: Grant, used: int | None) -> None:
        """The request is over (`used`: its tokens; None: unknown, the reservation stays). In the background: the
        answer does not wait for it."""
        task = asyncio.get_running_loop().create_task(self._settle(grant, grant.ask.cost if used is None else used))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self, grant: Grant, used: int) -> None:
        try:
            await grant.counters.settle(grant.ask, used)
        except CountersUnavailable as e:  # the lease expires by itself (lease_ttl); the reservation stays counted
            log.debug("settling a limit reservation failed: %s", e.detail)

    def _ask(self, policy: KeyPolicy, cost: int) -> LimitAsk:
        now = datetime.datetime.now(datetime.UTC)
        s = self.settings
        return LimitAsk(policy.name, secrets.token_hex(8), cost, policy.requests_per_minute, policy.tokens_per_minute,
                        policy.max_concurrent, policy.tokens_per_day, policy.tokens_per_month,
                        now.strftime("%Y-%m-%d"), now.strftime("%Y-%m"), s.window, s.lease_ttl)

    async def _verdict(self, ask: LimitAsk) -> tuple[Verdict, Counters]:
        shared = self.shared
        if shared is not None and time.monotonic() >= self._retry_at:
            try:
                verdict = await shared.admit(ask)
            except CountersUnavailable as e:
                self._unavailable(e)
            else:
                if self.failing_open:
                    self.failing_open = False
                    log.warning(orjson.dumps({"event": "limits_shared_again", "counters": self.describe}).decode())
                return verdict, shared
        elif shared is not None and self.settings.fail == "closed":
            raise CountersUnavailable("not answering")
        own = self.local
        if shared is not None and self.metrics is not None:
            self.metrics.limits_fail_open(ask.key)
        return await own.admit(self.share_of(ask)), own

    def _unavailable(self, e: CountersUnavailable) -> None:
        """The shared counters did not answer: 503 (closed), or this process counts alone (open), logged once; they
        are tried again RETRY_SHARED seconds later."""
        self._retry_at = time.monotonic() + RETRY_SHARED
        if self.settings.fail == "closed":
            log.warning(orjson.dumps({"event": "limits_unavailable", "counters": self.describe,
                                      "detail": e.detail}).decode())
            raise e
        if not self.failing_open:
            self.failing_open = True
            log.warning(orjson.dumps({"event": "limits_fail_open", "counters": self.describe, "detail": e.detail,
                                      "share": f"1/{self.settings.processes}"}).decode())

    def share_of(self, ask: LimitAsk) -> LimitAsk:
        """This process's share of each limit (fail-open); quotas and concurrency too."""
        n = self.settings.processes
        if n <= 1:
            return ask

        def part(limit: int) -> int:
            return max(1, limit // n) if limit else 0

        return dataclasses.replace(
            ask, requests_per_minute=part(ask.requests_per_minute), tokens_per_minute=part(ask.tokens_per_minute),
            max_concurrent=part(ask.max_concurrent), tokens_per_day=part(ask.tokens_per_day),
            tokens_per_month=part(ask.tokens_per_month))

    def _count(self, key: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.limited(key, reason)

    async def close(self) -> None:
        if self._settling:
            await asyncio.wait(list(self._settling), timeout=2)


def reservation(request: dict[str, Any], size: int, output_estimate: int) -> int:
    """Tokens to reserve: the input (the body's bytes / 4, rounded up: a token is 4 bytes of English or more) and
    the output the request allows (none named: `output_estimate`; 0 for embeddings and rerank)."""
    output = 0
    if output_estimate:
        named = next((request[f] for f in _OUTPUT_FIELDS if isinstance(request.get(f), int)), None)
        output = named if named is not None and named > 0 else output_estimate
    return math.ceil(size / 4) + output


def view_of(ask: LimitAsk, verdict: Verdict) -> LimitView:
    return LimitView(ask.requests_per_minute, max(0, ask.requests_per_minute - verdict.requests), verdict.reset,
                     ask.tokens_per_minute, max(0, ask.tokens_per_minute - verdict.tokens), verdict.reset)


def refusal(key: str, ask: LimitAsk, verdict: Verdict, view: LimitView) -> LimitRefused:
    reason = verdict.reason
    if reason in ("day", "month"):
        quota = ask.tokens_per_day if reason == "day" else ask.tokens_per_month
        return LimitRefused(
            f"The API key {key!r} has used its quota of {quota} tokens per {reason} (UTC); this request would need "
            f"{ask.cost} more.", 429, code="insufficient_quota", type="insufficient_quota",
            headers={"x-should-retry": "false"}, view=view)
    if reason == "too_large":
        return LimitRefused(
            f"Request too large for the API key {key!r}: it reserves {ask.cost} tokens, its limit is "
            f"{ask.tokens_per_minute} tokens per minute. Lower max_tokens or the input.", 429,
            code="rate_limit_exceeded", type="tokens", headers={"x-should-retry": "false"}, view=view)
    limit = {"requests": ask.requests_per_minute, "tokens": ask.tokens_per_minute,
             "concurrent": ask.max_concurrent}.get(reason, 0)
    per = " at once" if reason == "concurrent" else " per minute"
    wait = verdict.retry_after
    return LimitRefused(
        f"Rate limit reached for the API key {key!r}: {limit} {_UNITS.get(reason, reason)}{per}. Try again in "
        f"{wait:.3g} s.", 429, code="rate_limit_exceeded", type=_UNITS.get(reason, reason).split()[-1],
        headers={"retry-after": str(whole_seconds(wait)), "retry-after-ms": str(max(1, round(wait * 1000)))},
        view=view)
