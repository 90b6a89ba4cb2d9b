"""The embedding service through gRPC (the `Embedder` port)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import numpy as np

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core.client import calling
from hippo_gateway.domain.models import Vectors


class GrpcEmbedder:
    """Learns the service's limits from Info once (`connect`), then cuts texts to what the
    model reads (it ignores the rest anyway) and splits calls at its batch limit."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        self.dimension = 0
        self._max_texts = 1
        self._max_chars = 1

    async def connect(self, timeout: float) -> None:
        async with calling("embedding"):
            info = await self._stub.Info(
                embedding_pb2.InfoRequest(), timeout=timeout, wait_for_ready=True
            )
        self.dimension, self._max_texts, self._max_chars = (
            info.dimension,
            info.max_texts,
            info.max_chars,
        )

    async def embed(self, texts: Sequence[str]) -> Vectors:
        rows: list[Vectors] = []
        for start in range(0, len(texts), self._max_texts):
            chunk = [t[: self._max_chars] for t in texts[start : start + self._max_texts]]
            async with calling("embedding"):
                reply = await self._stub.Embed(embedding_pb2.EmbedRequest(texts=chunk))
            flat = np.frombuffer(reply.vectors, dtype="<f4").astype(np.float32)
            rows.append(flat.reshape(reply.count, reply.dimension))
        return np.concatenate(rows) if rows else np.empty((0, self.dimension), np.float32)
