"""The embedding use case: validate, answer from cache, batch the rest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hippo_embedding import metrics
from hippo_embedding.domain.batcher import MicroBatcher
from hippo_embedding.domain.cache import VectorCache, key
from hippo_embedding.domain.encoder import Encoder, Vectors
from hippo_embedding.domain.validation import Limits, validate


@dataclass(frozen=True)
class Embedded:
    vectors: Vectors  # (n, dimension) float32, unit rows, request order
    cached: int  # texts answered from the cache


class EmbeddingService:
    def __init__(
        self, encoder: Encoder, batcher: MicroBatcher, cache: VectorCache, limits: Limits
    ) -> None:
        self.encoder = encoder
        self.limits = limits
        self._batcher = batcher
        self._cache = cache

    def drop_cache(self) -> int:
        """Empty the cache (the gateway's Forget): a cached text answers `cached`, and
        faster, so it would tell whether erased text was ever embedded. The cache is
        keyed by text alone, not by who sent it, so it goes whole. Returns entries dropped."""
        return self._cache.clear()

    async def embed(self, texts: Sequence[str]) -> Embedded:
        validate(texts, self.limits)
        out = np.empty((len(texts), self.encoder.dimension), dtype=np.float32)
        missing: dict[bytes, list[int]] = {}  # each distinct text is encoded once
        for i, text in enumerate(texts):
            k = key(text)
            row = self._cache.get(k)
            if row is None:
                missing.setdefault(k, []).append(i)
            else:
                out[i] = row
        cached = len(texts) - sum(len(rows) for rows in missing.values())
        metrics.TEXTS.labels("cache").inc(cached)
        if missing:
            firsts = [rows[0] for rows in missing.values()]
            vectors = await self._batcher.embed([texts[i] for i in firsts])
            for (k, rows), vector in zip(missing.items(), vectors, strict=True):
                self._cache.put(k, vector)
                out[rows] = vector
        return Embedded(out, cached)
