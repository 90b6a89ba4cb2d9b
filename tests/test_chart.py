"""The Helm chart (charts/hippo): lint, render under every value set in charts/hippo/ci,
validate every manifest against the Kubernetes schemas, and check what the manifests do.

No helm binary and no cluster here: helm-python-sdk (Helm v4's library) lints and renders,
kubernetes-validate checks the objects offline. What these tests cannot show (that pods
start, that probes pass on a real kubelet, that a CNI enforces the NetworkPolicy) is said
in docs/operations.md.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (requirements-dev.txt)")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from hippo_cli.registry import SERVICES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "hippo"
VALUE_SETS = {
    p.name.removesuffix("-values.yaml"): p for p in sorted(CHART.glob("ci/*-values.yaml"))
}
DASHBOARD = CHART / "dashboards" / "hippo.json"
RELEASE = "mem"
NAMESPACE = "hippo"
# The oldest Kubernetes the chart targets (gRPC probes are GA since 1.27; 1.30 is the
# oldest minor upstream still patched when this was written) and the newest schema known.
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
STATEFUL = {"retrieval", "summariser", "injection", "audit"}  # in the embedded mode
SCALED = {"gateway", "embedding"}
CLUSTER = {name for name in VALUE_SETS if name.startswith("cluster")}  # database.enabled
EMBEDDED = sorted(VALUE_SETS.keys() - CLUSTER)
TLS = {name for name in VALUE_SETS if name.startswith("tls")}  # tls.enabled: exec probes
SPEC = {s.name: s for s in SERVICES}
WORKLOADS = ("Deployment", "StatefulSet")
Doc = dict[str, Any]


def values_of(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(VALUE_SETS[name].read_text()) or {}
    if name == "metrics" and not DASHBOARD.exists():
        # The dashboard JSON is delivered separately; without it the template refuses
        # (test_dashboard_configmap checks that), so render the rest.
        loaded["metrics"]["dashboard"]["enabled"] = False
    return loaded


def render(values: dict[str, Any]) -> list[Doc]:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        out = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    docs: list[Doc] = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


@cache
def rendered(name: str) -> tuple[Doc, ...]:
    return tuple(render(values_of(name)))


def merged(base: str, extra: dict[str, Any]) -> dict[str, Any]:
    def deep(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = dict(a)
        for k, v in b.items():
            out[k] = deep(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    return deep(values_of(base), extra)


def find(docs: tuple[Doc, ...] | list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: tuple[Doc, ...] | list[Doc], kind: str, name: str) -> Doc:
    found = find(docs, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def workload(docs: tuple[Doc, ...] | list[Doc], service: str) -> Doc:
    name = f"{RELEASE}-hippo-{service}"
    found = [d for d in docs if d["kind"] in WORKLOADS and d["metadata"]["name"] == name]
    assert len(found) == 1, name
    return found[0]


def config(docs: tuple[Doc, ...] | list[Doc], service: str) -> dict[str, str]:
    data: dict[str, str] = one(docs, "ConfigMap", f"{RELEASE}-hippo-{service}")["data"]
    return data


def containers(doc: Doc) -> Iterator[Doc]:
    spec = doc["spec"]["template"]["spec"] if "template" in doc["spec"] else doc["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


# ---- lint and schema ---------------------------------------------------------------


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_strict_lint_only_misses_the_undownloaded_qdrant_chart(value_set: str) -> None:
    """`helm lint --strict` finds nothing but the Qdrant dependency chart, which is declared
    (condition qdrant.enabled) and fetched by `helm dependency build`, never vendored."""
    report = helm.lint(CHART, values_of(value_set), strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert [m["error"] for m in problems] == [
        "chart directory is missing these dependencies: qdrant"
    ]


def test_strict_lint_is_clean_without_the_dependency(tmp_path: Path) -> None:
    copy = tmp_path / "hippo"
    shutil.copytree(CHART, copy)
    meta = yaml.safe_load((copy / "Chart.yaml").read_text())
    assert [d["name"] for d in meta.pop("dependencies")] == ["qdrant"]
    (copy / "Chart.yaml").write_text(yaml.safe_dump(meta))
    report = helm.lint(copy, values_of("default"), strict=True)
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    assert report["errors"] == []


def test_qdrant_dependency_is_conditional() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (dep,) = meta["dependencies"]
    assert dep["condition"] == "qdrant.enabled"
    assert yaml.safe_load((CHART / "values.yaml").read_text())["qdrant"]["enabled"] is False


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"retrieval": {"replicas": 2}}, "/retrieval/replicas"),
        ({"gatewy": {}}, "gatewy"),
        ({"embedding": {"port": 70000}}, "/embedding/port"),
        ({"summariser": {"llmUrl": "tgi:80"}}, "/summariser/llmUrl"),
        ({"injection": {"env": {"bad-name": "x"}}}, "bad-name"),
        ({"retrieval": {"lexicalIndex": "lucene"}}, "/retrieval/lexicalIndex"),
        ({"retrieval": {"fusion": "both"}}, "/retrieval/fusion"),
        ({"retrieval": {"qdrantCollections": {"shardNumber": 0}}}, "shardNumber"),
    ],
)
def test_values_schema_refuses(values: dict[str, Any], message: str) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError, match=message):
        chart.validate_schema(merged("default", values))


@pytest.mark.parametrize(
    ("service", "key"),
    [
        ("embedding", "PORT"),
        ("summariser", "drain_seconds"),
        ("gateway", "API_KEYS"),
        ("retrieval", "LEXICAL_INDEX"),
        ("retrieval", "FUSION"),
    ],
)
def test_env_cannot_override_what_the_manifests_are_built_from(service: str, key: str) -> None:
    """A PORT set through `env` would move the server but not its probes and Service."""
    with pytest.raises(helm.HelmError, match=rf"{service}\.env\.{key}: the chart sets"):
        render(merged("default", {service: {"env": {key: "1"}}}))


def test_api_keys_are_required() -> None:
    """The gateway refuses to start without keys: the chart refuses to render instead."""
    with pytest.raises(helm.HelmError, match=r"gateway\.apiKeys is required"):
        render({})
    docs = render({"gateway": {"existingSecret": "my-keys"}})
    refs = [
        e["secretRef"]["name"]
        for e in workload(docs, "gateway")["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        if "secretRef" in e
    ]
    assert refs == ["my-keys"]
    assert not find(docs, "Secret", f"{RELEASE}-hippo-gateway-secret")


# ---- cluster mode ---------------------------------------------------------------------


def test_cluster_mode_lifts_the_one_replica_caps() -> None:
    """Embedded mode refuses a second replica of a stateful service (it would be a second,
    separate store); cluster mode (state in PostgreSQL) takes any number."""
    with helm.Chart.load(CHART) as chart:
        for name in STATEFUL:
            with pytest.raises(helm.HelmError, match=f"/{name}/replicas"):
                chart.validate_schema(merged("default", {name: {"replicas": 2}}))
            chart.validate_schema(merged("cluster", {name: {"replicas": 3}}))


def test_cluster_mode_needs_a_database_url() -> None:
    with pytest.raises(helm.HelmError, match=r"database\.enabled needs database\.existingSecret"):
        render(merged("default", {"database": {"enabled": True}}))


def test_cluster_mode_workloads() -> None:
    """Retrieval and injection keep projections (and the model) on volumes of their own:
    StatefulSets, started in parallel. The summariser and audit hold nothing locally:
    Deployments, no claims, no witness volume (checkpoints are in PostgreSQL). Every
    service has a PodDisruptionBudget; the Deployments an HPA when asked."""
    docs = rendered("cluster")
    values = values_of("cluster")
    for name in ("retrieval", "injection"):
        sts = workload(docs, name)
        assert sts["kind"] == "StatefulSet"
        assert sts["spec"]["replicas"] == values[name]["replicas"] == 2
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        assert {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]} == {"data"}
    for name in ("summariser", "audit"):
        dep = workload(docs, name)
        assert dep["kind"] == "Deployment" and "volumeClaimTemplates" not in dep["spec"]
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        assert "emptyDir" in volumes["data"] and "witness" not in volumes
        one(docs, "HorizontalPodAutoscaler", dep["metadata"]["name"])
    assert "HIPPO_AUDIT_WITNESS_PATH" not in config(docs, "audit")
    for name in SPEC:
        pdb = one(docs, "PodDisruptionBudget", f"{RELEASE}-hippo-{name}")
        assert pdb["spec"]["maxUnavailable"] == 1
        one(docs, "Service", f"{RELEASE}-hippo-{name}-headless")


def test_large_profile_runs_retrieval_stateless_on_a_distributed_qdrant() -> None:
    """cluster-large: both indexes on a three-node Qdrant (the subchart), so retrieval
    is a Deployment with no volume, scaled by an HPA; collections are created sharded
    and replicated as the values say. Without the Qdrant server, or in embedded mode,
    the same lexicalIndex keeps retrieval a StatefulSet (its BM25 shard on its volume)."""
    docs = rendered("cluster-large")
    values = values_of("cluster-large")
    dep = workload(docs, "retrieval")
    assert dep["kind"] == "Deployment"
    assert "volumeClaimTemplates" not in dep["spec"] and "replicas" not in dep["spec"]
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["data"]
    hpa = one(docs, "HorizontalPodAutoscaler", dep["metadata"]["name"])
    scaling = values["retrieval"]["autoscaling"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        scaling["minReplicas"],
        scaling["maxReplicas"],
    )
    one(docs, "PodDisruptionBudget", f"{RELEASE}-hippo-retrieval")
    env = config(docs, "retrieval")
    assert env["HIPPO_RETRIEVAL_LEXICAL_INDEX"] == "qdrant"
    assert env["HIPPO_RETRIEVAL_QDRANT_URL"] == f"http://{RELEASE}-qdrant:6333"
    assert env["HIPPO_RETRIEVAL_QDRANT_SHARD_NUMBER"] == "6"
    assert env["HIPPO_RETRIEVAL_QDRANT_REPLICATION_FACTOR"] == "2"
    qdrant = values["qdrant"]
    assert qdrant["replicaCount"] >= 3 and qdrant["config"]["cluster"]["enabled"]
    assert int(env["HIPPO_RETRIEVAL_QDRANT_REPLICATION_FACTOR"]) <= qdrant["replicaCount"]
    local = render(merged("cluster-large", {"qdrant": {"enabled": False}}))
    assert workload(local, "retrieval")["kind"] == "StatefulSet"
    embedded = render(merged("default", {"retrieval": {"lexicalIndex": "qdrant"}}))
    assert workload(embedded, "retrieval")["kind"] == "StatefulSet"
    assert config(embedded, "retrieval")["HIPPO_RETRIEVAL_LEXICAL_INDEX"] == "qdrant"


def test_server_side_fusion_only_where_one_qdrant_collection_can_hold_both() -> None:
    """fusion server reaches retrieval where BM25 and vectors are on a Qdrant server;
    elsewhere the chart refuses to render rather than ship a retrieval that will not
    start."""
    fused = render(merged("cluster-large", {"retrieval": {"fusion": "server"}}))
    assert config(fused, "retrieval")["HIPPO_RETRIEVAL_FUSION"] == "server"
    assert config(rendered("cluster-large"), "retrieval")["HIPPO_RETRIEVAL_FUSION"] == "client"
    for values in (
        merged("default", {"retrieval": {"fusion": "server"}}),  # no Qdrant server
        merged("cluster-large", {"retrieval": {"fusion": "server", "lexicalIndex": "tantivy"}}),
    ):
        with pytest.raises(helm.HelmError, match=r"retrieval\.fusion server needs"):
            render(values)


def test_cluster_mode_database_url_comes_from_a_secret() -> None:
    """Every service with a state of record gets HIPPO_<SVC>_DATABASE__URL from the
    Secret (CloudNativePG's app Secret, key `uri`), never through the ConfigMap; the
    embedding service has no state and no URL."""
    docs = rendered("cluster")
    for name, spec in SPEC.items():
        (c,) = workload(docs, name)["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in c.get("env", [])}
        url = f"HIPPO_{name.upper()}_DATABASE__URL"
        if name == "embedding":
            assert url not in env
            continue
        assert env[url]["valueFrom"]["secretKeyRef"] == {"name": "hippo-pg-app", "key": "uri"}
        assert "database" in spec.settings_type().model_fields, name
        assert not any("DATABASE" in k for k in config(docs, name))
    # The URL given as a value goes into a Secret the chart makes.
    url = "postgresql://hippo:s3cret@pg.db:5432/hippo"
    docs2 = render(merged("default", {"database": {"enabled": True, "url": url}}))
    secret = one(docs2, "Secret", f"{RELEASE}-hippo-database")
    assert secret["stringData"] == {"url": url}
    (c,) = workload(docs2, "gateway")["spec"]["template"]["spec"]["containers"]
    ref = next(e for e in c["env"] if e["name"] == "HIPPO_GATEWAY_DATABASE__URL")
    assert ref["valueFrom"]["secretKeyRef"] == {"name": f"{RELEASE}-hippo-database", "key": "url"}
    assert "s3cret" not in json.dumps([d for d in docs2 if d["kind"] != "Secret"])


def test_cluster_mode_replicas_share_one_audit_signing_key() -> None:
    """Replicas verify each other's checkpoints: one key, made by the chart (kept on
    upgrade through lookup) when none is given, never one per pod."""
    docs = rendered("cluster")
    secret = one(docs, "Secret", f"{RELEASE}-hippo-audit-secret")["stringData"]
    assert len(secret["HIPPO_AUDIT_SIGNING_KEY"]) == 44
    embedded = rendered("default")
    assert not find(embedded, "Secret", f"{RELEASE}-hippo-audit-secret")


# ---- every manifest is a valid Kubernetes object ---------------------------------------


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_manifests_validate(value_set: str, kube: str) -> None:
    docs = rendered(value_set)
    assert docs
    for doc in docs:
        if doc["apiVersion"] == "cert-manager.io/v1":
            # cert-manager's CRD: no schema ships with kubernetes-validate.
            assert doc["kind"] == "Certificate" and doc["spec"]["issuerRef"]["name"]
            continue
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            # Prometheus Operator CRDs: no schema ships with kubernetes-validate.
            assert doc["kind"] in {"ServiceMonitor", "PrometheusRule"}
            assert doc["spec"]
            continue
        kubernetes_validate.validate(doc, kube, strict=True)


# ---- workloads ---------------------------------------------------------------------


@pytest.mark.parametrize("value_set", EMBEDDED)
def test_stateful_services_are_statefulsets_with_volumes(value_set: str) -> None:
    docs = rendered(value_set)
    for name in STATEFUL:
        sts = workload(docs, name)
        assert sts["kind"] == "StatefulSet"
        assert sts["spec"]["replicas"] == 1
        assert sts["spec"]["serviceName"] == f"{RELEASE}-hippo-{name}-headless"
        one(docs, "Service", sts["spec"]["serviceName"])
        claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
        assert "data" in claims
        mounts = {
            m["name"]: m["mountPath"]
            for m in sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        }
        assert mounts["data"] == "/data"
        assert not find(docs, "HorizontalPodAutoscaler", sts["metadata"]["name"])
    # The service's state goes where the volume is.
    assert config(docs, "retrieval")["HIPPO_RETRIEVAL_DATA_DIR"] == "/data"
    assert config(docs, "injection")["HIPPO_INJECTION_MODEL_DIR"] == "/data/model"
    assert config(docs, "audit")["HIPPO_AUDIT_WITNESS_PATH"] == "/witness/witness.log"
    audit = workload(docs, "audit")
    assert {c["metadata"]["name"] for c in audit["spec"]["volumeClaimTemplates"]} == {
        "data",
        "witness",
    }


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_stateless_services_are_deployments_with_an_hpa(value_set: str) -> None:
    docs = rendered(value_set)
    for name in SCALED:
        dep = workload(docs, name)
        assert dep["kind"] == "Deployment"
        # With an HPA the replica count is the HPA's: a fixed one would fight it on upgrade.
        assert "replicas" not in dep["spec"]
        hpa = one(docs, "HorizontalPodAutoscaler", dep["metadata"]["name"])
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": dep["metadata"]["name"],
        }
        assert hpa["spec"]["minReplicas"] >= 2


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS.keys() - TLS))
def test_native_grpc_probes_match_health_semantics(value_set: str) -> None:
    """startup and liveness ask "" (liveness); readiness asks the service's proto name,
    which is what the service reports SERVING only after warm-up (hippo_cli.registry)."""
    docs = rendered(value_set)
    for name, spec in SPEC.items():
        (c,) = workload(docs, name)["spec"]["template"]["spec"]["containers"]
        port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
        assert port == int(config(docs, name)[f"HIPPO_{name.upper()}_PORT"])
        assert c["readinessProbe"]["grpc"] == {"port": port, "service": spec.full_name}
        assert c["livenessProbe"]["grpc"] == {"port": port}
        assert c["startupProbe"]["grpc"] == {"port": port}
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert "httpGet" not in c[probe] and "exec" not in c[probe]
        # Liveness must not kill a pod that is merely busy or still warming up.
        assert c["livenessProbe"]["failureThreshold"] * c["livenessProbe"]["periodSeconds"] >= 30
    injection = workload(docs, "injection")["spec"]["template"]["spec"]["containers"][0]
    startup = injection["startupProbe"]
    # The first start converts the model (1-2 minutes on 2 cores).
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 300


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_termination_grace_outlasts_prestop_and_service_grace(value_set: str) -> None:
    docs = rendered(value_set)
    for name in SPEC:
        pod = workload(docs, name)["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        cmd = c["lifecycle"]["preStop"]["exec"]["command"]
        assert cmd[0] == "sleep"
        env = config(docs, name)
        needed = int(cmd[1]) + float(env[f"HIPPO_{name.upper()}_GRACE_SECONDS"])
        needed += float(env.get(f"HIPPO_{name.upper()}_DRAIN_SECONDS", 0))
        assert pod["terminationGracePeriodSeconds"] > needed, name


def test_too_short_termination_grace_is_refused() -> None:
    with pytest.raises(helm.HelmError, match=r"summariser\.terminationGracePeriodSeconds"):
        # 5 s preStop + 10 s grace + 3 s drain = 18 s.
        render(merged("default", {"summariser": {"terminationGracePeriodSeconds": 18}}))
    render(merged("default", {"summariser": {"terminationGracePeriodSeconds": 19}}))


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_security_contexts(value_set: str) -> None:
    docs = rendered(value_set)
    pods = [d for d in docs if d["kind"] in WORKLOADS] + find(docs, "Pod")
    assert len(pods) == len(SPEC) + 1  # + the helm test pod
    for doc in pods:
        spec = doc["spec"]["template"]["spec"] if "template" in doc["spec"] else doc["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for c in containers(doc):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert "privileged" not in sc
            # A read-only root needs a writable /tmp.
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_labels_come_from_the_helpers(value_set: str) -> None:
    docs = rendered(value_set)
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "hippo"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "hippo-0.1.0"
    for name in SPEC:
        wl = workload(docs, name)
        selector = wl["spec"]["selector"]["matchLabels"]
        assert selector == {
            "app.kubernetes.io/name": "hippo",
            "app.kubernetes.io/instance": RELEASE,
            "app.kubernetes.io/component": name,
        }
        pod_labels = wl["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
        service = one(docs, "Service", f"{RELEASE}-hippo-{name}")
        assert service["spec"]["selector"] == selector


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_settings_are_real_fields_and_peers_resolve(value_set: str) -> None:
    """Every HIPPO_* variable the chart sets is a field of that service's settings (an
    unknown one stops the service at start), and every peer address names a Service port."""
    docs = rendered(value_set)
    ports = {
        (s["metadata"]["name"], p["port"])
        for s in find(docs, "Service")
        for p in s["spec"]["ports"]
    }
    for name, spec in SPEC.items():
        fields = {f.upper() for f in spec.settings_type().model_fields}
        env = dict(config(docs, name))
        for secret in find(docs, "Secret", f"{RELEASE}-hippo-{name}-secret"):
            env.update(secret["stringData"])
        for key, value in env.items():
            prefix = f"HIPPO_{name.upper()}_"
            assert key.startswith(prefix), key
            # A nested model's field (TLS__CA_FILE) belongs to its top-level field.
            assert key.removeprefix(prefix).split("__")[0] in fields, key
            if key.endswith("_ADDR"):
                # Peers resolve the headless Service: every ready pod, balanced round robin.
                assert value.startswith("dns:///"), f"{key}={value}"
                host, _, port = value.removeprefix("dns:///").partition(":")
                assert host.endswith("-headless"), f"{key}={value}"
                assert (host, int(port)) in ports, f"{key}={value}"
            if key.endswith("_URL") and value.startswith(f"http://{RELEASE}-hippo-"):
                host, _, port = value.removeprefix("http://").partition(":")
                assert (host, int(port)) in ports, f"{key}={value}"


# ---- value sets ------------------------------------------------------------------------


def test_defaults_keep_vectors_in_process_and_llm_on_the_injection_host() -> None:
    docs = rendered("default")
    assert config(docs, "retrieval")["HIPPO_RETRIEVAL_QDRANT_URL"] == ""
    injection_http = f"http://{RELEASE}-hippo-injection:8085"
    assert config(docs, "summariser")["HIPPO_SUMMARISER_LLM_URL"] == injection_http
    assert config(docs, "gateway")["HIPPO_GATEWAY_LLM_URL"] == injection_http
    injection = workload(docs, "injection")["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in injection["containers"][0]["resources"].get("limits", {})
    assert "HIPPO_INJECTION_DEVICE" not in config(docs, "injection")
    assert not find(docs, "ServiceMonitor") and not find(docs, "PrometheusRule")
    assert not find(docs, "PodDisruptionBudget")
    gw_secret = one(docs, "Secret", f"{RELEASE}-hippo-gateway-secret")["stringData"]
    assert (
        json.loads(gw_secret["HIPPO_GATEWAY_API_KEYS"])
        == values_of("default")["gateway"]["apiKeys"]
    )
    # The generated fingerprint key is 32 random bytes, base64.
    assert len(gw_secret["HIPPO_GATEWAY_AUDIT_FINGERPRINT_KEY"]) == 44


def test_external_qdrant() -> None:
    docs = rendered("external-qdrant")
    values = values_of("external-qdrant")["externalQdrant"]
    assert config(docs, "retrieval")["HIPPO_RETRIEVAL_QDRANT_URL"] == values["url"]
    (c,) = workload(docs, "retrieval")["spec"]["template"]["spec"]["containers"]
    assert {"secretRef": {"name": values["existingSecret"]}} in c["envFrom"]
    assert not find(docs, "Secret", f"{RELEASE}-hippo-retrieval-secret")
    # An API key given as a value goes into the chart's Secret, never the ConfigMap.
    docs2 = render(merged("default", {"externalQdrant": {"url": values["url"], "apiKey": "s3"}}))
    secret = one(docs2, "Secret", f"{RELEASE}-hippo-retrieval-secret")
    assert secret["stringData"] == {"HIPPO_RETRIEVAL_QDRANT_API_KEY": "s3"}
    assert "s3" not in json.dumps(config(docs2, "retrieval"))


def test_qdrant_subchart_url() -> None:
    docs = render(merged("default", {"qdrant": {"enabled": True}}))
    assert (
        config(docs, "retrieval")["HIPPO_RETRIEVAL_QDRANT_URL"] == f"http://{RELEASE}-qdrant:6333"
    )


def test_gpu_injection() -> None:
    docs = rendered("gpu-injection")
    pod = workload(docs, "injection")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["resources"]["limits"]["memory"]  # the CPU limits stay
    assert c["image"].endswith(":0.1.0-cuda")
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    env = config(docs, "injection")
    assert env["HIPPO_INJECTION_DEVICE"] == "cuda"
    assert env["HIPPO_INJECTION_DTYPE"] == "bfloat16"
    # Only the LLM host moves to the GPU.
    for name in SPEC.keys() - {"injection"}:
        spec = workload(docs, name)["spec"]["template"]["spec"]
        assert "nodeSelector" not in spec
        assert "-cuda" not in spec["containers"][0]["image"]


def test_external_tgi() -> None:
    docs = rendered("external-tgi")
    assert config(docs, "summariser")["HIPPO_SUMMARISER_LLM_URL"] == "http://tgi.llm.svc:80"
    assert config(docs, "gateway")["HIPPO_GATEWAY_LLM_URL"] == "http://tgi.llm.svc:80"
    # Token counts still come from the injection service's gRPC API.
    assert config(docs, "summariser")["HIPPO_SUMMARISER_INJECTION_ADDR"] == (
        f"dns:///{RELEASE}-hippo-injection-headless:50055"
    )


def test_metrics_on() -> None:
    docs = rendered("metrics")
    (monitor,) = find(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    sel = monitor["spec"]["selector"]
    assert {"key": "hippo/headless", "operator": "DoesNotExist"} in sel["matchExpressions"]
    selected = [
        s
        for s in find(docs, "Service")
        if sel["matchLabels"].items() <= s["metadata"]["labels"].items()
        and "hippo/headless" not in s["metadata"]["labels"]
    ]
    # Exactly one scraped Service per service, each with a port named like the endpoint.
    assert sorted(s["metadata"]["labels"]["app.kubernetes.io/component"] for s in selected) == (
        sorted(SPEC)
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    for s in selected:
        assert endpoint["port"] in {p["name"] for p in s["spec"]["ports"]}
    (rule,) = find(docs, "PrometheusRule")
    rules_file = yaml.safe_load((CHART / "rules" / "hippo-alerts.yaml").read_text())
    assert rule["spec"]["groups"] == rules_file["groups"]
    assert {p["metadata"]["name"] for p in find(docs, "PodDisruptionBudget")} == {
        f"{RELEASE}-hippo-{n}" for n in SPEC
    }
    for name in SPEC:
        assert config(docs, name)[f"HIPPO_{name.upper()}_OTLP_ENDPOINT"] == (
            "http://otel-collector.monitoring.svc:4317"
        )


def test_dashboard_configmap() -> None:
    values = yaml.safe_load((CHART / "ci" / "metrics-values.yaml").read_text())
    if not DASHBOARD.exists():
        with pytest.raises(helm.HelmError, match=r"dashboards/hippo\.json"):
            render(values)
        pytest.skip("charts/hippo/dashboards/hippo.json is not there yet")
    (cm,) = [d for d in render(values) if d["metadata"]["name"] == f"{RELEASE}-hippo-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["hippo.json"]) == json.loads(DASHBOARD.read_text())


def test_checksum_follows_the_service_settings() -> None:
    def checksums(docs: list[Doc] | tuple[Doc, ...]) -> dict[str, str]:
        return {
            n: workload(docs, n)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for n in SPEC.keys() - {"gateway"}  # the gateway's holds a generated key
        }

    before = checksums(rendered("default"))
    after = checksums(render(merged("default", {"embedding": {"env": {"LOG_LEVEL": "debug"}}})))
    assert after["embedding"] != before["embedding"]
    assert {k: v for k, v in after.items() if k != "embedding"} == {
        k: v for k, v in before.items() if k != "embedding"
    }
    data = config(rendered("default"), "embedding")
    assert len(before["embedding"]) == len(hashlib.sha256().hexdigest())
    assert data["HIPPO_EMBEDDING_HOST"] == "0.0.0.0"


def test_helm_test_pod_checks_every_service() -> None:
    docs = rendered("default")
    (pod,) = find(docs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (c,) = pod["spec"]["containers"]
    assert c["command"][:3] == ["python", "-m", "hippo_core.healthcheck"]
    targets = [a for a in c["command"] if "/" in a]
    expected = [
        f"{RELEASE}-hippo-{s.name}:{config(docs, s.name)[f'HIPPO_{s.name.upper()}_PORT']}"
        f"/{s.full_name}"
        for s in SERVICES
    ]
    assert sorted(targets) == sorted(expected)
    # The NetworkPolicy admits it: it carries the release's instance label.
    assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


# ---- NetworkPolicy, evaluated ------------------------------------------------------------


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        value = labels.get(expr["key"])
        op = expr["operator"]
        ok = {
            "In": value in expr.get("values", []),
            "NotIn": value not in expr.get("values", []),
            "Exists": expr["key"] in labels,
            "DoesNotExist": expr["key"] not in labels,
        }[op]
        if not ok:
            return False
    return True


def allowed(
    docs: tuple[Doc, ...] | list[Doc],
    target: Doc,
    port_name: str,
    src_labels: dict[str, str],
    src_ns: dict[str, str],
) -> bool:
    """Is ingress to `target`'s pods on `port_name` allowed from a pod with `src_labels` in a
    namespace labelled `src_ns` (same namespace when src_ns is the release's)?"""
    pod_labels = target["spec"]["template"]["metadata"]["labels"]
    same_ns = src_ns.get("kubernetes.io/metadata.name") == NAMESPACE
    policies = [
        p for p in find(docs, "NetworkPolicy") if _selects(p["spec"]["podSelector"], pod_labels)
    ]
    if not policies:
        return True
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            if "ports" in rule and port_name not in {p["port"] for p in rule["ports"]}:
                continue
            if "from" not in rule:
                return True
            for peer in rule["from"]:
                ns_ok = (
                    _selects(peer["namespaceSelector"], src_ns)
                    if "namespaceSelector" in (peer)
                    else same_ns
                )
                pod_ok = (
                    _selects(peer["podSelector"], src_labels) if "podSelector" in peer else True
                )
                if ns_ok and pod_ok:
                    return True
    return False


OUTSIDE_POD = {"app": "some-client"}
OWN_NS = {"kubernetes.io/metadata.name": NAMESPACE}
OTHER_NS = {"kubernetes.io/metadata.name": "apps"}
MONITORING_NS = {"kubernetes.io/metadata.name": "monitoring"}
RELEASE_POD = {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": "gateway"}


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_network_policy_only_the_gateway_is_reachable_from_outside(value_set: str) -> None:
    docs = rendered(value_set)
    for name in SPEC:
        target = workload(docs, name)
        for ns in (OWN_NS, OTHER_NS):
            assert allowed(docs, target, "grpc", OUTSIDE_POD, ns) is (name == "gateway"), name
        # Peers inside the release reach every service.
        assert allowed(docs, target, "grpc", RELEASE_POD, OWN_NS), name
        # A pod of another release of the chart in the same namespace does not.
        other_release = {**RELEASE_POD, "app.kubernetes.io/instance": "other"}
        assert allowed(docs, target, "grpc", other_release, OWN_NS) is (name == "gateway")
    injection = workload(docs, "injection")
    assert not allowed(docs, injection, "http", OUTSIDE_POD, OTHER_NS)


def test_network_policy_metrics_port() -> None:
    default, metrics = rendered("default"), rendered("metrics")
    for name in SPEC:
        # By default nobody outside the release scrapes (not even the gateway's port).
        assert not allowed(default, workload(default, name), "metrics", OUTSIDE_POD, MONITORING_NS)
        # metricsFrom opens the metrics port, and only it, to the monitoring namespace.
        target = workload(metrics, name)
        assert allowed(metrics, target, "metrics", {"app": "prometheus"}, MONITORING_NS)
        assert not allowed(metrics, target, "metrics", OUTSIDE_POD, OTHER_NS)
        if name != "gateway":
            assert not allowed(metrics, target, "grpc", {"app": "prometheus"}, MONITORING_NS)


def test_network_policy_gateway_from() -> None:
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}
    docs = render(merged("default", {"networkPolicy": {"gatewayFrom": [peer]}}))
    gateway = workload(docs, "gateway")
    assert allowed(docs, gateway, "grpc", OUTSIDE_POD, OTHER_NS)
    assert not allowed(docs, gateway, "grpc", OUTSIDE_POD, MONITORING_NS)
    off = render(merged("default", {"networkPolicy": {"enabled": False}}))
    assert not find(off, "NetworkPolicy")


# ---- TLS ---------------------------------------------------------------------------------


def test_tls_gives_every_service_its_identity_and_mounts_it() -> None:
    """tls.enabled: a Certificate per service (URI SAN spiffe://hippo/<service>, the DNS
    names its peers dial), its Secret mounted at /tls and named in the settings; probes
    run the TLS healthcheck with the pod's own certificate; the LLM URL is HTTPS."""
    docs = rendered("tls")
    certs = {c["metadata"]["name"]: c["spec"] for c in find(docs, "Certificate")}
    assert set(certs) == {f"{RELEASE}-hippo-{n}" for n in [*SPEC, "operator"]}
    for name, spec in SPEC.items():
        cert = certs[f"{RELEASE}-hippo-{name}"]
        assert cert["uris"] == [f"spiffe://hippo/{name}"]
        assert f"{RELEASE}-hippo-{name}-headless" in cert["dnsNames"]
        assert "localhost" in cert["dnsNames"]
        assert {"server auth", "client auth"} <= set(cert["usages"])
        env = config(docs, name)
        prefix = f"HIPPO_{name.upper()}_TLS__"
        assert env[f"{prefix}CA_FILE"] == "/tls/ca.crt"
        assert env[f"{prefix}CERT_FILE"] == "/tls/tls.crt"
        assert env[f"{prefix}KEY_FILE"] == "/tls/tls.key"
        pod = workload(docs, name)["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
        assert volume["secret"]["secretName"] == cert["secretName"]
        (c,) = pod["containers"]
        assert {"name": "tls", "mountPath": "/tls", "readOnly": True} in c["volumeMounts"]
        port = int(env[f"HIPPO_{name.upper()}_PORT"])
        ready = c["readinessProbe"]["exec"]["command"]
        assert ready[:4] == [
            "python",
            "-m",
            "hippo_core.healthcheck",
            f"127.0.0.1:{port}/{spec.full_name}",
        ]
        assert "--tls-cert=/tls/tls.crt" in ready and "grpc" not in c["livenessProbe"]
    assert config(docs, "gateway")["HIPPO_GATEWAY_TLS__REQUIRE_CLIENT_CERT"] == "true"
    for name in ("gateway", "summariser"):
        url = config(docs, name)[f"HIPPO_{name.upper()}_LLM_URL"]
        assert url == f"https://{RELEASE}-hippo-injection:8085"
    test = one(docs, "Pod", f"{RELEASE}-hippo-test-health")
    assert test["spec"]["volumes"][-1]["secret"]["secretName"] == f"{RELEASE}-hippo-operator-tls"


def test_tls_from_existing_secrets_without_cert_manager() -> None:
    values = merged(
        "tls",
        {"tls": {"certManager": {"enabled": False}, "existingSecrets": {"audit": "audit-certs"}}},
    )
    docs = render(values)
    assert not find(docs, "Certificate")
    volumes = workload(docs, "audit")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "audit-certs", "defaultMode": 0o400}} in volumes
    retrieval = workload(docs, "retrieval")["spec"]["template"]["spec"]["volumes"]
    assert any(
        v.get("secret", {}).get("secretName") == f"{RELEASE}-hippo-retrieval-tls" for v in retrieval
    )


def test_tls_with_cert_manager_needs_an_issuer() -> None:
    values = merged("tls", {"tls": {"certManager": {"issuerRef": {"name": ""}}}})
    with pytest.raises(helm.HelmError, match=r"tls\.certManager\.issuerRef\.name is required"):
        render(values)


def test_tls_is_off_by_default() -> None:
    docs = rendered("default")
    assert not find(docs, "Certificate")
    assert not any(k.startswith("HIPPO_AUDIT_TLS") for k in config(docs, "audit"))


def test_an_embedder_directory_is_mounted_and_listed() -> None:
    volume = {"name": "models", "persistentVolumeClaim": {"claimName": "embedders"}}
    mount = {"name": "models", "mountPath": "/models", "readOnly": True}
    values = merged(
        "default",
        {
            "embedding": {
                "env": {"MODELS": "builtin,bge=/models/bge-small"},
                "extraVolumes": [volume],
                "extraVolumeMounts": [mount],
            }
        },
    )
    docs = render(values)
    assert config(docs, "embedding")["HIPPO_EMBEDDING_MODELS"] == "builtin,bge=/models/bge-small"
    spec = workload(docs, "embedding")["spec"]["template"]["spec"]
    assert volume in spec["volumes"]
    assert mount in spec["containers"][0]["volumeMounts"]
    other = workload(docs, "retrieval")["spec"]["template"]["spec"]
    assert all(v["name"] != "models" for v in other["volumes"])  # only where asked
