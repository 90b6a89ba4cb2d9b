"""Ports: what the retrieval domain needs from its stores.

The turn store is the source of truth; both indexes are projections that remember the
last sequence number they applied and catch up from the store's change feed. Every
method takes the tenant (and user) and applies it inside the adapter.

In cluster mode several replicas share one turn store (PostgreSQL); each keeps its own
projections, except an index shared by all (a Qdrant server collection: the vectors, and
with lexical_index=qdrant the BM25 index too), which one replica at a time writes
(`writable`). `Replicas` is how a replica learns of
the others' writes and makes a write searchable on all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from hippo_retrieval.domain.models import (
    Candidate,
    Change,
    Cursor,
    EmbeddingModel,
    GraphState,
    NewTurn,
    Place,
    Scope,
    SessionStats,
    StoredTurn,
    UserStats,
    Vector,
)


class TurnStore(Protocol):
    def append(self, turns: Sequence[NewTurn]) -> list[tuple[StoredTurn, bool]]:
        """Store all turns in one durable transaction, or none. A memory_id that already
        exists is not written again: (the stored turn, False). Returns once committed."""
        ...

    def get(self, tenant: str, user: str, memory_ids: Sequence[str]) -> list[StoredTurn]:
        """The turns with these ids inside tenant and user, in the order asked; missing skipped."""
        ...

    def update_metadata(
        self,
        tenant: str,
        user: str,
        memory_id: str,
        set_: Mapping[str, str],
        remove: Sequence[str],
        vector: Vector | None = None,
        vector_model: str = "",
    ) -> tuple[StoredTurn, bool] | None:
        """Change one turn's metadata (and vector, given) and touch it in the feed; None
        when the user has no such turn; (turn, False) when nothing changed."""
        ...

    def list_turns(
        self, scope: Scope, *, newest_first: bool, after: Cursor | None, limit: int
    ) -> list[StoredTurn]:
        """At most `limit` of the scope's turns (tenant, user, and session, time range and
        roles when set, all applied in the query) by (time_us, seq), ascending or
        descending, starting after `after` in that order. Keyset, never an offset."""
        ...

    def list_sessions(self, tenant: str, user: str, after: str, limit: int) -> list[SessionStats]:
        """At most `limit` of the user's sessions that hold turns, by session id, with
        ids after `after` ("" = from the first)."""
        ...

    def list_users(self, tenant: str, after: str, limit: int) -> list[UserStats]:
        """At most `limit` of the tenant's users that hold turns, by user id, with ids
        after `after` ("" = from the first)."""
        ...

    def changes(self, after_seq: int, limit: int) -> list[Change]:
        """Writes, touches (a turn whose neighbourhood changed, as its current row) and
        deletions with seq > after_seq, in seq order (the indexes' feed)."""
        ...

    def previous(self, turns: Sequence[StoredTurn]) -> dict[str, StoredTurn]:
        """The live turn just before each turn in its session, keyed by memory_id."""
        ...

    def locate(self, tenant: str, user: str, memory_ids: Sequence[str]) -> dict[str, Place]:
        """Session, position and speaker of each of the user's turns among memory_ids."""
        ...

    def delete(
        self, tenant: str, user: str, *, session: str | None = None, memory_ids: Sequence[str] = ()
    ) -> list[str]:
        """Erase the user's turns (all, one session's, or the given ids) durably; the text
        is gone, a Deletion per turn stays in the change feed. Returns the erased ids."""
        ...

    def model_vectors(
        self, model: str, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], Vector]:
        """The vectors of `model` kept for these (tenant, memory_id) turns beside their
        own (an index rebuilt with another model embedded them); missing skipped."""
        ...

    def put_model_vectors(self, model: str, rows: Sequence[tuple[str, str, Vector]]) -> int:
        """Keep `model`'s vectors of (tenant, memory_id) turns, durably; erased with the
        turn, and never kept for a turn already erased. Returns how many were kept."""
        ...

    def last_seq(self) -> int: ...

    def size(self) -> int:
        """Turns stored, all tenants (for status and metrics)."""
        ...

    def tenant_size(self, tenant: str) -> int:
        """Turns stored in one tenant (the gateway's stored-turn quota)."""
        ...

    def close(self) -> None: ...


class LexicalIndex(Protocol):
    """BM25 over the turn text, scoped by tenant/user/session/time/role."""

    def apply(self, changes: Sequence[Change]) -> None:
        """Apply writes and deletions in order; visible to search after the next commit."""
        ...

    def commit(self) -> None:
        """Make applied changes searchable and durable, recording the last applied seq."""
        ...

    def writable(self) -> bool:
        """Whether this replica applies changes to the index now (VectorIndex.writable:
        always for an index of its own; for a Qdrant collection shared by every replica,
        only while it is that collection's one writer)."""
        ...

    def applied_seq(self) -> int:
        """The seq of the last committed change (0 for a new index)."""
        ...

    def search(
        self,
        scope: Scope,
        query: str,
        limit: int,
        query_repairs: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        """Best first. Any user text is searched as plain words; never raises on syntax.
        `query_repairs` (typed word -> the caller's repair): a typed word no turn holds is
        searched as its repair when some turn holds that (adapters/analysis.py)."""
        ...

    def close(self) -> None: ...


class VectorIndex(Protocol):
    """Cosine nearest neighbours over turn vectors, scoped like LexicalIndex."""

    def apply(self, changes: Sequence[Change]) -> None:
        """Upsert the turns that carry a vector, delete the deleted; durable on return.
        Only while `writable()`."""
        ...

    def writable(self) -> bool:
        """Whether this replica applies changes to the index now: always for an index of
        its own; for one shared by every replica, only while it is that index's one
        writer (it tries to become it). When False, another replica applies the feed and
        `applied_seq()` reports that replica's progress."""
        ...

    def applied_seq(self) -> int: ...

    def search(self, scope: Scope, vector: Vector, limit: int) -> list[Candidate]: ...

    def graph_state(self) -> GraphState | None:
        """Points, and points in the HNSW graph; None where the engine builds its graph
        itself (a Qdrant server's optimizer)."""
        ...

    def build_graph(self, cancelled: Callable[[], bool]) -> None:
        """Put every point in the graph, without stopping searches elsewhere in the
        process. Only on an index no one searches or writes yet (a generation being
        rebuilt): the index may be unusable while it runs. Stops early, raising, once
        `cancelled()` is true."""
        ...

    def close(self) -> None: ...


class IndexSet(Protocol):
    """Where index generations live. A generation is one lexical + one vector index built
    from the turn store; `hippo reindex` builds generation n+1 beside the live n, then
    switches. Which generation is live is recorded durably, so a restart opens it."""

    def current(self) -> int:
        """The live generation (1 when none was ever recorded)."""
        ...

    def open(self, generation: int, dimension: int) -> tuple[LexicalIndex, VectorIndex]:
        """Open (creating if missing) the generation's indexes, vectors of `dimension`."""
        ...

    def embedding(self, generation: int) -> EmbeddingModel | None:
        """The embedding model the generation's vector index was built with, as recorded
        (None: not recorded, a generation older than the record: the legacy model)."""
        ...

    def set_embedding(self, generation: int, model: EmbeddingModel) -> None:
        """Record (durably, before the generation is built) its embedding model."""
        ...

    @property
    def shared_vectors(self) -> bool:
        """Whether every replica searches one vector index (cluster mode with a Qdrant
        server): it belongs to no generation, so a rebuild cannot change its model."""
        ...

    def set_current(self, generation: int) -> None:
        """Record `generation` as live, durably (atomic: a crash leaves old or new)."""
        ...

    def remove(self, generation: int) -> None:
        """Delete the generation's indexes; they must be closed. Absent is not an error.
        A vector index shared by all replicas is not the generation's to delete."""
        ...

    def purge_pending(self) -> bool:
        """Whether an erasure reached the live generation's files and no rebuild has
        rewritten them since (recorded durably: a restart still purges)."""
        ...

    def set_purge_pending(self, pending: bool) -> None:
        """Record (durably) that the live generation's files hold erased documents."""
        ...

    def close(self) -> None:
        """Release what the set holds beyond its generations (a shared index's writer
        lease); after every generation is closed."""
        ...

    @property
    def vector_backend(self) -> str:
        """ "edge" or "qdrant", for status and logs."""
        ...

    @property
    def lexical_backend(self) -> str:
        """ "tantivy" or "qdrant" (the same Qdrant as the vectors), for status and logs."""
        ...

    @property
    def local_files(self) -> bool:
        """Whether this replica keeps index files of its own. False (stateless mode: both
        indexes are Qdrant collections every replica shares): there is nothing here for a
        reindex to rebuild or for a purge to rewrite."""
        ...


class Embedder(Protocol):
    """The embedding service, for the vectors an index of another model needs (a rebuild
    with a new model, writes and queries that still come with the old one). Blocking."""

    def models(self) -> list[EmbeddingModel]:
        """The models the service has loaded, its default first."""
        ...

    def embed(self, texts: Sequence[str], model: str) -> Vector:
        """(len(texts), dimension) float32 unit rows of `model`."""
        ...


class Replicas(Protocol):
    """The other replicas of this service, sharing its turn store (cluster mode; the
    embedded default has none). Each projects the shared feed into its own indexes, so a
    write waited for must be searchable on all of them: the next search may go to any."""

    def join(self, visible_seq: int, wake: Callable[[bool], None]) -> None:
        """Announce this replica, searchable up to `visible_seq`. From now on call
        `wake(urgent)` when the feed may have grown through another replica (urgent: a
        writer waits to see it, so make it searchable now rather than at the next batch)."""
        ...

    def progress(self, visible_seq: int) -> None:
        """This replica is searchable up to `visible_seq` now (cheap: never blocks)."""
        ...

    def want(self, seq: int) -> int | None:
        """A writer here waits until `seq` is searchable on every live replica: ask them
        to hurry. Returns the lowest searchable seq among the other live replicas (None
        when there are none). Blocking (a database round trip)."""
        ...

    def others_visible(self) -> int | None:
        """The lowest searchable seq among the other live replicas, as last heard (a
        replica that stopped heartbeating is left out); None when there are none. Cheap."""
        ...

    def close(self) -> None:
        """Leave: the others stop waiting for this replica at once."""
        ...
