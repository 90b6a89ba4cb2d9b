"""Keeps both indexes in step with the turn store, the source of truth.

A write is acknowledged once the turn store committed it; the projector then applies the
change feed to the indexes on its own thread. Tantivy commits are batched (every
`commit_interval_s` or `commit_every` changes: a commit per request would cost an fsync
and a segment each); the vector index is durable per apply. Each index records the last
seq it applied, so at start `catch_up()` replays only what it missed, and `rebuild()` is
the same from seq 0 into empty indexes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hippo_retrieval.domain.ports import LexicalIndex, TurnStore, VectorIndex

PAGE = 1000


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
    ) -> None:
        self._store = store
        self._lexical = lexical
        self._vectors = vectors
        self._interval = commit_interval_s
        self._every = commit_every
        self._on_progress = on_progress  # (store seq, lexical seq, vector seq), for metrics
        self._wake = threading.Condition()
        self._visible = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        # In memory: what each index has applied (lexical: applied, not yet committed).
        self._lexical_applied = lexical.applied_seq()
        self._lexical_committed = self._lexical_applied
        self._vector_applied = vectors.applied_seq()

    def lag(self) -> tuple[int, int]:
        """Sequence numbers not yet searchable in (lexical, vector)."""
        last = self._store.last_seq()
        return last - self._lexical_committed, last - self._vector_applied

    def catch_up(self) -> int:
        """Apply everything the indexes missed (synchronously); returns changes applied."""
        total = 0
        while True:
            applied = self._step(force_commit=True)
            total += applied
            if applied == 0:
                return total

    def _step(self, force_commit: bool = False) -> int:
        start = min(self._lexical_applied, self._vector_applied)
        changes = self._store.changes(start, PAGE)
        if changes:
            lexical = [c for c in changes if c.seq > self._lexical_applied]
            vector = [c for c in changes if c.seq > self._vector_applied]
            if lexical:
                self._lexical.apply(lexical)
                self._lexical_applied = lexical[-1].seq
            if vector:
                self._vectors.apply(vector)
                self._vector_applied = vector[-1].seq
        pending = self._lexical_applied - self._lexical_committed
        if pending and (force_commit or pending >= self._every):
            self._lexical.commit()
            self._lexical_committed = self._lexical_applied
        self._report()
        return len(changes)

    def _report(self) -> None:
        with self._visible:
            self._visible.notify_all()
        if self._on_progress is not None:
            self._on_progress(self._store.last_seq(), self._lexical_committed, self._vector_applied)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="projector", daemon=True)
        self._thread.start()

    def notify(self) -> None:
        """A write was committed: wake the projector."""
        with self._wake:
            self._wake.notify()

    def _run(self) -> None:
        last_commit = time.monotonic()
        while True:
            with self._wake:
                if self._stop:
                    return
                self._wake.wait(timeout=self._interval)
            due = time.monotonic() - last_commit >= self._interval
            while self._step(force_commit=due) == PAGE:
                pass  # a backlog: keep going before sleeping
            if due:
                last_commit = time.monotonic()

    def wait_visible(self, seq: int, timeout: float) -> bool:
        """Block until `seq` is searchable in both indexes, or `timeout` passes."""
        end = time.monotonic() + timeout
        with self._visible:
            while min(self._lexical_committed, self._vector_applied) < seq:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.notify()
                self._visible.wait(timeout=min(left, 0.05))
        return True

    def close(self) -> None:
        """Stop the thread, then apply and commit what is left."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        self.catch_up()
