"""Key vectors from the embedding service (blocking gRPC: the memtok pipeline runs on the
model's thread), with a deadline on every call."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core import client
from hippo_core.settings import TlsSettings
from hippo_injection.domain.memtok.models import Vector


class EmbeddingClient:
    def __init__(self, addr: str, timeout_s: float, tls: TlsSettings | None = None) -> None:
        # Counted and traced like aio peers, with this service's certificate under TLS.
        self._channel = client.blocking_channel(addr, tls_settings=tls)
        self._stub = embedding_pb2_grpc.EmbeddingServiceStub(self._channel)
        self._timeout = timeout_s

    def embed(self, texts: Sequence[str]) -> Vector:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        reply = self._stub.Embed(
            embedding_pb2.EmbedRequest(texts=list(texts)), timeout=self._timeout
        )
        vectors = np.frombuffer(reply.vectors, dtype="<f4").reshape(reply.count, reply.dimension)
        return vectors.astype(np.float32)

    def close(self) -> None:
        self._channel.close()
