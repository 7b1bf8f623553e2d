"""The Redis state store behind Sentinel and in a Redis Cluster (proxy/state/urls.py, proxy/state/redis.py), with real
redis-server and redis-sentinel processes on loopback and the proxy driven by the openai SDK.

A failover during a conversation loses no stored response that the client was given: a put is acknowledged only
once a replica holds it (wait_replicas, 1 by default with Sentinel); while no replica takes writes, a response that
would be stored on the master alone is a 503, not an answer whose id may vanish."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import Mock, RedisServer, free_port, wait_for

REDIS_SENTINEL = shutil.which("redis-sentinel")
REDIS_CLI = shutil.which("redis-cli")
SERVICE = "mymaster"


class Sentinel:
    """One redis-sentinel watching `master` (quorum 1, a failover 0.5 s after the master stops answering)."""

    def __init__(self, directory: Path, master_port: int) -> None:
        assert REDIS_SENTINEL
        self.port = free_port()
        conf = directory / "sentinel.conf"  # Sentinel rewrites its file: it must be its own and writable
        conf.write_text(f"port {self.port}\nbind 127.0.0.1\ndaemonize no\ndir {directory}\n"
                        f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 1\n"
                        f"sentinel down-after-milliseconds {SERVICE} 500\n"
                        f"sentinel failover-timeout {SERVICE} 5000\n"
                        f"sentinel parallel-syncs {SERVICE} 2\n")
        with open(directory / "sentinel.log", "ab") as log:
            self.proc = subprocess.Popen([REDIS_SENTINEL, str(conf)], stdout=log, stderr=subprocess.STDOUT)

    def command(self, *args: Any) -> Any:
        import redis

        with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2) as client:
            return client.execute_command(*args)

    def master_port(self) -> int | None:
        with contextlib.suppress(Exception):
            return int(self.command("SENTINEL", "get-master-addr-by-name", SERVICE)[1])
        return None

    def replicas(self) -> int:
        with contextlib.suppress(Exception):
            return len(self.command("SENTINEL", "replicas", SERVICE))
        return 0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def replicas_of(master: RedisServer) -> int:
    with contextlib.suppress(Exception):
        return int(master.command("INFO", "replication")["connected_slaves"])  # redis-py parses INFO
    return 0


@pytest.fixture
def sentinel_setup(start_redis: Callable[..., RedisServer], tmp_path: Path) -> Iterator[
        tuple[RedisServer, list[RedisServer], Sentinel]]:
    if not REDIS_SENTINEL:
        pytest.skip("redis-sentinel is not installed (Debian package redis-sentinel; `make system-deps` installs it)")
    fast = ("--repl-diskless-sync-delay", "0")  # a replica syncs at once, not after redis's 5 s of waiting for others
    master = start_redis(*fast)
    replicas = [start_redis(*fast, "--replicaof", "127.0.0.1", str(master.port)) for _ in range(2)]
    assert wait_for(lambda: replicas_of(master) == 2, timeout=15), "the replicas did not connect"
    directory = tmp_path / "sentinel"
    directory.mkdir()
    sentinel = Sentinel(directory, master.port)
    try:
        assert wait_for(lambda: sentinel.master_port() == master.port and sentinel.replicas() == 2, timeout=20), \
            "the sentinel did not find the master and its replicas"
        yield master, replicas, sentinel
    finally:
        for replica in replicas:  # never leave a stopped process behind
            if replica.running:
                replica.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        sentinel.stop()


def _retrying(call: Callable[[], Any], seconds: float = 30) -> Any:
    """`call()`, again while the store answers 503 (a failover in progress), for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except openai.APIStatusError as e:
            if e.status_code != 503 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_failover_loses_no_acknowledged_response(
        sentinel_setup: tuple[RedisServer, list[RedisServer], Sentinel], start_mock: Callable[..., Mock],
        start_proxy: Callable[..., Any]) -> None:
    master, replicas, sentinel = sentinel_setup
    # Every replica acknowledges: whichever Sentinel promotes holds the write (with one of two, its choice by stale
    # offsets can pick the other: docs/state-store.md).
    url = f"redis+sentinel://127.0.0.1:{sentinel.port}/{SERVICE}?wait_replicas={len(replicas)}"
    mock = start_mock("openai")
    safe = start_proxy(mock=mock, server={"state_store": url, "state_timeout": 0.5}).client()

    # (503 until both replicas have synced with the master: not acknowledged, so tried again)
    acknowledged = [_retrying(lambda i=i: safe.responses.create(model="m", input=f"turn one of chat {i}"))  # type: ignore[misc]
                    for i in range(3)]

    for replica in replicas:  # the replicas fall behind: nothing new reaches them
        replica.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    with pytest.raises(openai.APIStatusError) as refused:
        safe.responses.create(model="m", input="stored on the master alone")
    assert refused.value.status_code == 503
    assert refused.value.body["code"] == "state_store_unavailable"  # type: ignore[index]

    old = master.port
    master.kill()
    for replica in replicas:
        replica.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    assert wait_for(lambda: sentinel.master_port() not in (None, old), timeout=30), "no failover"
    assert sentinel.master_port() in [r.port for r in replicas]

    # The follow-ups read the stored turns and store nothing: the promoted replica has one replica left, fewer than
    # wait_replicas, so it refuses new writes until another one joins (the price docs/state-store.md names).
    for first in acknowledged:
        follow = _retrying(lambda first=first: safe.responses.create(  # type: ignore[misc]
            model="m", input="and then?", previous_response_id=first.id, store=False))
        assert follow.status == "completed" and follow.output_text
        assert _retrying(lambda first=first: safe.responses.retrieve(first.id)).id == first.id  # type: ignore[misc]


def _cluster_ok(node: RedisServer) -> bool:
    with contextlib.suppress(Exception):
        return b"cluster_state:ok" in node.command("CLUSTER", "INFO")
    return False


def test_two_proxies_share_responses_through_a_cluster(
        start_redis: Callable[..., RedisServer], start_mock: Callable[..., Mock],
        start_proxy: Callable[..., Any]) -> None:
    if not REDIS_CLI:
        pytest.skip("redis-cli is not installed (Debian package redis-tools, a dependency of redis-server)")
    nodes = [start_redis("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                         "--cluster-node-timeout", "2000") for _ in range(3)]
    subprocess.run([REDIS_CLI, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
                    "--cluster-replicas", "0", "--cluster-yes"], check=True, timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: all(_cluster_ok(n) for n in nodes), timeout=30), "the cluster did not form"
    mock = start_mock("openai")
    a = start_proxy(mock=mock, server={"state_store": f"redis+cluster://127.0.0.1:{nodes[0].port}"}).client()
    b = start_proxy(mock=mock, server={
        "state_store": f"redis+cluster://127.0.0.1:{nodes[1].port},127.0.0.1:{nodes[2].port}"}).client()
    firsts = [a.responses.create(model="m", input=f"hello {i}") for i in range(8)]
    for first in firsts:
        follow = b.responses.create(model="m", input="and then?", previous_response_id=first.id)
        assert follow.status == "completed" and follow.output_text
    held = [int(n.command("DBSIZE")) for n in nodes]
    assert sum(held) == 16 and sum(1 for n in held if n) >= 2  # keys on several nodes: routed by slot


def test_a_sentinel_that_is_not_there_is_a_503_not_a_hang(start_mock: Callable[..., Mock],
                                                           start_proxy: Callable[..., Any]) -> None:
    with socket.socket() as silent:  # accepts and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        proxy = start_proxy(mock=start_mock("openai"), server={
            "state_store": f"redis+sentinel://127.0.0.1:{silent.getsockname()[1]},127.0.0.1:{free_port()}/m",
            "state_timeout": 0.3})
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as err:
            proxy.client().responses.create(model="m", input="hi")
    assert err.value.status_code == 503 and time.monotonic() - started < 5
