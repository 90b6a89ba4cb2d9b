"""Domain metrics of the gateway (`hippo_gateway_*`)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

RECALL_SECONDS = Histogram(
    "hippo_gateway_recall_seconds",
    "Recall latency inside the gateway (query embedding + search), by mode.",
    ["mode"],
    buckets=(0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
RECALL_HITS = Histogram(
    "hippo_gateway_recall_hits",
    "Hits returned by one Recall, by mode.",
    ["mode"],
    buckets=(0, 1, 5, 10, 20, 50, 100),
)
TURNS = Counter(
    "hippo_gateway_turns_remembered",
    "Turns in Remember calls: created = stored now, deduplicated = already stored.",
    ["result"],
)
FORGOTTEN = Counter("hippo_gateway_memories_forgotten", "Memories erased by Forget.")
AUTH_FAILURES = Counter(
    "hippo_gateway_auth_failures",
    "Calls refused with UNAUTHENTICATED (missing, unknown, malformed or ambiguous key) or "
    "PERMISSION_DENIED (the key's roles do not allow the RPC).",
)
QUOTA_REFUSED = Counter(
    "hippo_gateway_quota_refused",
    "Calls refused with RESOURCE_EXHAUSTED by a tenant quota, by quota "
    "(requests_per_second, max_stored_turns).",
    ["quota"],
)

# -- audit recording (domain/audit_recorder.py) -----------------------------------------
AUDIT_RECORD_SECONDS = Histogram(
    "hippo_gateway_audit_record_seconds",
    "Time a call spends recording its audit event: path=spool (the spool's commit: a local "
    "fsync, or PostgreSQL in cluster mode; the default) or direct (an Append to the audit "
    "service: fail-closed mode, ReportOutcome).",
    ["path"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
# The spool's depth, deliveries, failures and dead items are the core outbox's metrics:
# hippo_outbox_*{outbox="gateway_audit"} (hippo_core.outbox).

# Known label values start at zero: a series born at its first event is first scraped
# at 1, so rate() never shows that event and a ratio of two such series has gaps.
for _mode in ("hybrid", "lexical", "semantic"):
    RECALL_SECONDS.labels(_mode)
    RECALL_HITS.labels(_mode)
for _label in ("created", "deduplicated"):
    TURNS.labels(_label)
for _label in ("spool", "direct"):
    AUDIT_RECORD_SECONDS.labels(_label)

# The OpenAI-compatible HTTP API (openai_api.py); gRPC calls have grpc_server_* instead.
HTTP_ROUTES = ("/v1/chat/completions", "/v1/models")
HTTP_REQUESTS = Counter(
    "hippo_gateway_http_requests",
    "Requests to the OpenAI-compatible API, by route (other: no such route) and HTTP "
    "status (for a streamed reply that failed after its headers: the error's status).",
    ["route", "status"],
)
HTTP_SECONDS = Histogram(
    "hippo_gateway_http_request_seconds",
    "Time of one request to the OpenAI-compatible API, to its last byte, by route.",
    ["route"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
