"""Settings of the retrieval service (environment prefix `HIPPO_RETRIEVAL_`)."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from hippo_core.settings import DatabaseSettings, ServiceSettings


class RetrievalSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIPPO_RETRIEVAL_")

    port: int = Field(50053, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    metrics_port: int = Field(
        9103, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 picks a free one)."
    )
    data_dir: str = Field(
        "var/retrieval",
        description="Where the turn store (turns.sqlite3, embedded default) and this "
        "replica's indexes live. Losing the indexes costs a rebuild; losing turns.sqlite3 "
        "loses the memories (in cluster mode they are in PostgreSQL).",
    )
    database: DatabaseSettings = Field(
        default_factory=DatabaseSettings,
        description="The turn store: empty URL = SQLite under data_dir (one replica); a "
        "PostgreSQL URL = cluster mode, every replica sharing the store (schema "
        "hippo_retrieval) and projecting it into indexes of its own.",
    )
    replica_id: str = Field(
        "",
        pattern=r"^[A-Za-z0-9._:-]{0,200}$",
        description="Cluster mode: this replica's name among the others (read-your-writes "
        "waits for each). Empty: the host name and a digest of data_dir, stable across "
        "restarts of the same replica. Two live replicas must never share one.",
    )
    replica_heartbeat_seconds: float = Field(
        1.0,
        gt=0,
        description="Cluster mode: how often a replica publishes what it can search "
        "(at once, too, when a writer waits for it).",
    )
    replica_expiry_seconds: float = Field(
        5.0,
        gt=0,
        description="Cluster mode: a replica silent this long is no longer waited for by "
        "wait_searchable writes (the longest a dead replica can delay them). At least "
        "twice the heartbeat.",
    )
    dimension: int = Field(
        384,
        ge=1,
        le=65536,
        description="Vector size of embedding_model (the first index's; an index rebuilt "
        "with another model records that model's own).",
    )
    embedding_model: str = Field(
        "sentence-transformers/all-MiniLM-L6-v2",
        min_length=1,
        description="The embedding model of the first index generation and of vectors "
        "stored before models were recorded. Change the model with `hippo reindex "
        "--embedding-model NAME`, not here (docs/recall.md).",
    )
    embedding_addr: str = Field(
        "127.0.0.1:50052",
        description="The embedding service, asked only for vectors of another model than "
        "a turn's (a reindex with a new model; writes and queries during the switch). "
        "Empty: none; such a reindex, write or query is then FAILED_PRECONDITION.",
    )
    embedding_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="Deadline of each Embed call (up to 256 texts) made while re-embedding.",
    )
    qdrant_url: str = Field(
        "",
        description="Qdrant server URL (e.g. http://qdrant:6333). Empty: vectors are kept "
        "in-process by qdrant-edge under data_dir (the single-machine default).",
    )
    qdrant_api_key: SecretStr = Field(
        SecretStr(""), description="API key of the Qdrant server; empty for none."
    )
    qdrant_collection: str = Field(
        "hippo_turns",
        pattern=r"^[A-Za-z0-9_-]{1,200}$",
        description="Collection name prefix on the Qdrant server; generation n of the "
        "index is `<prefix>_g<n>`; in cluster mode every replica shares `<prefix>_shared`. "
        "Give each retrieval deployment its own prefix.",
    )
    lexical_index: Literal["tantivy", "qdrant"] = Field(
        "tantivy",
        description="The BM25 engine. tantivy: a Tantivy index under data_dir (the "
        "default). qdrant: sparse vectors in the same Qdrant as the vectors "
        "(in-process under data_dir, or on qdrant_url); in cluster mode "
        "with qdrant_url, retrieval is stateless: both indexes are collections every "
        "replica shares and nothing is written under data_dir (docs/recall.md).",
    )
    fusion: Literal["client", "server"] = Field(
        "client",
        description="Where hybrid search fuses BM25 and vectors. client: here, by RRF "
        "(the default; every hit reports its BM25 and vector ranks). server: with "
        "lexical_index=qdrant and qdrant_url, both vectors of a turn live in one "
        "collection and the Qdrant server fuses them by weighted RRF in one query; hits "
        "then report no per-retriever ranks (docs/recall.md).",
    )
    qdrant_shard_number: int = Field(
        1,
        ge=1,
        le=1024,
        description="Qdrant server: shards of each collection retrieval creates (spread "
        "over the cluster's nodes; several per node let it rebalance when nodes are added). "
        "Only read when a collection is created.",
    )
    qdrant_replication_factor: int = Field(
        1,
        ge=1,
        le=16,
        description="Qdrant server: copies of each shard on different nodes (2+: a node "
        "can fail without losing or blocking the index). Only read when a collection is "
        "created; at most the cluster's node count.",
    )
    qdrant_timeout_seconds: float = Field(
        5.0, gt=0, description="Deadline of each call to the Qdrant server."
    )
    rrf_k: float = Field(
        5.0,
        gt=0,
        description="Reciprocal Rank Fusion constant: score = sum w / (k + rank). 5 measured "
        "best (flat 2-10); the literature's 60 blurs the top ranks (docs/recall.md).",
    )
    lexical_weight: float = Field(
        1.5,
        ge=0,
        description="RRF weight of the BM25 retriever (over turns indexed in context it is "
        "the stronger one; docs/recall.md).",
    )
    semantic_weight: float = Field(1.0, ge=0, description="RRF weight of the vector retriever.")
    neighbour_weight: float = Field(
        0.5,
        ge=0,
        le=2,
        description="HYBRID only: after fusion, a candidate gains this share of the best "
        "score of the turns right before/after it in its session (among the candidates). "
        "0 turns it off.",
    )
    speaker_weight: float = Field(
        0.3,
        ge=0,
        le=2,
        description="HYBRID only: when the query names exactly one speaker of the candidates "
        "(metadata `speaker`: any of their names of 3+ letters, or one typing slip from one "
        "of 5+), that speaker's turns' scores are multiplied by 1 + this. 0 turns it off "
        "(docs/recall.md).",
    )
    short_turn_terms: int = Field(
        0,
        ge=0,
        le=64,
        description="HYBRID only: a candidate whose own text holds n content words (3+ "
        "letters or digits, not a stop word) with n under this keeps sqrt(n / this) of its "
        'score (none counts as half a word), so "lol" and "ok" do not crowd out the turns '
        "that hold facts. 0 (the default) turns it off; 8 measured best on chat-style "
        "data, at a cost to terse turns in small stores (docs/recall.md).",
    )
    typo_repair: bool = Field(
        True,
        description="BM25: a query word of 4+ letters that no stored turn holds is searched "
        "as the words one typing slip away that turns do hold (docs/recall.md).",
    )
    candidates: int = Field(
        100,
        ge=1,
        le=1000,
        description="Results each retriever hands to fusion (more than top_k: RRF rewards "
        "documents both rank well, which can sit below either one's top_k).",
    )
    max_top_k: int = Field(100, ge=1, le=1000, description="Largest top_k a Search may ask.")
    max_turns_per_write: int = Field(1024, ge=1, description="Most turns per Write call.")
    filter_keys: list[str] = Field(
        ["speaker", "agent_id", "run_id", "app_id", "source", "category"],
        max_length=64,
        description="Metadata keys Recall and ListMemories may filter on (equality): both "
        "indexes hold these keys' values, and only these. A JSON list, e.g. "
        '["speaker", "agent_id"]. Turns stored before a key was declared are found by it '
        "after `hippo reindex`.",
    )
    commit_interval_seconds: float = Field(
        0.5,
        gt=0,
        le=60,
        description="The BM25 index commits at most this long after a write (a commit per "
        "write would cost an fsync and a segment each). Bounds write-to-searchable time.",
    )
    commit_every: int = Field(
        1000, ge=1, description="The BM25 index also commits once this many changes wait."
    )
    purge_delay_seconds: float = Field(
        60.0,
        ge=0,
        le=86400,
        description="After an erasure reaches the indexes, rebuild them this much later "
        "(erasures meanwhile share the rebuild) so the erased documents' terms and vectors "
        "leave the index files; the bound is this plus one rebuild (docs/security.md). "
        "Lower: sooner gone, more rebuilds under frequent erasures.",
    )
    graph_min_points: int = Field(
        5000,
        ge=0,
        description="The embedded vector index (qdrant-edge) searches vectors one by one "
        "until an HNSW graph holds them. Once this many are outside the graph (and at "
        "least half as many as are in it), a background rebuild builds the graph in a "
        "child process while the live indexes keep serving; any rebuild of at least "
        "this many vectors builds it too. Minutes of one core per 100k vectors. At 10k "
        "vectors of one user the graph saves ~2 ms of a hybrid Recall (docs/recall.md). 0: "
        "never (exact search only). Ignored with a Qdrant server, which builds its own.",
    )
    threads: int = Field(
        4, ge=1, le=64, description="Worker threads for store and index calls (blocking I/O)."
    )

    @model_validator(mode="after")
    def _heartbeat_below_expiry(self) -> RetrievalSettings:
        if self.replica_expiry_seconds < 2 * self.replica_heartbeat_seconds:
            raise ValueError(
                "replica_expiry_seconds must be at least twice replica_heartbeat_seconds: "
                "one late heartbeat must not drop a live replica"
            )
        return self

    @model_validator(mode="after")
    def _server_fusion_needs_one_collection(self) -> RetrievalSettings:
        if self.fusion == "server" and (self.lexical_index != "qdrant" or not self.qdrant_url):
            raise ValueError(
                "fusion=server needs lexical_index=qdrant and qdrant_url: the server fuses "
                "only what one of its collections holds"
            )
        return self

    def replica_name(self) -> str:
        """`replica_id`, or one derived from the host and the data dir."""
        if self.replica_id:
            return self.replica_id
        where = str(Path(self.data_dir).resolve())
        return f"{socket.gethostname()}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"
