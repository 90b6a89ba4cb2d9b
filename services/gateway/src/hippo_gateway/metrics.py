"""Domain metrics of the gateway (`hippo_gateway_*`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
    "hippo_gateway_auth_failures", "Calls refused with UNAUTHENTICATED (missing or unknown key)."
)

# -- audit recording (domain/audit.py) ------------------------------------------------------
AUDIT_RECORD_SECONDS = Histogram(
    "hippo_gateway_audit_record_seconds",
    "Time a call spends recording its audit event: path=spool (local fsync; the default) "
    "or direct (an Append to the audit service: fail-closed mode, ReportOutcome).",
    ["path"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
AUDIT_SPOOL_DEPTH = Gauge(
    "hippo_gateway_audit_spool_depth",
    "Audit items in the local spool, not yet delivered (grows while the audit service is "
    "down; drains in order when it returns).",
)
AUDIT_SPOOLED = Counter("hippo_gateway_audit_spooled", "Audit items written to the spool.")
AUDIT_DELIVERED = Counter(
    "hippo_gateway_audit_delivered", "Audit items appended to the audit service."
)
AUDIT_FAILURES = Counter(
    "hippo_gateway_audit_delivery_failures",
    "Failed deliveries to the audit service, by status code (retried; nothing is dropped).",
    ["code"],
)
AUDIT_DEAD = Counter(
    "hippo_gateway_audit_dead_letters",
    "Audit items the service refused for good (INVALID_ARGUMENT: a bug), moved to the "
    "spool's dead-letter table instead of blocking the queue.",
)

# Known label values start at zero: a series born at its first event is first scraped
# at 1, so rate() never shows that event and a ratio of two such series has gaps.
for _mode in ("hybrid", "lexical", "semantic"):
    RECALL_SECONDS.labels(_mode)
    RECALL_HITS.labels(_mode)
for _label in ("created", "deduplicated"):
    TURNS.labels(_label)
for _label in ("spool", "direct"):
    AUDIT_RECORD_SECONDS.labels(_label)
