"""deploy/k8s/inference-pool: MindIE pods as an Inference Gateway pool (docs/inference-gateway.md). Beyond the schema
validation of every rendered object (test_deploy_k8s.py, against the vendored GIE and Gateway API CRDs): the pool
selects the sidecar pods on the proxy's port, the EPP is the pool's and reads the names the proxy exports, the proxy's
configuration is pool-member mode with MindIE's metrics port, and the route leads to the pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_k8s import _env, _selector_matches, kinds, proxy_containers, rendered, validate

NAME = "inference-pool"


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in kinds(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} objects"
    return found[0]


def deployments(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the MindIE pods' Deployment, the EPP's)."""
    pods = next(d for d in kinds(docs, "Deployment") if any(c["name"] == "mindie"
                                                              for c in d["spec"]["template"]["spec"]["containers"]))
    epp = next(d for d in kinds(docs, "Deployment") if d is not pods)
    return pods, epp


def test_the_pool_selects_the_sidecar_pods_on_the_proxys_port() -> None:
    docs = rendered(NAME)
    pool = one(docs, "InferencePool")
    pods, _ = deployments(docs)
    template = pods["spec"]["template"]
    assert _selector_matches(pool["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])
    assert pods["spec"]["replicas"] >= 2, "a pool of one pod leaves the EPP nothing to choose"
    (_, proxy), = proxy_containers([pods])
    http = next(p["containerPort"] for p in proxy["ports"] if p["name"] == "http")
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [http], "the pool's pods are reached via the proxy"
    mindie_ports = {p["containerPort"] for c in template["spec"]["containers"] if c["name"] == "mindie"
                    for p in c["ports"]}
    assert http not in mindie_ports


def test_the_epp_is_the_pools_and_reads_the_proxys_gauges() -> None:
    docs = rendered(NAME)
    pool = one(docs, "InferencePool")
    pods, epp = deployments(docs)
    ref = pool["spec"]["endpointPickerRef"]
    service = one(docs, "Service", ref["name"])
    assert _selector_matches(service["spec"]["selector"], epp["spec"]["template"]["metadata"]["labels"])
    port = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    (container,) = epp["spec"]["template"]["spec"]["containers"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    args = container["args"]
    assert args[args.index("--pool-name") + 1] == pool["metadata"]["name"]
    assert args[args.index("--pool-group") + 1] == pool["apiVersion"].split("/")[0]
    image = container["image"]
    assert ":" in image.rsplit("/", 1)[-1] and not image.endswith((":latest", ":main")), f"unpinned image {image}"
    # The plugins config: mounted where --config-file points; the vllm engine's names, which the proxy exports.
    config_file = Path(args[args.index("--config-file") + 1])
    mount = next(m for m in container["volumeMounts"] if Path(m["mountPath"]) == config_file.parent)
    volume = next(v for v in epp["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    config = yaml.safe_load(one(docs, "ConfigMap", volume["configMap"]["name"])["data"][config_file.name])
    plugins = {p["type"]: p.get("parameters", {}) for p in config["plugins"]}
    assert {"queue-scorer", "kv-cache-utilization-scorer", "metrics-data-source"} <= set(plugins)
    assert plugins["metrics-data-source"]["path"] == "/metrics"
    assert plugins["core-metrics-extractor"].get("defaultEngine", "vllm") == "vllm"
    assert "engineConfigs" not in plugins["core-metrics-extractor"]
    assert pods["spec"]["template"]["metadata"]["labels"]["llm-d.ai/engine-type"] == "vllm"
    # The EPP may read the pool and its pods.
    rules = one(docs, "Role", one(docs, "RoleBinding")["roleRef"]["name"])["rules"]
    granted = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
               if {"get", "watch", "list"} <= set(rule["verbs"])}
    assert {("", "pods"), ("inference.networking.k8s.io", "inferencepools")} <= granted
    assert one(docs, "RoleBinding")["subjects"][0]["name"] == epp["spec"]["template"]["spec"]["serviceAccountName"]


def test_the_proxys_gauges_are_the_names_the_epp_reads() -> None:
    """The names the EPP's built-in vllm engine configuration reads (llm-d-router's core-metrics-extractor
    defaults: docs/inference-gateway.md) are the names the proxy exports."""
    from proxy.metrics.model_server import KV_CACHE, RUNNING, WAITING

    assert (WAITING, RUNNING, KV_CACHE) == (
        "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")


def test_the_proxy_is_a_pool_member_reading_mindies_metrics_port(tmp_path: Path) -> None:
    from proxy.__main__ import parser, settings_from_args

    docs = rendered(NAME)
    pods, _ = deployments(docs)
    template, proxy = proxy_containers([pods])[0]
    env = _env(proxy)
    config_path = Path(env["DIALECT_PROXY_CONFIG"])
    mount = next(m for m in proxy["volumeMounts"] if config_path.parent == Path(m["mountPath"]))
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == mount["name"])
    local = tmp_path / config_path.name
    local.write_text(one(docs, "ConfigMap", volume["configMap"]["name"])["data"][config_path.name])
    env["DIALECT_PROXY_CONFIG"] = str(local)
    settings = settings_from_args(parser().parse_args(["serve"]), env)
    assert settings.server.pool_member and settings.server.workers == 1
    (u,) = settings.upstreams
    assert u.dialect == "mindie" and u.metrics_url and u.health_url
    mindie = next(c for c in template["spec"]["containers"] if c["name"] == "mindie")
    metrics_port = int(u.metrics_url.split(":")[2].split("/")[0])
    assert metrics_port in {p["containerPort"] for p in mindie["ports"]}
    assert _env(mindie).get("MIES_SERVICE_MONITOR_MODE") == "1", "MindIE serves its metrics only in monitor mode"


def test_the_route_leads_to_the_pool() -> None:
    docs = rendered(NAME)
    pool = one(docs, "InferencePool")
    route = one(docs, "HTTPRoute")
    refs = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert refs == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                     "name": pool["metadata"]["name"]}]


@pytest.mark.parametrize(("kind", "change", "says"), [
    ("InferencePool", lambda d: d["spec"].update(targetPort=[{"number": 8000}]), "targetPort"),
    ("InferencePool", lambda d: d["spec"]["endpointPickerRef"].update(failureMode="FailSoft"), "FailSoft"),
    ("InferencePool", lambda d: d["spec"].update(targetPorts=[{"number": 70000}]), "70000"),
    ("InferencePool", lambda d: d["spec"].pop("selector"), "selector"),
    ("HTTPRoute", lambda d: d["spec"]["rules"][0]["matches"][0]["path"].update(type="Prefix"), "Prefix"),
    ("HTTPRoute", lambda d: d["spec"]["rules"][0].update(backendRef=[]), "backendRef"),
])
def test_the_crd_validation_catches_mistakes(kind: str, change: Any, says: str) -> None:
    doc = yaml.safe_load(yaml.safe_dump(one(rendered(NAME), kind)))
    validate(doc)
    change(doc)
    with pytest.raises(AssertionError, match=says):
        validate(doc)
