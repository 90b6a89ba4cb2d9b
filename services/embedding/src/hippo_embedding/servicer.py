"""gRPC edge of the embedding service: convert in, one domain call, convert out."""

from __future__ import annotations

import grpc

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core.errors import Unavailable
from hippo_embedding import convert
from hippo_embedding.domain.service import EmbeddingService
from hippo_embedding.settings import EmbeddingSettings


class EmbeddingServicer(embedding_pb2_grpc.EmbeddingServiceServicer):
    """Registered when the port binds; given its domain service once warm-up has loaded
    the model. Health is NOT_SERVING until then, and an early call gets UNAVAILABLE."""

    def __init__(self, settings: EmbeddingSettings) -> None:
        self._settings = settings
        self.service: EmbeddingService | None = None

    def _domain(self) -> EmbeddingService:
        if self.service is None:
            raise Unavailable("the embedding model is still loading; retry shortly")
        return self.service

    async def Embed(
        self, request: embedding_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> embedding_pb2.EmbedResponse:
        domain = self._domain()
        result = await domain.embed(list(request.texts))
        return convert.embed_response(result, domain.encoder.model)

    async def DropCache(
        self, request: embedding_pb2.DropCacheRequest, context: grpc.aio.ServicerContext
    ) -> embedding_pb2.DropCacheResponse:
        dropped = self._domain().drop_cache()
        return embedding_pb2.DropCacheResponse(entries_dropped=dropped)

    async def Info(
        self, request: embedding_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> embedding_pb2.InfoResponse:
        return convert.info_response(self._domain().encoder, self._settings)
