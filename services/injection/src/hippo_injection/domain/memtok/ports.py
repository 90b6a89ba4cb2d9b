"""Ports of the memtok store. The item store (SQLite) is the source of truth; the key
index is a projection of its key vectors, rebuilt from it when they disagree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hippo_injection.domain.memtok.models import Memtok, Vector


class ItemStore(Protocol):
    def meta(self) -> dict[str, str]:
        """The store's own facts: model_id, layer, key_seq."""
        ...

    def set_meta(self, values: dict[str, str]) -> None: ...

    def get(self, tenant: str, user: str, ids: Sequence[str]) -> list[Memtok]:
        """Items of this tenant and user among ids (missing skipped)."""
        ...

    def by_user(self, tenant: str, user: str) -> list[Memtok]: ...

    def users(self) -> list[tuple[str, str]]: ...

    def put(self, items: Sequence[Memtok]) -> None:
        """Insert or replace, in one durable transaction."""
        ...

    def delete(self, tenant: str, user: str, ids: Sequence[str]) -> None: ...

    def count(self, tenant: str, user: str) -> int: ...

    def user_mode(self, tenant: str, user: str) -> str | None:
        """The user's recorded influence mode (off, disclose_only, on), None if unset."""
        ...

    def set_user_mode(self, tenant: str, user: str, mode: str | None) -> None: ...

    def close(self) -> None: ...


class KeyIndex(Protocol):
    """Cosine search over key vectors, always inside one tenant and user."""

    def upsert(self, items: Sequence[Memtok], seq: int) -> None: ...

    def delete(self, tenant: str, ids: Sequence[str], seq: int) -> None: ...

    def search(self, tenant: str, user: str, vector: Vector, limit: int) -> list[tuple[str, float]]:
        """(memtok id, cosine) best first."""
        ...

    def applied_seq(self) -> int: ...

    def close(self) -> None: ...


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> Vector:
        """(len(texts), dim) unit rows in the embedding model's space."""
        ...


class ValueMaker(Protocol):
    """Value vectors in the LLM's hidden space at `layer` (scaled to its mean norm)."""

    @property
    def model_id(self) -> str: ...

    @property
    def layer(self) -> int: ...

    def values(self, texts: Sequence[str]) -> Vector:
        """(len(texts), hidden) float32."""
        ...
