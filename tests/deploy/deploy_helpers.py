"""Shared helpers for the deploy/ checks: paths, external tools, PromQL metric names, the exposed metric names."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
PROMETHEUS_DIR = DEPLOY / "prometheus"
GRAFANA_DASHBOARD = DEPLOY / "grafana" / "dashboard.json"

# Metric names a query may use that the proxy does not export: Prometheus' own per-target series.
PROMETHEUS_BUILTIN = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})


def missing(what: str, install: str) -> None:
    """Skip on a developer machine without the tool; fail in CI (CI=true), where a skip would hide a gap."""
    message = f"{what} is not installed ({install})"
    if os.environ.get("CI"):
        pytest.fail(message + " — CI must install it")
    pytest.skip(message)


def tool(name: str, install: str) -> str:
    """An executable: the one next to this interpreter (pip-installed into the venv) first, then PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        missing(name, install)
        raise AssertionError("unreachable")
    return found


def promtool() -> str:
    return tool("promtool", "apt-get install -y prometheus")


# -- PromQL ------------------------------------------------------------------------------------------------------

_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.:$])[a-zA-Z_:][\w:]*")
_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "inf", "nan", "start", "end", "atan2",
})


def promql_metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression (a small lexer: enough for the queries in deploy/)."""
    text = _STRINGS.sub('""', expr)
    text = _BRACES.sub("", text)
    text = _BRACKETS.sub("", text)
    text = _GROUPING.sub("", text)
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group(0)
        rest = text[m.end():].lstrip()
        if word.lower() in _KEYWORDS or rest.startswith("("):
            continue  # a keyword, a function or an aggregation
        names.add(word)
    # A selector written as {__name__="..."} names its metric inside the braces.
    names.update(re.findall(r'__name__\s*=\s*"([^"]+)"', expr))
    return names


def grafana_to_promql(expr: str, rate_interval: str = "5m") -> str:
    """Replace Grafana's variables so that the expression is plain PromQL."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("${__rate_interval}", rate_interval)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


# -- the Grafana dashboard ---------------------------------------------------------------------------------------

def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GRAFANA_DASHBOARD.read_text())
    return data


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in panels:
        out.append(p)
        out += _panels(p.get("panels", []))  # panels inside collapsed rows
    return out


def panel_queries() -> list[tuple[str, str]]:
    """(where, expr) for every panel target."""
    return [(f"panel {p.get('title')!r} target {t.get('refId')}", t["expr"])
            for p in _panels(dashboard()["panels"]) for t in p.get("targets", []) if t.get("expr")]


def variable_queries() -> list[tuple[str, str]]:
    """(where, selector) for every query variable: label_values(selector, label) -> selector."""
    out = []
    for v in dashboard()["templating"]["list"]:
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        assert q.startswith("label_values(") and q.endswith(")"), q
        selector = q[len("label_values("):-1].rsplit(",", 1)[0].strip()
        out.append((f"variable {v['name']}", selector))
    return out


def all_queries() -> list[tuple[str, str]]:
    return panel_queries() + variable_queries()


# -- what the proxy exposes --------------------------------------------------------------------------------------

def exercised_metrics():  # type: ignore[no-untyped-def]
    """A Metrics instance on which every metric has at least one series (two upstreams, every outcome)."""
    from proxy.dialects.mindie import MindIEDialect
    from proxy.metrics.definitions import Metrics

    m = Metrics(["DeepSeek-R1", "deepseek-v4-flash"], key_names=["team-a"])  # inbound keys: the key_* families
    for upstream, model, dialect in (("r1", "DeepSeek-R1", "mindie"), ("ds", "deepseek-v4-flash", "deepseek")):
        ok = m.request("/v1/chat/completions", upstream, model, stream=True, key="team-a")
        ok.upstream_started()
        ok.upstream_headers()
        ok.chunk(False)
        for _ in range(4):
            ok.chunk(True)
        ok.add_upstream_wait(0.001)
        ok.usage({"prompt_tokens": 20, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 8},
                  "completion_tokens_details": {"reasoning_tokens": 2}})
        timings = MindIEDialect().timings({"prefill_time": 120, "decode_time_arr": [30, 28, 27],
                                           "usage": {"queue_wait_time": [900, 60, 40], "batch_size": [1, 2, 2]}})
        assert timings is not None
        ok.upstream_timings(timings)
        ok.finish(200, False, "stop")
        err = m.request("/v1/chat/completions", upstream, model, stream=False)
        err.upstream_started()
        err.upstream_error(dialect, "500")
        err.finish(502, False, None, "bad_gateway")
        limited = m.request("/v1/chat/completions", upstream, model, stream=False)
        limited.finish(429, False, None, "rate_limited")
        cut = m.request("/v1/chat/completions", upstream, model, stream=True)
        cut.chunk(True)
        cut.truncated("upstream_closed")
        cut.finish(200, False, None, "bad_gateway")
        gone = m.request("/v1/chat/completions", upstream, model, stream=True)
        gone.chunk(True)
        gone.finish(200, True, None)
        m.request("/v1/chat/completions", upstream, model, stream=True)  # left in flight
        m.upstream_up(upstream, True)
        m.limited("team-a", "requests")  # per-key limits (proxy/gateway/limits.py)
        m.quota_remaining("team-a", "day", 1000, 50)
        m.limits_fail_open("team-a")
        # gateway series (proxy/gateway/replicas.py sets these per replica)
        for replica in ("0", "1"):
            m.child(m.upstream_attempts, upstream, replica, "ok").inc(3)
            m.child(m.upstream_attempts, upstream, replica, "unavailable").inc()
            m.child(m.replica_in_flight, upstream, replica).set(1)
            m.child(m.replica_queue_length, upstream, replica).set(0)
            m.child(m.replica_queue_wait, upstream, replica).observe(0.2)
            m.child(m.replica_up, upstream, replica).set(1)
            m.child(m.replica_ejections, upstream, replica).inc()
        m.child(m.retries, upstream, "unavailable").inc()
        m.child(m.admission_rejections, upstream, "queue_full").inc()
        m.child(m.affinity, upstream, "owner").inc()
    return m


def exposed_sample_names() -> set[str]:
    """Every series name the proxy's /metrics shows (histograms as _bucket/_sum/_count, counters as _total)."""
    body, _ = exercised_metrics().render()
    return {s.name for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


# -- a real Prometheus server on loopback -------------------------------------------------------------------------

@contextlib.contextmanager
def prometheus_server(tmp_path: Path, target: str, rule_files: list[str] | None = None,
                      interval_s: int = 1) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """Run Debian's `prometheus` on 127.0.0.1 scraping `target` (host:port) every `interval_s`; yields
    (base URL, process, log path). Stopped (terminate, then kill) on exit."""
    binary = tool("prometheus", "apt-get install -y prometheus")
    config: dict[str, Any] = {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s",
                   "scrape_timeout": f"{interval_s}s"},
        "scrape_configs": [{"job_name": "dialect-proxy", "static_configs": [{"targets": [target]}]}],
    }
    if rule_files:
        config["rule_files"] = rule_files
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_path = tmp_path / "prometheus.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
        )
        try:
            yield f"http://127.0.0.1:{port}", proc, log_path
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def prom_query(base: str, expr: str) -> list[dict[str, Any]]:
    """An instant query against Prometheus's HTTP API; the result vector."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.load(r)
    assert data["status"] == "success", data
    result: list[dict[str, Any]] = data["data"]["result"]
    return result
