"""What the gateway needs from its peers. The adapters speak gRPC; tests may use doubles."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hippo_gateway.domain.models import Memory, Recalled, RecallQuery, TurnToStore, Vectors


class Embedder(Protocol):
    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Unit vectors for the texts, in order. Texts longer than the model reads are
        cut by the adapter (the model would ignore the rest anyway)."""
        ...


class TurnStore(Protocol):
    async def write(
        self, tenant: str, turns: Sequence[TurnToStore], wait_searchable: bool = False
    ) -> list[tuple[Memory, bool]]:
        """Store all turns or none; (stored memory, created now) per turn, in order.
        `wait_searchable`: return only once they are searchable in both indexes."""
        ...

    async def search(self, tenant: str, query: RecallQuery, vector: Vectors | None) -> Recalled: ...

    async def delete(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> list[str]:
        """Erase durably; returns the ids erased (absent ones are skipped)."""
        ...
