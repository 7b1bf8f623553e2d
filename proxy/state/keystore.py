"""The Redis key store: named API keys that `dialect-proxy keys` creates, changes and revokes in the state store's
Redis, shared by every replica (proxy/gateway/keys.py asks it for a key it does not know from its file).

    dialect-proxy:{apikeys}:<sha256 hex>   JSON: {"name": ..., the policy's fields as in api_keys_file}
    dialect-proxy:{apikeys}:names          hash: name -> sha256 hex

(`{apikeys}` is a hash tag: on a Redis Cluster all of them sit in one slot, so one transaction writes both.)

Only the key's SHA-256 is stored: the key itself is printed once, by `keys create`, and never again. Every call is
bounded in time (the store's timeout), and a failure is a StoreUnavailable.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from proxy.state.redis import KEY_PREFIX, RedisStore

NAMES: Final = f"{KEY_PREFIX}:{{apikeys}}:names"


def record_key(digest_hex: str) -> str:
    return f"{KEY_PREFIX}:{{apikeys}}:{digest_hex}"


class RedisKeyStore:
    def __init__(self, store: RedisStore) -> None:
        self.store = store

    async def get(self, digest_hex: str) -> dict[str, Any] | None:
        """The policy mapping of the key with this SHA-256 (its `name` among the fields), or None."""
        raw = await self.store.call("GET", self.store.client.get(record_key(digest_hex)))
        if raw is None:
            return None
        value = orjson.loads(raw)
        return value if isinstance(value, dict) else None

    async def put(self, digest_hex: str, fields: dict[str, Any]) -> None:
        """Store (replace) a key's policy; `fields["name"]` is its name."""
        async with self.store.client.pipeline(transaction=True) as pipe:
            pipe.set(record_key(digest_hex), orjson.dumps(fields))
            pipe.hset(NAMES, fields["name"], digest_hex)
            await self.store.call("SET+HSET", pipe.execute())

    async def find(self, name: str) -> tuple[str, dict[str, Any]] | None:
        """The key named `name`: its SHA-256 (hex) and policy mapping."""
        digest_hex = await self.store.call("HGET", self.store.client.hget(NAMES, name))
        if digest_hex is None:
            return None
        digest_hex = digest_hex.decode() if isinstance(digest_hex, bytes) else str(digest_hex)
        fields = await self.get(digest_hex)
        return None if fields is None else (digest_hex, fields)

    async def names(self) -> list[str]:
        names = await self.store.call("HKEYS", self.store.client.hkeys(NAMES))
        return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in names)

    async def delete(self, name: str) -> bool:
        found = await self.find(name)
        if found is None:
            return False
        async with self.store.client.pipeline(transaction=True) as pipe:
            pipe.delete(record_key(found[0]))
            pipe.hdel(NAMES, name)
            await self.store.call("DEL+HDEL", pipe.execute())
        return True
