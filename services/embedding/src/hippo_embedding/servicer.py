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
    the models. Health is NOT_SERVING until then, and an early call gets UNAVAILABLE."""

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
        result = await self._domain().embed(list(request.texts), request.model)
        return convert.embed_response(result)

    async def DropCache(
        self, request: embedding_pb2.DropCacheRequest, context: grpc.aio.ServicerContext
    ) -> embedding_pb2.DropCacheResponse:
        dropped = self._domain().drop_cache()
        return embedding_pb2.DropCacheResponse(entries_dropped=dropped)

    async def Info(
        self, request: embedding_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> embedding_pb2.InfoResponse:
        encoders = [model.encoder for model in self._domain().models]
        return convert.info_response(encoders, self._settings)
