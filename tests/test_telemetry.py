"""Telemetry end to end: the local cluster exports traces over OTLP and metrics to a real
Prometheus, and the committed Grafana dashboard's queries work against what it exports.

One cluster for the module (starting it is the expensive part): an OTLP/gRPC receiver
stands in for the collector (a real OTLP endpoint, read back here), Prometheus (the Debian
binary, `make prometheus`) scrapes every service each second, and a short load through
the gateway exercises every panel before the tests look.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from hippo_cli.cluster import LocalCluster, local_cluster
from hippo_cli.registry import SERVICES
from hippo_core.listen import reserve_port

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "charts" / "hippo" / "dashboards" / "hippo.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
KEY = (("x-api-key", "hippo-local-dev-key"),)
# Grafana fills $__rate_interval from the panel's width; any window that covers the load
# (it runs for about a minute) gives each rate() at least two samples here.
RATE_WINDOW = "5m"


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _exprs() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _panels(_dashboard()) for t in p["targets"]]


_METRIC = re.compile(r"\b(?:grpc|hippo)_[a-z0-9_]+")


_LABELS = re.compile(r"\{[^}]*\}|\b(?:by|without)\s*\([^)]*\)")


def _metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (label matchers and groupings removed first)."""
    return set(_METRIC.findall(_LABELS.sub(" ", expr)))


# --- the dashboard file itself (no cluster) ---------------------------------------------


def test_dashboard_has_the_rows_and_a_datasource_variable() -> None:
    dashboard = _dashboard()
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == [
        "Overview",
        "Recall",
        "Indexes",
        "Replicas (cluster mode)",
        "Embedding",
        "LLM host",
        "Summariser",
        "Audit",
    ]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in _panels(dashboard):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))  # Grafana silently drops panels with a duplicate id
    overview = " ".join(expr for title, expr in _exprs() if title.startswith("Latency p"))
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}, sum by (le, grpc_service, grpc_method)" in overview


def test_dashboard_json_is_what_its_script_writes() -> None:
    script = ROOT / "scripts" / "gen_dashboard.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def _documented() -> set[str]:
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", METRICS_DOC.read_text(), re.MULTILINE))


def test_every_dashboard_metric_is_documented() -> None:
    used = set().union(*(_metric_names(expr) for _, expr in _exprs()))
    base = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    assert base - _documented() == set()


def _exposed_name(family: Any) -> str:
    # How a family's samples are named on /metrics, as docs/metrics.md lists them.
    if family.type == "counter":
        return f"{family.name}_total"
    return f"{family.name}_info" if family.type == "info" else str(family.name)


def test_every_registered_metric_is_documented() -> None:
    """Importing the metrics modules registers every hippo_/grpc_ metric in this process;
    docs/metrics.md must have a row for each, and no row for a metric that is gone (alert
    rules are written from it)."""
    import importlib

    from prometheus_client import REGISTRY

    for spec in SERVICES:
        importlib.import_module(f"{spec.module}.metrics")
    importlib.import_module("hippo_core.metrics")
    importlib.import_module("hippo_core.outbox")  # the outboxes' metrics (gateway, summariser)
    ours = {_exposed_name(f) for f in REGISTRY.collect() if f.name.startswith(("hippo_", "grpc_"))}
    assert ours - _documented() == set()
    assert _documented() - ours == set()


def _label_values(metric: Any, label: str) -> set[str]:
    return {sample.labels[label] for family in metric.collect() for sample in family.samples}


def test_series_preset_at_zero_use_the_domains_own_label_values() -> None:
    """Known label values are exported at zero from the start (so rate() sees the first
    event); a preset value the code never uses would sit beside the live series."""
    from hippo_gateway import metrics as gateway
    from hippo_gateway.domain.models import Mode as GatewayMode
    from hippo_injection import metrics as injection
    from hippo_injection.domain.types import FinishReason
    from hippo_retrieval import metrics as retrieval
    from hippo_retrieval.domain.models import Mode as RetrievalMode

    assert _label_values(gateway.RECALL_SECONDS, "mode") == {m.value for m in GatewayMode}
    assert _label_values(retrieval.SEARCH_SECONDS, "mode") == {m.value for m in RetrievalMode}
    reasons = {r.value for r in FinishReason}
    assert _label_values(injection.GENERATED_TOKENS, "finish_reason") == reasons


# --- the running cluster ----------------------------------------------------------------


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int


@dataclass
class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """A real OTLP/gRPC trace endpoint that keeps what it is sent."""

    spans: list[Span] = field(default_factory=list)

    def Export(self, request: Any, context: Any) -> Any:
        for resource in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for s in scope.spans:
                    self.spans.append(
                        Span(
                            attrs.get("service.name", ""),
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.kind,
                        )
                    )
        return trace_service_pb2.ExportTraceServiceResponse()


def _prometheus_binary() -> str:
    unpacked = Path(sys.executable).parent.parent / "prometheus" / "usr" / "bin" / "prometheus"
    found = str(unpacked) if unpacked.exists() else shutil.which("prometheus")
    if found is None:
        pytest.fail("no prometheus binary: run `make prometheus` (make test does)")
    return found


@contextmanager
def _prometheus(cluster: LocalCluster, workdir: Path) -> Iterator[str]:
    """Prometheus on a free port scraping every service each second; stopped on exit."""
    jobs = [
        {
            "job_name": name,
            "static_configs": [{"targets": [urllib.parse.urlsplit(url).netloc]}],
        }
        for name, url in cluster.metrics.items()
    ]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": jobs,
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = reserve_port()
    process = subprocess.Popen(
        [
            _prometheus_binary(),
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "prometheus.log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).read()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((workdir / "prometheus.log").read_text()) from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _query(prometheus: str, expr: str) -> dict[str, Any]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            answer: dict[str, Any] = json.load(reply)
    except urllib.error.HTTPError as exc:  # 400: the expression does not parse
        answer = json.load(exc)
    return answer


@dataclass
class Telemetry:
    cluster: LocalCluster
    prometheus: str
    receiver: OtlpReceiver
    exported: dict[str, str]  # service -> its /metrics text after the load


def _load(cluster: LocalCluster, round_: int) -> None:
    """One round of a short, varied load: store new turns (merges follow), recall in
    every mode (the repeat hits the embedding cache), build a context, fail twice."""
    from hippo.memory.v1 import memory_pb2 as pb
    from hippo.memory.v1 import memory_pb2_grpc

    with grpc.insecure_channel(cluster.gateway) as gateway:
        memory = memory_pb2_grpc.MemoryServiceStub(gateway)
        scope = pb.Scope(user_id="tel", session_id="s1")
        facts = [
            (f"My sister Lena moved to Porto in May {2020 + round_}.", "Porto is lovely."),
            (f"The build fails with ERR_CONNECTION_REFUSED on port {5432 + round_}.", "Is it up?"),
            (f"I adopted a greyhound named Comet{round_} last week.", "A great name."),
        ]
        for user, assistant in facts:  # over the test's 64-token window: merges follow
            memory.Remember(
                pb.RememberRequest(
                    scope=scope,
                    turns=[
                        pb.Turn(role=pb.ROLE_USER, text=user),
                        pb.Turn(role=pb.ROLE_ASSISTANT, text=assistant),
                    ],
                    wait_searchable=True,
                ),
                metadata=KEY,
                timeout=60,
            )
        for mode in (pb.RECALL_MODE_HYBRID, pb.RECALL_MODE_LEXICAL, pb.RECALL_MODE_SEMANTIC):
            for _ in range(2):  # the repeat is answered from the embedding cache
                memory.Recall(
                    pb.RecallRequest(scope=pb.Scope(user_id="tel"), query="Lena Porto", mode=mode),
                    metadata=KEY,
                    timeout=30,
                )
        memory.BuildContext(
            pb.BuildContextRequest(scope=scope, query="Where does Lena live?", token_budget=512),
            metadata=KEY,
            timeout=60,
        )
        with pytest.raises(grpc.RpcError):  # UNAUTHENTICATED: the error panels see it
            memory.Recall(pb.RecallRequest(scope=pb.Scope(user_id="tel"), query="x"), timeout=10)
        with pytest.raises(grpc.RpcError):  # INVALID_ARGUMENT
            memory.Recall(pb.RecallRequest(scope=pb.Scope(user_id="no spaces")), metadata=KEY)


def _one_offs(cluster: LocalCluster) -> None:
    """The slower calls, once, while no merge holds the model: a streamed Chat, an audit
    check, an influence applied, a session forgotten."""
    from hippo.injection.v1 import injection_pb2, injection_pb2_grpc
    from hippo.memory.v1 import memory_pb2 as pb
    from hippo.memory.v1 import memory_pb2_grpc

    with (
        grpc.insecure_channel(cluster.gateway) as gateway,
        grpc.insecure_channel(cluster.addrs["injection"]) as llm,
    ):
        memory = memory_pb2_grpc.MemoryServiceStub(gateway)
        chat = pb.ChatRequest(
            scope=pb.Scope(user_id="tel", session_id="s2"),
            message="Say hello.",
            params=pb.GenerationParameters(max_new_tokens=4),
        )
        list(memory.Chat(chat, metadata=KEY, timeout=120))
        influenced = pb.ChatRequest(
            scope=pb.Scope(user_id="tel", session_id="s3"),
            message="My daughter Ingrid is allergic to peanuts, never order satay for her.",
            params=pb.GenerationParameters(max_new_tokens=2),
            influence=pb.INFLUENCE_MODE_ON,  # the memtok pipeline: key lookups on the model thread
        )
        list(memory.Chat(influenced, metadata=KEY, timeout=180))
        memory.VerifyAudit(pb.VerifyAuditRequest(), metadata=KEY, timeout=30)
        # Through the gateway an influence is applied only when the memtok store holds a
        # close enough match (a thin store injects nothing), which this short load does
        # not build: the influence panel is fed by the injection service directly.
        stub = injection_pb2_grpc.InjectionServiceStub(llm)
        vector = stub.MakeValueVector(
            injection_pb2.MakeValueVectorRequest(text="cats", layer=4, scale_to_layer_norm=True),
            timeout=60,
        )
        influence = injection_pb2.Influence(vector=vector.vector, layer=4, strength=0.5)
        list(
            stub.Generate(
                injection_pb2.GenerateRequest(
                    prompt="Hello", max_new_tokens=2, influences=[influence]
                ),
                timeout=60,
            )
        )
        memory.Forget(
            pb.ForgetRequest(session=pb.Scope(user_id="tel", session_id="s2")),
            metadata=KEY,
            timeout=60,
        )


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode())


def _sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return 0.0


def _wait_scraped(prometheus: str, targets: int) -> None:
    """Until every target has been scraped once: series that exist before the load then
    start at their idle value, and the load's events show up in rate()."""
    deadline = time.monotonic() + 30
    while True:
        result = _query(prometheus, "up == 1")["data"]["result"]
        if len(result) == targets:
            return
        assert time.monotonic() < deadline, f"Prometheus scraped only {result}"
        time.sleep(0.2)


def _merges_settle(summariser_metrics: str, above: float, timeout: float = 120) -> float:
    """Wait for more committed summary merges than `above` and none pending."""
    deadline = time.monotonic() + timeout
    while True:
        text = _scrape(summariser_metrics)
        merged = _sample(text, "hippo_summariser_merges_total", result="committed")
        if merged > above and _sample(text, "hippo_summariser_merges_pending") == 0:
            return merged
        assert time.monotonic() < deadline, f"merges: {merged} committed, none new in time"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def telemetry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Telemetry]:
    receiver = OtlpReceiver()
    otlp = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, otlp)
    otlp_port = otlp.add_insecure_port("127.0.0.1:0")
    otlp.start()
    env = {f"{s.env_prefix()}OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}" for s in SERVICES}
    env |= {
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # export spans within 0.2 s, not the default 5 s
        # A small window and summary, so the load's three exchanges cause real merges.
        "HIPPO_SUMMARISER_WINDOW_TOKENS": "64",
        "HIPPO_SUMMARISER_SUMMARY_TOKENS": "32",
    }
    workdir = tmp_path_factory.mktemp("telemetry")
    try:
        with (
            local_cluster(workdir / "var", env) as cluster,
            _prometheus(cluster, workdir) as prometheus,
        ):
            _wait_scraped(prometheus, len(cluster.metrics))
            # A labelled series is born at its first event, so Prometheus first sees it
            # already at 1 and rate() has no increase to show. The second round moves
            # every series that the first one created, as steady traffic would.
            merged = 0.0
            for round_ in range(2):
                _load(cluster, round_)
                merged = _merges_settle(cluster.metrics["summariser"], above=merged)
                if round_ == 0:
                    _one_offs(cluster)
                time.sleep(2.5)  # at least two scrapes between the rounds and after
            exported = {name: _scrape(url) for name, url in cluster.metrics.items()}
            yield Telemetry(cluster, prometheus, receiver, exported)
    finally:
        otlp.stop(grace=None)


def test_every_panel_query_parses_and_returns_data(telemetry: Telemetry) -> None:
    failures = []
    for title, expr in _exprs():
        answer = _query(telemetry.prometheus, expr.replace("$__rate_interval", RATE_WINDOW))
        if answer["status"] != "success":
            failures.append(f"{title}: {expr}: {answer.get('error')}")
        elif not answer["data"]["result"]:
            failures.append(f"{title}: {expr}: no data")
        elif all(r["value"][1] in ("NaN", "+Inf", "-Inf") for r in answer["data"]["result"]):
            # e.g. a quantile of a histogram that saw nothing: the panel would stay empty
            failures.append(f"{title}: {expr}: only NaN/Inf: {answer['data']['result']}")
    assert failures == [], "\n".join(failures)


def _exported_names(telemetry: Telemetry) -> set[str]:
    """Every sample name a service exposes, including families declared but not yet
    observed (a labelled counter before its first increment has no samples)."""
    names: set[str] = set()
    for text in telemetry.exported.values():
        for family in text_string_to_metric_families(text):
            names.update(sample.name for sample in family.samples)
            names.add(_exposed_name(family))
            if family.type == "histogram":
                names.update(f"{family.name}_{part}" for part in ("bucket", "sum", "count"))
    return names


def test_every_dashboard_metric_is_exported_by_a_service(telemetry: Telemetry) -> None:
    used = set().union(*(_metric_names(expr) for _, expr in _exprs()))
    assert used - _exported_names(telemetry) == set()


def test_every_exported_metric_is_documented(telemetry: Telemetry) -> None:
    ours = set()
    for text in telemetry.exported.values():
        for family in text_string_to_metric_families(text):
            if family.name.startswith(("hippo_", "grpc_")):
                ours.add(_exposed_name(family))
    assert ours - _documented() == set()


def _wait_for_spans(receiver: OtlpReceiver, done: Any, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.2)


def _trace_of(receiver: OtlpReceiver, service: str, name: str) -> list[Span]:
    root = next(
        s for s in receiver.spans if s.service == service and s.name == name and s.kind == 2
    )
    return [s for s in receiver.spans if s.trace_id == root.trace_id]


def test_one_trace_per_request_across_services(telemetry: Telemetry) -> None:
    """Remember reaches injection through the summariser (CountTokens), BuildContext and
    Chat fan out from the gateway to four services (Chat's reply over HTTP), VerifyAudit
    reaches the audit service. Each is one trace whose spans form one tree rooted at the
    gateway."""
    receiver = telemetry.receiver
    memory = "/hippo.memory.v1.MemoryService"
    wanted = {
        f"{memory}/Remember": {"embedding", "retrieval", "summariser", "injection"},
        f"{memory}/BuildContext": {"embedding", "retrieval", "summariser", "injection"},
        f"{memory}/VerifyAudit": {"audit"},
        f"{memory}/Chat": {"embedding", "retrieval", "summariser", "injection"},
    }

    def services(method: str) -> set[str]:
        try:
            return {s.service for s in _trace_of(receiver, "hippo-gateway", method)}
        except StopIteration:
            return set()

    def complete() -> bool:
        return all({f"hippo-{x}" for x in need} <= services(m) for m, need in wanted.items())

    _wait_for_spans(receiver, complete)
    for method, need in wanted.items():
        spans = _trace_of(receiver, "hippo-gateway", method)
        assert {f"hippo-{x}" for x in need} | {"hippo-gateway"} <= {s.service for s in spans}
        ids = {s.span_id for s in spans}
        roots = [s for s in spans if not s.parent_id]
        assert len(roots) == 1 and roots[0].name == method  # one tree, rooted at the gateway
        assert all(s.parent_id in ids for s in spans if s.parent_id)
        # Every downstream server span is the child of the caller's client span.
        servers = [s for s in spans if s.kind == 2 and s is not roots[0]]
        clients = {s.span_id: s for s in spans if s.kind == 3}
        assert servers
        wrong = [(s.service, s.name) for s in servers if clients[s.parent_id].name != s.name]
        assert wrong == [], method
    # With influence on, the injection service looks memtok keys up in the embedding
    # service from its model thread (a blocking channel): still the request's trace.
    chats = [
        s for s in receiver.spans if s.name == f"{memory}/Chat" and s.service == "hippo-gateway"
    ]
    lookups = [
        [s for s in receiver.spans if s.trace_id == chat.trace_id and s.service == "hippo-injection"
         and s.kind == 3 and s.name.endswith("/Embed")]
        for chat in chats
    ]  # fmt: skip
    assert any(lookups), [(c.trace_id, len(x)) for c, x in zip(chats, lookups, strict=True)]
    # Chat streams its reply over the LLM host's TGI HTTP API: in the trace too.
    # (The summariser's merges use that API too, each in a trace of its own.)
    in_chats = {chat.trace_id for chat in chats}
    http = [
        s
        for s in receiver.spans
        if s.service == "hippo-injection" and s.name.startswith("POST /") and s.trace_id in in_chats
    ]
    assert http and all(s.kind == 2 and s.parent_id for s in http)


def test_spooled_audit_deliveries_rejoin_the_callers_trace(telemetry: Telemetry) -> None:
    """The gateway spools audit events and delivers them later in batches; each delivery
    is a span in the trace of a Memory call that spooled one of its events, and the
    audit service's Append is its grandchild (through the client span)."""
    receiver = telemetry.receiver

    def deliveries() -> list[Span]:
        return [s for s in receiver.spans if s.name == "audit.deliver"]

    _wait_for_spans(receiver, lambda: len(deliveries()) > 0)
    assert deliveries()
    for delivery in deliveries():
        spans = [s for s in receiver.spans if s.trace_id == delivery.trace_id]
        roots = [s for s in spans if not s.parent_id]
        assert len(roots) == 1 and roots[0].service == "hippo-gateway"
        assert roots[0].name.startswith("/hippo.memory.v1.MemoryService/")
        calls = {s.span_id for s in spans if s.kind == 3 and s.parent_id == delivery.span_id}
        audit = [s for s in spans if s.service == "hippo-audit" and s.parent_id in calls]
        assert [s.name.rsplit("/", 1)[-1] for s in audit] in (["Append"], ["ForgetUser"])


def test_health_checks_make_no_spans(telemetry: Telemetry) -> None:
    # The launcher polled every service's health while starting the cluster.
    assert telemetry.receiver.spans
    assert not [s for s in telemetry.receiver.spans if "grpc.health" in s.name]
