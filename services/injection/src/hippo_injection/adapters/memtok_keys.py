"""Memtok key vectors through retrieval's vector-store port (`VectorIndex`): the same
adapters (Qdrant edge in-process by default, a Qdrant server via qdrant-client) index
memtoks as they index turns. A memtok is written as a turn-shaped record: its id as
memory_id, tenant and user as the scope, session "memtok", no text (the item store holds
the words). Every search carries tenant and user in the engine's filter."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hippo_injection.domain.memtok.models import Memtok, Vector
from hippo_retrieval.domain.models import Deletion, Role, Scope, StoredTurn
from hippo_retrieval.domain.ports import VectorIndex

SESSION = "memtok"


class RetrievalKeyIndex:
    def __init__(self, index: VectorIndex) -> None:
        self._index = index

    @classmethod
    def edge(cls, path: Path, dimension: int = 384) -> RetrievalKeyIndex:
        from hippo_retrieval.adapters.edge_vectors import EdgeVectorIndex

        return cls(EdgeVectorIndex(path, dimension))

    def upsert(self, items: Sequence[Memtok], seq: int) -> None:
        changes = [
            StoredTurn(
                seq=seq,
                memory_id=m.id,
                tenant=m.tenant,
                user=m.user,
                session=SESSION,
                role=Role.USER if m.source.value == "operator" else Role.ASSISTANT,
                text="",
                time_us=m.created_us,
                client_id="",
                metadata={},
                vector=m.key,
            )
            for m in items
        ]
        if not changes:
            # Only the applied seq moves (a rebuild that found nothing).
            changes = [Deletion(seq, "\x00none", "\x00none")]  # type: ignore[list-item]
        self._index.apply(changes)

    def delete(self, tenant: str, ids: Sequence[str], seq: int) -> None:
        self._index.apply([Deletion(seq, tenant, i) for i in ids])

    def search(self, tenant: str, user: str, vector: Vector, limit: int) -> list[tuple[str, float]]:
        hits = self._index.search(Scope(tenant, user, session=SESSION), vector, limit)
        return [(h.memory_id, h.score) for h in hits]

    def applied_seq(self) -> int:
        return self._index.applied_seq()

    def close(self) -> None:
        self._index.close()
