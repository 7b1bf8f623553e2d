"""`dialect-proxy keys create|list|show|set|revoke|usage`: the Redis key store (proxy/state/keystore.py) from the
command line. `create` prints the new key once; only its SHA-256 is stored. The Redis is the state store's
(`--state-store` or DIALECT_PROXY_STATE_STORE); replicas started with `api_keys_store: true` accept these keys, and
refuse a revoked or expired one within a second (proxy/gateway/keys.py REMOTE_TTL)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import secrets
import sys
from collections.abc import Mapping
from typing import Any, Final

import orjson

from proxy.errors import ProxyError
from proxy.gateway.keys import KeyPolicy, stored_policy
from proxy.settings import ConfigError
from proxy.state.counters_redis import RedisCounters
from proxy.state.keystore import RedisKeyStore
from proxy.state.redis import RedisStore

# policy field -> (flag, type)
FIELDS: Final = {
    "models": ("--models", str), "requests_per_minute": ("--requests-per-minute", int),
    "tokens_per_minute": ("--tokens-per-minute", int), "max_concurrent": ("--max-concurrent", int),
    "tokens_per_day": ("--tokens-per-day", int), "tokens_per_month": ("--tokens-per-month", int),
    "expires": ("--expires", str), "weight": ("--weight", float),
}
KEY_PREFIX: Final = "sk-dp-"


def add_parser(sub: Any, env_name: str) -> None:
    keys = sub.add_parser("keys", help="manage the API keys kept in Redis (create, list, show, set, revoke, usage)",
                          description=__doc__)
    keys.add_argument("--state-store", default=None, help=f"the Redis URL (redis://HOST:6379/0) [env {env_name}]")
    actions = keys.add_subparsers(dest="keys_action", required=True)
    for action, text in (("create", "create a key and print it (once)"), ("set", "change a key's policy")):
        p = actions.add_parser(action, help=text)
        p.add_argument("name")
        for field, (flag, _) in FIELDS.items():
            p.add_argument(flag, dest=field, default=None,
                           help="comma-separated model names, globs allowed" if field == "models" else
                           "YYYY-MM-DD, the last UTC day" if field == "expires" else None)
        if action == "set":
            p.add_argument("--unset", action="append", default=[], choices=sorted(FIELDS),
                           help="remove a field (no limit)")
    actions.add_parser("list", help="every key's name and policy")
    for action, text in (("show", "a key's policy"), ("revoke", "delete a key: every replica refuses it within 1 s"),
                         ("usage", "a key's tokens today and this month (UTC)")):
        actions.add_parser(action, help=text).add_argument("name")


def run(args: argparse.Namespace, environ: Mapping[str, str], env_name: str) -> int:
    url = args.state_store or environ.get(env_name)
    if not url or not url.startswith(("redis://", "rediss://", "redis+sentinel://", "redis+cluster://")):
        raise ConfigError("--state-store: the key store lives in Redis; give its redis:// URL")
    try:
        return asyncio.run(_run(args, RedisStore(url)))
    except ProxyError as e:  # the Redis does not answer (its log line says why)
        print(f"dialect-proxy keys: {e.message}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace, store: RedisStore) -> int:
    keys = RedisKeyStore(store)
    try:
        action = args.keys_action
        if action == "create":
            return await _create(keys, args)
        if action == "set":
            return await _set(keys, args)
        if action == "list":
            for name in await keys.names():
                found = await keys.find(name)
                print(orjson.dumps(found[1] if found else {"name": name}).decode())
            return 0
        found = await keys.find(args.name)
        if found is None:
            print(f"no key named {args.name!r}", file=sys.stderr)
            return 1
        if action == "show":
            print(orjson.dumps(found[1], option=orjson.OPT_INDENT_2).decode())
        elif action == "revoke":
            await keys.delete(args.name)
            print(f"revoked {args.name!r}")
        else:
            await _usage(store, found[1])
        return 0
    finally:
        await store.close()


async def _create(keys: RedisKeyStore, args: argparse.Namespace) -> int:
    if await keys.find(args.name) is not None:
        print(f"a key named {args.name!r} exists already (revoke it first, or `keys set` its policy)",
              file=sys.stderr)
        return 1
    fields = {"name": args.name, **_given(args)}
    _check(fields)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    await keys.put(hashlib.sha256(key.encode()).hexdigest(), fields)
    print(key)
    print(f"(the key of {args.name!r}: shown this once; only its SHA-256 is kept)", file=sys.stderr)
    return 0


async def _set(keys: RedisKeyStore, args: argparse.Namespace) -> int:
    found = await keys.find(args.name)
    if found is None:
        print(f"no key named {args.name!r}", file=sys.stderr)
        return 1
    digest_hex, fields = found
    fields = {k: v for k, v in fields.items() if k not in args.unset}
    fields.update(_given(args))
    _check(fields)
    await keys.put(digest_hex, fields)
    print(orjson.dumps(fields).decode())
    return 0


async def _usage(store: RedisStore, fields: dict[str, Any]) -> None:
    now = datetime.datetime.now(datetime.UTC)
    day, month = now.strftime("%Y-%m-%d"), now.strftime("%Y-%m")
    used_day, used_month = await RedisCounters(store, store.timeout).usage(fields["name"], day, month)
    print(orjson.dumps({"name": fields["name"], "day": day, "tokens_day": used_day,
                        "tokens_per_day": fields.get("tokens_per_day"), "month": month, "tokens_month": used_month,
                        "tokens_per_month": fields.get("tokens_per_month")}).decode())


def _given(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, (flag, kind) in FIELDS.items():
        value = getattr(args, field)
        if value is None:
            continue
        try:
            out[field] = [m.strip() for m in value.split(",") if m.strip()] if field == "models" else kind(value)
        except ValueError:
            raise ConfigError(f"{flag}: expected a {kind.__name__}, got {value!r}") from None
    return out


def _check(fields: dict[str, Any]) -> None:
    """The policy reads as a replica will read it (proxy/gateway/keys.py), or a ConfigError names the field."""
    if stored_policy(fields, KeyPolicy("default")) is None:
        raise ConfigError(f"the policy of {fields['name']!r} does not read (see the message above)")
