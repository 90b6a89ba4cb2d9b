"""Write the Grafana dashboard, charts/hippo/dashboards/hippo.json, from the panels below.

The JSON is what ships (the chart's ConfigMap, compose's provisioning); this script is
how it is edited, so panel layout, ids and the datasource wiring stay uniform. Every
query must work against the real cluster: tests/test_telemetry.py runs each one in a
real Prometheus, and `--check` (run by that test file) fails when the committed JSON is
not what this script writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "charts" / "hippo" / "dashboards" / "hippo.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"  # Grafana's window: at least four scrape intervals
# Probes and reflection are not traffic: they would dominate request rates.
NOT_INFRA = 'grpc_service!~"grpc.health.v1.Health|grpc.reflection.v1alpha.ServerReflection"'
WIDTH, HEIGHT = 8, 8  # three panels to a row of Grafana's 24 columns


def _series(metric: str, selector: str) -> str:
    return f"{metric}{{{selector}}}[{RATE}]" if selector else f"{metric}[{RATE}]"


def quantile(q: str, metric: str, by: str, selector: str = "") -> str:
    buckets = _series(f"{metric}_bucket", selector)
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({buckets})))"


def mean(metric: str, by: str = "", selector: str = "") -> str:
    group = f" by ({by})" if by else ""
    total, count = _series(f"{metric}_sum", selector), _series(f"{metric}_count", selector)
    return f"sum{group} (rate({total})) / sum{group} (rate({count}))"


def rate(metric: str, by: str = "", selector: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({_series(metric, selector)}))"


@dataclass
class Layout:
    panels: list[dict[str, Any]] = field(default_factory=list)
    y: int = 0
    x: int = 0

    def row(self, title: str) -> None:
        if self.x:
            self.y, self.x = self.y + HEIGHT, 0
        grid = {"h": 1, "w": 24, "x": 0, "y": self.y}
        self.panels.append(
            {"type": "row", "title": title, "collapsed": False, "gridPos": grid, "panels": []}
        )
        self.y += 1

    def panel(self, title: str, about: str, unit: str, *targets: tuple[str, str]) -> None:
        if self.x + WIDTH > 24:
            self.y, self.x = self.y + HEIGHT, 0
        self.panels.append(
            {
                "type": "timeseries",
                "title": title,
                "description": about,
                "datasource": DATASOURCE,
                "gridPos": {"h": HEIGHT, "w": WIDTH, "x": self.x, "y": self.y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"},
                },
                "targets": [
                    {
                        "refId": chr(ord("A") + i),
                        "datasource": DATASOURCE,
                        "expr": expr,
                        "legendFormat": legend,
                        "range": True,
                    }
                    for i, (expr, legend) in enumerate(targets)
                ],
            }
        )
        self.x += WIDTH


def overview(d: Layout) -> None:
    d.row("Overview")
    per_method = "{{grpc_service}}/{{grpc_method}}"
    failed = f'grpc_code!="OK", {NOT_INFRA}'
    d.panel(
        "Requests / s",
        "RPCs completed per second, per service and method (health and reflection excluded).",
        "reqps",
        (rate("grpc_server_handled_total", "grpc_service, grpc_method", NOT_INFRA), per_method),
    )
    d.panel(
        "Errors / s",
        "RPCs that ended with a status other than OK, per service, method and code.",
        "reqps",
        (
            rate("grpc_server_handled_total", "grpc_service, grpc_method, grpc_code", failed),
            per_method + " {{grpc_code}}",
        ),
    )
    d.panel(
        "Error ratio",
        "Share of RPCs per service that did not end OK.",
        "percentunit",
        (
            rate("grpc_server_handled_total", "grpc_service", failed)
            + " / "
            + rate("grpc_server_handled_total", "grpc_service", NOT_INFRA),
            "{{grpc_service}}",
        ),
    )
    for q, name in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99")):
        d.panel(
            f"Latency {name}",
            f"Server-side handling time, {q} quantile, per service and method.",
            "s",
            (
                quantile(q, "grpc_server_handling_seconds", "grpc_service, grpc_method", NOT_INFRA),
                per_method,
            ),
        )
    d.panel(
        "In flight",
        "RPCs being served now, per service (at max_concurrent_rpcs the next is refused).",
        "short",
        ("sum by (grpc_service) (hippo_grpc_server_inflight)", "{{grpc_service}}"),
    )
    d.panel(
        "Outbound calls / s",
        "RPCs this cluster's services make to their peers, by peer method and code.",
        "reqps",
        (
            rate("grpc_client_handled_total", "grpc_service, grpc_method, grpc_code"),
            per_method + " {{grpc_code}}",
        ),
    )
    d.panel(
        "Outbound latency p95",
        "Peer calls as the caller sees them (network and queueing included).",
        "s",
        (quantile("0.95", "grpc_client_handling_seconds", "grpc_service, grpc_method"), per_method),
    )


def recall(d: Layout) -> None:
    d.row("Recall")
    d.panel(
        "Recall latency by mode",
        "Recall inside the gateway (query embedding + search), p50 and p95 by mode.",
        "s",
        (quantile("0.5", "hippo_gateway_recall_seconds", "mode"), "p50 {{mode}}"),
        (quantile("0.95", "hippo_gateway_recall_seconds", "mode"), "p95 {{mode}}"),
    )
    d.panel(
        "Search latency in retrieval",
        "One search inside the retrieval service: both retrievers, fusion, reading rows; "
        "p95 by mode.",
        "s",
        (quantile("0.95", "hippo_retrieval_search_seconds", "mode"), "p95 {{mode}}"),
    )
    d.panel(
        "Candidates per retriever",
        "Mean candidates one retriever hands to fusion.",
        "short",
        (mean("hippo_retrieval_candidates", "retriever"), "{{retriever}}"),
    )
    d.panel(
        "Hits per Recall",
        "Mean hits returned by one Recall, by mode.",
        "short",
        (mean("hippo_gateway_recall_hits", "mode"), "{{mode}}"),
    )
    d.panel(
        "Turns remembered / s",
        "Turns in Remember calls; deduplicated = retries and replays that stored nothing new.",
        "short",
        (rate("hippo_gateway_turns_remembered_total", "result"), "{{result}}"),
    )
    d.panel(
        "Auth failures / s",
        "Calls refused with UNAUTHENTICATED.",
        "reqps",
        (rate("hippo_gateway_auth_failures_total"), "refused"),
    )


def indexes(d: Layout) -> None:
    d.row("Indexes")
    d.panel(
        "Index lag",
        "Changes committed to the turn store but not yet searchable, per index.",
        "short",
        ("max by (index) (hippo_retrieval_index_lag)", "{{index}}"),
    )
    d.panel(
        "Sequence numbers",
        "The turn store's last change and the last one searchable in each index.",
        "short",
        ("max by (store) (hippo_retrieval_seq)", "{{store}}"),
    )
    d.panel(
        "Turns stored",
        "Turns held in the turn store, all tenants.",
        "short",
        # max, not sum: in cluster mode every replica reports the shared store's total.
        ("max (hippo_retrieval_turns)", "turns"),
    )
    d.panel(
        "Turn writes and deletes / s",
        "Turns written (created or already there) and erased.",
        "short",
        (rate("hippo_retrieval_turns_written_total", "result"), "written {{result}}"),
        (rate("hippo_retrieval_turns_deleted_total"), "deleted"),
    )
    d.panel(
        "Data on disk",
        "Bytes under each stateful service's data directory (SQLite, indexes, logs).",
        "bytes",
        ("sum by (service) (hippo_data_dir_bytes)", "{{service}}"),
    )


def replicas(d: Layout) -> None:
    d.row("Replicas (cluster mode)")
    d.panel(
        "Serving replicas",
        "Processes scraped per service: in cluster mode two or more of each.",
        "short",
        ("count by (service) (hippo_build_info)", "{{service}}"),
    )
    d.panel(
        "Retrieval replicas in step",
        "Replicas sharing the turn store with a fresh heartbeat (a write with "
        "wait_searchable waits for each of them), and how long such writes waited.",
        "short",
        ("max (hippo_retrieval_replicas)", "replicas"),
        (
            quantile("0.95", "hippo_retrieval_visible_wait_seconds", "outcome"),
            "p95 wait {{outcome}}",
        ),
    )
    d.panel(
        "Merge claims / s",
        "Summary merges claimed by replicas: taken, taken over from a replica that stopped "
        "or stalled, left to another (busy), lost while merging.",
        "short",
        (rate("hippo_summariser_claims_total", "result"), "{{result}}"),
    )
    d.panel(
        "Outbox items adopted / s",
        "Audit events a replica took over from one that stopped before delivering them.",
        "short",
        (rate("hippo_outbox_adopted_total", "outbox"), "{{outbox}}"),
    )


def embedding(d: Layout) -> None:
    d.row("Embedding")
    d.panel(
        "Texts per model call",
        "Mean micro-batch size; requests per call above 1 means batching works.",
        "short",
        (mean("hippo_embedding_batch_texts"), "texts"),
        (mean("hippo_embedding_batch_requests"), "requests"),
    )
    d.panel(
        "Cache hit rate",
        "Share of texts answered from the LRU cache.",
        "percentunit",
        (
            rate("hippo_embedding_texts_total", selector='source="cache"')
            + " / "
            + rate("hippo_embedding_texts_total"),
            "hit rate",
        ),
    )
    d.panel(
        "Model call latency",
        "One encoder call, p50 and p95.",
        "s",
        (quantile("0.5", "hippo_embedding_forward_seconds", "instance"), "p50 {{instance}}"),
        (quantile("0.95", "hippo_embedding_forward_seconds", "instance"), "p95 {{instance}}"),
    )
    d.panel(
        "Queue and cache",
        "Texts waiting for the model; vectors held in the cache.",
        "short",
        ("sum (hippo_embedding_queue_texts)", "queued"),
        ("sum (hippo_embedding_cache_entries)", "cached"),
    )


def llm_host(d: Layout) -> None:
    d.row("LLM host")
    d.panel(
        "Queue depth",
        "Requests waiting for the model (the one running excluded), by priority class: "
        "interactive (Chat) goes first, background (summary merges) when none waits; "
        "refused = RESOURCE_EXHAUSTED / s at a class's wait bound.",
        "short",
        ("sum by (priority) (hippo_injection_queue_depth)", "{{priority}}"),
        (rate("hippo_injection_rejected_total", "priority"), "refused {{priority}}"),
    )
    ttft = "hippo_injection_time_to_first_token_seconds"
    d.panel(
        "Time to first token",
        "Request validated to first token, queueing and prefill included.",
        "s",
        (quantile("0.5", ttft, "instance"), "p50 {{instance}}"),
        (quantile("0.95", ttft, "instance"), "p95 {{instance}}"),
    )
    speed = "hippo_injection_tokens_per_second"
    d.panel(
        "Tokens / s per reply",
        "Generation rate of finished replies, median and p10 (the slow tail).",
        "short",
        (quantile("0.5", speed, "instance"), "p50 {{instance}}"),
        (quantile("0.1", speed, "instance"), "p10 {{instance}}"),
    )
    d.panel(
        "Generated tokens / s",
        "Tokens of finished replies, by finish reason.",
        "short",
        (rate("hippo_injection_generated_tokens_total", "finish_reason"), "{{finish_reason}}"),
    )
    d.panel(
        "Model utilisation",
        "Share of time the model thread is busy (1.0 = one replica saturated).",
        "percentunit",
        (rate("hippo_injection_model_busy_seconds_total", "instance"), "{{instance}}"),
    )
    strength = "hippo_injection_influence_strength"
    d.panel(
        "Influence strength applied",
        "|strength| of the influences applied, p50 and p95.",
        "short",
        (quantile("0.5", strength, "instance"), "p50 {{instance}}"),
        (quantile("0.95", strength, "instance"), "p95 {{instance}}"),
    )


def summariser(d: Layout) -> None:
    d.row("Summariser")
    d.panel(
        "Merges / s",
        "Committed merges, and merges dropped by compare-and-set (planned again).",
        "short",
        (rate("hippo_summariser_merges_total", "result"), "{{result}}"),
    )
    d.panel(
        "Merge duration and lag",
        "p95 of one merge, and of a session needing a merge until its window is back in budget.",
        "s",
        (quantile("0.95", "hippo_summariser_merge_seconds", "instance"), "merge p95 {{instance}}"),
        (
            quantile("0.95", "hippo_summariser_merge_lag_seconds", "instance"),
            "lag p95 {{instance}}",
        ),
    )
    checked = rate("hippo_summariser_facts_total", selector='stage="checked"')
    d.panel(
        "Retention",
        "Share of the merged turns' facts kept by the LLM's first answer and by the "
        "committed summary.",
        "percentunit",
        (
            rate("hippo_summariser_facts_total", selector='stage="kept_llm"') + f" / {checked}",
            "LLM",
        ),
        (
            rate("hippo_summariser_facts_total", selector='stage="kept"') + f" / {checked}",
            "committed",
        ),
    )
    d.panel(
        "Sessions",
        "Sessions held in the session store, and those with a merge scheduled, running or "
        "waiting to retry.",
        "short",
        # max, not sum: in cluster mode every replica reports the shared store's total.
        ("max (hippo_summariser_sessions)", "held"),
        ("sum (hippo_summariser_merges_pending)", "merge pending"),
    )
    d.panel(
        "Merge backlog",
        "Sessions waiting for a merge (scheduled, running or retrying), all replicas. "
        "It rises after a bulk load and should fall back; above 50 for 15 minutes "
        "HippoMergeBacklogHigh fires (docs/operations.md).",
        "short",
        ("sum (hippo_summariser_merges_pending)", "backlog"),
        (rate("hippo_summariser_merges_total", selector='result="committed"'), "merged / s"),
    )
    d.panel(
        "Turns appended / s",
        "Turns in Append calls; duplicate = a retried Remember.",
        "short",
        (rate("hippo_summariser_turns_appended_total", "result"), "{{result}}"),
    )


def audit(d: Layout) -> None:
    d.row("Audit")
    d.panel(
        "Append latency",
        "Append reaching the writer to its group commit being fsynced, p50 and p99.",
        "s",
        (quantile("0.5", "hippo_audit_append_seconds", "instance"), "p50 {{instance}}"),
        (quantile("0.99", "hippo_audit_append_seconds", "instance"), "p99 {{instance}}"),
    )
    d.panel(
        "Entries per commit",
        "Mean entries per group commit (one fsync).",
        "short",
        (mean("hippo_audit_commit_entries"), "entries"),
    )
    d.panel(
        "Chain length",
        "Entries in the log, and entries covered by the latest signed checkpoint.",
        "short",
        ("max (hippo_audit_chain_length)", "chain"),
        ("max (hippo_audit_checkpoint_size)", "checkpointed"),
    )
    d.panel(
        "Last checkpoint age",
        "Seconds since the latest checkpoint was signed (0 before the first).",
        "s",
        ("max (hippo_audit_last_checkpoint_age_seconds)", "age"),
    )
    d.panel(
        "Writable",
        "0 when the log disagreed with its signed checkpoints at start and refuses writes.",
        "short",
        ("min (hippo_audit_writable)", "writable"),
    )
    d.panel(
        "Entries appended / s",
        "Audit entries appended, by event type.",
        "short",
        (rate("hippo_audit_entries_appended_total", "event_type"), "{{event_type}}"),
    )
    d.panel(
        "Not yet in the log",
        "Events waiting for the audit service in the outboxes (the gateway's spool, the "
        "summariser's merge events; both grow while it is unreachable), and events refused "
        "for good (a bug).",
        "short",
        ("sum by (outbox) (hippo_outbox_depth)", "{{outbox}} waiting"),
        ("sum by (outbox) (hippo_outbox_dead)", "{{outbox}} refused"),
    )
    d.panel(
        "Oldest undelivered audit event",
        "Age of the oldest event waiting in each outbox: how far delivery is behind.",
        "s",
        ("max by (outbox) (hippo_outbox_oldest_seconds)", "{{outbox}}"),
    )


def dashboard() -> dict[str, Any]:
    layout = Layout()
    for section in (overview, recall, indexes, replicas, embedding, llm_host, summariser, audit):
        section(layout)
    for number, panel in enumerate(layout.panels, start=1):
        panel["id"] = number  # Grafana drops panels whose id repeats
    return {
        "title": "Hippo",
        "uid": "hippo-overview",
        "description": "Hippo cluster: gRPC traffic per service and method, recall, indexes, "
        "embedding, LLM host, summariser, audit. Every metric is documented in "
        "docs/metrics.md.",
        "tags": ["hippo", "grpc"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "version": 1,
        "links": [],
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                    "options": [],
                }
            ]
        },
        "panels": layout.panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the JSON is stale")
    args = parser.parse_args()
    if args.check:
        if not OUT.exists() or OUT.read_text() != render():
            sys.exit(f"{OUT} is stale: run `make dashboard` and commit the result")
        return
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())


if __name__ == "__main__":
    main()
