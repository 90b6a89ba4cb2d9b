"""Ports of the memtok store. The item store (SQLite, or PostgreSQL in cluster mode) is
the source of truth; the key index is a projection of its key vectors, kept by each
process (replica) for itself and brought up to the store's last change when they
disagree.

Every change to the items has a number (`seq`), growing in commit order: the key index
remembers the last one it applied. With one writer (SQLite) the index follows each write
directly; with several (PostgreSQL) the store keeps a change feed from which any
replica's index catches up with the others' writes."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from hippo_injection.domain.memtok.models import Changes, Memtok, Observation, Vector
from hippo_injection.domain.types import MemoryStates


class ItemStore(Protocol):
    @property
    def shared(self) -> bool:
        """True when other processes (replicas) write this store too: the key index
        must catch up from the change feed before it is searched."""
        ...

    def meta(self) -> dict[str, str]:
        """The store's own facts: model_id, layer."""
        ...

    def set_meta(self, values: dict[str, str]) -> None: ...

    def claim_meta(self, values: dict[str, str]) -> dict[str, str]:
        """Set the names not set yet (the first writer wins, also between replicas that
        start at once); the meta afterwards."""
        ...

    def head(self) -> int:
        """The seq of the last change (0: none yet)."""
        ...

    def changes(self, after: int, upto: int) -> Changes | None:
        """The changes numbered after `after` up to `upto` (<= head), as they stand now.
        None when the store keeps no feed (one writer: the index rebuilds instead) or
        has trimmed the part asked for."""
        ...

    def trim_changes(self, before_us: int) -> int:
        """Forget the feed's records of items deleted before `before_us`; how many. An
        index behind what was trimmed rebuilds instead of catching up."""
        ...

    def get(self, tenant: str, user: str, ids: Sequence[str]) -> list[Memtok]:
        """Items of this tenant and user among ids (missing skipped)."""
        ...

    def by_user(self, tenant: str, user: str) -> list[Memtok]: ...

    def users(self) -> list[tuple[str, str]]: ...

    def put(self, items: Sequence[Memtok]) -> int:
        """Insert or replace, in one durable transaction; the change's seq (0 when
        nothing was given). An id held by another tenant or user is left unchanged. An
        item's `states`, when set, are stored with it (packed as its values are); None
        keeps what is stored."""
        ...

    def states(self, tenant: str, user: str, ids: Sequence[str]) -> dict[str, MemoryStates]:
        """The stored attendable states of these items of this tenant and user (items
        without any, or missing, left out)."""
        ...

    def delete(self, tenant: str, user: str, ids: Sequence[str]) -> int:
        """The change's seq (0 when nothing was given)."""
        ...

    def erase(self, tenant: str, user: str) -> tuple[list[str], int]:
        """Everything of this user (items, recorded mode) deleted and scrubbed from the
        engine's files as far as it can; the erased item ids and the change's seq (0:
        no items)."""
        ...

    def count(self, tenant: str, user: str) -> int: ...

    def writing(self, tenant: str, user: str) -> AbstractContextManager[None]:
        """Held while one user's items are read and then written: another replica's
        writer of the same user waits (no lost count, no duplicate). Re-entrant."""
        ...

    def owns_upkeep(self) -> bool:
        """Whether this process runs the timed upkeep now: always with one writer; with
        several, the one replica holding the upkeep lease."""
        ...

    def user_mode(self, tenant: str, user: str) -> str | None:
        """The user's recorded influence mode (off, disclose_only, on), None if unset."""
        ...

    def set_user_mode(self, tenant: str, user: str, mode: str | None) -> None: ...

    def close(self) -> None: ...


class ReplyBuffer(Protocol):
    """The latest reply's ranked words per user, waiting for the next operator query.
    In memory with one process; in the shared store when replicas take turns serving a
    user (the next query may reach another replica)."""

    def replace(self, tenant: str, user: str, entries: Sequence[tuple[Observation, int]]) -> None:
        """The user's buffer becomes `entries` (observation, time written), in order."""
        ...

    def take(self, tenant: str, user: str) -> list[tuple[Observation, int]]:
        """The user's buffer, emptied."""
        ...

    def peek(self, tenant: str, user: str) -> list[tuple[Observation, int]]: ...

    def drop(self, tenant: str, user: str) -> None: ...


class KeyIndex(Protocol):
    """Cosine search over key vectors, always inside one tenant and user."""

    def upsert(self, items: Sequence[Memtok], seq: int) -> None: ...

    def delete(self, tenant: str, ids: Sequence[str], seq: int) -> None: ...

    def search(self, tenant: str, user: str, vector: Vector, limit: int) -> list[tuple[str, float]]:
        """(memtok id, cosine) best first."""
        ...

    def applied_seq(self) -> int: ...

    def clear(self) -> None:
        """Empty, with applied seq 0 (before a rebuild)."""
        ...

    def close(self) -> None: ...


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> Vector:
        """(len(texts), dim) unit rows in the embedding model's space."""
        ...


class StateMaker(Protocol):
    """Attendable key/value states of texts (Engine.memory_states), values from
    `from_layer` up."""

    @property
    def model_id(self) -> str: ...

    @property
    def from_layer(self) -> int: ...

    def states(self, texts: Sequence[str]) -> list[MemoryStates]: ...


class ValueMaker(Protocol):
    """Value vectors in the LLM's hidden space at `layer` (scaled to its mean norm)."""

    @property
    def model_id(self) -> str: ...

    @property
    def layer(self) -> int: ...

    def values(self, texts: Sequence[str]) -> Vector:
        """(len(texts), hidden) float32."""
        ...
