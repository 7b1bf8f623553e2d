"""Thinking signatures: how the proxy recognises reasoning it produced when a client sends it back.

Anthropic clients return earlier `thinking` blocks unchanged, each with the opaque `signature` the server gave it.
Ours is a keyed MAC over the thinking text, so that a later request can tell "reasoning this proxy delivered"
from text a client made up or got elsewhere:

    signature = base64( version byte | HMAC-SHA256(key, "thinking\\0" + text)[:16] | payload )

- version 1 (the thinking text was shown): no payload, the text is the block's `thinking`.
- version 2 (the client asked for `thinking.display: "omitted"`): the block's `thinking` is empty, and the payload is
  the zlib-compressed text, so the reasoning comes back with the next request although the client never saw it (as
  Anthropic's own signatures carry it). Integrity, not secrecy: the client could decompress it.

The key is random per process (one for the whole process: the Responses endpoint verifies what the compaction endpoint
sealed) unless one is configured (`client.thinking_key_env`): with several workers or after a restart, signatures made
elsewhere do not verify. See docs/messages.md for what a failed check
changes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import zlib
from typing import Final

_DOMAIN: Final = b"thinking\x00"
# Compaction summaries (proxy/clients/responses_compact.py) are sealed under their own domain: a sealed reasoning text
# is never accepted as a summary, nor the other way round.
COMPACTION: Final = b"compaction\x00"
_MAC_LEN: Final = 16
SHOWN: Final = 1
CARRIED: Final = 2
# A carried text never inflates beyond this (the request body limit bounds the compressed form; this bounds a bomb).
MAX_CARRIED_BYTES: Final = 16 * 1024 * 1024
_PROCESS_KEY: Final = secrets.token_bytes(32)  # the key when none is configured


class ThinkingSigner:
    __slots__ = ("_domain", "_key")

    def __init__(self, key: bytes | None = None, domain: bytes = _DOMAIN) -> None:
        self._key = key or _PROCESS_KEY
        self._domain = domain

    def for_domain(self, domain: bytes) -> ThinkingSigner:
        """A signer with the same key for another kind of sealed text."""
        return ThinkingSigner(self._key, domain)

    def mac(self) -> hmac.HMAC:
        """An incremental MAC: `update()` it with each piece of UTF-8 thinking text, then `sign(mac)`."""
        return hmac.new(self._key, self._domain, hashlib.sha256)

    def sign(self, mac: hmac.HMAC, carried: str | None = None) -> str:
        """The signature for the text fed to `mac`; `carried` (the same text) makes a version-2 signature."""
        digest = mac.digest()[:_MAC_LEN]
        if carried is None:
            return base64.b64encode(bytes((SHOWN,)) + digest).decode()
        return base64.b64encode(bytes((CARRIED,)) + digest + zlib.compress(carried.encode(), 6)).decode()

    def sign_text(self, text: str, carry: bool = False) -> str:
        mac = self.mac()
        mac.update(text.encode())
        return self.sign(mac, text if carry else None)

    def open(self, thinking: str, signature: object) -> tuple[str, bool | None]:
        """(the thinking text, verified) for a block a client sent back. `verified` is True for our own signature
        over that text, False for one of ours that does not match (another key, or altered), None for a signature
        that is not ours at all (another server's, or none)."""
        if not isinstance(signature, str) or not signature:
            return thinking, None
        try:
            raw = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            return thinking, None
        if len(raw) < 1 + _MAC_LEN or raw[0] not in (SHOWN, CARRIED):
            return thinking, None
        text = thinking
        if raw[0] == CARRIED:
            if len(raw) == 1 + _MAC_LEN:
                return thinking, None
            try:
                inflater = zlib.decompressobj()
                data = inflater.decompress(raw[1 + _MAC_LEN:], MAX_CARRIED_BYTES)
                if inflater.unconsumed_tail or not inflater.eof:
                    return thinking, None
                carried = data.decode()
            except (zlib.error, UnicodeDecodeError):
                return thinking, None
            text = thinking or carried
        mac = self.mac()
        mac.update(text.encode())
        return text, hmac.compare_digest(mac.digest()[:_MAC_LEN], raw[1:1 + _MAC_LEN])
