"""Health checks of one upstream replica: what /readyz, the start-up log line and active health
(proxy/gateway/replicas.py) ask, and why a replica is (not) ready.

Ready means "a request would work": the operator's `health_url` (or, when none is set, the dialect's own health path:
`paths.health` in its mapping, e.g. vLLM's `GET /health`) answers 2xx, and the dialect's inference path exists and
takes the configured key. The second is asked without generating anything: the spoke's readiness request
(`Dialect.readiness.request`, proxy/dialects/readiness.py) is a chat body that the upstream must refuse as invalid,
and the spoke judges the answer (`Dialect.readiness.verdict`) — its validation error is ready, a 404 or an auth error
is not, and so is an error body at HTTP 200 (Siliconstorm's `{"code": 801}`). The request carries CHECK_HEADER, so
that an upstream's logs (and the mock's counters) can tell it from a client's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import orjson

from proxy.errors import ProxyError
from proxy.gateway.upstream import read_body

if TYPE_CHECKING:
    from proxy.dialects import Dialect
    from proxy.gateway.redact import Redactor
    from proxy.gateway.upstream import UpstreamClient
    from proxy.settings import ReplicaSettings, UpstreamSettings

CHECK_HEADER: Final = "x-dialect-proxy-check"
# Seconds a check's result answers /readyz (and the start-up log line) before the upstream is asked again: a
# Kubernetes probe every few seconds per pod, times the pods, must not become as many requests upstream.
READY_CACHE: Final = 5.0
_BODY_LIMIT: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class UpstreamCheck:
    """One readiness check of one replica: what was asked, what came back, and why it is (not) ready. The open
    /readyz shows the path asked and the reason, never the upstream's address (that goes to the log)."""

    url: str
    ready: bool
    reachable: bool
    status: int | None
    reason: str

    def summary(self) -> str:
        return "up" if self.ready else "down: " + self.reason

    def as_json(self) -> dict[str, Any]:
        return {"path": urlsplit(self.url).path or "/", "ready": self.ready, "reachable": self.reachable,
                "status": self.status, "reason": self.reason}


async def probe(client: UpstreamClient, dialect: Dialect, u: UpstreamSettings, replica: ReplicaSettings,
                timeout: float, redactor: Redactor) -> UpstreamCheck:
    """The replica's health URL (its own, else its dialect's health path), if any, must answer 2xx, then its dialect's
    readiness request must get an answer the dialect calls ready; each within `timeout`."""
    health = None
    own = dialect.path("health")
    if replica.health_url is not None:
        health = await _health_url(client, replica.health_url, timeout, redactor, "health_url")
    elif own:
        health = await _health_url(client, replica.url + own, timeout, redactor, f"the {u.dialect} health path")
    if health is not None and not health.ready:
        return health
    path, body = dialect.readiness.request(u)
    url = replica.url + path
    headers = dialect.readiness.headers(u)
    headers[CHECK_HEADER] = "readiness"
    try:
        resp = await client.open("POST", url, body=orjson.dumps(body), headers=headers, timeout=timeout)
        try:
            raw = await read_body(resp, timeout, limit=_BODY_LIMIT)
        finally:
            resp.close()
    except ProxyError as err:
        return UpstreamCheck(url, False, False, None, redactor.for_client(err.message))
    ready, reason = dialect.readiness.verdict(resp.status, raw, path, u)
    if health is not None:
        reason += f"; {health.reason}"
    return UpstreamCheck(url, ready, True, resp.status, redactor.for_client(reason))


async def pool_member_probe(client: UpstreamClient, dialect: Dialect, replica: ReplicaSettings, timeout: float,
                            redactor: Redactor) -> UpstreamCheck | None:
    """Pool-member mode (docs/inference-gateway.md): ready is what the engine itself says — the replica's health URL
    (MindIE: its management port's /health), else the dialect's ready path (MindIE's /v2/health/ready) or health
    path — so that the pod leaves the InferencePool while its engine loads or fails. None: the dialect has neither;
    the ordinary check applies."""
    if replica.health_url is not None:
        return await _health_url(client, replica.health_url, timeout, redactor, "health_url")
    path = dialect.ready_path or dialect.path("health")
    if not path:
        return None
    return await _health_url(client, replica.url + path, timeout, redactor, f"the {dialect.name} ready path")


async def _health_url(client: UpstreamClient, url: str, timeout: float, redactor: Redactor,
                      label: str) -> UpstreamCheck:
    shown = urlsplit(url).path or "/"
    try:
        # An operator's health URL may answer plain text (JSON is the session default); no key goes there.
        resp = await client.open("GET", url, headers={"Accept": "*/*"}, timeout=timeout)
        resp.close()
    except ProxyError as err:
        return UpstreamCheck(url, False, False, None, redactor.for_client(err.message))
    status = resp.status
    if 200 <= status < 300:
        return UpstreamCheck(url, True, True, status, f"{label} GET {shown} answered HTTP {status}")
    return UpstreamCheck(url, False, True, status, f"{label} GET {shown} answered HTTP {status} (expected 2xx)")
