"""Wiring only: settings -> encoders (one batcher each) -> domain -> serve()."""

from __future__ import annotations

import asyncio

import grpc

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core.server.app import Service, run
from hippo_core.server.authz import OPERATOR, callers
from hippo_embedding import adapters
from hippo_embedding.domain.batcher import MicroBatcher
from hippo_embedding.domain.cache import VectorCache
from hippo_embedding.domain.service import EmbeddingService, Model
from hippo_embedding.domain.validation import Limits
from hippo_embedding.servicer import EmbeddingServicer
from hippo_embedding.settings import EmbeddingSettings

FULL_NAME = embedding_pb2.DESCRIPTOR.services_by_name["EmbeddingService"].full_name
# Who may call each RPC when TLS is on (docs/security.md has the whole table).
CALLERS = callers(
    FULL_NAME,
    {
        # retrieval re-embeds every turn when an index is rebuilt with another model.
        "Embed": {"gateway", "injection", "retrieval", OPERATOR},
        "Info": {"gateway", "injection", "retrieval", OPERATOR},
        "DropCache": {"gateway", OPERATOR},  # Forget's erasure
    },
)
WARMUP_TEXTS = ["Hippo warms up the encoder.", "A second, longer sentence so shapes vary a bit."]


def build(settings: EmbeddingSettings) -> Service:
    """The embedding service for `Runner`; the models load during warm-up."""
    servicer = EmbeddingServicer(settings)
    batchers: list[MicroBatcher] = []

    def register(server: grpc.aio.Server) -> None:
        embedding_pb2_grpc.add_EmbeddingServiceServicer_to_server(servicer, server)

    async def warmup() -> None:
        # Off the event loop, so health keeps answering NOT_SERVING while it loads.
        encoders = await asyncio.to_thread(adapters.load_all, settings)
        models: list[Model] = []
        for encoder in encoders:  # each model its own queue, worker and thread
            batcher = MicroBatcher(
                encoder.encode,
                max_batch=settings.max_batch,
                max_queued=settings.max_queued_texts,
                wait_s=settings.batch_wait_ms / 1000,
                model=encoder.model,
            )
            batcher.start()
            batchers.append(batcher)
            await batcher.embed(WARMUP_TEXTS)  # the first call allocates and picks kernels
            models.append(Model(encoder, batcher))
        limits = Limits(max_texts=settings.max_texts, max_chars=settings.max_chars)
        servicer.service = EmbeddingService(models, VectorCache(settings.cache_entries), limits)

    async def close() -> None:
        for batcher in batchers:
            await batcher.close()

    return Service("embedding", [FULL_NAME], register, warmup, close, callers=CALLERS)


def main() -> None:
    settings = EmbeddingSettings()
    run(build(settings), settings)


if __name__ == "__main__":
    main()
