"""Secrets and internal addresses out of any text that leaves the proxy.

An upstream may quote its credential back (`Invalid API key: Bearer sk-…`), and a connection error names the
upstream's address (`Connect call failed ('10.0.0.5', 1025)`). Every piece of upstream-derived text that reaches a
client message, a log line or a metric label goes through one `Redactor`, built once from the settings:

- `secrets(text)`: the configured keys (every upstream's `api_key`, the client keys of `api_keys_env`) and anything
  that looks like a credential (`Bearer …`, `sk-…`, `api_key=…`) become `[redacted]`, and every URL in the text goes
  through proxy/settings.py `redact_url` (user info and credential-like query parameters: ***), the one redaction of
  a URL, which log lines that name a URL call directly. For logs and metric labels.
- `for_client(text)`: the same, and the upstreams' configured URLs and host:port pairs, and IP addresses, become
  `[upstream address]` (clients get the upstream's *name*; the address is in the proxy's log).

`sanitize(err)` applies both to a ProxyError about to be sent (message, param, the upstream's code).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from proxy.settings import redact_url

if TYPE_CHECKING:
    from proxy.errors import ProxyError
    from proxy.settings import Settings

REDACTED = "[redacted]"
ADDRESS = "[upstream address]"

# Credential-looking tokens: an Authorization scheme and its token, OpenAI/DeepSeek-style `sk-…` keys, and
# `key=value` / `"api_key": "value"` pairs whose name says credential.
_TOKENS = re.compile(
    r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=\-]{6,}"
    r"|\bsk-[A-Za-z0-9_\-]{6,}"
    r"|\b(api[_-]?key|apikey|access[_-]?token|secret|password|authorization)(\"?'?\s*[:=]\s*\"?'?)[^\s\"',;&]{4,}"
)
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]+")
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?:[:,]\s?\d{1,5})?(?![\d.])")
_IPV6_BRACKET = re.compile(r"\[[0-9a-fA-F:]{2,}(?:%\w+)?\](?::\d{1,5})?")


def _token(match: re.Match[str]) -> str:
    if match.group(1):
        return match.group(1) + match.group(2) + REDACTED
    if match.group(3):
        return match.group(3) + match.group(4) + REDACTED
    return REDACTED


def redact_urls(text: str) -> str:
    """Every URL in `text` through `redact_url` (e.g. an exception's text that quotes the URL it was asked for)."""
    return _URL.sub(_url, text) if "://" in text else text


def _url(match: re.Match[str]) -> str:
    return redact_url(match.group())


class Redactor:
    def __init__(self, secrets: Iterable[str] = (), addresses: Iterable[str] = ()) -> None:
        # Longest first, so that a key that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
        self._addresses = sorted({a for a in addresses if a}, key=len, reverse=True)

    @classmethod
    def from_settings(cls, settings: Settings) -> Redactor:
        secrets = [u.api_key for u in settings.upstreams if u.api_key]
        secrets += [k for k in settings.server.api_keys if k]
        addresses: list[str] = []
        for u in settings.upstreams:
            replicas = [(r.url, r.health_url) for r in u.replica_list()]  # every replica's (proxy/gateway/replicas.py)
            for url in {u.url, u.health_url, *(x for pair in replicas for x in pair)}:
                if url:
                    addresses.extend(url_forms(url))
        return cls(secrets, addresses)

    def secrets(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return _TOKENS.sub(_token, redact_urls(text))

    def for_client(self, text: str) -> str:
        text = self.secrets(text)
        for address in self._addresses:
            if address in text:
                text = text.replace(address, ADDRESS)
        text = _IPV6_BRACKET.sub(ADDRESS, text)
        return _IPV4.sub(ADDRESS, text)

    def sanitize(self, err: ProxyError) -> ProxyError:
        """The error, made fit to send to a client (in place; returned for convenience)."""
        err.message = self.for_client(err.message)
        if err.param is not None:
            err.param = self.for_client(err.param)
        if err.upstream_code is not None:
            err.upstream_code = self.secrets(err.upstream_code)
        return err


def url_forms(url: str) -> list[str]:
    """The ways a URL's address shows up in text: the URL itself, scheme://host:port, host:port."""
    parts = urlsplit(url)
    forms = [url.rstrip("/")]
    if parts.scheme and parts.netloc:
        forms.append(f"{parts.scheme}://{parts.netloc}")
        host = parts.hostname or ""
        forms.append(parts.netloc.rsplit("@", 1)[-1])
        if parts.port is not None:
            forms.append(f"{host}:{parts.port}")
            if ":" in host:
                forms.append(f"[{host}]:{parts.port}")
    return forms
