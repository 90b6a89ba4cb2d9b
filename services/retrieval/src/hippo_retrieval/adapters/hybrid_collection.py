"""BM25 and vectors in one Qdrant collection, fused by the engine (`fusion=server`).

What it is: each point holds both of a turn's vectors, the dense `dense` and the sparse
BM25 `lexical` (sparse_lexical.py: the same analysis and weights as the separate BM25
collection), with the usual payload. A hybrid search is then one query: two prefetches
(BM25 and nearest neighbours, each `candidates` deep, each inside the whole scope) fused
on the server by weighted Reciprocal Rank Fusion (`RrfQuery`), so one request crosses the
network and one list of fused candidates comes back, where client-side fusion asks for
two lists and fuses them here. On a sharded cluster the fusion runs where the shards'
results meet, next to the data.

What differs from client-side fusion (domain/fusion.py), and why it is an option:
* Qdrant's weighted RRF is 1 / (rank / w + k' - 1) = w / (rank + w (k' - 1)): a weight
  scales a list's scores and moves its offset with them, where Hippo's, w / (k + rank),
  scales only. With w = 1 both are RRF, and k' = k + 1 gives the very same scores
  (`engine_k`). With other weights no choice is exact; `engine_weights` keeps their
  ratios (how much more BM25 counts than vectors) and divides them by their geometric
  mean, so the lists' offsets w (k' - 1) sit around Hippo's k on both sides of it (over
  ranks 1-100 this is 5x closer to Hippo's scores than passing the weights as they are;
  docs/recall.md has the measured recall of both).
* The engine returns the fused order, not each retriever's ranks: hits report no
  lexical or semantic rank (0), and the search reports no per-retriever candidate
  counts, so the audit log records only the fused order.
The neighbour and speaker steps run after either fusion, on the fused scores.

Writes. Both of a point's vectors are written in one upsert. The projector applies a
page's BM25 documents to the lexical side and its vectors to the vector side (two ports,
one collection): `OneCollection` holds the documents from the lexical side's `apply`
until the vector side's `apply` writes each turn with both, so a collection with one
applied seq is never half written. Deletions go once, from the vector side.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from qdrant_client import QdrantClient, models

from hippo_retrieval.adapters import qdrant_vectors
from hippo_retrieval.adapters.edge_vectors import MEMORY_ID, TIME, turn_row, vector_list
from hippo_retrieval.adapters.qdrant_vectors import ONE_NODE, Layout
from hippo_retrieval.adapters.sparse_lexical import LEXICAL, QdrantLexicalIndex, ranked, repairs
from hippo_retrieval.domain.models import (
    Candidate,
    Change,
    GraphState,
    Scope,
    StoredTurn,
    Vector,
)

DENSE = "dense"  # the dense vector's name

log = logging.getLogger(__name__)


def engine_k(k: float) -> int:
    """Qdrant's RRF constant for Hippo's `k`: the engine scores rank r (1-based) with
    1 / (r + k' - 1), Hippo with 1 / (r + k); the engine's k is a whole number."""
    return max(1, round(k) + 1)


def engine_weights(weights: tuple[float, float]) -> tuple[float, float]:
    """Qdrant's RRF weights for Hippo's (module docstring): the same ratio, geometric mean
    1 over the positive ones (a weight of 0 stays 0: that list adds nothing in both)."""
    positive = [w for w in weights if w > 0]
    if not positive:
        return (0.0, 0.0)
    mean = math.exp(sum(math.log(w) for w in positive) / len(positive))
    return (weights[0] / mean, weights[1] / mean)


class QdrantHybridIndex(QdrantLexicalIndex):
    """One collection of a Qdrant server with both vectors per point: the BM25 search of
    `QdrantLexicalIndex` (its `search`), nearest neighbours (`nearest`), and both fused in
    the engine (`hybrid`)."""

    def __init__(
        self,
        client: QdrantClient,
        collection: str,
        dimension: int,
        *,
        concurrent_searches: bool = False,
        layout: Layout = ONE_NODE,
        typos: bool = False,
    ) -> None:
        if dimension <= 0:
            raise ValueError("dimension must be positive")
        self._dimension = dimension
        super().__init__(
            client,
            collection,
            concurrent_searches=concurrent_searches,
            layout=layout,
            typos=typos,
        )

    def _vectors(self) -> dict[str, models.VectorParams]:
        return {DENSE: models.VectorParams(size=self._dimension, distance=models.Distance.COSINE)}

    def _point_vector(self, turn: StoredTurn) -> dict[str, Any]:
        vectors: dict[str, Any] = super()._point_vector(turn)  # the BM25 vector
        row = turn_row(turn, self._dimension)
        if row is not None:  # a turn without a vector is still found by its words
            vectors[DENSE] = row
        return vectors

    def count_vectors(self) -> int:
        """Points with a dense vector (all tenants): `count()` counts every turn."""
        with self._lock:
            self._require_open()
            dense = models.Filter(must=[models.HasVectorCondition(has_vector=DENSE)])
            return self._client.count(self._collection, count_filter=dense, exact=True).count

    def nearest(self, scope: Scope, vector: Vector, limit: int) -> list[Candidate]:
        return self._nearest(scope, vector, self._dimension, DENSE, limit)

    def hybrid(
        self,
        scope: Scope,
        query: str,
        vector: Vector,
        candidates: int,
        k: float,
        weights: tuple[float, float],
        query_repairs: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        """BM25 and nearest neighbours, `candidates` each, fused in the engine by RRF with
        Hippo's `k` and (BM25, vector) `weights` (`engine_k`, `engine_weights`): the
        fused candidates, best first (at most 2 x candidates: every one either retriever
        found)."""
        if candidates <= 0:
            return []
        where = qdrant_vectors.scope_filter(scope)
        terms = self._encoder.query_terms(query, query_repairs)
        fixed = repairs(terms, self._vocabulary(where), edits=self._typos)
        indices, values = self._encoder.query(terms, fixed)
        dense = vector_list(vector, self._dimension, "the query")
        prefetch: list[models.Prefetch] = []
        used: list[float] = []
        weights = engine_weights(weights)
        if indices:
            sparse = models.SparseVector(indices=indices, values=values)
            prefetch.append(
                models.Prefetch(query=sparse, using=LEXICAL, filter=where, limit=candidates)
            )
            used.append(weights[0])
        if dense is not None:
            prefetch.append(
                models.Prefetch(query=dense, using=DENSE, filter=where, limit=candidates)
            )
            used.append(weights[1])
        if not prefetch:
            return []
        fusion = models.RrfQuery(rrf=models.Rrf(k=engine_k(k), weights=used))
        points = self._query(fusion, None, where, 2 * candidates, [MEMORY_ID, TIME], prefetch)
        return ranked(points)


class Writer(Protocol):
    """What writes the collection: the index itself, or a `LeasedIndex` over it."""

    def writable(self) -> bool: ...

    def apply(self, changes: Sequence[Change]) -> None: ...

    def applied_seq(self) -> int: ...


class OneCollection:
    """The lexical and the vector port over one `QdrantHybridIndex` (module docstring:
    writes). `writer` applies (the index, or a LeasedIndex over it in cluster mode);
    `close` closes the index unless `owned` is False (a shared collection: the index
    set shuts it down)."""

    def __init__(self, index: QdrantHybridIndex, writer: Writer, *, owned: bool = True) -> None:
        self.index = index
        self._writer = writer
        self._owned = owned
        self._documents: dict[int, str] = {}  # seq -> BM25 document, until written
        self._lock = threading.Lock()
        self.lexical = _LexicalSide(self)
        self.vectors = _VectorSide(self)

    def writable(self) -> bool:
        return self._writer.writable()

    def applied_seq(self) -> int:
        return self._writer.applied_seq()

    def hold(self, changes: Sequence[Change]) -> None:
        with self._lock:
            for change in changes:
                if isinstance(change, StoredTurn):
                    self._documents[change.seq] = change.document

    def write(self, changes: Sequence[Change]) -> None:
        with self._lock:
            documents = dict(self._documents)
        joined: list[Change] = []
        for change in changes:
            if isinstance(change, StoredTurn):
                document = documents.get(change.seq)
                if document is None:
                    # Not handed to the lexical side first (the projector always does):
                    # the turn's own words still make it findable by BM25.
                    log.warning("turn seq %d has no BM25 document: indexed by its text", change.seq)
                    document = change.text
                change = replace(change, document=document)
            joined.append(change)
        self._writer.apply(joined)
        if changes:
            last = max(c.seq for c in changes)
            with self._lock:
                self._documents = {s: d for s, d in self._documents.items() if s > last}

    def close(self) -> None:
        if self._owned:
            self.index.close()


class _Side:
    def __init__(self, pair: OneCollection) -> None:
        self._pair = pair

    def writable(self) -> bool:
        return self._pair.writable()

    def applied_seq(self) -> int:
        return self._pair.applied_seq()

    def count(self) -> int:
        return self._pair.index.count()

    def close(self) -> None:
        self._pair.close()  # the index's close is idempotent: both sides may call it


class _LexicalSide(_Side):
    """`LexicalIndex`: holds the documents for the vector side's write."""

    def apply(self, changes: Sequence[Change]) -> None:
        self._pair.hold(changes)

    def commit(self) -> None:
        """Nothing to write (the vector side's apply is durable), but a closed
        collection refuses, as every lexical index does."""
        self._pair.index.commit()

    def search(
        self,
        scope: Scope,
        query: str,
        limit: int,
        query_repairs: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        return self._pair.index.search(scope, query, limit, query_repairs)


class _VectorSide(_Side):
    """`VectorIndex`, and the engine's fusion (`hybrid`, retriever.EngineFusion)."""

    def apply(self, changes: Sequence[Change]) -> None:
        self._pair.write(changes)

    def count(self) -> int:
        return self._pair.index.count_vectors()

    def search(self, scope: Scope, vector: Vector, limit: int) -> list[Candidate]:
        return self._pair.index.nearest(scope, vector, limit)

    def hybrid(
        self,
        scope: Scope,
        query: str,
        vector: Vector,
        candidates: int,
        k: float,
        weights: tuple[float, float],
        query_repairs: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        return self._pair.index.hybrid(scope, query, vector, candidates, k, weights, query_repairs)

    def graph_state(self) -> GraphState | None:
        return None  # the server's optimizer builds the graph

    def build_graph(self, cancelled: Callable[[], bool]) -> None:
        """Nothing to do: the server's optimizer builds it."""


__all__ = ["DENSE", "OneCollection", "QdrantHybridIndex", "engine_k", "engine_weights"]
