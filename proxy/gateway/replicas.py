"""The replicas of one upstream (docs/gateway.md): choosing one per request, failing over, keeping the sick out.

    ReplicaSet            one per upstream; a Replica per URL, each with its own connection pool (UpstreamClient),
     │                    admission (proxy/gateway/admission.py), passive and active health
     ├── balancer         least_outstanding | prefix_affinity (consistent hashing with bounded load)
     └── Attempts         one request's walk over the replicas: acquire a Ticket, report the outcome, maybe retry

Failover happens only before the upstream's response headers are accepted (refused or reset connection, timeout
before headers, HTTP 502/503), and so always before any byte reached the client: `Attempts.open` walks the
replicas until an answer head is accepted, for translated and passed-through requests alike. A retry goes to a
replica the request has not tried yet, at most `retries` times, and only while the request's total deadline allows.

Passive health (outlier ejection): `outlier_failures` failed attempts in a row take a replica out for
`outlier_backoff` seconds, doubled on each ejection up to `outlier_backoff_max`. Back in, it is on probation: its
first failure ejects it again (for longer), its first success clears the record. Active health: every
`health_interval` seconds each replica's health URL is probed (proxy/gateway/health.py); a replica whose check fails is
out until one passes. When no replica is in, all are used (better a likely failure than a certain one).

The state is per process: with `--workers N` each worker balances, ejects and admits on its own.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import hashlib
import logging
import math
import random
import time
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.errors import ProxyError, UpstreamTimeout, UpstreamUnreachable
from proxy.gateway.admission import Admission, QueueFull, QueueTimeout
from proxy.gateway.health import UpstreamCheck, pool_member_probe, probe
from proxy.gateway.upstream import UpstreamClient

if TYPE_CHECKING:
    from aiohttp import ClientResponse

    from proxy.dialects import Dialect
    from proxy.gateway.redact import Redactor
    from proxy.hub.canonical import RequestContext
    from proxy.metrics.definitions import Metrics
    from proxy.metrics.tracing import RequestTrace
    from proxy.settings import ReplicaSettings, ServerSettings, UpstreamSettings

log: Final = logging.getLogger("dialect_proxy")

RETRY_STATUSES: Final = frozenset({502, 503})
VNODES: Final = 100  # points per replica on the hash ring


class Replica:
    """One server of an upstream."""

    __slots__ = ("admission", "checked", "checking", "client", "ejected_until", "ejections", "failures", "healthy",
                 "index", "labels", "live", "name", "ok", "probation", "settings", "url")

    def __init__(self, index: int, settings: ReplicaSettings, client: UpstreamClient, admission: Admission,
                 upstream_label: str) -> None:
        self.index = index
        self.settings = settings
        self.name = settings.name
        self.url = settings.url
        self.client = client
        self.admission = admission
        self.labels = (upstream_label, settings.name)
        self.failures = 0  # consecutive failed attempts
        self.ejections = 0  # consecutive ejections (the backoff doubles with each)
        self.ejected_until = 0.0
        self.probation = False
        self.healthy = True  # the last active health check passed (or none ran yet)
        self.live = False  # its in_flight and queue_length series exist (made at its first use)
        self.ok: Any = None  # its upstream_attempts{result="ok"} child, once resolved
        self.checked: tuple[float, UpstreamCheck] | None = None  # (when, what) of its last readiness check
        self.checking: asyncio.Future[UpstreamCheck] | None = None  # the check under way: callers share it

    @property
    def outstanding(self) -> int:
        return self.admission.in_flight + self.admission.queued

    def up(self) -> bool:
        """It takes requests: not ejected, and its last active health check passed. Reads the clock only while an
        ejection is on record."""
        until = self.ejected_until
        if until:
            if time.monotonic() < until:
                return False
            self.ejected_until = 0.0  # the ejection is over: no clock reads until the next one
        return self.healthy

    def up_value(self) -> float:
        """replica_up: 1 if it takes requests, else 0."""
        return 1.0 if self.up() else 0.0


class Ticket:
    """A replica admitted for one attempt. `release()` when the attempt's response is over (idempotent)."""

    __slots__ = ("_t0", "released", "replica", "waited")

    def __init__(self, rset: ReplicaSet, replica: Replica, waited: float) -> None:
        self.replica = replica
        self.waited = waited
        self.released = False
        # How long the slot is held feeds Retry-After, which only a limited admission ever answers.
        self._t0 = time.monotonic() if replica.admission.max_in_flight else None

    @property
    def client(self) -> UpstreamClient:
        return self.replica.client

    @property
    def url(self) -> str:
        return self.replica.url

    def release(self) -> None:
        if not self.released:
            self.released = True
            t0 = self._t0
            self.replica.admission.release(None if t0 is None else time.monotonic() - t0)


class ReplicaSet:
    """The replicas of one upstream, and the policy that picks one."""

    def __init__(self, upstream: UpstreamSettings, server: ServerSettings, dialect: Dialect, metrics: Metrics,
                 redactor: Redactor) -> None:
        self.upstream = upstream
        self.redactor = redactor
        self.server = server
        self.dialect = dialect
        self.metrics = metrics
        self.label = metrics.upstream_label(upstream.name)
        several = len(upstream.replica_list()) > 1
        self.replicas = [
            Replica(i, r, UpstreamClient(upstream, server, redactor, replica=r.name if several else None),
                    Admission(upstream.max_in_flight, upstream.queue_size, upstream.queue_timeout), self.label)
            for i, r in enumerate(upstream.replica_list())
        ]
        self.affinity = upstream.balance == "prefix_affinity" and several
        ring = sorted((_hash(f"{r.name}#{v}".encode()), r.index) for r in self.replicas for v in range(VNODES))
        self._ring_keys = [h for h, _ in ring]
        self._ring_owners = [i for _, i in ring]
        self.only = self.replicas[0] if len(self.replicas) == 1 else None  # the common case, a lone replica
        self._health_task: asyncio.Task[None] | None = None
        self._rng = random.Random()
        for r in self.replicas:
            metrics.live_gauge(metrics.replica_up, r.labels, r.up_value, max)
            r.admission.on_change = functools.partial(self.gauges, r)

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Active health checks, for upstreams with several replicas (a lone replica is used whatever it says)."""
        if len(self.replicas) > 1 and self.upstream.health_interval > 0 and self._health_task is None:
            self._health_task = asyncio.create_task(self._health_loop())

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        for r in self.replicas:
            await r.client.close()

    # -- choosing -----------------------------------------------------------------------------------------------

    def attempts(self, request: dict[str, Any]) -> Attempts:
        key = affinity_key(request, self.upstream.affinity_turns) if self.affinity else None
        return Attempts(self, key)

    async def acquire(self, key: int | None, tried: Collection[int]) -> Ticket | None:
        """A ticket on the best replica not in `tried` (None when every replica was tried). Raises the 429
        ProxyError when the chosen replicas are full (queue full, or queue_timeout passed)."""
        if len(self.replicas) == 1 and key is None and not tried:  # a sidecar's one upstream with a free slot: go
            only = self.replicas[0]
            if only.admission.try_acquire():
                return Ticket(self, only, 0.0)
        candidates = [r for r in self.replicas if r.index not in tried] if tried else self.replicas
        if not candidates:
            return None
        live = [r for r in candidates if r.up()] or candidates
        pool = [r for r in live if r.admission.has_slot()] or [r for r in live if r.admission.has_room()]
        if not pool:
            self.metrics.child(self.metrics.admission_rejections, self.label, "queue_full").inc()
            raise self._rate_limited(min(live, key=lambda r: r.admission.retry_after()), "full")
        replica = self._choose(pool, live, key)
        m = self.metrics
        if replica.admission.try_acquire():
            return Ticket(self, replica, 0.0)
        t0 = time.monotonic()
        try:
            waited = await replica.admission.acquire()
        except (QueueFull, QueueTimeout) as e:
            m.child(m.replica_queue_wait, *replica.labels).observe(time.monotonic() - t0)
            reason = "queue_full" if isinstance(e, QueueFull) else "queue_timeout"
            m.child(m.admission_rejections, self.label, reason).inc()
            raise self._rate_limited(replica, "full" if reason == "queue_full" else "timeout") from None
        m.child(m.replica_queue_wait, *replica.labels).observe(waited)
        return Ticket(self, replica, waited)

    def _choose(self, pool: list[Replica], live: list[Replica], key: int | None) -> Replica:
        if key is None:
            return self._least_outstanding(pool)
        # Consistent hashing with bounded load: walk the ring from the key; the first replica whose load stays
        # within affinity_load x the mean (counting this request) takes it.
        total = sum(r.outstanding for r in live)
        bound = math.ceil(self.upstream.affinity_load * (total + 1) / len(live))
        in_pool = {r.index for r in pool}
        in_live = {r.index for r in live}
        start = bisect.bisect(self._ring_keys, key)
        owner: int | None = None
        seen: set[int] = set()
        n = len(self._ring_owners)
        for step in range(n):
            index = self._ring_owners[(start + step) % n]
            if index in seen:
                continue
            seen.add(index)
            if owner is None and index in in_live:
                owner = index
            replica = self.replicas[index]
            if index in in_pool and replica.outstanding + 1 <= bound:
                self.metrics.child(self.metrics.affinity, self.label, "owner" if index == owner else "spill").inc()
                return replica
            if len(seen) == len(self.replicas):
                break
        self.metrics.child(self.metrics.affinity, self.label, "spill").inc()
        return self._least_outstanding(pool)

    def _least_outstanding(self, pool: list[Replica]) -> Replica:
        """The replica with the fewest requests in flight or queued; a tie goes to a random one of them."""
        best: list[Replica] = []
        low = -1
        for r in pool:
            admission = r.admission
            n = admission.in_flight + admission.queued
            if n < low or low < 0:
                low = n
                best = [r]
            elif n == low:
                best.append(r)
        return best[0] if len(best) == 1 else self._rng.choice(best)

    def _rate_limited(self, replica: Replica, why: str) -> ProxyError:
        seconds = replica.admission.retry_after()
        what = ("every replica is at max_in_flight and its queue is full" if why == "full"
                else f"no replica slot became free within queue_timeout ({self.upstream.queue_timeout:g} s)")
        return ProxyError(f"The upstream `{self.upstream.name}` is busy: {what}. Retry in {seconds} s.", 429,
                          code="rate_limited", headers={"Retry-After": str(seconds)})

    # -- health -------------------------------------------------------------------------------------------------

    def succeeded(self, replica: Replica) -> None:
        replica.failures = 0
        if replica.probation:
            replica.probation = False
            replica.ejections = 0
        if not replica.live:
            self.gauges(replica)

    def failed(self, replica: Replica, result: str) -> None:
        """A failed attempt (passive health). Enough in a row, or one on probation, ejects the replica."""
        if time.monotonic() < replica.ejected_until:  # already out (a request that was under way): no double count
            return
        replica.failures += 1
        limit = self.upstream.outlier_failures
        if limit and (replica.failures >= limit or replica.probation) and len(self.replicas) > 1:
            replica.ejections += 1
            backoff = min(self.upstream.outlier_backoff * 2 ** (replica.ejections - 1),
                          self.upstream.outlier_backoff_max)
            replica.ejected_until = time.monotonic() + backoff
            replica.failures = 0
            replica.probation = True
            self.metrics.child(self.metrics.replica_ejections, *replica.labels).inc()
            log.warning(orjson.dumps({"event": "replica_ejected", "upstream": self.upstream.name,
                                      "replica": replica.name, "after": result, "seconds": backoff}).decode())
        self.gauges(replica)

    def gauges(self, replica: Replica) -> None:
        """The replica's in_flight and queue_length series, made at its first use (the exposition lists a
        replica's series once it was used; the admission calls this until then). They read the admission's counts
        when a scrape (or, with `--workers N`, a write to the files: proxy/metrics/files.py) collects them, as
        replica_up reads the replica's state: acquire, release, ejections and health checks write no metric."""
        if replica.live:
            return
        m = self.metrics
        adm = replica.admission
        m.live_gauge(m.replica_in_flight, replica.labels, functools.partial(_in_flight, adm))
        m.live_gauge(m.replica_queue_length, replica.labels, functools.partial(_queued, adm))
        replica.live = True
        adm.on_change = None

    async def check(self, max_age: float = 0.0) -> list[tuple[Replica, UpstreamCheck]]:
        """Probe every replica (a result younger than `max_age` seconds is reused; callers at the same time share
        one check). With active health on, the result also takes replicas out and back in (without it, a check made
        for /readyz or the start-up log line must not leave a replica out for good)."""
        active = len(self.replicas) > 1 and self.upstream.health_interval > 0
        now = time.monotonic()
        results = await asyncio.gather(*(self._check(r, now, max_age) for r in self.replicas))
        for r, result in zip(self.replicas, results, strict=True):
            if active and r.healthy != result.ready:
                log.warning(orjson.dumps({"event": "replica_health", "upstream": self.upstream.name,
                                          "replica": r.name, "ready": result.ready,
                                          "detail": result.reason}).decode())
                r.healthy = result.ready
                self.gauges(r)
        return list(zip(self.replicas, results, strict=True))

    async def _check(self, replica: Replica, now: float, max_age: float) -> UpstreamCheck:
        if replica.checked is not None and now - replica.checked[0] < max_age:
            return replica.checked[1]
        if replica.checking is None:
            replica.checking = asyncio.ensure_future(self._probe(replica))
        return await asyncio.shield(replica.checking)

    async def _probe(self, replica: Replica) -> UpstreamCheck:
        try:
            result = None
            if self.server.pool_member:
                result = await pool_member_probe(replica.client, self.dialect, replica.settings,
                                                 self.server.readiness_timeout, self.redactor)
            if result is None:
                result = await probe(replica.client, self.dialect, self.upstream, replica.settings,
                                     self.server.readiness_timeout, self.redactor)
            replica.checked = (time.monotonic(), result)
            return result
        finally:
            replica.checking = None

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.upstream.health_interval)
            try:
                await self.check()
            except Exception:  # a bug of ours must not end the checks for good
                log.exception("active health check of %s failed", self.upstream.name)

    def any_replica(self) -> Replica:
        """A replica for side requests (model listings): an available one, else the first."""
        return next((r for r in self.replicas if r.up()), self.replicas[0])


class Attempts:
    """One request's walk over the replicas of its upstream. What the access log line says of it (the endpoint's
    AccessRecord reads it): the replica that answered last, the time queued for a slot, and each retry's replica and
    failure."""

    __slots__ = ("_rset", "key", "queue_ms", "replica", "retries", "retries_left", "tried")

    def __init__(self, rset: ReplicaSet, key: int | None) -> None:
        self._rset = rset
        self.key = key
        self.tried: tuple[int, ...] = ()  # the indexes of the replicas tried
        self.retries_left = rset.upstream.retries
        self.replica = ""  # the name of the replica of the latest attempt
        self.queue_ms = 0.0  # waited for a free slot, over every attempt
        self.retries: list[tuple[str, str]] = []  # (replica, failure) of each attempt that was retried

    async def next(self) -> Ticket:
        rset = self._rset
        only = rset.only
        if only is not None and not self.tried and only.admission.try_acquire():  # a lone replica with a free slot
            ticket = Ticket(rset, only, 0.0)
        else:
            found = await rset.acquire(self.key, self.tried)
            assert found is not None  # the first call always finds one; retry() checked the others
            ticket = found
        replica = ticket.replica
        self.tried += (replica.index,)
        self.replica = replica.name
        if ticket.waited:
            self.queue_ms = round(self.queue_ms + ticket.waited * 1000, 2)
        return ticket

    def succeeded(self, ticket: Ticket) -> None:
        replica = ticket.replica
        ok = replica.ok
        if ok is None:
            m = self._rset.metrics
            ok = replica.ok = m.child(m.upstream_attempts, *replica.labels, "ok")
        ok.inc()
        self._rset.succeeded(replica)

    async def open(self, ctx: RequestContext, path: str, payload: bytes,
                   headers_for: Callable[[RequestContext], dict[str, str]], deadline: float,
                   loop: asyncio.AbstractEventLoop, trace: RequestTrace | None) -> tuple[Ticket, ClientResponse]:
        """POST `payload` to `path` on one replica after another until one's answer head is accepted: a failure
        before it (refused, reset, timeout, HTTP 502/503) goes to another replica while retries and the deadline
        allow. Nothing has reached the client yet. The caller releases the returned ticket once the answer is done;
        an error raised here has released it. `headers_for` is asked per attempt (`ctx.attempt` counts them: MindIE's
        req-id is unique per attempt)."""
        rset = self._rset
        server = rset.server
        while True:
            ticket = await self.next()
            headers = headers_for(ctx)
            if ctx.stream:
                headers["Accept"] = "text/event-stream"
            if trace is not None:  # the attempt's CLIENT span; its traceparent goes upstream
                trace.attempt(ticket.replica, headers)
            time_left = deadline - loop.time()
            try:
                resp = await ticket.client.open("POST", ticket.url + path, body=payload, headers=headers,
                                                timeout=min(server.first_byte_timeout, max(time_left, 0.001)),
                                                loop=loop)
            except (UpstreamUnreachable, UpstreamTimeout) as failure:
                if trace is not None:
                    trace.attempt_failed(failure)
                if self.retry(ticket, failure, deadline - loop.time()):
                    ctx.attempt += 1
                    continue
                ticket.release()
                rset.metrics.upstream_up(rset.upstream.name, False)
                raise
            except BaseException:  # cancelled (the client left, shutdown): the slot is free again
                ticket.release()
                raise
            if resp.status in RETRY_STATUSES:
                if self.retry(ticket, resp.status, deadline - loop.time()):
                    if trace is not None:
                        trace.attempt_failed(resp.status)
                    resp.close()
                    ctx.attempt += 1
                    continue
            else:
                self.succeeded(ticket)
            rset.metrics.upstream_up(rset.upstream.name, True)
            return ticket, resp

    def retry(self, ticket: Ticket, failure: ProxyError | int, time_left: float) -> bool:
        """The attempt on `ticket` failed before its response was accepted (an exception, or HTTP 502/503).
        Records it (metrics, passive health, access log) and says whether to try another replica. On True the
        ticket is released; on False the caller keeps it until its error answer is done."""
        result = _result(failure)
        rset = self._rset
        m = rset.metrics
        m.child(m.upstream_attempts, *ticket.replica.labels, result).inc()
        rset.failed(ticket.replica, result)
        again = self.retries_left > 0 and time_left > 0 and len(self.tried) < len(rset.replicas)
        if again:
            self.retries_left -= 1
            m.child(m.retries, rset.label, result).inc()
            self.retries.append((ticket.replica.name, result))
            ticket.release()
        return again


def _in_flight(admission: Admission) -> int:
    return admission.in_flight


def _queued(admission: Admission) -> int:
    return admission.queued


def _result(failure: ProxyError | int) -> str:
    if isinstance(failure, int):
        return "bad_gateway" if failure == 502 else "unavailable"
    if isinstance(failure, UpstreamTimeout):
        return "timeout"
    if isinstance(failure, UpstreamUnreachable):
        return "unreachable"
    return "error"


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def affinity_key(request: dict[str, Any], turns: int) -> int | None:
    """The conversation prefix that decides the replica: the leading system/developer messages, the tools, and the
    first `turns` other messages (a completion: the prompt's first 2,000 characters). None when there is none."""
    messages = request.get("messages")
    if isinstance(messages, list) and messages:
        head: list[Any] = []
        rest = 0
        for message in messages:
            system = isinstance(message, dict) and message.get("role") in ("system", "developer")
            if not system:
                if rest >= turns:
                    break
                rest += 1
            head.append(message)
        tools = request.get("tools")
        return _hash(_dumps([head, tools]))
    prompt = request.get("prompt")
    if isinstance(prompt, str) and prompt:
        return _hash(prompt[:2000].encode())
    if isinstance(prompt, list) and prompt:
        return _hash(_dumps(prompt[:1])[:8000])
    return None


def _dumps(value: Iterable[Any]) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return repr(value).encode()
