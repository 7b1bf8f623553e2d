"""deploy/prometheus: promtool checks of the rules, their unit tests and the scrape configs; alert hygiene."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_helpers import (
    K8S,
    PROMETHEUS_BUILTIN,
    PROMETHEUS_DIR,
    exposed_sample_names,
    promql_metric_names,
    promtool,
)

ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts.test.yml"


def run_promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_promql_metric_names_lexer() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, model) (rate(a_bucket{x="y", z=~"$v"}[$__rate_interval])))'
            ' / on (model) group_left sum without (pod) (b_total offset 5m) > 1e3 and up{job="j"} == bool 0')
    assert promql_metric_names(expr) == {"a_bucket", "b_total", "up"}


def test_promtool_check_rules() -> None:
    r = run_promtool("check", "rules", ALERTS.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_unit_tests_cover_every_alert() -> None:
    r = run_promtool("test", "rules", ALERTS_TEST.name)
    assert r.returncode == 0, r.stdout + r.stderr
    tested = {case["alertname"] for t in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
              for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert {r["alert"] for r in alert_rules()} <= tested, "every alert needs a unit test in which it fires"


def test_promtool_check_config() -> None:
    r = run_promtool("check", "config", "prometheus.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_check_kubernetes_config() -> None:
    r = run_promtool("check", "config", "prometheus-kubernetes.yml")
    if r.returncode != 0 and "kubernetes_sd_configs not found" in r.stdout + r.stderr:
        # Debian's prometheus package is built without Kubernetes service discovery; its promtool cannot parse
        # the file. The relabelling is checked below by simulation instead.
        pytest.skip("this promtool is built without Kubernetes service discovery (Debian's package)")
    assert r.returncode == 0, r.stdout + r.stderr


def _relabel_keep(config: list[dict], labels: dict[str, str]) -> bool:
    for rule in config:
        if rule.get("action", "replace") != "keep":
            continue
        value = rule.get("separator", ";").join(labels.get(n, "") for n in rule["source_labels"])
        if not re.fullmatch(rule["regex"], value):  # Prometheus anchors relabel regexes
            return False
    return True


def _k8s_docs(sub: str) -> list[dict]:
    return [d for f in sorted((K8S / sub).glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text()) if isinstance(d, dict) and "kind" in d]


def test_kubernetes_sd_relabelling_keeps_exactly_the_proxy_ports() -> None:
    job = yaml.safe_load((PROMETHEUS_DIR / "prometheus-kubernetes.yml").read_text())["scrape_configs"][0]
    relabel = job["relabel_configs"]
    seen = 0
    for sub in ("base", "sidecar"):
        for d in _k8s_docs(sub):
            if d["kind"] != "Deployment":
                continue
            pod_labels = d["spec"]["template"]["metadata"]["labels"]
            for c in d["spec"]["template"]["spec"]["containers"]:
                for port in c.get("ports", []):
                    meta = {"__meta_kubernetes_pod_phase": "Running",
                            "__meta_kubernetes_pod_container_port_name": port.get("name", "")}
                    meta.update({"__meta_kubernetes_pod_label_" + re.sub(r"[^\w]", "_", k): v
                                 for k, v in pod_labels.items()})
                    expected = c["name"] == "dialect-proxy" and port.get("name") == "http"
                    assert _relabel_keep(relabel, meta) == expected, (sub, c["name"], port)
                    seen += expected
    assert seen == 2  # the gateway and the sidecar proxy


def test_alerts_use_only_exposed_metrics() -> None:
    exposed = exposed_sample_names() | PROMETHEUS_BUILTIN
    for rule in alert_rules():
        names = promql_metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= exposed, f"{rule['alert']} uses metrics the proxy does not expose: {names - exposed}"


def test_alerts_are_labelled_and_described() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {
        "DialectProxyHighErrorRate", "DialectProxyHighTimeToFirstToken", "DialectProxyTruncatedStreams",
        "DialectProxyUpstreamDown",
    }
    for r in rules:
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r["alert"]  # kube-prometheus's three
        assert r["annotations"].get("summary") and r["annotations"].get("description"), r["alert"]
        assert "for" in r, r["alert"]
