"""Speed as users feel it (`make bench-felt`): the figures of the public gateway board "On the Bench"
(github.com/GetBusbar/benchmarking), measured its way for every relay in one run on this machine.

    python tests/bench/felt.py [--relays direct,nginx,...] [--no-soak]

Per relay: the p99 latency it adds over direct at concurrency 1 (an instant mock); the throughput frontier (the
most requests/s over a concurrency sweep while 99 % finish under 1, 5, 10, 50, 100 ms and none failed); for streams
of 64 frames paced 20 ms, the added time to the first frame and the added inter-frame gap (p50, p99; a relay's
gap percentile minus direct's), and the streams sustained (the most concurrent streams with every frame delivered,
none failed and no stall past 10 x the pace); each relay's resident memory idle and after its runs. Then the memory
soak of the compiled proxy (tests/bench/felt_soak.py).

The relays, each on CPU 1 alone (idle but the one measured): nginx as a plain relay (Debian package), the bare
aiohttp relay (tests/bench/bare_relay.py), dialect-proxy pure and compiled (tests/compiled_tree.py) with OpenAI in
and out, MindIE full-text in front of a MindIE upstream, and Anthropic Messages in / OpenAI out, and LiteLLM's proxy
as an OpenAI-to-OpenAI relay (installed in its own virtualenv by the Makefile target; telemetry off). The upstreams
(tests/bench/felt_mock.py, the built-in mock's answers replayed) and the load (wrk, and tests/bench/felt_load.py's
stream client in this process) share CPU 0: the direct rows show how much more they carry than any relay. The
MindIE row's added figures are against the MindIE upstream direct; the Messages row's against the OpenAI upstream
direct (the board's way: the added time includes the translation). The c=1 run is made three times: the relay on its own
CPU (the board's layout); moved onto the load's CPU, where no idle vCPU has to be woken: on this VM such a wake-up
alone has a p99 of hundreds of µs to milliseconds (the row "direct across CPUs"), hiding the relay's own tail; and
on its own CPU again with every CPU idling by polling (PM QoS, root only: `polling_idle`), a dedicated core that
never halts, where the floor is gone and the relay does not share its CPU.

Durations (environment; the full run by default, ~28 minutes with the 10-minute soak): FELT_C1_SECONDS (10),
FELT_RUNG_SECONDS (2), FELT_C1_STREAMS (15), FELT_SWEEP_SECONDS (3), FELT_SOAK_SECONDS (600); FELT_SMOKE=1 makes
every one short (the test tests/bench/test_felt.py). FELT_LITELLM: the litellm executable (default
.bench/litellm-venv/bin/litellm; the row is left out without it). Loopback only; every run bounded. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import uvloop

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (tests/bench/bench.py: processes, nginx)
import felt_load  # noqa: E402
import felt_soak  # noqa: E402
from felt_load import Rung, StreamFigures, pct  # noqa: E402

SMOKE = os.environ.get("FELT_SMOKE") == "1"


def setting(name: str, full: float, smoke: float) -> float:
    return float(os.environ.get(name, smoke if SMOKE else full))


C1_SECONDS = setting("FELT_C1_SECONDS", 10, 1)
RUNG_SECONDS = setting("FELT_RUNG_SECONDS", 2, 1)
C1_STREAMS = int(setting("FELT_C1_STREAMS", 15, 3))
SWEEP_SECONDS = setting("FELT_SWEEP_SECONDS", 3, 1.5)
SOAK_SECONDS = setting("FELT_SOAK_SECONDS", 600, 20)
PACE_MS = 20.0
FRAMES = 64
STALL = 10 * PACE_MS / 1000
BOUNDS_MS = (1, 5, 10, 50, 100)
LADDER = (1, 2, 4, 8, 16, 32, 64, 128, 256) if not SMOKE else (1, 4, 16)
STREAM_LADDER = (1, 8, 32, 128, 256, 384, 512, 768, 1024, 1536, 2048) if not SMOKE else (1, 8, 32)
RELAY_CPU, LOAD_CPU = 1, 0
LITELLM = os.environ.get("FELT_LITELLM", os.path.join(ROOT, ".bench", "litellm-venv", "bin", "litellm"))


# -------------------------------------------------------------------------------------------- the upstreams

MOCK_PROMPT = f"bench [mock:chunks={FRAMES}]"


async def capture(dialect: str, full_text: bool, directory: str) -> None:
    """The built-in mock's non-stream and stream answers to the bench's prompt, as felt_mock.py's files."""
    port = bench.free_port()
    mock = bench.start(["mock", "--port", str(port), "--dialect", dialect, *(["--full-text"] if full_text else [])],
                       LOAD_CPU)
    try:
        base = f"http://127.0.0.1:{port}"
        await bench.wait_up(base + "/health")
        async with aiohttp.ClientSession() as s:
            for name, stream in (("plain", False), ("stream", True)):
                body = {"model": "bench", "stream": stream, "messages": [{"role": "user", "content": MOCK_PROMPT}]}
                async with s.post(base + "/v1/chat/completions", json=body) as r:
                    data = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"mock {dialect} answered {r.status}: {data[:300]!r}")
                with open(os.path.join(directory, name), "wb") as f:  # noqa: ASYNC230 (before any load)
                    f.write(data)
    finally:
        bench.stop(mock)


@dataclass
class Upstream:
    name: str
    dialect: str
    full_text: bool
    cpu: int = LOAD_CPU
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        directory = tempfile.mkdtemp(prefix=f"felt-{self.name}-")
        bench.TEMP_DIRS.append(directory)
        await capture(self.dialect, self.full_text, directory)
        self.port = bench.free_port()
        self.proc = bench.start([os.path.join(HERE, "felt_mock.py"), str(self.port), directory, str(PACE_MS)],
                                self.cpu)
        await bench.wait_up(f"http://127.0.0.1:{self.port}/")


# ------------------------------------------------------------------------------------------------- the relays

@dataclass
class Relay:
    """One row: a relay (or direct) in front of an upstream, spoken to in one client dialect."""

    name: str
    upstream: str  # "openai" or "mindie"
    api: str = "chat"
    baseline: str = "direct"  # the row whose figures this one's are "added" to
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    baseline_only: bool = False  # the MindIE upstream direct: its c=1 figures only, for the MindIE row's "added"
    figures: dict[str, float] = field(default_factory=dict)
    sweep: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def pin(cpu: int) -> Callable[[], None]:
    def preexec() -> None:
        if bench.TWO_CPUS:
            os.sched_setaffinity(0, {cpu})
    return preexec


def start_proxy(tree: str | None, upstream: Upstream) -> tuple[int, subprocess.Popen[bytes]]:
    port = bench.free_port()
    ft = ["--full-text"] if upstream.full_text else []
    proc = bench.start(["serve", "--port", str(port), "--upstream-url", f"http://127.0.0.1:{upstream.port}",
                        "--upstream-dialect", upstream.dialect, "--log-level", "warning", *ft], RELAY_CPU,
                       cwd=tree or ROOT)
    return port, proc


LITELLM_CONFIG = """model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench
      api_base: http://127.0.0.1:{port}/v1
      api_key: bench
litellm_settings:
  telemetry: false
  drop_params: true
"""


def start_litellm(upstream: Upstream) -> tuple[int, subprocess.Popen[bytes]] | None:
    """LiteLLM's proxy (one uvicorn worker, no database, no callbacks), OpenAI to the OpenAI upstream."""
    if not os.path.exists(LITELLM):
        return None
    directory = tempfile.mkdtemp(prefix="felt-litellm-")
    bench.TEMP_DIRS.append(directory)
    config = os.path.join(directory, "config.yaml")
    with open(config, "w") as f:
        f.write(LITELLM_CONFIG.format(port=upstream.port))
    port = bench.free_port()
    env = {**os.environ, "LITELLM_TELEMETRY": "False", "LITELLM_MASTER_KEY": felt_load.KEY,
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "LITELLM_MODE": "PRODUCTION",
           "DISABLE_ADMIN_UI": "True"}
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([LITELLM, "--config", config, "--host", "127.0.0.1", "--port", str(port),
                             "--num_workers", "1"], preexec_fn=pin(RELAY_CPU), env=env, cwd=directory,
                            stdout=subprocess.DEVNULL, stderr=log)
    bench.LOGS[proc.pid] = log
    return port, proc


async def start_relays(wanted: set[str], ups: dict[str, Upstream], compiled: str | None,
                       relays: list[Relay]) -> None:
    """Every row into `relays` as it starts (the caller stops them, also when one fails to start)."""
    relays += [Relay("direct", "openai"), Relay("direct mindie-ft", "mindie", baseline="direct mindie-ft",
                                                   baseline_only=True)]
    relays[0].port, relays[1].port = ups["openai"].port, ups["mindie"].port
    # The machine's floor: no relay, the upstream alone on the relays' CPU, so that each request wakes the other
    # vCPU as every relay row's does (its c=1 figures only; docs/speed.md "The machine's floor").
    cross = Upstream("openai", "openai", False, cpu=RELAY_CPU)
    await cross.start()
    relays.append(Relay("direct across CPUs", "openai", port=cross.port, proc=cross.proc, baseline_only=True))
    if "nginx" in wanted:
        port = bench.free_port()
        proc = bench.start_nginx(port, ups["openai"].port, RELAY_CPU)
        if proc is not None:
            relays.append(Relay("nginx", "openai", port=port, proc=proc))
    if "bare" in wanted:
        port = bench.free_port()
        proc = bench.start([os.path.join(HERE, "bare_relay.py"), str(port), f"http://127.0.0.1:{ups['openai'].port}"],
                           RELAY_CPU)
        relays.append(Relay("bare aiohttp", "openai", port=port, proc=proc))
    builds = [("pure", None)] * ("pure" in wanted) + [("compiled", compiled)] * (compiled is not None)
    for build, tree in builds:
        port, proc = start_proxy(tree, ups["openai"])
        relays.append(Relay(f"proxy {build} chat", "openai", port=port, proc=proc))
        relays.append(Relay(f"proxy {build} messages", "openai", "messages", port=port, proc=proc))
        port, proc = start_proxy(tree, ups["mindie"])
        relays.append(Relay(f"proxy {build} mindie-ft", "mindie", baseline="direct mindie-ft", port=port, proc=proc))
    for relay in relays:
        await wait_ready(relay)
    if "litellm" in wanted and (started := start_litellm(ups["openai"])) is not None:
        litellm = Relay("litellm", "openai", port=started[0], proc=started[1])
        try:
            await wait_ready(litellm)
        except RuntimeError as e:  # a third-party install: the run goes on without its row
            print(f"LiteLLM left out, it did not start: {str(e)[-1500:]}", flush=True)
            bench.stop(started[1])
        else:
            relays.append(litellm)


async def wait_ready(relay: Relay, timeout: float = 120) -> None:
    """Until the relay answers a real request (LiteLLM takes seconds to start)."""
    client = felt_load.Client(relay.port, relay.api, stream=False, timeout=5)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if died := bench.died(relay.proc):
            raise RuntimeError(died)
        answer, _ = await client.one(None)
        if answer.status == 200 and answer.complete:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{relay.name} did not answer within {timeout:g} s")


# ---------------------------------------------------------------------------------------------- the figures

def frontier(rungs: list[Rung]) -> dict[str, float]:
    """The most requests/s of a rung with p99 under each bound and no request failed (0 when none qualified)."""
    out = {}
    for bound in BOUNDS_MS:
        ok = [r.rps for r in rungs if r.errors == 0 and r.p99_us < bound * 1000]
        out[f"rps@{bound}ms"] = max(ok, default=0.0)
    return out


async def measure_requests(relay: Relay) -> None:
    script = felt_load.wrk_script(relay.api)
    try:
        felt_load.wrk(relay.url, script, 1, 1)  # warm-up
        c1 = await asyncio.to_thread(felt_load.wrk, relay.url, script, 1, C1_SECONDS)
        relay.figures.update(c1_p50_us=c1.p50_us, c1_p99_us=c1.p99_us, c1_errors=c1.errors)
        if relay.proc is None:  # direct: the upstream and wrk already share one CPU
            relay.figures.update(c1one_p50_us=c1.p50_us, c1one_p99_us=c1.p99_us)
        elif not relay.baseline_only:
            one = await c1_one_cpu(relay, script)
            relay.figures.update(c1one_p50_us=one.p50_us, c1one_p99_us=one.p99_us)
        polled = await c1_polling(relay, script)
        if polled is not None:
            relay.figures.update(c1poll_p50_us=polled.p50_us, c1poll_p99_us=polled.p99_us)
        if relay.baseline_only:
            return
        rungs: list[Rung] = []
        for conc in LADDER:
            rung = await asyncio.to_thread(felt_load.wrk, relay.url, script, conc, RUNG_SECONDS)
            rungs.append(rung)
            relay.sweep.append(f"c{conc}: {rung.rps:.0f}/s p99 {rung.p99_us / 1000:.1f} ms err {rung.errors}")
            if rung.errors or len(rungs) > 1 and min(r.p99_us for r in rungs[-2:]) > 2 * BOUNDS_MS[-1] * 1000:
                break  # no rung above qualifies at any bound (two in a row: one can be the machine's hiccup)
        relay.figures.update(frontier(rungs))
        relay.figures["rps_max"] = max((r.rps for r in rungs if not r.errors), default=0.0)
    finally:
        os.unlink(script)


async def c1_one_cpu(relay: Relay, script: str) -> Rung:
    """The c=1 run again with the relay moved onto the load's CPU for its duration: each request then wakes no
    idle vCPU, so its tail is the relay's own work, not this VM's cross-vCPU wake-up floor (docs/speed.md "The
    machine's floor"). The direct rows already run this way (the upstream and wrk share CPU 0)."""
    move(relay.proc, LOAD_CPU)
    try:
        felt_load.wrk(relay.url, script, 1, 1)  # warm-up on the new CPU
        return await asyncio.to_thread(felt_load.wrk, relay.url, script, 1, C1_SECONDS)
    finally:
        move(relay.proc, RELAY_CPU)


async def c1_polling(relay: Relay, script: str) -> Rung | None:
    """The c=1 run again in the board's layout (the relay on its own CPU) with every CPU idling by polling instead of
    halting (`polling_idle`): a dedicated core that never sleeps, so a request wakes no halted vCPU and the relay's
    own tail shows beside the other relays'. None where the polling cannot be held (not root)."""
    with polling_idle() as held:
        if not held:
            return None
        felt_load.wrk(relay.url, script, 1, 1)  # warm-up
        return await asyncio.to_thread(felt_load.wrk, relay.url, script, 1, C1_SECONDS)


@contextlib.contextmanager
def polling_idle() -> Iterator[bool]:
    """While held, Linux's CPU idle governor keeps every CPU in its polling state (PM QoS: 0 µs written to
    /dev/cpu_dma_latency, the request latency-tuning profiles such as tuned's make; released when the file is
    closed). Idle vCPUs of this VM otherwise halt, and waking one costs a round trip through the hypervisor: the
    machine's floor (docs/speed.md). False when the file cannot be opened (root only)."""
    try:
        fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
    except OSError:
        yield False
        return
    try:
        os.write(fd, struct.pack("i", 0))
        yield True
    finally:
        os.close(fd)


def move(proc: subprocess.Popen[bytes] | None, cpu: int) -> None:
    """Every thread of the process and of its children onto `cpu` (nginx's worker, LiteLLM's threads)."""
    if proc is None or not bench.TWO_CPUS:
        return
    for pid in [proc.pid, *bench.children(proc.pid)]:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(task), {cpu})
            except OSError:
                pass  # a thread that ended


async def measure_streams(relay: Relay) -> None:
    client = felt_load.Client(relay.port, relay.api, timeout=30)
    await client.run(1, 0.1, max_each=1)  # warm-up
    t0 = time.perf_counter()
    c1 = felt_load.figures(await client.run(1, 3600, max_each=C1_STREAMS), FRAMES, STALL, time.perf_counter() - t0)
    relay.figures.update(ttft_p50_us=pct(c1.ttft, 50) * 1e6, ttft_p99_us=pct(c1.ttft, 99) * 1e6,
                         gap_p50_us=pct(c1.gaps, 50) * 1e6, gap_p99_us=pct(c1.gaps, 99) * 1e6,
                         c1_stream_failed=c1.failed)
    if relay.baseline_only:
        return
    best: StreamFigures | None = None
    best_conc = 0
    for conc in STREAM_LADDER:
        f = await stream_window(client, relay, conc)
        if f.failed or f.stalled or not f.streams:
            f = await stream_window(client, relay, conc)  # the board's rule: a point fails only if no window passed
        if f.failed or f.stalled or not f.streams:
            break
        best, best_conc = f, conc
    relay.figures["streams"] = best_conc
    relay.figures["stream_fps"] = best.fps if best else 0.0


async def stream_window(client: felt_load.Client, relay: Relay, conc: int) -> StreamFigures:
    t0 = time.perf_counter()
    streams = await client.run(conc, SWEEP_SECONDS)
    f = felt_load.figures(streams, FRAMES, STALL, time.perf_counter() - t0)
    relay.sweep.append(f"streams {conc}: {f.streams} done, {f.failed} failed, {f.stalled} stalled, "
                       f"{f.fps:.0f} frames/s, gap p99 {pct(f.gaps, 99) * 1000:.1f} ms")
    return f


async def measure(relay: Relay) -> None:
    pids = [relay.proc.pid] if relay.proc else []
    if pids:
        relay.figures["rss_idle_mib"] = bench.tree_rss_kib(pids[0]) / 1024
    await measure_requests(relay)
    await measure_streams(relay)
    if pids:
        relay.figures["rss_after_mib"] = bench.tree_rss_kib(pids[0]) / 1024
        if died := bench.died(relay.proc):
            raise RuntimeError(died)


def added(relays: list[Relay]) -> None:
    """Each row's figures minus its baseline's; `load_bound` 1 where a relay sustained as many streams as direct
    (the board's mock-bound guard: there the stream client and the upstream were the limit, the figure a floor)."""
    rows = {r.name: r for r in relays}
    direct_streams = rows["direct"].figures.get("streams", 0)
    for relay in relays:
        base = rows[relay.baseline].figures
        f = relay.figures
        for key in ("c1_p50_us", "c1_p99_us", "c1one_p50_us", "c1one_p99_us", "c1poll_p50_us", "c1poll_p99_us",
                    "ttft_p50_us", "ttft_p99_us", "gap_p50_us", "gap_p99_us"):
            if key in f and key in base:
                f["added_" + key] = f[key] - base[key]
        if relay.name != "direct" and not relay.baseline_only:
            f["load_bound"] = float(f["streams"] >= direct_streams)


# ------------------------------------------------------------------------------------------------- the table

COLUMNS = [  # (heading, figure, format)
    ("added p99 c=1 µs", "added_c1_p99_us", "{:.0f}"),
    ("added p50 c=1 µs", "added_c1_p50_us", "{:.0f}"),
    ("p99 c=1 µs", "c1_p99_us", "{:.0f}"),
    ("added p99 c=1 one CPU µs", "added_c1one_p99_us", "{:.0f}"),
    ("added p50 c=1 one CPU µs", "added_c1one_p50_us", "{:.0f}"),
    ("added p99 c=1 polling idle µs", "added_c1poll_p99_us", "{:.0f}"),
    ("added p50 c=1 polling idle µs", "added_c1poll_p50_us", "{:.0f}"),
    *[(f"req/s p99<{b}ms", f"rps@{b}ms", "{:.0f}") for b in BOUNDS_MS],
    ("added TTFT p50 µs", "added_ttft_p50_us", "{:.0f}"),
    ("added TTFT p99 µs", "added_ttft_p99_us", "{:.0f}"),
    ("added gap p50 µs", "added_gap_p50_us", "{:.0f}"),
    ("added gap p99 µs", "added_gap_p99_us", "{:.0f}"),
    ("streams sustained", "streams", "{:.0f}"),
    ("frames/s there", "stream_fps", "{:.0f}"),
    ("RSS idle MiB", "rss_idle_mib", "{:.1f}"),
    ("RSS after MiB", "rss_after_mib", "{:.1f}"),
]


def table(relays: list[Relay]) -> str:
    """Markdown: one column per relay, one row per figure (pasteable into docs/speed.md)."""
    lines = ["| figure | " + " | ".join(r.name for r in relays) + " |", "|---" * (len(relays) + 1) + "|"]
    for heading, key, fmt in COLUMNS:
        cells = [cell(r.figures, key, fmt) for r in relays]
        lines.append(f"| {heading} | " + " | ".join(cells) + " |")
    lines.append("\n≥: as many streams as direct, the stream client and the upstream on CPU 0 being the limit.")
    return "\n".join(lines)


# The board's published figures that issue 48 quotes (On the Bench, 24 Jul 2026; 4 Graviton3 cores a gateway), µs.
BOARD = {
    "added_c1_p99_us": ("added p99 c=1 µs", {"LiteLLM-Python": 8000, "Bifrost": 939, "agentgateway": 186,
                                              "LiteLLM-Rust": 107}),
    "added_gap_p99_us": ("added inter-frame µs", {"LiteLLM-Python": 2700, "Bifrost": 28, "agentgateway": 1}),
}


def board(relays: list[Relay]) -> str:
    """The proxy's place on the board estimated through LiteLLM, measured here and there: the board's LiteLLM figure
    x (the proxy's here / LiteLLM's here). An estimate across machines (Graviton3, 4 cores a gateway there; one
    vCPU here), not a measurement."""
    rows = {r.name: r.figures for r in relays}
    if "litellm" not in rows:
        return "(the board estimate needs the LiteLLM row)"
    names = [n for n in ("proxy compiled chat", "proxy compiled messages", "proxy pure chat") if n in rows]
    lines = ["| figure | LiteLLM here | " + " | ".join(f"{n} here" for n in names) + " | LiteLLM-Python on the board"
             " | " + " | ".join(f"{n} on the board (estimate)" for n in names) + " | the board's others |",
             "|---" * (4 + 2 * len(names)) + "|"]
    for key, (heading, published) in BOARD.items():
        lt = rows["litellm"][key]
        here = [rows[n][key] for n in names]
        estimates = [f"{published['LiteLLM-Python'] * h / lt:.0f}" if h > 0 and lt > 0 else "below resolution"
                     for h in here]
        others = ", ".join(f"{k} {v}" for k, v in published.items() if k != "LiteLLM-Python")
        lines.append(f"| {heading} | {lt:.0f} | " + " | ".join(f"{h:.0f}" for h in here) +
                     f" | {published['LiteLLM-Python']} | " + " | ".join(estimates) + f" | {others} |")
    return "\n".join(lines)


def cell(figures: dict[str, float], key: str, fmt: str) -> str:
    if key not in figures:
        return "—"
    floor = "≥ " if key == "streams" and figures.get("load_bound") else ""
    return floor + fmt.format(figures[key])


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


# The c=1 tail in three layouts: the relay on its own CPU (the board's), on the load's CPU (no idle vCPU to wake:
# the relay's own tail, without this VM's floor, but sharing a CPU with the load), and on its own CPU with every CPU
# idling by polling (the board's layout without the floor: `polling_idle`; root only).
LAYOUTS = (("relay on its own CPU", "added_c1_p99_us"), ("one CPU", "added_c1one_p99_us"),
           ("own CPU, polling idle", "added_c1poll_p99_us"))


def goals(relays: list[Relay]) -> list[str]:
    """The issue's goals for the compiled build, against this run's figures."""
    rows = {r.name: r.figures for r in relays}
    need = ("proxy compiled chat", "nginx", "bare aiohttp")
    if not all(n in rows for n in need):
        return ["(goals need the compiled proxy, nginx and the bare relay in the run)"]
    p, n, b = rows["proxy compiled chat"], rows["nginx"], rows["bare aiohttp"]
    layouts = [(layout, key) for layout, key in LAYOUTS if key in p and key in n]
    out = [
        *[f"added p99 c=1 within 3 x nginx's ({layout}): {p[key]:.0f} vs 3 x {n[key]:.0f} µs "
          f"-> {verdict(p[key] <= 3 * max(n[key], 1))}" for layout, key in layouts],
        f"added inter-frame p99 within 2 x nginx's: {p['added_gap_p99_us']:.0f} vs 2 x {n['added_gap_p99_us']:.0f} µs "
        f"-> {'met' if p['added_gap_p99_us'] <= 2 * max(n['added_gap_p99_us'], 1) else 'NOT met'}",
        f"streams sustained >= 80 % of the bare relay's: {p['streams']:.0f} vs {b['streams']:.0f} "
        "-> " + (verdict(p["streams"] >= 0.8 * b["streams"]) if b["streams"] else
                 "unknown (the bare relay sustained none)"),
    ]
    if "direct across CPUs" in rows:  # what the machine adds to every relay row's c=1 tail before any relay work
        floor = rows["direct across CPUs"]
        out.append(f"the machine's floor (no relay, the upstream on the relays' CPU): added p99 c=1 "
                   f"{floor['added_c1_p99_us']:.0f} µs, added p50 {floor['added_c1_p50_us']:.0f} µs"
                   + (f"; polling idle: p99 {floor['added_c1poll_p99_us']:.0f} µs, p50 "
                      f"{floor['added_c1poll_p50_us']:.0f} µs" if "added_c1poll_p99_us" in floor else ""))
    if "litellm" in rows:
        lt = rows["litellm"]
        for layout, key in layouts:
            if key not in lt:
                continue
            ratio_p99 = lt[key] / max(p[key], 1)
            out.append(f"ahead of LiteLLM >= 20 x on added p99 ({layout}): {ratio_p99:.1f} x "
                       f"-> {verdict(ratio_p99 >= 20)}")
        ratio_rps = p["rps@10ms"] / lt["rps@10ms"] if lt["rps@10ms"] else float("inf")
        out.append(f"ahead of LiteLLM >= 20 x on req/s at p99 < 10 ms: {ratio_rps:.1f} x "
                   f"-> {verdict(ratio_rps >= 20)}" if lt["rps@10ms"] else
                   f"ahead of LiteLLM >= 20 x on req/s at p99 < 10 ms: {p['rps@10ms']:.0f} against none "
                   f"(LiteLLM carried nothing under 10 ms) -> {verdict(p['rps@10ms'] > 0)}")
    return out


async def memory_soak(tree: str) -> list[str]:
    up = Upstream("soak", "openai", False)
    await up.start()
    try:
        result = await felt_soak.soak(tree, SOAK_SECONDS, up.port, RELAY_CPU)
    finally:
        if up.proc is not None:
            bench.stop(up.proc)
    return felt_soak.report(result, SOAK_SECONDS)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relays", default="nginx,bare,pure,compiled,litellm",
                    help="comma-separated, from nginx, bare, pure, compiled, litellm (direct always runs)")
    ap.add_argument("--compiled-tree", help="an already compiled copy of this tree (tests/compiled_tree.py)")
    ap.add_argument("--no-soak", action="store_true")
    ap.add_argument("--soak-only", action="store_true", help="only the memory soak of the compiled proxy")
    ap.add_argument("--json", help="write every figure of every relay to this file")
    args = ap.parse_args()
    wanted = set(args.relays.split(","))
    bench.raise_fd_limit(65536)
    bench.pin_self({LOAD_CPU})
    started = time.monotonic()
    compiled = args.compiled_tree
    if compiled is None and "compiled" in wanted:
        compiled = bench.compiled_copy()
        bench.TEMP_DIRS.append(compiled)
    print(f"bench-felt {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; relays on CPU {RELAY_CPU}, upstream mocks and load (wrk, stream client) on "
          f"CPU {LOAD_CPU}; c=1 {C1_SECONDS:g} s, rungs {RUNG_SECONDS:g} s {LADDER}, {C1_STREAMS} streams at c=1, "
          f"stream sweep {SWEEP_SECONDS:g} s a point {STREAM_LADDER}, {FRAMES} frames paced {PACE_MS:g} ms, "
          f"stall > {STALL * 1000:g} ms", flush=True)
    ups = {"openai": Upstream("openai", "openai", False), "mindie": Upstream("mindie", "mindie", True)}
    relays: list[Relay] = []
    if args.soak_only:
        print("\n".join(await memory_soak(compiled or ROOT)))
        return
    try:
        for up in ups.values():
            await up.start()
        await start_relays(wanted, ups, compiled, relays)
        for relay in relays:
            await measure(relay)
            print(f"  {relay.name}: " + "; ".join(relay.sweep), flush=True)
        added(relays)
        print("\n" + table(relays) + "\n")
        for line in goals(relays):
            print(line)
        print("\nOn the board, estimated through LiteLLM (its figure there x ours / its here; across machines):\n")
        print(board(relays))
        if args.json:
            with open(args.json, "w") as f:  # noqa: ASYNC230 (after the load)
                json.dump({r.name: r.figures for r in relays}, f, indent=1)
    finally:
        bench.stop(*{r.proc for r in relays if r.proc is not None}, *(u.proc for u in ups.values() if u.proc))
    if not args.no_soak and compiled is not None:
        print("\n" + "\n".join(await memory_soak(compiled)))
    print(f"\nbench-felt took {(time.monotonic() - started) / 60:.1f} minutes")


if __name__ == "__main__":
    try:
        uvloop.run(main())
    finally:
        for tree in bench.TEMP_DIRS:
            shutil.rmtree(tree, ignore_errors=True)
