"""One index for every replica: a Qdrant server collection written by one replica at a
time (cluster mode with `qdrant_url`): the vector collection, and with
`lexical_index=qdrant` the BM25 collection too (each has a lease of its own, so their
writers may be different replicas).

Why one writer: replicas apply the same feed, so several writers would be idempotent in
the end, but not meanwhile: a replica behind the others that re-applies an old put after
another already applied that turn's deletion brings the erased point back until it
reaches the deletion itself (never, if it stops first). So the writer holds a lease (a
PostgreSQL advisory lock, `Database.lease`), released when its process or connection
dies; the others search the collection and, every `retry_s`, try to take the lease.

Where the applied seq lives: in the collection (`QdrantIndex` keeps it in its
`_meta` companion, written after the data), so it is shared by construction: a new
writer continues from what the last one recorded, and a reader takes it as the index's
progress (`applied_seq()` re-reads it).

What remains between checking the lease and writing: a writer cut off from PostgreSQL
(a partition) keeps writing until its next check while a second one starts; both apply
the feed in order, and the check before each batch bounds the overlap to one batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import Gauge

from hippo_core.errors import Unavailable
from hippo_retrieval import metrics
from hippo_retrieval.adapters.qdrant_vectors import QdrantIndex
from hippo_retrieval.domain.models import Candidate, Change, GraphState, Scope

log = logging.getLogger(__name__)


class WriterLease(Protocol):
    """One holder at a time (hippo_core.postgres.Lease)."""

    def acquire(self) -> bool: ...

    def held(self) -> bool: ...

    def release(self) -> None: ...


class LeasedIndex:
    """`VectorIndex` or `LexicalIndex` (as `index` is) over a collection shared by every
    replica; writes only while this replica holds `lease`. Generations share one instance
    (the index set owns it): `close()` is a no-op, `shutdown()` releases the lease and
    closes the collection."""

    def __init__(
        self,
        index: QdrantIndex,
        lease: WriterLease,
        *,
        retry_s: float = 2.0,
        gauge: Gauge = metrics.VECTOR_WRITER,
    ) -> None:
        self._index = index
        self._gauge = gauge  # 1 while this replica writes the collection
        self._lease = lease
        self._retry_s = retry_s
        self._lock = threading.Lock()  # one apply at a time (two generations during a reindex)
        self._writer = False
        self._next_try = 0.0

    @property
    def collection(self) -> str:
        return self._index.collection

    def writable(self) -> bool:
        with self._lock:
            if self._writer:
                if self._lease.held():
                    return True
                self._set_writer(False)
                log.warning("projector lease of %s lost", self.collection)
            now = time.monotonic()
            if now < self._next_try:
                return False
            self._next_try = now + self._retry_s
            if not self._lease.acquire():
                return False
            # Continue from what the last writer recorded, never from this replica's
            # older view (writing a lower seq back would replay, and re-apply, its work).
            self._index.reload_applied()
            self._set_writer(True)
            log.info("projector lease of %s taken: this replica writes it", self.collection)
            return True

    def _set_writer(self, writer: bool) -> None:
        self._writer = writer
        self._gauge.set(1 if writer else 0)

    def apply(self, changes: Sequence[Change]) -> None:
        with self._lock:
            if not (self._writer and self._lease.held()):
                self._set_writer(False)
                raise Unavailable(f"{self.collection}: not the writer of the shared index")
            # Two generations of this replica may hand it the same changes (a reindex):
            # what the collection has applied already is not applied again.
            applied = self._index.applied_seq()
            self._index.apply([c for c in changes if c.seq > applied])

    def applied_seq(self) -> int:
        with self._lock:
            if self._writer:
                return self._index.applied_seq()
        return self._index.reload_applied()  # another replica's progress

    def commit(self) -> None:
        """Nothing to do: the collection is durable and searchable per apply."""

    def search(
        self,
        scope: Scope,
        query: Any,
        limit: int,
        query_repairs: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        """The wrapped index's search: a vector, or the query text (lexical, with its
        `query_repairs`)."""
        more = () if query_repairs is None else (query_repairs,)
        result: list[Candidate] = self._index.search(scope, query, limit, *more)  # type: ignore[attr-defined]
        return result

    def graph_state(self) -> GraphState | None:
        return None  # a Qdrant server's collection: the server builds its graph

    def build_graph(self, cancelled: Callable[[], bool]) -> None:
        """Nothing to do: the server's optimizer builds it."""

    def count(self) -> int:
        return self._index.count()

    def close(self) -> None:
        """A generation lets go of it; the index set's `shutdown()` closes it."""

    def shutdown(self) -> None:
        with self._lock:
            self._set_writer(False)
            self._lease.release()
            self._index.close()
