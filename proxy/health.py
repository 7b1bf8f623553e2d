"""Health checks of one upstream replica: what /readyz, the start-up log line and active health (proxy/replicas.py)
ask, and why a replica is (not) ready."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .errors import ProxyError

if TYPE_CHECKING:
    from .dialects import Dialect
    from .redact import Redactor
    from .settings import ReplicaSettings, UpstreamSettings
    from .upstream import UpstreamClient


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
    """Ready when the replica answers its health URL, or its dialect's model/health path, with 2xx within `timeout`.
    A 404 on the dialect's path means a wrong URL or dialect, not a live upstream; 401/403 a wrong key. An upstream
    whose dialect has no such path (the engine API) is ready when it answers at all."""
    path = dialect.path("health")
    health_url = replica.health_url
    url = health_url or replica.url + (path or "/")
    shown = urlsplit(url).path or "/"
    headers = {"Authorization": f"Bearer {u.api_key}"} if u.api_key and health_url is None else {}
    if health_url is not None:
        headers["Accept"] = "*/*"  # a health URL of the operator's may answer plain text (JSON is the session default)
    try:
        resp = await client.open("GET", url, headers=headers, timeout=timeout)
        resp.close()
    except ProxyError as err:
        return UpstreamCheck(url, False, False, None, redactor.for_client(err.message))
    status = resp.status
    if health_url is None and not path:
        if status < 500:
            return UpstreamCheck(url, True, True, status, f"answered HTTP {status} (the {u.dialect} dialect has no "
                                                         "health path: reachable is all that can be checked)")
        return UpstreamCheck(url, False, True, status, f"GET {shown} answered HTTP {status}")
    if 200 <= status < 300:
        return UpstreamCheck(url, True, True, status, f"GET {shown} answered HTTP {status}")
    if status == 404 and health_url is None:
        reason = (f"GET {shown} answered 404: the URL (host, port, path prefix) or the dialect ({u.dialect}) is "
                  f"wrong; `dialect-proxy probe URL` tells what the upstream speaks")
    elif status in (401, 403) and health_url is None:
        reason = (f"GET {shown} answered {status}: the upstream refused the API key "
                  + ("(check the variable named by api_key_env)" if u.api_key else "(set api_key_env)"))
    else:
        reason = f"GET {shown} answered HTTP {status} (expected 2xx)"
    return UpstreamCheck(url, False, True, status, reason)
