"""The embedding use case: pick the model, validate, answer from cache, batch the rest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hippo_core.errors import InvalidArgument
from hippo_embedding import metrics
from hippo_embedding.domain.batcher import MicroBatcher
from hippo_embedding.domain.cache import VectorCache, key
from hippo_embedding.domain.encoder import Encoder, Vectors
from hippo_embedding.domain.validation import Limits, validate


@dataclass(frozen=True)
class Model:
    """One loaded embedder and the batcher (queue, worker thread) that owns it."""

    encoder: Encoder
    batcher: MicroBatcher


@dataclass(frozen=True)
class Embedded:
    vectors: Vectors  # (n, dimension) float32, unit rows, request order
    cached: int  # texts answered from the cache
    model: str  # the model that encoded them


class EmbeddingService:
    def __init__(self, models: Sequence[Model], cache: VectorCache, limits: Limits) -> None:
        if not models:
            raise ValueError("at least one model")
        self.models = list(models)  # the default first
        self.limits = limits
        self._by_name = {m.encoder.model: m for m in self.models}
        self._cache = cache

    @property
    def encoder(self) -> Encoder:
        """The default model's encoder."""
        return self.models[0].encoder

    def model(self, name: str) -> Model:
        """The model called `name`; "" is the default one."""
        if not name:
            return self.models[0]
        found = self._by_name.get(name)
        if found is None:
            loaded = ", ".join(repr(m.encoder.model) for m in self.models)
            raise InvalidArgument(
                "model", f"no model {name!r} is loaded; loaded: {loaded}", reason="UNKNOWN_MODEL"
            )
        return found

    def drop_cache(self) -> int:
        """Empty the cache (the gateway's Forget): a cached text answers `cached`, and
        faster, so it would tell whether erased text was ever embedded. The cache is
        keyed by model and text, not by who sent it, so it goes whole, every model's
        entries. Returns entries dropped."""
        return self._cache.clear()

    async def embed(self, texts: Sequence[str], model: str = "") -> Embedded:
        chosen = self.model(model)
        validate(texts, self.limits)
        name = chosen.encoder.model
        out = np.empty((len(texts), chosen.encoder.dimension), dtype=np.float32)
        missing: dict[bytes, list[int]] = {}  # each distinct text is encoded once
        for i, text in enumerate(texts):
            k = key(name, text)
            row = self._cache.get(k)
            if row is None:
                missing.setdefault(k, []).append(i)
            else:
                out[i] = row
        cached = len(texts) - sum(len(rows) for rows in missing.values())
        metrics.TEXTS.labels("cache").inc(cached)
        if missing:
            firsts = [rows[0] for rows in missing.values()]
            vectors = await chosen.batcher.embed([texts[i] for i in firsts])
            for (k, rows), vector in zip(missing.items(), vectors, strict=True):
                self._cache.put(k, vector)
                out[rows] = vector
        return Embedded(out, cached, name)
