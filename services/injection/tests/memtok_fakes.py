"""Deterministic stand-ins for the memtok store's unit tests: a bag-of-words embedder
(words hashed into 384 dimensions) and a value maker with a fixed model id. The real
model and the real key index (Qdrant edge) are used by the other tests.

`open_store` builds a MemtokStore on either item store: SQLite under `root` (url "") or
PostgreSQL at `url` (the key index under `root` either way, as a replica keeps it);
the `engine_url` fixture (injection_harness.py) runs a test on both."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import SecretStr

from hippo_core.settings import DatabaseSettings
from hippo_injection.__main__ import open_items
from hippo_injection.adapters.memtok_keys import EdgeKeyIndex
from hippo_injection.domain.memtok.models import Observation, Vector
from hippo_injection.domain.memtok.policy import Policy
from hippo_injection.domain.memtok.store import MemtokStore
from hippo_injection.domain.types import MemoryStates
from hippo_injection.settings import InjectionSettings

DAY_US = 86_400_000_000


def _slot(word: str, dim: int) -> int:
    return int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little") % dim


class BagEmbedder:
    def __init__(self, dim: int = 384) -> None:
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> Vector:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.casefold()):
                out[i, _slot(word, self.dim)] += 1.0
            n = np.linalg.norm(out[i])
            if n > 0:
                out[i] /= n
        return out


class FakeValues:
    def __init__(self, model_id: str = "model-a", layer: int = 3, hidden: int = 16) -> None:
        self.model_id = model_id
        self.layer = layer
        self.hidden = hidden

    def values(self, texts: Sequence[str]) -> Vector:
        rows = [
            np.random.default_rng(_slot(t + self.model_id, 2**31)).standard_normal(self.hidden)
            for t in texts
        ]
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.hidden)


class FakeStates:
    """Attendable states of a fixed shape (4 layers, 1 head, 8 dims), one token per word
    plus <bos>, drawn from the text: what Engine.memory_states gives, small."""

    layers, head_dim = 4, 8

    def __init__(self, model_id: str = "model-a", from_layer: int = 1) -> None:
        self.model_id = model_id
        self.from_layer = from_layer

    def states(self, texts: Sequence[str]) -> list[MemoryStates]:
        out = []
        for text in texts:
            rng = np.random.default_rng(_slot(f"{self.from_layer}{text}", 2**31))
            shape = (self.layers, 1, 1 + len(text.split()), self.head_dim)
            keys = rng.standard_normal(shape).astype(np.float16)
            values = rng.standard_normal(shape).astype(np.float16)[self.from_layer :]
            out.append(MemoryStates(self.model_id, self.from_layer, keys, values))
        return out


def settings(root: Path, url: str = "", **kw: object) -> InjectionSettings:
    return InjectionSettings(
        data_dir=str(root),
        database=DatabaseSettings(url=SecretStr(url)),
        **kw,  # type: ignore[arg-type]
    )


def open_store(
    root: Path,
    policy: Policy | None = None,
    values: FakeValues | None = None,
    *,
    url: str = "",
    attend: FakeStates | None = None,
    **kw: bool,
) -> MemtokStore:
    """Through the service's own wiring of the item store (SQLite, or PostgreSQL when
    `url` is set)."""
    items, buffer = open_items(settings(root, url))
    keys = EdgeKeyIndex(root / "memtok-keys")
    try:
        return MemtokStore(
            items, keys, BagEmbedder(), values or FakeValues(), policy or Policy(),
            buffer=buffer, attend=attend, **kw,
        )  # fmt: skip
    except BaseException:
        keys.close()
        items.close()
        raise


def close(store: MemtokStore) -> None:
    store.keys.close()
    store.items.close()


def obs(word: str, rank: float = 0.8, context: str = "", **kw: object) -> Observation:
    return Observation(
        word=word,
        source_words=f"{context} {word}".strip(),
        rank=rank,
        surprise=float(kw.pop("surprise", 6.0)),  # type: ignore[arg-type]
        attention=1.0,
        **kw,  # type: ignore[arg-type]
    )
