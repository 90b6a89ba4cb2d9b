"""LRU cache of vectors keyed by a hash of the model and the text.

Keys are 16-byte BLAKE2b digests of (model, text), so memory per entry is fixed whatever
the text length, and one text embedded by two models is two entries, never confused.
Hippo embeds the same text more than once (a turn at write time, then as a query or a
recalled neighbour), and identical short texts ("ok", "thanks!") are common.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from hippo_embedding import metrics
from hippo_embedding.domain.encoder import Vectors


def key(model: str, text: str) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(model.encode("utf-8"))
    digest.update(b"\0")  # a model name holds no NUL, so (model, text) pairs never collide
    digest.update(text.encode("utf-8"))
    return digest.digest()


class VectorCache:
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: OrderedDict[bytes, Vectors] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, k: bytes) -> Vectors | None:
        row = self._items.get(k)
        if row is not None:
            self._items.move_to_end(k)
        return row

    def clear(self) -> int:
        """Drop every entry (a Forget: see `EmbeddingService.drop_cache`); how many."""
        dropped = len(self._items)
        self._items.clear()
        metrics.CACHE_ENTRIES.set(0)
        return dropped

    def put(self, k: bytes, row: Vectors) -> None:
        if self._capacity == 0:
            return
        frozen = np.array(row, dtype=np.float32)  # a copy: callers may reuse their buffer
        frozen.flags.writeable = False
        self._items[k] = frozen
        self._items.move_to_end(k)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)
        metrics.CACHE_ENTRIES.set(len(self._items))
