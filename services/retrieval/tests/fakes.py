"""In-memory test doubles of the retrieval ports, for domain unit tests.

Each real adapter (SQLite, Tantivy, Qdrant edge, qdrant-client) has its own tests against
real storage; these only let the domain's logic be tested fast and deterministically.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hippo_retrieval.domain.models import (
    Candidate,
    Change,
    Deletion,
    GraphState,
    NewTurn,
    Place,
    Scope,
    StoredTurn,
    Vector,
)

_IDS = uuid.UUID("0b9f6c1e-2a55-4d0e-8c53-6e2f1c7a9d41")


def memory_id(*parts: str, client_id: str = "") -> str:
    """A UUID-shaped memory id, as the gateway makes them: stable for the same parts and
    client id, fresh (random) without a client id."""
    if not client_id:
        return str(uuid.uuid4())
    return str(uuid.uuid5(_IDS, "\x1f".join((*parts, client_id))))


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def in_scope(turn: StoredTurn, scope: Scope) -> bool:
    return (
        turn.tenant == scope.tenant
        and turn.user == scope.user
        and (scope.session is None or turn.session == scope.session)
        and (scope.start_us is None or turn.time_us >= scope.start_us)
        and (scope.end_us is None or turn.time_us < scope.end_us)
        and (not scope.roles or turn.role in scope.roles)
    )


class MemoryStore:
    def __init__(self) -> None:
        self.turns: dict[tuple[str, str], StoredTurn] = {}
        self.log: list[Change] = []
        self.seq = 0
        self.positions: dict[tuple[str, str, str], int] = {}

    def append(self, turns: Sequence[NewTurn]) -> list[tuple[StoredTurn, bool]]:
        out = []
        for t in turns:
            key = (t.tenant, t.memory_id)
            if key in self.turns:
                out.append((self.turns[key], False))
                continue
            self.seq += 1
            session = (t.tenant, t.user, t.session)
            self.positions[session] = self.positions.get(session, 0) + 1
            stored = StoredTurn(
                self.seq, t.memory_id, t.tenant, t.user, t.session, t.role, t.text,
                t.time_us, t.client_id, dict(t.metadata), t.vector, self.positions[session],
            )  # fmt: skip
            self.turns[key] = stored
            self.log.append(stored)
            out.append((stored, True))
        return out

    def get(self, tenant: str, user: str, memory_ids: Sequence[str]) -> list[StoredTurn]:
        found = [self.turns.get((tenant, m)) for m in memory_ids]
        return [t for t in found if t is not None and t.user == user]

    def changes(self, after_seq: int, limit: int) -> list[Change]:
        live = [
            c
            for c in self.log
            if c.seq > after_seq
            and (isinstance(c, Deletion) or (c.tenant, c.memory_id) in self.turns)
        ]
        return live[:limit]

    def delete(
        self, tenant: str, user: str, *, session: str | None = None, memory_ids: Sequence[str] = ()
    ) -> list[str]:
        gone = [
            t.memory_id
            for t in self.turns.values()
            if t.tenant == tenant
            and t.user == user
            and (session is None or t.session == session)
            and (not memory_ids or t.memory_id in memory_ids)
        ]
        for m in gone:
            del self.turns[(tenant, m)]
            self.seq += 1
            self.log.append(Deletion(self.seq, tenant, m))
        return gone

    def previous(self, turns: Sequence[StoredTurn]) -> dict[str, StoredTurn]:
        out = {}
        for t in turns:
            before = [
                o for o in self.turns.values()
                if (o.tenant, o.user, o.session) == (t.tenant, t.user, t.session)
                and o.position < t.position
            ]  # fmt: skip
            if before:
                out[t.memory_id] = max(before, key=lambda o: o.position)
        return out

    def locate(self, tenant: str, user: str, memory_ids: Sequence[str]) -> dict[str, Place]:
        found = (self.turns.get((tenant, m)) for m in memory_ids)
        return {
            t.memory_id: Place(t.session, t.position, t.metadata.get("speaker", ""))
            for t in found
            if t is not None and t.user == user
        }

    def last_seq(self) -> int:
        return self.seq

    def size(self) -> int:
        return len(self.turns)

    def tenant_size(self, tenant: str) -> int:
        return sum(1 for t, _ in self.turns if t == tenant)

    def close(self) -> None:
        pass


class MemoryIndex:
    """Both index ports: word overlap for lexical, dot product for vectors."""

    def __init__(self) -> None:
        self.pending: dict[str, StoredTurn | None] = {}
        self.docs: dict[str, StoredTurn] = {}
        self.applied = 0
        self.committed = 0
        self.commits = 0
        self.autocommit = False
        self.in_graph = 0  # as vectors: points a graph build has covered
        self.graph_builds = 0

    def apply(self, changes: Sequence[Change]) -> None:
        for c in changes:
            self.pending[c.memory_id] = c if isinstance(c, StoredTurn) else None
            self.applied = c.seq
        if self.autocommit:
            self.commit()

    def commit(self) -> None:
        for m, t in self.pending.items():
            if t is None:
                self.docs.pop(m, None)
            else:
                self.docs[m] = t
        self.pending.clear()
        self.committed = self.applied
        self.commits += 1

    def writable(self) -> bool:
        return True

    def applied_seq(self) -> int:
        return self.committed

    def search(
        self,
        scope: Scope,
        query: str | Vector,
        limit: int,
        query_repairs: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        """`query_repairs`: each repaired word is searched beside the typed one (the real
        indexes choose one of the two per word: test_retrieval_lexical.py)."""
        if isinstance(query, str) and query_repairs:
            query = " ".join([query, *query_repairs.values()])
        scored = []
        for t in self.docs.values():
            if not in_scope(t, scope):
                continue
            if isinstance(query, str):
                score = float(len(_words(query) & _words(t.text)))
            else:
                score = float(np.dot(query, t.vector)) if t.vector is not None else 0.0
            if score > 0:
                scored.append(Candidate(t.memory_id, score))
        return sorted(scored, key=lambda c: -c.score)[:limit]

    def graph_state(self) -> GraphState:
        return GraphState(points=len(self.docs), in_graph=min(self.in_graph, len(self.docs)))

    def build_graph(self, cancelled: Callable[[], bool]) -> None:
        self.graph_builds += 1
        self.in_graph = len(self.docs)

    def close(self) -> None:
        pass
