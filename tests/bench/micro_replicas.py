"""In-process micro benchmark of one request's walk over the replica machinery (proxy/gateway/replicas.py,
proxy/gateway/admission.py) and of a scrape.

    python tests/bench/micro_replicas.py [--rounds 5] [--ref GIT_REF] [--multiprocess]

A walk is what the handler (proxy/endpoint/inference.py) does per request: `ReplicaSet.attempts`, `Attempts.next`
(acquire a ticket), `Attempts.succeeded`, `Ticket.release`; "walk" times all of it, "release" the release alone.
Upstreams: one replica without an admission limit (the common case), one with `max_in_flight`, three replicas balanced
by least_outstanding, three by prefix_affinity. "scrape" renders /metrics after the walks (the replica series and the
attempt counters). Coroutines are stepped by hand (no wait happens on these paths), so the event loop's own cost is
not in the figures.

`--ref REF` runs the same scenarios on REF's proxy/ (`git archive`) in a separate process, alternating with this
tree's, so the before/after comes from one run on one machine. `--multiprocess` runs both in prometheus_client's
multiprocess mode (values in mmap files in a temporary PROMETHEUS_MULTIPROC_DIR, as with `serve --workers N`). Prints
µs: the fastest over the alternating rounds (the machine is shared). Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from timing import fastest  # tests/bench/timing.py, next to this script (imports nothing of the proxy)

ROOT = Path(__file__).resolve().parents[2]
REQUEST = {"model": "m", "messages": [{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "Say hello in five words."}]}


def scenarios() -> dict[str, Callable[[], object]]:
    """Runs in the worker process, after `proxy` was imported from the tree under test."""
    from proxy.dialects import get_dialect
    from proxy.gateway.redact import Redactor
    from proxy.gateway.replicas import ReplicaSet
    from proxy.metrics.definitions import Metrics
    from proxy.settings import ReplicaSettings, ServerSettings, UpstreamSettings

    multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
    metrics = Metrics(["m"], multiprocess=multiprocess)
    three = tuple(ReplicaSettings(str(i), f"http://127.0.0.1:{i + 1}") for i in range(3))
    upstreams = {
        "1 replica": UpstreamSettings(name="solo", dialect="openai", url="http://127.0.0.1:1"),
        "1 replica, max_in_flight": UpstreamSettings(name="limited", dialect="openai", url="http://127.0.0.1:1",
                                                     max_in_flight=64, queue_size=64),
        "3 replicas, least_outstanding": UpstreamSettings(name="three", dialect="openai", url=three[0].url,
                                                          replicas=three),
        "3 replicas, prefix_affinity": UpstreamSettings(name="affine", dialect="openai", url=three[0].url,
                                                        replicas=three, balance="prefix_affinity"),
    }
    sets = {name: ReplicaSet(u, ServerSettings(), get_dialect("openai"), metrics, Redactor())
            for name, u in upstreams.items()}

    def step(coro: Any) -> Any:
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        raise RuntimeError("the walk waited")

    def walk(rset: Any) -> Callable[[], object]:
        def run() -> None:
            attempts = rset.attempts(REQUEST)
            ticket = step(attempts.next())
            attempts.succeeded(ticket)
            ticket.release()
        return run

    def release(rset: Any) -> Callable[[], object]:
        # a ticket taken outside the timed call: worker() times `run` alone
        pending: list[Any] = []

        def take() -> None:
            attempts = rset.attempts(REQUEST)
            ticket = step(attempts.next())
            attempts.succeeded(ticket)
            pending.append(ticket)

        def run() -> None:
            pending.pop().release()

        run.take = take  # type: ignore[attr-defined]
        return run

    table: dict[str, Callable[[], object]] = {}
    for name, rset in sets.items():
        table[f"walk: {name}"] = walk(rset)
    table["release: 1 replica"] = release(sets["1 replica"])
    for name in sets:  # every series exists before the scrape is timed
        walk(sets[name])()
    table["scrape (/metrics)"] = lambda: metrics.render()
    return table


def worker(root: str, rounds: int) -> None:
    sys.path.insert(0, root)
    table = scenarios()
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, run in table.items():
            us = fastest(run, before=getattr(run, "take", None)) * 1e6  # `take`: a ticket, untimed
            best[name] = min(best.get(name, float("inf")), us)
    print(json.dumps(best))


def export(ref: str, into: str) -> str:
    """REF's proxy/ package, unpacked under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "proxy"], check=True,
                             capture_output=True, timeout=60).stdout
    os.makedirs(into)
    path = Path(into) / "ref.tar"
    path.write_bytes(archive)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ref", help="a git ref to compare with (its proxy/ runs in its own process)")
    ap.add_argument("--multiprocess", action="store_true")
    ap.add_argument("--worker", metavar="ROOT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, 1)
        return
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        trees = {"this tree": str(ROOT)}
        if args.ref:
            trees = {args.ref: export(args.ref, os.path.join(tmp, "ref")), **trees}
        best: dict[str, dict[str, float]] = {label: {} for label in trees}
        for i in range(args.rounds):
            for label, root in trees.items():
                env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
                if args.multiprocess:  # a fresh, empty directory per process: prometheus_client reads it at import
                    env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix=f"mp{i}-", dir=tmp)
                out = subprocess.run([sys.executable, __file__, "--worker", root], env=env, check=True,
                                     capture_output=True, text=True, timeout=300).stdout
                for name, us in json.loads(out).items():
                    best[label][name] = min(best[label].get(name, float("inf")), us)
    mode = "multiprocess (mmap files)" if args.multiprocess else "single process"
    print(f"replica walk per request, {mode}, µs, fastest of {args.rounds} alternating rounds")
    labels = list(trees)
    print(f"{'':<42}" + "".join(f"{label:>14}" for label in labels) + ("        ratio" if len(labels) == 2 else ""))
    for name in best[labels[-1]]:
        row = [best[label].get(name, float("nan")) for label in labels]
        ratio = f"{row[1] / row[0]:>12.2f}x" if len(row) == 2 else ""
        print(f"{name:<42}" + "".join(f"{us:>14.2f}" for us in row) + ratio)


if __name__ == "__main__":
    main()
