"""Domain metrics of the embedding service (`hippo_embedding_*`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

BATCH_TEXTS = Histogram(
    "hippo_embedding_batch_texts",
    "Texts encoded per model call (micro-batch size).",
    buckets=_SIZES,
)
BATCH_REQUESTS = Histogram(
    "hippo_embedding_batch_requests",
    "Embed requests that shared one model call; above 1 means micro-batching happened.",
    buckets=_SIZES,
)
FORWARD_SECONDS = Histogram(
    "hippo_embedding_forward_seconds",
    "Time of one model call, by model (EmbedResponse.model).",
    ["model"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
TEXTS = Counter(
    "hippo_embedding_texts", "Texts answered, by where the vector came from.", ["source"]
)
DROPPED = Counter(
    "hippo_embedding_texts_dropped",
    "Texts removed from the queue unencoded because their caller gave up (deadline, cancel).",
)
QUEUED = Gauge(
    "hippo_embedding_queue_texts",
    "Texts waiting for the model now, by model (each model has its own queue).",
    ["model"],
)
REJECTED = Counter(
    "hippo_embedding_rejected_total",
    "Embed calls refused with RESOURCE_EXHAUSTED, by reason (queue_full: max_queued_texts; "
    "deadline: the queue ahead would outlast the caller's deadline).",
    ["reason"],
)
CACHE_ENTRIES = Gauge("hippo_embedding_cache_entries", "Vectors held in the LRU cache.")

# Known label values start at zero: a series born at its first event is first scraped
# at 1, so rate() never shows that event and a ratio of two such series has gaps.
for _label in ("model", "cache"):
    TEXTS.labels(_label)
