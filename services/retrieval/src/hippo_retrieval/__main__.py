"""Wiring only: settings -> stores -> domain -> serve()."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc

from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_core.server.app import Service, run
from hippo_core.server.authz import OPERATOR, callers
from hippo_retrieval.adapters.embedding_client import GrpcEmbedder
from hippo_retrieval.adapters.generations import (
    QDRANT,
    LocalIndexSet,
    QdrantServer,
    SharedIndexSet,
)
from hippo_retrieval.adapters.sqlite_store import SqliteTurnStore
from hippo_retrieval.domain.models import EmbeddingModel
from hippo_retrieval.domain.ports import IndexSet, Replicas, TurnStore
from hippo_retrieval.domain.retriever import LEXICAL, SEMANTIC, FusionConfig
from hippo_retrieval.domain.service import ProjectionConfig, RetrievalService
from hippo_retrieval.domain.validation import Limits
from hippo_retrieval.servicer import RetrievalServicer
from hippo_retrieval.settings import RetrievalSettings

FULL_NAME = retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"].full_name
# Who may call each RPC when TLS is on (docs/security.md has the whole table): the
# gateway reads, writes and counts (quotas), the operator's `hippo reindex` rebuilds.
CALLERS = callers(
    FULL_NAME,
    {
        "Write": {"gateway"},
        "Search": {"gateway"},
        "Get": {"gateway"},
        "List": {"gateway"},
        "ListSessions": {"gateway"},
        "ListUsers": {"gateway"},
        "UpdateMetadata": {"gateway"},
        "Delete": {"gateway"},
        "Status": {"gateway", OPERATOR},
        "Reindex": {OPERATOR},
    },
)


def _nothing() -> None:
    pass


def domain(settings: RetrievalSettings) -> tuple[RetrievalService, Callable[[], None]]:
    """The domain service over its stores (not yet opened: `open()` catches up), and what
    to close after it. The engine follows `database.url`: empty, the embedded SQLite
    store; set, cluster mode (the shared PostgreSQL store, the other replicas, and the
    shared collection's writer lease when vectors are on a Qdrant server; with BM25 on
    it too, lexical_index=qdrant, stateless: nothing under data_dir)."""
    root = Path(settings.data_dir)
    server = None
    if settings.qdrant_url:
        server = QdrantServer(
            settings.qdrant_url,
            settings.qdrant_api_key.get_secret_value() or None,
            settings.qdrant_collection,
            settings.qdrant_timeout_seconds,
            shards=settings.qdrant_shard_number,
            replication=settings.qdrant_replication_factor,
        )
    store: TurnStore
    replicas: Replicas | None = None
    indexes: IndexSet | None = None
    release: Callable[[], None] = _nothing
    if not settings.database.url.get_secret_value():
        store = SqliteTurnStore(root / "turns.sqlite3")
    else:
        # Imported here: psycopg stays out of the embedded default's start-up.
        from hippo_core.postgres import Database
        from hippo_retrieval.adapters import postgres_store
        from hippo_retrieval.adapters.replicas import PostgresReplicas

        database = Database(
            settings.database, schema=postgres_store.SCHEMA, application="retrieval"
        )
        database.open(postgres_store.MIGRATIONS)
        release = database.close
        store = postgres_store.PostgresTurnStore(database)
        replicas = PostgresReplicas(
            database,
            settings.replica_name(),
            heartbeat_s=settings.replica_heartbeat_seconds,
            expiry_s=settings.replica_expiry_seconds,
        )
        if server is not None:
            vector_lease = database.lease(f"vector-projector:{server.shared_name}")
            if settings.lexical_index == QDRANT and settings.fusion == "server":
                # Stateless, one collection holding both, fused by the server.
                lease = database.lease(f"projector:{server.shared_fused_name}")
                indexes = SharedIndexSet(server, lease, None, typos=settings.typo_repair)
            elif settings.lexical_index == QDRANT:
                # Stateless: nothing under data_dir, both indexes shared on the server.
                lexical_lease = database.lease(f"lexical-projector:{server.shared_lexical_name}")
                indexes = SharedIndexSet(
                    server, vector_lease, lexical_lease, typos=settings.typo_repair
                )
            else:
                indexes = LocalIndexSet(
                    root, server=server, lease=vector_lease, typos=settings.typo_repair
                )
    if indexes is None:
        indexes = LocalIndexSet(
            root,
            server=server,
            typos=settings.typo_repair,
            lexical=settings.lexical_index,
            fused=settings.fusion == "server",
        )
    embedder: GrpcEmbedder | None = None
    if settings.embedding_addr:
        embedder = GrpcEmbedder(
            settings.embedding_addr, settings.embedding_timeout_seconds, settings.tls
        )
        release = _both(release, embedder.close)
    service = RetrievalService(
        store,
        indexes,
        fusion=FusionConfig(
            k=settings.rrf_k,
            weights={LEXICAL: settings.lexical_weight, SEMANTIC: settings.semantic_weight},
            candidates=settings.candidates,
            max_top_k=settings.max_top_k,
            neighbour_weight=settings.neighbour_weight,
            speaker_weight=settings.speaker_weight,
            short_turn_terms=settings.short_turn_terms,
        ),
        projection=ProjectionConfig(
            settings.commit_interval_seconds,
            settings.commit_every,
            purge_delay_s=settings.purge_delay_seconds,
            filter_keys=frozenset(settings.filter_keys),
            graph_min_points=settings.graph_min_points,
        ),
        limits=Limits(max_turns=settings.max_turns_per_write, dimension=settings.dimension),
        threads=settings.threads,
        replicas=replicas,
        embedding=EmbeddingModel(settings.embedding_model, settings.dimension),
        embedder=embedder,
    )
    return service, release


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def close() -> None:
        try:
            first()
        finally:
            second()

    return close


def build(settings: RetrievalSettings) -> Service:
    servicer = RetrievalServicer()
    opened: list[tuple[RetrievalService, Callable[[], None]]] = []

    def register(server: grpc.aio.Server) -> None:
        retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(servicer, server)

    async def warmup() -> None:
        # Off the event loop: catching up a large backlog takes a while, and health must
        # keep answering NOT_SERVING meanwhile.
        service, release = await asyncio.to_thread(domain, settings)
        opened.append((service, release))
        await asyncio.to_thread(service.open)
        servicer.service = service

    async def close() -> None:
        for service, release in opened:
            try:
                await asyncio.to_thread(service.close)
            finally:
                release()

    return Service("retrieval", [FULL_NAME], register, warmup, close, callers=CALLERS)


def main() -> None:
    settings = RetrievalSettings()
    run(build(settings), settings)


if __name__ == "__main__":
    main()
