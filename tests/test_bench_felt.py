"""`make bench-felt` works (tests/bench/felt.py), in its short form (FELT_SMOKE=1): the bare relay and the pure proxy
measured against the replaying upstream, every figure present, the load not the bottleneck (direct carries far more
requests/s than the relay, and at least as many streams), and a short memory soak of the proxy with every answer
whole. Real processes on loopback; bounded by the script's own short durations and a timeout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FELT = os.path.join(ROOT, "tests", "bench", "felt.py")

pytestmark = [pytest.mark.bench, pytest.mark.skipif(shutil.which("wrk") is None or (os.cpu_count() or 1) < 2,
                                reason="bench-felt needs wrk (Debian package) and two CPUs")]


def run_felt(*args: str, soak_seconds: int = 6) -> str:
    env = {**os.environ, "FELT_SMOKE": "1", "FELT_SOAK_SECONDS": str(soak_seconds)}
    done = subprocess.run([sys.executable, FELT, *args], capture_output=True, text=True, timeout=400, env=env,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_every_figure_of_the_bare_relay_and_the_proxy_with_the_load_not_the_bottleneck(tmp_path: str) -> None:
    out = os.path.join(tmp_path, "felt.json")
    text = run_felt("--relays", "bare,pure", "--no-soak", "--json", out)
    with open(out) as f:
        figures = json.load(f)
    assert set(figures) == {"direct", "direct mindie-ft", "direct across CPUs", "bare aiohttp", "proxy pure chat",
                            "proxy pure messages", "proxy pure mindie-ft"}
    for name, row in figures.items():
        keys = ("added_c1_p99_us", "added_ttft_p99_us", "added_gap_p99_us")
        if not name.startswith("direct "):  # the MindIE baseline and the machine's floor: their c=1 figures only
            keys += ("rps@100ms", "streams", "added_c1one_p99_us")  # and the c=1 tail with the relay on one CPU
        for key in keys:
            assert row[key] == row[key], (name, key, row)  # not NaN: measured
        assert row["c1_errors"] == 0 and row["c1_stream_failed"] == 0, (name, row)
    direct, bare = figures["direct"], figures["bare aiohttp"]
    assert direct["rps_max"] > 5 * bare["rps_max"], (direct, bare)
    assert direct["streams"] >= bare["streams"] > 0
    assert figures["direct mindie-ft"]["c1_p99_us"] > 0
    assert 15_000 < direct["gap_p50_us"] < 25_000  # the 20 ms pace, seen by the stream client
    assert "| added p99 c=1 µs |" in text and "| streams sustained |" in text
    assert "| added p99 c=1 one CPU µs |" in text
    if os.access("/dev/cpu_dma_latency", os.W_OK):  # root: the board's layout again with every CPU polling when idle
        assert all(row["added_c1poll_p99_us"] == row["added_c1poll_p99_us"] for row in figures.values())
        assert "| added p99 c=1 polling idle µs |" in text


def test_the_memory_soak_reports_idle_steady_growth_and_recovered_with_every_answer_whole() -> None:
    text = run_felt("--soak-only", "--compiled-tree", ROOT, soak_seconds=6)  # this tree itself: no compiling
    assert ", 0 failed" in text, text
    line = next(x for x in text.splitlines() if "RSS idle" in x)
    for word in ("steady", "growth", "KiB/min", "recovered"):
        assert word in line, line
