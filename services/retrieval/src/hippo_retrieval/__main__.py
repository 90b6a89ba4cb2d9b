"""Wiring only: settings -> stores -> domain -> serve()."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_core.server.app import Service, run
from hippo_retrieval.adapters.generations import LocalIndexSet, QdrantServer
from hippo_retrieval.adapters.sqlite_store import SqliteTurnStore
from hippo_retrieval.domain.retriever import LEXICAL, SEMANTIC, FusionConfig
from hippo_retrieval.domain.service import ProjectionConfig, RetrievalService
from hippo_retrieval.domain.validation import Limits
from hippo_retrieval.servicer import RetrievalServicer
from hippo_retrieval.settings import RetrievalSettings

FULL_NAME = retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"].full_name


def domain(settings: RetrievalSettings) -> RetrievalService:
    """The domain service over its stores (not yet opened: `open()` catches up)."""
    root = Path(settings.data_dir)
    server = None
    if settings.qdrant_url:
        server = QdrantServer(
            settings.qdrant_url,
            settings.qdrant_api_key.get_secret_value() or None,
            settings.qdrant_collection,
            settings.qdrant_timeout_seconds,
        )
    return RetrievalService(
        SqliteTurnStore(root / "turns.sqlite3"),
        LocalIndexSet(root, dimension=settings.dimension, server=server),
        fusion=FusionConfig(
            k=settings.rrf_k,
            weights={LEXICAL: settings.lexical_weight, SEMANTIC: settings.semantic_weight},
            candidates=settings.candidates,
            max_top_k=settings.max_top_k,
            neighbour_weight=settings.neighbour_weight,
        ),
        projection=ProjectionConfig(settings.commit_interval_seconds, settings.commit_every),
        limits=Limits(max_turns=settings.max_turns_per_write, dimension=settings.dimension),
        threads=settings.threads,
    )


def build(settings: RetrievalSettings) -> Service:
    servicer = RetrievalServicer()
    opened: list[RetrievalService] = []

    def register(server: grpc.aio.Server) -> None:
        retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(servicer, server)

    async def warmup() -> None:
        # Off the event loop: catching up a large backlog takes a while, and health must
        # keep answering NOT_SERVING meanwhile.
        service = await asyncio.to_thread(domain, settings)
        opened.append(service)
        await asyncio.to_thread(service.open)
        servicer.service = service

    async def close() -> None:
        for service in opened:
            await asyncio.to_thread(service.close)

    return Service("retrieval", [FULL_NAME], register, warmup, close)


def main() -> None:
    settings = RetrievalSettings()
    run(build(settings), settings)


if __name__ == "__main__":
    main()
