"""Domain metrics of the retrieval service (`hippo_retrieval_*`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SEARCH_SECONDS = Histogram(
    "hippo_retrieval_search_seconds",
    "Time of one search inside the service (both retrievers, fusion, reading the rows).",
    ["mode"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
CANDIDATES = Histogram(
    "hippo_retrieval_candidates",
    "Candidates one retriever returned for a search, before fusion.",
    ["retriever"],
    buckets=(0, 1, 5, 10, 20, 50, 100, 200, 500),
)
WRITES = Counter(
    "hippo_retrieval_turns_written",
    "Turns in Write calls: created = stored now, existing = the id was already stored.",
    ["result"],
)
DELETES = Counter("hippo_retrieval_turns_deleted", "Turns erased from the turn store.")
TURNS = Gauge("hippo_retrieval_turns", "Turns held in the turn store (all tenants).")
SEQ = Gauge(
    "hippo_retrieval_seq",
    "Last sequence number: of the turn store (store) and searchable in each index.",
    ["store"],
)
LAG = Gauge(
    "hippo_retrieval_index_lag",
    "Sequence numbers committed to the turn store but not yet searchable in the index.",
    ["index"],
)
REINDEXES = Counter("hippo_retrieval_reindexes", "Completed index rebuilds.")
VECTORS_OUTSIDE_GRAPH = Gauge(
    "hippo_retrieval_vectors_outside_graph",
    "Vectors of the live generation that searches score one by one, outside the HNSW "
    "graph (an edge shard; a background rebuild puts them in at graph_min_points).",
)
GRAPH_BUILD_SECONDS = Histogram(
    "hippo_retrieval_graph_build_seconds",
    "Time to build an edge shard's HNSW graph during a rebuild.",
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 2400),
)
TURNS_EMBEDDED = Counter(
    "hippo_retrieval_turns_embedded",
    "Turns embedded here for an index of another model than their stored vector's "
    "(a reindex with a new embedding model, writes during the switch).",
)
QUERY_REEMBEDDED = Counter(
    "hippo_retrieval_queries_reembedded",
    "Searches whose query vector came from another model than the index's, embedded "
    "again here (callers that had not yet learnt of a switch).",
)
VISIBLE_WAIT = Histogram(
    "hippo_retrieval_visible_wait_seconds",
    "Time a write waited to become searchable (wait_searchable writes and deletes): here "
    "and, in cluster mode, on every other live replica. outcome = visible or timeout.",
    ["outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
REPLICAS = Gauge(
    "hippo_retrieval_replicas",
    "Retrieval replicas sharing the turn store with a fresh heartbeat, this one included "
    "(cluster mode; 1 in the embedded default).",
)
VECTOR_WRITER = Gauge(
    "hippo_retrieval_vector_writer",
    "1 while this replica is the one writer of the vector index shared by all replicas "
    "(cluster mode with a Qdrant server); 0 otherwise.",
)
LEXICAL_WRITER = Gauge(
    "hippo_retrieval_lexical_writer",
    "1 while this replica is the one writer of the BM25 index shared by all replicas "
    "(cluster mode with a Qdrant server and lexical_index=qdrant); 0 otherwise.",
)


def record_progress(store_seq: int, lexical_seq: int, vector_seq: int) -> None:
    SEQ.labels("store").set(store_seq)
    SEQ.labels("lexical").set(lexical_seq)
    SEQ.labels("vector").set(vector_seq)
    LAG.labels("lexical").set(store_seq - lexical_seq)
    LAG.labels("vector").set(store_seq - vector_seq)


# Known label values start at zero: a series born at its first event is first scraped
# at 1, so rate() never shows that event and a ratio of two such series has gaps.
for _mode in ("hybrid", "lexical", "semantic"):
    SEARCH_SECONDS.labels(_mode)
for _label in ("lexical", "semantic"):
    CANDIDATES.labels(_label)
for _label in ("created", "existing"):
    WRITES.labels(_label)
for _label in ("visible", "timeout"):
    VISIBLE_WAIT.labels(_label)
REPLICAS.set(1)
