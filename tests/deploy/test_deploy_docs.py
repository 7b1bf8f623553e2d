"""deploy/METRICS.md documents exactly the metrics the proxy exports; deploy/README.md lists every alert."""

from __future__ import annotations

import re

import yaml
from deploy_helpers import DEPLOY, PROMETHEUS_DIR, exercised_metrics
from prometheus_client.parser import text_string_to_metric_families


def model_server_metrics() -> bytes:
    """What model_server_metrics adds to /metrics (proxy/metrics/model_server.py), with a reading of the engine."""
    import time

    from proxy.dialects.engine_metrics import EngineLoad
    from proxy.dialects.mindie import MindIEDialect
    from proxy.gateway.admission import Admission
    from proxy.metrics.model_server import EngineMetricsReader, ModelServerGauges
    from proxy.settings import build_settings

    settings = build_settings(config={"server": {"pool_member": True}, "upstreams": [
        {"dialect": "mindie", "url": "http://127.0.0.1:1025", "metrics_url": "http://127.0.0.1:1027/metrics"}]},
        environ={})
    assert MindIEDialect.engine_metrics is not None
    reader = EngineMetricsReader(settings.upstreams[0], MindIEDialect.engine_metrics, True)
    reader.load, reader.read_at = EngineLoad("m", 1, 2, 0.5), time.monotonic()
    return ModelServerGauges(reader, Admission(), "m").render()


def test_metrics_md_documents_every_metric() -> None:
    body, _ = exercised_metrics().render()
    exported = set()
    for fam in text_string_to_metric_families(body.decode() + model_server_metrics().decode()):
        if fam.name.endswith("_created"):
            continue  # prometheus-client's creation timestamps, not metrics of their own
        exported.add(fam.name + "_total" if fam.type == "counter" else fam.name)
    documented = set(re.findall(r"^\| `((?:dialect_proxy_|vllm:)[\w:]+)` \|", (DEPLOY / "METRICS.md").read_text(),
                                re.MULTILINE))
    assert documented == exported, (
        f"undocumented: {sorted(exported - documented)}; documented but not exported: {sorted(documented - exported)}"
    )


def test_readme_lists_every_alert() -> None:
    readme = (DEPLOY / "README.md").read_text()
    alerts = [r["alert"] for g in yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())["groups"]
              for r in g["rules"]]
    for name in alerts:
        assert f"| {name} |" in readme, name
