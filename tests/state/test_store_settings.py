"""The state store settings: server.state_* in the file, --state-* flags, DIALECT_PROXY_STATE_* variables; errors
name the key and never show credentials."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.__main__ import main, parser, settings_from_args
from proxy.settings import ConfigError, build_settings, redact_url
from proxy.state import MemoryStore, log_store, open_store
from proxy.state.redis import RedisStore

UPSTREAM = {"name": "u", "dialect": "openai", "url": "http://127.0.0.1:9"}
SECRET = "hunter2-XYZ"


def settings(**server: object):  # type: ignore[no-untyped-def]
    return build_settings(config={"upstreams": [UPSTREAM], "server": server}, environ={})


def test_defaults_are_a_bounded_memory_store() -> None:
    s = settings().server
    assert (s.state_store, s.state_max_entries, s.state_max_bytes, s.state_ttl, s.state_timeout) == (
        "memory", 10_000, 256 * 1024 * 1024, 86_400.0, 2.0)
    store = open_store(settings())
    assert isinstance(store, MemoryStore) and store.describe() == "memory"


def test_file_values_reach_the_memory_store() -> None:
    store = open_store(settings(state_max_entries=5, state_max_bytes="1000", state_ttl=60, state_store="Memory"))
    assert isinstance(store, MemoryStore)
    assert (store.max_entries, store.max_bytes, store.ttl) == (5, 1000, 60.0)


def test_redis_url_builds_a_redis_store() -> None:
    store = open_store(settings(state_store=f"redis://:{SECRET}@127.0.0.1:6390/2", state_ttl=30, state_timeout=0.5))
    assert isinstance(store, RedisStore)
    assert (store.ttl, store.timeout) == (30.0, 0.5)
    assert store.describe() == "redis://***@127.0.0.1:6390/2"
    asyncio.run(store.close())
    assert SECRET not in repr(settings(state_store=f"rediss://user:{SECRET}@redis.example:6380/0"))


@pytest.mark.parametrize(("url", "kind", "hosts", "extra"), [
    ("redis://h:6390/2", "redis", (("h", 6390),), {"db": 2, "wait_replicas": 0}),
    ("redis://h?wait_replicas=2", "redis", (("h", 6379),), {"wait_replicas": 2, "url": "redis://h"}),
    (f"redis+sentinel://:{SECRET}@s1,s2:26380,[::1]/mymaster/1", "sentinel",
     (("s1", 26379), ("s2", 26380), ("::1", 26379)), {"service": "mymaster", "db": 1, "wait_replicas": 1,
                                                       "password": SECRET, "tls": False}),
    (f"rediss+sentinel://s1/m?wait_replicas=0&sentinel_password={SECRET}", "sentinel", (("s1", 26379),),
     {"wait_replicas": 0, "sentinel_password": SECRET, "tls": True}),
    ("redis+cluster://u:p@c1:7000,c2:7001", "cluster", (("c1", 7000), ("c2", 7001)),
     {"username": "u", "password": "p", "wait_replicas": 0}),
])
def test_sentinel_and_cluster_urls(url: str, kind: str, hosts: tuple[tuple[str, int], ...],
                                   extra: dict[str, object]) -> None:
    from proxy.state.urls import parse_store_url

    assert settings(state_store=url).server.state_store == url
    found = parse_store_url(url, redact_url(url))
    assert (found.kind, found.hosts) == (kind, hosts)
    for name, value in extra.items():
        assert getattr(found, name) == value, name
    assert SECRET not in redact_url(url)


def test_flag_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("upstreams: [{name: u, dialect: openai, url: 'http://127.0.0.1:9'}]\n"
                   "server: {state_store: memory, state_ttl: 10, state_max_entries: 7}\n")
    env = {"DIALECT_PROXY_STATE_STORE": "redis://127.0.0.1:6379/1", "DIALECT_PROXY_STATE_TTL": "20"}
    s = settings_from_args(parser().parse_args(["serve", "--config", str(cfg), "--state-ttl", "30"]), env).server
    assert (s.state_store, s.state_ttl, s.state_max_entries) == ("redis://127.0.0.1:6379/1", 30.0, 7)
    s = settings_from_args(parser().parse_args(["serve", "--config", str(cfg), "--state-store", "rediss://r:6380",
                                                "--state-max-bytes", "4096", "--state-timeout", "1.5"]), env).server
    assert (s.state_store, s.state_ttl, s.state_max_bytes, s.state_timeout) == ("rediss://r:6380", 20.0, 4096, 1.5)


@pytest.mark.parametrize(("server", "needle"), [
    ({"state_store": "redis"}, "server.state_store: expected memory or a redis://, rediss://, redis+sentinel:// or "
                               "redis+cluster:// URL, got 'redis'"),
    ({"state_store": "http://127.0.0.1:6379"}, "server.state_store: expected memory or a redis://"),
    ({"state_store": "redis+sentinel://s1:26379,s2"}, "the path is the Sentinel service name (e.g. /mymaster)"),
    ({"state_store": "redis+sentinel://s1,s2:x/m"}, "'redis+sentinel://s1,s2:x/m' is not a valid URL"),
    ({"state_store": "redis+sentinel://s1,/m"}, "'redis+sentinel://s1,/m' names no host"),
    ({"state_store": "redis+sentinel://s1/m/db"}, "the path is the database number (e.g. /0), got 'm/db'"),
    ({"state_store": "redis+sentinel://s1/m?wait_replicas=all"}, "wait_replicas must be a whole number"),
    ({"state_store": "redis+sentinel://s1/m?timeout=1"}, "unknown query parameter 'timeout'"),
    ({"state_store": "redis+cluster://c1,c2/3"}, "a Redis Cluster has database 0 only"),
    ({"state_store": "redis+cluster://c1?wait_replicas=1"}, "wait_replicas is not available with redis+cluster://"),
    ({"state_store": "redis://h?sentinel_password=x"}, "sentinel_username and sentinel_password go with"),
    ({"state_store": "redis://"}, "server.state_store: 'redis://' names no host"),
    ({"state_store": "redis://h:notaport/0"}, "server.state_store: 'redis://h:notaport/0' is not a valid URL"),
    ({"state_store": "redis://h:6379/zero"}, "the path is the database number (e.g. /0), got 'zero'"),
    ({"state_store": ""}, "server.state_store: expected a non-empty string"),
    ({"state_max_entries": 0}, "server.state_max_entries: must be greater than 0"),
    ({"state_max_entries": "many"}, "server.state_max_entries: expected an integer"),
    ({"state_max_bytes": -1}, "server.state_max_bytes: must be greater than 0"),
    ({"state_ttl": 0}, "server.state_ttl: must be greater than 0"),
    ({"state_timeout": "soon"}, "server.state_timeout: expected a number"),
    ({"state_sotre": "memory"}, "server.state_sotre: unknown key"),
])
def test_errors_name_the_key(server: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**server)
    assert needle in str(err.value)


@pytest.mark.parametrize("url", [
    f"http://:{SECRET}@127.0.0.1:6379",
    f"redis://user:{SECRET}@h:99999/0",
    f"redis://:{SECRET}@h:6379/x",
    f"redis://:{SECRET}@:6379/0",
    f"redis://:{SECRET}/x@h:6379/0",
    f"redis://:{SECRET}#x@h:6379/0",
])
def test_errors_never_show_credentials(url: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(state_store=url)
    assert SECRET not in str(err.value) and "***" in str(err.value)


def test_url_secrets() -> None:
    from proxy.settings import url_secrets

    assert set(url_secrets(f"redis://me:{SECRET}%21@h:1/0")) >= {f"{SECRET}%21", f"{SECRET}!"}
    assert SECRET in url_secrets(f"redis://h:1/0?password={SECRET}")
    assert url_secrets("redis://h:1/0") == ()


def test_cli_error_never_echoes_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", "--upstream-url", "http://127.0.0.1:9", "--upstream-dialect", "openai",
                 "--state-store", f"redis://:{SECRET}@127.0.0.1:6379/db"])
    out = capsys.readouterr()
    assert code == 2 and "config error: --state-store: " in out.err  # the flag it came from
    assert SECRET not in out.err + out.out


def test_help_lists_the_flags_and_env_vars() -> None:
    text = parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    for flag in ("state-store", "state-max-entries", "state-max-bytes", "state-ttl", "state-timeout"):
        assert f"--{flag}" in text
        assert "DIALECT_PROXY_" + flag.upper().replace("-", "_") in text.replace("\n", "").replace(" ", "")


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    (f"redis://:{SECRET}@127.0.0.1:6379/0", "redis://***@127.0.0.1:6379/0"),
    (f"rediss://admin:{SECRET}@[::1]:6380/1", "rediss://***@[::1]:6380/1"),
    (f"redis://h/0?password={SECRET}&db=1", "redis://h/0?password=***&db=1"),
    (f"redis://a%40b:{SECRET}%40x@h:1", "redis://***@h:1"),
    (f"redis://:{SECRET}/#?x@h:1/0", "redis://***@h:1/0"),  # unescaped '/', '#', '?' in a password
    ("redis://h", "redis://h"),
    ("redis://", "redis://"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.fixture
def logs() -> Iterator[list[str]]:
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("dialect_proxy")
    handler, old = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_start_up_line_names_the_store(logs: list[str]) -> None:
    s = settings(state_max_entries=50)
    asyncio.run(log_store(open_store(s), s))
    assert len(logs) == 1
    line = logs[0]
    assert '"event":"state_store"' in line and '"store":"memory"' in line and '"max_entries":50' in line


def test_a_memory_store_with_several_workers_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Each worker would have its own memory store: follow-ups on the other worker would fail. Exit 2, one line."""
    code = main(["serve", "--upstream-url", "http://127.0.0.1:9", "--upstream-dialect", "openai", "--workers", "2",
                 "--port", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "server.state_store: memory is per process, so with --workers 2" in err
    assert "use --state-store redis://HOST:6379/0" in err and "or --workers 1" in err


def test_start_up_line_for_an_unreachable_redis_hides_the_password(logs: list[str]) -> None:
    from tests.conftest import free_port

    s = settings(state_store=f"redis://:{SECRET}@127.0.0.1:{free_port()}/0", state_timeout=0.3)

    async def main() -> None:
        store = open_store(s)
        await log_store(store, s)
        await store.close()

    asyncio.run(main())
    start_up = [line for line in logs if '"event":"state_store"' in line]
    assert len(start_up) == 1 and '"reachable":false' in start_up[0] and "redis://***@127.0.0.1:" in start_up[0]
    assert not any(SECRET in line for line in logs)
