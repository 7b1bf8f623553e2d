"""deploy/METRICS.md documents exactly the metrics the proxy exports; deploy/README.md lists every alert."""

from __future__ import annotations

import re

import yaml
from deploy_helpers import DEPLOY, PROMETHEUS_DIR, exercised_metrics
from prometheus_client.parser import text_string_to_metric_families


def test_metrics_md_documents_every_metric() -> None:
    body, _ = exercised_metrics().render()
    exported = set()
    for fam in text_string_to_metric_families(body.decode()):
        if fam.name.endswith("_created"):
            continue  # prometheus-client's creation timestamps, not metrics of their own
        exported.add(fam.name + "_total" if fam.type == "counter" else fam.name)
    documented = set(re.findall(r"^\| `(dialect_proxy_\w+)` \|", (DEPLOY / "METRICS.md").read_text(), re.MULTILINE))
    assert documented == exported, (
        f"undocumented: {sorted(exported - documented)}; documented but not exported: {sorted(documented - exported)}"
    )


def test_readme_lists_every_alert() -> None:
    readme = (DEPLOY / "README.md").read_text()
    alerts = [r["alert"] for g in yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())["groups"]
              for r in g["rules"]]
    for name in alerts:
        assert f"| {name} |" in readme, name
