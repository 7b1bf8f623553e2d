"""deploy/grafana/dashboard.json: well-formed, every query is valid PromQL over metrics the proxy exposes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from deploy_helpers import (
    PROMETHEUS_BUILTIN,
    _panels,
    all_queries,
    dashboard,
    exposed_sample_names,
    grafana_to_promql,
    promql_metric_names,
    promtool,
)


def test_dashboard_shape() -> None:
    d = dashboard()
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    panels = _panels(d["panels"])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "upstream", "model"} <= variables
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p.get("targets"), p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]


def test_every_query_uses_exposed_metrics() -> None:
    exposed = exposed_sample_names()
    used: set[str] = set()
    for where, expr in all_queries():
        names = promql_metric_names(grafana_to_promql(expr))
        assert names, where
        assert names <= exposed | PROMETHEUS_BUILTIN, f"{where} uses unknown metrics {names - exposed}: {expr}"
        used |= names
    # and the dashboard shows every metric family the proxy exports
    families = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count").removesuffix("_total")
                for n in exposed if not n.endswith("_created")}
    shown = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count").removesuffix("_total")
             for n in used}
    assert families <= shown, f"metrics missing from the dashboard: {families - shown}"


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (with Grafana's variables filled in) as a recording rule."""
    rules = [{"record": f"dashboard_query_{i}", "expr": grafana_to_promql(expr)}
             for i, (_, expr) in enumerate(all_queries())]
    f = tmp_path / "dashboard-queries.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = subprocess.run([promtool(), "check", "rules", str(f)], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
