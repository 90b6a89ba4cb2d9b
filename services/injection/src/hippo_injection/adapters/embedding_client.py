"""Key vectors from the embedding service (blocking gRPC: the memtok pipeline runs on the
model's thread), through `hippo_core.embedding_client`, with a deadline on every call."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hippo_core.embedding_client import BlockingEmbedder
from hippo_core.settings import TlsSettings
from hippo_injection.domain.memtok.models import Vector


class EmbeddingClient:
    def __init__(self, addr: str, timeout_s: float, tls: TlsSettings | None = None) -> None:
        # A busy embedding service is waited out for at most one more deadline: the
        # model's thread has generation work queued behind this call.
        self._client = BlockingEmbedder(addr, timeout_s, tls, max_wait_s=timeout_s)

    def embed(self, texts: Sequence[str]) -> Vector:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        vectors, _ = self._client.embed(texts)
        return vectors

    def close(self) -> None:
        self._client.close()
