"""proxy.metrics.definitions: exact values after a scripted sequence, label bounding, exposition validity,
multiprocess."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.build import BUILD
from proxy.dialects.mindie import MindIEDialect
from proxy.hub.events import Timings
from proxy.metrics import definitions as metrics_mod
from proxy.metrics import observer as observer_mod
from proxy.metrics.definitions import Metrics, prepare_multiprocess_dir
from proxy.metrics.labels import MAX_UNCONFIGURED_MODELS

ROUTE = "/v1/chat/completions"
CONFIGURED = ["DeepSeek-R1", "gpt-4o", "deepseek-chat"]


def mindie_timings(extras: dict[str, object]) -> Timings:
    """MindIE's timing fields as the proxy reads them (proxy/dialects/mindie.py), for the metrics layer."""
    timings = MindIEDialect().timings(extras)
    assert timings is not None
    return timings


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def at(self, t: float) -> None:
        assert t >= self.t, "time only moves forward"
        self.t = t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(observer_mod, "_now", c)
    return c


def value(m: Metrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


def series_names(body: bytes) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def run_script(m: Metrics, clock: FakeClock) -> None:
    """The known sequence. Times are offsets from 1000.0 s."""
    # 1. A MindIE stream, complete: role-only chunk, 4 token chunks, usage and timings on the finish chunk.
    clock.at(1000.0)
    o = m.request(ROUTE, "r1", "DeepSeek-R1", stream=True)
    clock.at(1000.25)
    o.upstream_started()
    clock.at(1000.75)
    o.upstream_headers()  # 0.5 s upstream wait
    clock.at(1001.0)
    o.chunk(False)  # role-only chunk: not the first token
    clock.at(1001.5)
    o.chunk(True)  # TTFT 1.5 s
    clock.at(1001.625)
    o.chunk(True)  # ITL 0.125
    clock.at(1001.75)
    o.chunk(True)  # ITL 0.125
    clock.at(1002.0)
    o.chunk(True)  # ITL 0.25
    o.add_upstream_wait(0.75)  # body reads: total upstream wait 1.25 s
    o.usage({
        "prompt_tokens": 54, "completion_tokens": 17, "total_tokens": 71,
        "prompt_tokens_details": {"cached_tokens": 32}, "completion_tokens_details": {"reasoning_tokens": 9},
        "batch_size": [1, 2, 2], "queue_wait_time": [5000, 250, 750],
    })
    o.usage({"prompt_tokens": 1000})  # a second usage (e.g. repeated on a later chunk) is not counted again
    o.upstream_timings(mindie_timings({
        "prefill_time": 200, "decode_time_arr": [50, 25, 25],
        "usage": {"batch_size": [1, 2, 2], "queue_wait_time": [5000, 250, 750]},
    }))
    o.chunk(False)  # the finish chunk
    clock.at(1002.5)
    o.finish(200, False, "stop")  # duration 2.5 s, overhead 2.5 - 1.25 = 1.25 s

    # 2. Non-stream request refused by MindIE with 422 (the proxy answers 400).
    clock.at(1010.0)
    o = m.request(ROUTE, "r1", "gpt-4o", stream=False)
    o.upstream_started()
    clock.at(1010.5)
    o.upstream_headers()
    o.upstream_error("mindie", "422")
    clock.at(1010.625)
    o.finish(400, False, None)

    # 3. DeepSeek stream, the client goes away mid-stream.
    clock.at(1020.0)
    o = m.request(ROUTE, "ds", "deepseek-chat", stream=True)
    o.upstream_started()
    clock.at(1020.5)
    o.upstream_headers()
    clock.at(1021.0)
    o.chunk(True)  # TTFT 1.0
    clock.at(1021.5)
    o.chunk(True)  # ITL 0.5
    clock.at(1022.0)
    o.finish(200, True, None)

    # 4. MindIE stream that dies after the 200: counted as 5xx / truncated whatever status the handler passes.
    clock.at(1030.0)
    o = m.request(ROUTE, "r1", "DeepSeek-R1", stream=True)
    o.upstream_started()
    o.upstream_headers()
    clock.at(1032.0)
    o.chunk(True)  # TTFT 2.0
    o.upstream_error("mindie", "Engine callback timeout")
    o.truncated("upstream_error")
    o.truncated("upstream_error")  # counted once
    clock.at(1033.0)
    o.finish(200, False, None)

    # 5. Connection refused before any byte: the whole time since upstream_started is upstream wait.
    clock.at(1040.0)
    o = m.request(ROUTE, "r1", "DeepSeek-R1", stream=False)
    clock.at(1040.125)
    o.upstream_started()
    clock.at(1041.125)
    o.upstream_error("any", "connect_refused")
    o.finish(502, False, None)  # duration 1.125, overhead 0.125

    # 6. Client gone before the first chunk of a stream; DeepSeek-style usage (cache hit field only).
    clock.at(1050.0)
    o = m.request(ROUTE, "ds", "deepseek-chat", stream=True)
    o.usage({"prompt_tokens": 10, "completion_tokens": 0, "prompt_cache_hit_tokens": 4})
    clock.at(1050.5)
    o.finish(200, True, None)

    m.upstream_up("r1", True)
    m.upstream_up("ds", False)


def test_scripted_sequence_exact_values(clock: FakeClock) -> None:
    m = Metrics(CONFIGURED)
    run_script(m, clock)
    req = "dialect_proxy_requests_total"
    common = {"route": ROUTE}
    assert value(m, req, **common, upstream="r1", model="DeepSeek-R1", stream="true", status="2xx", outcome="ok") == 1
    assert value(m, req, **common, upstream="r1", model="gpt-4o", stream="false", status="4xx", outcome="error") == 1
    assert value(m, req, **common, upstream="ds", model="deepseek-chat", stream="true", status="2xx",
                 outcome="client_disconnect") == 2
    assert value(m, req, **common, upstream="r1", model="DeepSeek-R1", stream="true", status="5xx",
                 outcome="truncated") == 1
    assert value(m, req, **common, upstream="r1", model="DeepSeek-R1", stream="false", status="5xx",
                 outcome="error") == 1
    total = sum(s.value for fam in text_string_to_metric_families(m.render()[0].decode())
                for s in fam.samples if s.name == req)
    assert total == 6

    dur = "dialect_proxy_request_duration_seconds"
    lab = {"route": ROUTE, "upstream": "r1", "model": "DeepSeek-R1", "stream": "true", "status": "2xx"}
    assert value(m, dur + "_count", **lab) == 1
    assert value(m, dur + "_sum", **lab) == pytest.approx(2.5)
    assert value(m, dur + "_bucket", **lab, le="2.5") == 1
    assert value(m, dur + "_bucket", **lab, le="1.0") == 0
    assert value(m, dur + "_sum", **{**lab, "status": "5xx"}) == pytest.approx(3.0)
    assert value(m, dur + "_sum", **{**lab, "stream": "false", "status": "5xx"}) == pytest.approx(1.125)

    ttft = "dialect_proxy_time_to_first_token_seconds"
    r1 = {"route": ROUTE, "upstream": "r1", "model": "DeepSeek-R1"}
    ds = {"route": ROUTE, "upstream": "ds", "model": "deepseek-chat"}
    assert value(m, ttft + "_count", **r1) == 2  # scripts 1 and 4
    assert value(m, ttft + "_sum", **r1) == pytest.approx(1.5 + 2.0)
    assert value(m, ttft + "_count", **ds) == 1
    assert value(m, ttft + "_sum", **ds) == pytest.approx(1.0)
    # non-stream requests record no TTFT
    assert value(m, ttft + "_count", route=ROUTE, upstream="r1", model="gpt-4o") == 0

    itl = "dialect_proxy_inter_token_latency_seconds"
    assert value(m, itl + "_count", **r1) == 3
    assert value(m, itl + "_sum", **r1) == pytest.approx(0.5)
    assert value(m, itl + "_bucket", **r1, le="0.15") == 2
    assert value(m, itl + "_count", **ds) == 1
    assert value(m, itl + "_sum", **ds) == pytest.approx(0.5)

    ov = "dialect_proxy_overhead_seconds"
    assert value(m, ov + "_count", route=ROUTE, upstream="r1", stream="true") == 2
    # script 1: 2.5 - (0.5 + 0.75); script 4: 3.0 - 0 (headers came at once, no body wait reported)
    assert value(m, ov + "_sum", route=ROUTE, upstream="r1", stream="true") == pytest.approx(1.25 + 3.0)
    # script 2: 0.625 - 0.5; script 5: 1.125 - 1.0
    assert value(m, ov + "_sum", route=ROUTE, upstream="r1", stream="false") == pytest.approx(0.125 + 0.125)

    tok = "dialect_proxy_tokens_total"
    r1m = {"upstream": "r1", "model": "DeepSeek-R1"}
    assert value(m, tok, **r1m, kind="prompt") == 54
    assert value(m, tok, **r1m, kind="completion") == 17
    assert value(m, tok, **r1m, kind="cached") == 32
    assert value(m, tok, **r1m, kind="reasoning") == 9
    dsm = {"upstream": "ds", "model": "deepseek-chat"}
    assert value(m, tok, **dsm, kind="prompt") == 10
    assert value(m, tok, **dsm, kind="cached") == 4
    assert value(m, tok, **dsm, kind="reasoning") == 0

    # MindIE timings: prefill in ms, decode in ms per token, queue wait in microseconds per token.
    assert value(m, "dialect_proxy_upstream_prefill_seconds_count", **r1m) == 1
    assert value(m, "dialect_proxy_upstream_prefill_seconds_sum", **r1m) == pytest.approx(0.2)
    assert value(m, "dialect_proxy_upstream_decode_token_seconds_count", **r1m) == 3
    assert value(m, "dialect_proxy_upstream_decode_token_seconds_sum", **r1m) == pytest.approx(0.1)
    assert value(m, "dialect_proxy_upstream_queue_wait_seconds_count", **r1m) == 3
    assert value(m, "dialect_proxy_upstream_queue_wait_seconds_sum", **r1m) == pytest.approx(0.006)
    assert value(m, "dialect_proxy_upstream_batch_size_count", **r1m) == 3
    assert value(m, "dialect_proxy_upstream_batch_size_sum", **r1m) == 5
    assert value(m, "dialect_proxy_upstream_batch_size_bucket", **r1m, le="1.0") == 1

    err = "dialect_proxy_upstream_errors_total"
    assert value(m, err, upstream="r1", dialect="mindie", code="422") == 1
    assert value(m, err, upstream="r1", dialect="mindie", code="engine_callback_timeout") == 1
    assert value(m, err, upstream="r1", dialect="any", code="connect_refused") == 1

    assert value(m, "dialect_proxy_truncated_streams_total", **r1m, reason="upstream_error") == 1
    disc = "dialect_proxy_client_disconnects_total"
    assert value(m, disc, route=ROUTE, **dsm, stage="mid_stream") == 1
    assert value(m, disc, route=ROUTE, **dsm, stage="before_first_chunk") == 1
    assert value(m, "dialect_proxy_finish_reasons_total", **r1m, reason="stop") == 1

    for labels in (r1, ds, {"route": ROUTE, "upstream": "r1", "model": "gpt-4o"}):
        assert value(m, "dialect_proxy_in_flight_requests", **labels) == 0
    assert value(m, "dialect_proxy_in_flight_streams", **r1) == 0
    assert value(m, "dialect_proxy_upstream_up", upstream="r1") == 1
    assert value(m, "dialect_proxy_upstream_up", upstream="ds") == 0
    assert value(m, "dialect_proxy_build_info", version=metrics_mod.__version__,
                 python_version="{}.{}.{}".format(*__import__("sys").version_info[:3]), build=BUILD) == 1


def test_in_flight_gauges_and_finish_once(clock: FakeClock) -> None:
    m = Metrics(CONFIGURED)
    lab = {"route": ROUTE, "upstream": "r1", "model": "gpt-4o"}
    a = m.request(ROUTE, "r1", "gpt-4o", stream=True)
    b = m.request(ROUTE, "r1", "gpt-4o", stream=False)
    assert value(m, "dialect_proxy_in_flight_requests", **lab) == 2
    assert value(m, "dialect_proxy_in_flight_streams", **lab) == 1
    a.finish(200, False, "length")
    a.finish(200, False, "length")  # ignored
    assert value(m, "dialect_proxy_in_flight_requests", **lab) == 1
    assert value(m, "dialect_proxy_in_flight_streams", **lab) == 0
    with b:
        pass  # leaving the block unfinished counts a 500 error
    assert value(m, "dialect_proxy_in_flight_requests", **lab) == 0
    assert value(m, "dialect_proxy_requests_total", **lab, stream="false", status="5xx", outcome="error") == 1
    assert value(m, "dialect_proxy_requests_total", **lab, stream="true", status="2xx", outcome="ok") == 1
    assert value(m, "dialect_proxy_finish_reasons_total", upstream="r1", model="gpt-4o", reason="length") == 1


def test_model_label_unconfigured_keeps_first_50() -> None:
    m = Metrics(None)
    names = [f"model-{i}" for i in range(MAX_UNCONFIGURED_MODELS)]
    assert [m.model_label(n) for n in names] == names
    assert m.model_label("model-50") == "other"  # the 51st distinct name
    assert m.model_label("model-0") == "model-0"  # earlier names stay
    assert m.model_label("yet-another") == "other"
    o = m.request(ROUTE, "r1", "model-51", stream=False)
    assert o.model == "other"
    o.finish(200, False, "stop")
    assert value(m, "dialect_proxy_requests_total", route=ROUTE, upstream="r1", model="other", stream="false",
                 status="2xx", outcome="ok") == 1


def test_model_label_configured_and_junk() -> None:
    m = Metrics(CONFIGURED)
    assert m.model_label("gpt-4o") == "gpt-4o"
    assert m.model_label("DeepSeek-R1") == "DeepSeek-R1"
    assert m.model_label("gpt-5") == "other"
    assert m.model_label("x" * 1000) == "other"
    assert m.model_label("") == "other"
    assert m.model_label(None) == "other"  # type: ignore[arg-type]
    m2 = Metrics([])
    assert m2.model_label("gpt-4o") == "other"  # an empty config allows no names


def test_other_labels_are_bounded() -> None:
    m = Metrics(CONFIGURED)
    o = m.request(ROUTE, "", "gpt-4o", stream=True)
    o.truncated("something the handler made up")
    o.upstream_error("martian", "E1")
    o.upstream_error("deepseek", "Insufficient System Resource!")
    o.finish(200, False, None)
    assert value(m, "dialect_proxy_truncated_streams_total", upstream="none", model="gpt-4o", reason="other") == 1
    assert value(m, "dialect_proxy_upstream_errors_total", upstream="none", dialect="other", code="e1") == 1
    assert value(m, "dialect_proxy_upstream_errors_total", upstream="none", dialect="deepseek",
                 code="insufficient_system_resource") == 1
    o = m.request(ROUTE, "r1", "gpt-4o", stream=False)
    for i in range(metrics_mod.MAX_ERROR_CODES + 10):
        o.upstream_error("siliconstorm", str(i))
    o.finish(502, False, "weird-reason")
    body = m.render()[0].decode()
    codes = {s.labels["code"] for fam in text_string_to_metric_families(body) for s in fam.samples
             if s.name == "dialect_proxy_upstream_errors_total"}
    assert len(codes) <= metrics_mod.MAX_ERROR_CODES + 1 and "other" in codes
    assert value(m, "dialect_proxy_upstream_errors_total", upstream="r1", dialect="siliconstorm", code="other") > 0
    # nothing a client sends ends up in a label: no finish_reason recorded for an error
    assert "weird" not in body


def test_bad_usage_and_timings_are_ignored() -> None:
    m = Metrics(CONFIGURED)
    o = m.request(ROUTE, "r1", "gpt-4o", stream=False)
    o.usage({"prompt_tokens": "12", "completion_tokens": -1, "prompt_tokens_details": None})
    o.upstream_timings(mindie_timings({"prefill_time": "fast", "decode_time_arr": [1, "x", None, float("nan"), 3]}))
    o.finish(200, False, "stop")
    r = {"upstream": "r1", "model": "gpt-4o"}
    assert value(m, "dialect_proxy_tokens_total", **r, kind="prompt") == 0
    assert value(m, "dialect_proxy_upstream_prefill_seconds_count", **r) == 0
    assert value(m, "dialect_proxy_upstream_decode_token_seconds_count", **r) == 2
    assert value(m, "dialect_proxy_upstream_decode_token_seconds_sum", **r) == pytest.approx(0.004)


def test_instances_are_independent() -> None:
    a, b = Metrics(CONFIGURED), Metrics(CONFIGURED)
    a.request(ROUTE, "r1", "gpt-4o", stream=False).finish(200, False, "stop")
    assert value(a, "dialect_proxy_requests_total", route=ROUTE, upstream="r1", model="gpt-4o", stream="false",
                 status="2xx", outcome="ok") == 1
    assert value(b, "dialect_proxy_requests_total", route=ROUTE, upstream="r1", model="gpt-4o", stream="false",
                 status="2xx", outcome="ok") == 0


def test_render_content_type_and_names(clock: FakeClock) -> None:
    m = Metrics(CONFIGURED)
    run_script(m, clock)
    body, ctype = m.render()
    assert ctype.startswith("text/plain; version=0.0.4")
    names = series_names(body)
    for base in ("requests", "upstream_errors", "truncated_streams", "client_disconnects", "tokens"):
        assert f"dialect_proxy_{base}_total" in names
    for h in ("request_duration_seconds", "time_to_first_token_seconds", "inter_token_latency_seconds",
              "overhead_seconds", "upstream_prefill_seconds", "upstream_decode_token_seconds",
              "upstream_queue_wait_seconds", "upstream_batch_size"):
        assert {f"dialect_proxy_{h}_bucket", f"dialect_proxy_{h}_sum", f"dialect_proxy_{h}_count"} <= names
    assert {"dialect_proxy_in_flight_requests", "dialect_proxy_in_flight_streams", "dialect_proxy_upstream_up",
            "dialect_proxy_build_info"} <= names


def promtool_check_metrics(body: bytes) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing in CI: apt-get install -y prometheus")
        pytest.skip("promtool not installed (apt-get install -y prometheus)")
    r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (r.stdout + r.stderr).decode()


def test_promtool_check_metrics(clock: FakeClock) -> None:
    m = Metrics(CONFIGURED)
    run_script(m, clock)
    promtool_check_metrics(m.render()[0])


# -- multiprocess -----------------------------------------------------------------------------------------------
# Worker processes are started with "spawn", so each imports prometheus_client afresh with
# PROMETHEUS_MULTIPROC_DIR already in its environment, exactly like `uvicorn --workers N` workers.

def _mp_worker(requests: int, hold: bool, exit_hard: bool, ready, release) -> None:  # type: ignore[no-untyped-def]
    m = Metrics(CONFIGURED, multiprocess=True)
    for _ in range(requests):
        o = m.request(ROUTE, "r1", "gpt-4o", stream=True)
        o.chunk(True)
        o.chunk(True)
        o.usage({"prompt_tokens": 10, "completion_tokens": 2})
        o.finish(200, False, "stop")
    m.upstream_up("r1", True)
    held = m.request(ROUTE, "r1", "gpt-4o", stream=True) if hold else None
    m.flush_files()  # what the app does every second (proxy/server/appstate.py) and when the worker stops
    ready.set()
    if held is not None:
        release.wait(60)
        if exit_hard:
            os._exit(0)  # dies with the request in flight (a killed worker): its live gauge must not stick
        held.finish(200, False, "stop")
        m.flush_files()


def _mp_render(out: str) -> None:
    body, _ = Metrics(None, multiprocess=True).render()
    Path(out).write_bytes(body)


def _families(body: bytes) -> dict[str, float]:
    """name{sorted labels} -> value, for the assertions below."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("route",))
            out[key] = out.get(key, 0.0) + s.value
    return out


@pytest.fixture
def multiproc_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    d = tmp_path / "prom"
    d.mkdir()
    (d / "counter_99999.db").write_bytes(b"stale")  # prepare_multiprocess_dir must clear leftovers
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(d))
    path = prepare_multiprocess_dir()
    assert path == str(d) and not list(d.iterdir())
    yield path


def test_multiprocess_one_scrape_shows_all_workers(multiproc_dir: str, tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    release = ctx.Event()
    ready = [ctx.Event(), ctx.Event()]
    workers = [
        ctx.Process(target=_mp_worker, args=(3, True, False, ready[0], release)),
        ctx.Process(target=_mp_worker, args=(4, True, True, ready[1], release)),
    ]
    try:
        for w in workers:
            w.start()
        for ev in ready:
            assert ev.wait(120), "worker did not start"

        def scrape(name: str) -> bytes:
            out = tmp_path / name
            r = ctx.Process(target=_mp_render, args=(str(out),))
            r.start()
            r.join(120)
            assert r.exitcode == 0
            return out.read_bytes()

        during = scrape("during.txt")
        v = _families(during)
        ok = ",model=gpt-4o,outcome=ok,status=2xx,stream=true,upstream=r1"
        assert v["dialect_proxy_requests_total" + ok] == 7
        assert v["dialect_proxy_tokens_total,kind=prompt,model=gpt-4o,upstream=r1"] == 70
        assert v["dialect_proxy_time_to_first_token_seconds_count,model=gpt-4o,upstream=r1"] == 7
        assert v["dialect_proxy_inter_token_latency_seconds_count,model=gpt-4o,upstream=r1"] == 7
        assert v["dialect_proxy_in_flight_requests,model=gpt-4o,upstream=r1"] == 2  # livesum over both workers
        assert v["dialect_proxy_in_flight_streams,model=gpt-4o,upstream=r1"] == 2
        assert v["dialect_proxy_upstream_up,upstream=r1"] == 1
        assert not any(k.startswith("dialect_proxy_in_flight") and "pid=" in k for k in v)
        promtool_check_metrics(during)

        release.set()
        for w in workers:
            w.join(120)
            assert w.exitcode == 0
        v = _families(scrape("after.txt"))
        assert v["dialect_proxy_requests_total" + ok] == 8  # the hard-exited worker never finished its held one
        # every worker is gone: their live gauges are dropped, so the series is absent (or 0)
        assert v.get("dialect_proxy_in_flight_requests,model=gpt-4o,upstream=r1", 0) == 0
        assert v.get("dialect_proxy_in_flight_streams,model=gpt-4o,upstream=r1", 0) == 0
    finally:
        release.set()
        for w in workers:
            w.join(10)
            if w.is_alive():
                w.kill()


def test_multiprocess_refuses_in_memory_values(multiproc_dir: str) -> None:
    # This pytest process imported prometheus_client without PROMETHEUS_MULTIPROC_DIR: its values live in memory,
    # so multiprocess mode here would silently export nothing. Metrics says so instead.
    if metrics_mod.multiprocess_enabled_by_env():
        pytest.skip("pytest itself runs with PROMETHEUS_MULTIPROC_DIR set")
    with pytest.raises(RuntimeError, match="prepare_multiprocess_dir"):
        Metrics(CONFIGURED, multiprocess=True)


def _mp_gateway_worker(first_up: bool, steps, done) -> None:  # type: ignore[no-untyped-def]
    """Holds a replica slot and reports upstream_up; `steps` tells it when to move on, `done` when it did."""
    import asyncio

    from proxy.dialects import get_dialect
    from proxy.gateway.redact import Redactor
    from proxy.gateway.replicas import ReplicaSet
    from proxy.settings import ReplicaSettings, ServerSettings, UpstreamSettings

    m = Metrics(CONFIGURED, multiprocess=True)
    upstream = UpstreamSettings(name="r1", dialect="openai", url="http://127.0.0.1:1",
                                replicas=(ReplicaSettings("a", "http://127.0.0.1:1"),))
    rset = ReplicaSet(upstream, ServerSettings(), get_dialect("openai"), m, Redactor())

    async def run() -> None:
        ticket = await rset.attempts({}).next()
        m.upstream_up("r1", first_up)
        m.flush_files()  # what the app does every second (proxy/server/appstate.py)
        done.put("holding")
        assert steps.get(timeout=60) == "release"
        rset.succeeded(ticket.replica)
        ticket.release()
        m.flush_files()
        done.put("released")
        assert steps.get(timeout=60) == "confirm"
        m.upstream_up("r1", first_up)  # unchanged: the flush writes it again, the newest now
        m.flush_files()
        done.put("confirmed")
        await rset.close()

    asyncio.run(run())


def test_multiprocess_gateway_gauges_merge(multiproc_dir: str, tmp_path: Path) -> None:
    """Replica gauges (read from the replicas' state) and upstream_up, written to the files at each worker's flush,
    merge across two real worker processes: in-flight summed, the upstream_up of the newest flush wins."""
    ctx = multiprocessing.get_context("spawn")
    steps = [ctx.Queue(), ctx.Queue()]
    done = [ctx.Queue(), ctx.Queue()]
    workers = [ctx.Process(target=_mp_gateway_worker, args=(up, steps[i], done[i]))
               for i, up in enumerate((False, True))]

    def scrape(name: str) -> dict[str, float]:
        out = tmp_path / name
        r = ctx.Process(target=_mp_render, args=(str(out),))
        r.start()
        r.join(120)
        assert r.exitcode == 0
        return _families(out.read_bytes())

    a = ",replica=a,upstream=r1"
    try:
        for w, d in zip(workers, done, strict=True):  # one after the other: worker 1 reports upstream_up last
            w.start()
            assert d.get(timeout=120) == "holding"
        v = scrape("holding.txt")
        assert v["dialect_proxy_replica_in_flight" + a] == 2
        assert v["dialect_proxy_replica_queue_length" + a] == 0
        assert v["dialect_proxy_replica_up" + a] == 1
        assert v["dialect_proxy_upstream_up,upstream=r1"] == 1  # worker 1's True is the newest
        for s, d in zip(steps, done, strict=True):
            s.put("release")
            assert d.get(timeout=60) == "released"
        v = scrape("released.txt")
        assert v["dialect_proxy_replica_in_flight" + a] == 0
        assert v["dialect_proxy_upstream_up,upstream=r1"] == 1
        steps[0].put("confirm")  # worker 0 confirms its False and flushes: now the newest
        assert done[0].get(timeout=60) == "confirmed"
        assert scrape("confirmed.txt")["dialect_proxy_upstream_up,upstream=r1"] == 0
        steps[1].put("confirm")
        assert done[1].get(timeout=60) == "confirmed"
        assert scrape("again.txt")["dialect_proxy_upstream_up,upstream=r1"] == 1
        for w in workers:
            w.join(60)
            assert w.exitcode == 0
    finally:
        for w in workers:
            w.join(5)
            if w.is_alive():
                w.kill()


@pytest.mark.parametrize("local", [True, False])
def test_chunks_of_one_read_equal_chunk_calls_in_one_instant(clock: FakeClock, local: bool) -> None:
    """`chunks(n, tokens)` (the events of one upstream read, as the handler reports them) records what `n` calls of
    `chunk` at the same instant record: TTFT once, inter-token latencies with 0 for the read's later tokens; with the
    local (single-process) and the prometheus_client (multiprocess) metric classes alike. A non-stream request records
    no inter-token latency, however many choices carry tokens."""
    reads = [(3, 2), (1, 0), (4, 4), (2, 1), (5, 3)]  # (events, of which tokens) per read
    batched, single = Metrics(["a"], local=local), Metrics(["a"], local=local)
    for stream in (True, False):
        clock.at(clock.t + 1.0)
        ob = batched.request(ROUTE, "r1", "a", stream)
        os_ = single.request(ROUTE, "r1", "a", stream)
        for i, (n, tokens) in enumerate(reads):
            clock.at(clock.t + 0.003 * (i + 1))
            ob.chunks(n, tokens)
            for k in range(n):
                os_.chunk(k < tokens)
        ob.finish(200, False, "stop")
        os_.finish(200, False, "stop")
    labels = {"route": ROUTE, "upstream": "r1", "model": "a"}
    itl = "dialect_proxy_inter_token_latency_seconds"
    for name in (itl + "_count", itl + "_sum", "dialect_proxy_time_to_first_token_seconds_count"):
        assert value(batched, name, **labels) == pytest.approx(value(single, name, **labels)), name
    for le in metrics_mod.TOKEN_LATENCY_BUCKETS:
        assert value(batched, itl + "_bucket", **labels, le=str(le)) == value(single, itl + "_bucket", **labels,
                                                                            le=str(le))
    assert value(batched, itl + "_count", **labels) == sum(t for _, t in reads) - 1  # the stream's only
    assert value(batched, itl + "_bucket", **labels, le="0.005") >= 5  # the zeros of reads with several tokens
