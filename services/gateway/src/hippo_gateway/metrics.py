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
    "hippo_gateway_auth_failures", "Calls refused with UNAUTHENTICATED (missing or unknown key)."
)
