"""Keeps both indexes in step with the turn store, the source of truth.

A write is acknowledged once the turn store committed it; the projector then applies the
change feed to the indexes on its own thread. Tantivy commits are batched (every
`commit_interval_s` or `commit_every` changes: a commit per request would cost an fsync
and a segment each); the vector index is durable per apply. Each index records the last
seq it applied, so at start `catch_up()` replays only what it missed, and `rebuild()` is
the same from seq 0 into empty indexes.

An index shared by several replicas (cluster mode, a Qdrant server collection: the
vectors, and with lexical_index=qdrant the BM25 index too) is written by one of them at a
time (`writable()`, asked of each index at every step). The others apply only the indexes
of their own and take a shared index's recorded seq as its progress, so what they call
searchable is what really is.

Each vector index holds the vectors of one embedding model. A turn written with another
model's vector (while an index is rebuilt with a new model, or while callers learn of the
switch) gets this index's vector from the ones the turn store keeps per model, or else
from the embedding service, which is then kept for the next rebuild. So a rebuild with a
new model re-embeds every turn once, and a purge rebuild after it embeds nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from hippo_core.embedding import vector_text
from hippo_retrieval import metrics
from hippo_retrieval.domain.documents import lexical_document
from hippo_retrieval.domain.models import (
    Change,
    Deletion,
    EmbeddingModel,
    StoredTurn,
    Vector,
    metadata_terms,
)
from hippo_retrieval.domain.ports import Embedder, LexicalIndex, TurnStore, VectorIndex

PAGE = 1000
# How often a replica starting up looks again whether the shared vector index's writer
# has caught up (it serves only once it has), and how often it says it is still waiting.
SHARED_POLL_S = 0.05
SHARED_LOG_S = 10.0

log = logging.getLogger(__name__)


class Projector:
    def __init__(
        self,
        store: TurnStore,
        lexical: LexicalIndex,
        vectors: VectorIndex,
        *,
        commit_interval_s: float = 0.5,
        commit_every: int = 1000,
        on_progress: Callable[[int, int, int], None] | None = None,
        on_deleted: Callable[[int], None] | None = None,
        model: EmbeddingModel | None = None,
        legacy_model: str = "",
        embedder: Embedder | None = None,
        filter_keys: frozenset[str] = frozenset(),
    ) -> None:
        self._store = store
        # Metadata keys the indexes hold as filter terms (StoredTurn.filter_terms).
        self._filter_keys = filter_keys
        # The vector index's model; None: take every stored vector as it is (tests of
        # other behaviour). `legacy_model` is what a vector stored without a name is.
        self._model = model
        self._legacy = legacy_model
        self._embedder = embedder
        self.embedded = 0  # turns this projector had embedded again for its model
        self.unembedded = 0  # turns left out of the vector index: no embedder to ask
        self._lexical = lexical
        self._vectors = vectors
        self._interval = commit_interval_s
        self._every = commit_every
        self._on_progress = on_progress  # (store seq, lexical seq, vector seq), for metrics
        # (the highest Deletion seq applied): an erasure reached the index files, whose
        # segments keep the deleted documents until they are rewritten (service.py).
        self._on_deleted = on_deleted
        self._wake = threading.Condition()
        self._visible = threading.Condition()
        self._stop = False
        self._urgent = False  # a caller waits for visibility: commit on the next step
        self.failures = 0  # failed attempts to apply (the thread retries with backoff)
        self._thread: threading.Thread | None = None
        # In memory: what each index has applied (lexical: applied, not yet committed).
        self._lexical_applied = lexical.applied_seq()
        self._lexical_committed = self._lexical_applied
        self._vector_applied = vectors.applied_seq()
        # Whether the last step wrote each index itself (see the module docstring).
        self._vector_writer = True
        self._lexical_writer = True

    def lag(self) -> tuple[int, int]:
        """Sequence numbers not yet searchable in (lexical, vector)."""
        last = self._store.last_seq()
        return last - self._lexical_committed, last - self._vector_applied

    def visible_seq(self) -> int:
        """The last seq searchable in both indexes."""
        return min(self._lexical_committed, self._vector_applied)

    def catch_up(
        self,
        progress: Callable[[int], None] | None = None,
        *,
        until: int | None = None,
        wait_shared: bool = False,
        pace: float = 0.0,
    ) -> int:
        """Apply what the indexes missed (synchronously), up to the store's last seq when
        called (or `until`); returns changes applied. Bounded on purpose: with writes
        arriving meanwhile, "until nothing is left" might never come. `progress(total so
        far)` is called after each page, for long rebuilds. `wait_shared`: when another
        replica writes the shared vector index, wait until it got there too (a replica
        starting up must not serve before its searches see everything). `pace`: after
        each page, sleep this many times as long as the page took (a rebuild beside live
        indexes: the pages hold the GIL, and searches wait for it)."""
        target = self._store.last_seq() if until is None else until
        total = 0
        since = time.monotonic()
        while self.visible_seq() < target:
            began = time.monotonic()
            applied = self._step(force_commit=True)
            total += applied
            if pace and applied:
                time.sleep(pace * (time.monotonic() - began))
            if progress is not None and applied:
                progress(total)
            if applied == 0:
                if not wait_shared or not self._waiting_for_shared(target):
                    break
                if time.monotonic() - since >= SHARED_LOG_S:
                    since = time.monotonic()
                    log.info(
                        "waiting for the shared indexes: at seq %d (lexical) and %d (vector) of %d",
                        self._lexical_committed,
                        self._vector_applied,
                        target,
                    )
                time.sleep(SHARED_POLL_S)
        return total

    def _waiting_for_shared(self, target: int) -> bool:
        """Whether an index another replica writes has not reached `target` yet."""
        return (not self._vector_writer and self._vector_applied < target) or (
            not self._lexical_writer and self._lexical_committed < target
        )

    def _step(self, force_commit: bool = False) -> int:
        vector_writer = self._vectors.writable()
        if not vector_writer or not self._vector_writer:
            # Another replica writes the shared index, or did until now: the index's own
            # record is the progress (what this replica last knew may be stale).
            self._vector_applied = self._vectors.applied_seq()
        self._vector_writer = vector_writer
        lexical_writer = self._lexical.writable()
        if not lexical_writer or not self._lexical_writer:
            self._lexical_applied = self._lexical_committed = self._lexical.applied_seq()
        self._lexical_writer = lexical_writer
        starts = [
            applied
            for writer, applied in (
                (lexical_writer, self._lexical_applied),
                (vector_writer, self._vector_applied),
            )
            if writer
        ]
        changes = (
            [self._with_filters(c) for c in self._store.changes(min(starts), PAGE)]
            if starts
            else []
        )
        if changes:
            lexical = (
                [c for c in changes if c.seq > self._lexical_applied] if lexical_writer else []
            )
            if lexical:
                self._lexical.apply(self._documents(lexical))
                self._lexical_applied = lexical[-1].seq
                deleted = [c.seq for c in lexical if isinstance(c, Deletion)]
                if deleted and self._on_deleted is not None:
                    self._on_deleted(max(deleted))
            vector = [c for c in changes if c.seq > self._vector_applied] if vector_writer else []
            if vector:
                self._vectors.apply(self._own_vectors(vector))
                self._vector_applied = vector[-1].seq
        pending = self._lexical_applied - self._lexical_committed
        if pending and (force_commit or pending >= self._every):
            self._lexical.commit()
            self._lexical_committed = self._lexical_applied
        self._report()
        return len(changes)

    def _with_filters(self, change: Change) -> Change:
        """The turn with the filter terms of its declared metadata keys (only those reach
        the indexes: other metadata, which may be anything, stays in the turn store)."""
        if not isinstance(change, StoredTurn) or not self._filter_keys:
            return change
        declared = {k: v for k, v in change.metadata.items() if k in self._filter_keys}
        return replace(change, filter_terms=tuple(metadata_terms(declared)))

    def _own_vectors(self, changes: list[Change]) -> list[Change]:
        """The changes with every turn's vector of this index's model (module docstring)."""
        if self._model is None:
            return changes
        own = self._model.name
        foreign = {
            i: c
            for i, c in enumerate(changes)
            if isinstance(c, StoredTurn)
            and c.vector is not None
            and (c.vector_model or self._legacy) != own
        }
        if not foreign:
            return changes
        found = self._store.model_vectors(own, [(c.tenant, c.memory_id) for c in foreign.values()])
        missing = [c for c in foreign.values() if (c.tenant, c.memory_id) not in found]
        if missing:
            found.update(self._embed(own, missing))
        out = list(changes)
        for i, c in foreign.items():
            out[i] = replace(c, vector=found.get((c.tenant, c.memory_id)), vector_model=own)
        return out

    def _embed(self, model: str, turns: list[StoredTurn]) -> dict[tuple[str, str], Vector]:
        if self._embedder is None:
            # Only a misconfiguration gets here (writes of another model are refused
            # without an embedder): keep the turn BM25-searchable rather than stall.
            self.unembedded += len(turns)
            log.warning(
                "%d turns carry no vector of %s and no embedding service is configured: "
                "they are left out of the vector index",
                len(turns),
                model,
            )
            return {}
        unique = {(t.tenant, t.memory_id): t for t in turns}
        rows = self._embedder.embed(
            [vector_text(t.text, t.metadata) for t in unique.values()], model
        )
        kept = list(zip(unique, rows, strict=True))
        self._store.put_model_vectors(model, [(k[0], k[1], row) for k, row in kept])
        self.embedded += len(kept)
        metrics.TURNS_EMBEDDED.inc(len(kept))
        return dict(kept)

    def _documents(self, changes: list[Change]) -> list[Change]:
        """Turns with their BM25 document (the turn in its context), deletions as they are."""
        turns = [c for c in changes if isinstance(c, StoredTurn)]
        previous = self._store.previous(turns) if turns else {}
        return [
            replace(c, document=lexical_document(c, previous.get(c.memory_id)))
            if isinstance(c, StoredTurn)
            else c
            for c in changes
        ]

    def _report(self) -> None:
        with self._visible:
            self._visible.notify_all()
        if self._on_progress is not None:
            self._on_progress(self._store.last_seq(), self._lexical_committed, self._vector_applied)

    def start(self) -> None:
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="projector", daemon=True)
        self._thread.start()

    def notify(self, *, urgent: bool = False) -> None:
        """A write was committed: wake the projector. `urgent`: a caller is waiting to see
        it, so commit the lexical index now instead of at the next interval (a bulk
        loader should not ask for this: it would cost a commit per request)."""
        with self._wake:
            if urgent:
                self._urgent = True
            self._wake.notify()

    def _run(self) -> None:
        last_commit = time.monotonic()
        backoff = 0.0
        while True:
            with self._wake:
                if self._stop:
                    return
                if backoff:
                    self._wake.wait(timeout=backoff)  # after a failure: don't spin
                elif not self._urgent:
                    self._wake.wait(timeout=self._interval)
                urgent, self._urgent = self._urgent, False
            due = urgent or time.monotonic() - last_commit >= self._interval
            try:
                while self._step(force_commit=due) == PAGE:
                    pass  # a backlog: keep going before sleeping
            except Exception:
                # An index that fails (disk full, a Qdrant server down) must not kill the
                # thread: the writes are safe in the turn store, and the next attempt
                # resumes from the last applied seq.
                self.failures += 1
                backoff = min(max(backoff * 2, 0.1), 5.0)
                log.exception("projector: applying changes failed; retrying in %.1f s", backoff)
                continue
            backoff = 0.0
            if due:
                last_commit = time.monotonic()

    def wait_visible(self, seq: int, timeout: float) -> bool:
        """Block until `seq` is searchable in both indexes, or `timeout` passes."""
        end = time.monotonic() + timeout
        with self._visible:
            while self.visible_seq() < seq:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.notify(urgent=True)
                self._visible.wait(timeout=min(left, 0.05))
        return True

    def stop(self) -> None:
        """Stop the thread; what it has not applied stays in the feed."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        """Stop the thread, then apply and commit what is left."""
        self.stop()
        self.catch_up()
