"""The lexical index on Qdrant sparse vectors: BM25 in the Qdrant engine itself.

Why: Tantivy is a file on one replica's disk; a Qdrant cluster shards and replicates
what it holds. With BM25 in Qdrant too, a retrieval replica keeps no index of its own
(docs/recall.md, "BM25 in Qdrant"). Tantivy stays the BM25 engine of `make run`.

Analysis. The very same terms as the Tantivy index (analysis.py: its tokenizers, stemmer
and stop words, through Tantivy's own analyzers): the turn's context document (date,
speaker, previous turn, attachment: documents.py) in `text`, the turn's own words in
`exact`.

One sparse vector, two term spaces. A term's dimension is a 32-bit hash of its field and
the term (`term_id`), so `text:run` and `exact:run` are different dimensions; both
fields live in one sparse vector `lexical`. Why not two named sparse vectors: BM25 over
several fields is the sum of each field's score, and one sparse dot product computes
exactly that sum in one query, where two vectors would need a fusion step (which ranks,
not sums). A hash collision (~1 pair among 100k distinct terms) merges two rare terms.

Weights. BM25 as Tantivy computes it (k1 1.2, b 0.75), split between the two sides:
* the document side holds each term's saturated frequency,
  tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / AVERAGE)), with the field's length
  in tokens. The average is a constant per field (AVG_TEXT_TOKENS, AVG_EXACT_TOKENS),
  not the corpus's running mean as in Tantivy: a stored weight cannot follow a mean that
  changes after it is written. b only scales how much longer-than-usual documents are
  discounted, so a constant within 2x of the true mean changes little (measured:
  bench/recall_locomo.py --lexical both);
* the engine multiplies by IDF (`Modifier.IDF`: ln(1 + (N - n + 0.5) / (n + 0.5)),
  Tantivy's formula), over every point of the collection, as Tantivy's is over the index;
* the query side weighs each distinct `text` term 1 and each identifier term
  EXACT_BOOST, as the Tantivy query does.

Tenancy, as the vector index: the payload is edge_vectors.payload (tenant, user, session,
role, time, metadata terms) with the tenant's keyword index marked `is_tenant`; every
search puts the whole scope in the engine's `must` filter; writes are conditional on the
tenant and deletions delete by (tenant AND id). This follows Qdrant's multitenancy
guidance for many small tenants (one collection partitioned by a payload field), which
fits Hippo: tenants hold users, and a user's turns, not a tenant's, are what one search
reads. Dedicated shards per tenant (custom sharding) fit a few large tenants, and can be
added on the server without changing this adapter's filters.

Typo repair (`typos=True`, as the Tantivy index's): a query term of 4+ letters that none
of the user's turns holds is replaced by the terms one edit away that some do, each
weighted TYPO_WEIGHT. The engine has no term dictionary to ask, so the index itself is
asked, within the search's own scope (`repairs`): a batch of single-term queries (limit
1) says which query terms no turn holds, and one query per unknown term, with all its
one-edit candidates, reads which of those occur in the REPAIR_SCAN best-matching turns.
Measured in-process (bench/lexical_parity.py): BM25 p50 4.9 ms per informal dev question
against 1.3 ms for Tantivy's repair, 1.9 ms against 0.6 ms on the clean questions. Unlike
Tantivy's, which asks the whole index, this asks only the user's own turns: another
user's vocabulary never steers a repair.

Writes are durable on `apply` (the engine's WAL, then flush), so `commit` has nothing to
do: changes are searchable as soon as they are applied.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from qdrant_client import QdrantClient, models
from qdrant_edge import (
    EdgeConfig,
    EdgeSparseVectorParams,
    Modifier,
    Query,
    QueryBatchRequest,
    QueryRequest,
    SparseVector,
)
from qdrant_edge import Filter as EdgeFilter

from hippo_core.typos import one_edit
from hippo_retrieval.adapters import qdrant_vectors
from hippo_retrieval.adapters.analysis import (
    EXACT_BOOST,
    TYPO_MAX_TERMS,
    TYPO_MIN_CHARS,
    TYPO_WEIGHT,
    Analysis,
    QueryTerms,
    clean_text,
)
from hippo_retrieval.adapters.edge_vectors import MEMORY_ID, TIME, EdgeIndex, scope_filter
from hippo_retrieval.adapters.qdrant_vectors import ONE_NODE, Layout, QdrantIndex
from hippo_retrieval.domain.models import Candidate, Scope, StoredTurn

LEXICAL = "lexical"  # the sparse vector's name
K1 = 1.2  # Tantivy's BM25 constants
B = 0.75
# Typical lengths in tokens: a chat turn of about 20 words and, in `text`, the previous
# turn, the date and the names that its context document adds (documents.py).
AVG_TEXT_TOKENS = 48.0
AVG_EXACT_TOKENS = 20.0
TEXT_SPACE = b"t\x1f"  # term spaces: a term's dimension hashes its field too
EXACT_SPACE = b"x\x1f"

Sparse = tuple[list[int], list[float]]  # indices, values
BATCH = 1024  # single-term queries per batch (typo repair's exact checks)
REPAIR_SCAN = 100  # turns whose terms one typo-repair query reads


def hashed(space: bytes, term: str) -> int:
    """The dimension of `term` in a field's term space: 32 bits of BLAKE2b, stable across
    processes and versions (Python's hash() is salted per process)."""
    digest = hashlib.blake2b(space + term.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "little")


# `hashed`, remembered: words are Zipfian, so most lookups hit (hashing was ~45% of the
# encoding time). Typo candidates, which are mostly not words, use `hashed` itself.
term_id = lru_cache(maxsize=1 << 16)(hashed)


class SparseEncoder:
    """Turns and queries as BM25 sparse vectors (module docstring)."""

    def __init__(self) -> None:
        self._analysis = Analysis()

    def document(self, turn: StoredTurn) -> Sparse:
        text = clean_text(turn.document or turn.text)
        exact = clean_text(turn.text)
        weights: defaultdict[int, float] = defaultdict(float)
        for space, tokens, average in (
            (TEXT_SPACE, self._analysis.text.analyze(text), AVG_TEXT_TOKENS),
            (EXACT_SPACE, self._analysis.exact.analyze(exact), AVG_EXACT_TOKENS),
        ):
            norm = K1 * (1 - B + B * len(tokens) / average)
            for term, tf in Counter(tokens).items():
                weights[term_id(space, term)] += tf * (K1 + 1) / (tf + norm)
        return _sorted(weights)

    def query_terms(self, query: str, repairs: Mapping[str, str] | None = None) -> QueryTerms:
        return self._analysis.query_terms(query, repairs)

    def query(self, terms: QueryTerms, repairs: Mapping[str, Mapping[str, float]] = {}) -> Sparse:
        """The query's vector; a term in `repairs` is searched as its repairs instead
        (term -> weight; none: the term is dropped)."""
        weights: defaultdict[int, float] = defaultdict(float)
        searched: set[str] = set()  # each word once, as the Tantivy index searches them
        for term in terms.text:
            found = repairs.get(term, {term: 1.0})
            for repair, weight in found.items():
                if weight >= 1.0:  # the word itself, or the caller's repair of it
                    if repair in searched:
                        continue
                    searched.add(repair)
                weights[term_id(TEXT_SPACE, repair)] += weight
        for term in terms.exact:
            weights[term_id(EXACT_SPACE, term)] += EXACT_BOOST
        return _sorted(weights)


class Vocabulary:
    """What typo repair asks of an index, within one search's scope. The engines differ
    only in how a query is written (`request(dimensions, limit, with_vectors)`), run
    (`run(requests)`: each request's hits) and read (`indices(hit)`: the dimensions of a
    hit's sparse vector)."""

    def __init__(
        self,
        request: Callable[[list[int], int, bool], Any],
        run: Callable[[list[Any]], list[Sequence[Any]]],
        indices: Callable[[Any], Iterable[int]],
    ) -> None:
        self._request = request
        self._run = run
        self._indices = indices

    def among(self, dimensions: list[int]) -> set[int]:
        """Those of `dimensions` found in the REPAIR_SCAN turns of the scope that match
        most of them (one query; a dimension held only by turns beyond those is missed,
        which costs a repair, never a wrong one)."""
        wanted = set(dimensions)
        [hits] = self._run([self._request(sorted(wanted), REPAIR_SCAN, True)])
        found: set[int] = set()
        for hit in hits:
            found.update(wanted.intersection(self._indices(hit)))
        return found

    def each(self, dimensions: list[int]) -> list[bool]:
        """For each dimension, whether any turn of the scope holds it (exact: single-term
        queries, BATCH to a batch)."""
        out: list[bool] = []
        for start in range(0, len(dimensions), BATCH):
            chunk = dimensions[start : start + BATCH]
            out.extend(
                bool(hits) for hits in self._run([self._request([d], 1, False) for d in chunk])
            )
        return out


def repairs(
    terms: QueryTerms, vocabulary: Vocabulary, *, edits: bool = True
) -> dict[str, dict[str, float]]:
    """What each query term no turn of the scope holds is searched as (term -> {repair:
    weight}; an empty one drops the term), the rest being searched as typed:
    - a term the caller repaired (`terms.hints`): its repair, when some turn holds it
      (a stop word: nothing);
    - otherwise, with `edits` (typo repair, module docstring), for the first
      TYPO_MAX_TERMS unknown terms of TYPO_MIN_CHARS+ letters, the terms one edit away
      that the scope's turns hold, at TYPO_WEIGHT each; a term with no such neighbour is
      searched as typed.
    Queries: one batch of single-term ones for the query's terms and the hints, one per
    unknown term with all its one-edit candidates."""
    probe = [t for t in terms.text if t in terms.hints or (edits and len(t) >= TYPO_MIN_CHARS)]
    if not probe:
        return {}
    # The caller's repairs are asked in the same batch: one round trip, not two.
    hints = [h for t in probe if (h := terms.hints.get(t)) is not None]
    asked = list(dict.fromkeys([*probe, *hints]))
    held = dict(zip(asked, vocabulary.each([term_id(TEXT_SPACE, t) for t in asked]), strict=True))
    unknown = [t for t in probe if not held[t]]
    out: dict[str, dict[str, float]] = {}
    for term in unknown:
        if term not in terms.hints:
            continue
        hint = terms.hints[term]
        if hint is None:
            out[term] = {}  # repaired to a stop word
        elif held[hint]:
            out[term] = {hint: 1.0}
    edited = [t for t in unknown if t not in out and len(t) >= TYPO_MIN_CHARS]
    for term in edited[:TYPO_MAX_TERMS] if edits else ():
        candidates = {hashed(TEXT_SPACE, c): c for c in one_edit(term)}
        found = vocabulary.among(list(candidates))
        if found:
            out[term] = {candidates[d]: TYPO_WEIGHT for d in sorted(found) if d in candidates}
    return out


def _sorted(weights: dict[int, float]) -> Sparse:
    indices = sorted(weights)
    return indices, [weights[i] for i in indices]


def ranked(points: Iterable[Any]) -> list[Candidate]:
    """Scored points (either engine's: `score`, and `payload` with MEMORY_ID and TIME)
    best first; equal scores earlier turn first, then by id, as the Tantivy index breaks
    ties (a replica and a rebuilt index rank alike)."""
    ordered = sorted(
        (-float(p.score), int((p.payload or {})[TIME]), str((p.payload or {})[MEMORY_ID]))
        for p in points
    )
    return [Candidate(memory_id=m, score=-negative) for negative, _, m in ordered]


def edge_config() -> EdgeConfig:
    return EdgeConfig(
        vectors={},
        sparse_vectors={LEXICAL: EdgeSparseVectorParams(modifier=Modifier.Idf)},
    )


class EdgeLexicalIndex(EdgeIndex):
    """`LexicalIndex` over an in-process Qdrant edge shard at `path` (sparse vectors)."""

    _what = "lexical shard"

    def __init__(self, path: Path, *, typos: bool = False) -> None:
        self._encoder = SparseEncoder()
        self._typos = typos
        super().__init__(path, edge_config())

    def _point_vector(self, turn: StoredTurn) -> dict[str, SparseVector]:
        indices, values = self._encoder.document(turn)
        return {LEXICAL: SparseVector(indices, values)}

    def commit(self) -> None:
        """Nothing to write: `apply` is durable and searchable on return."""
        with self._lock:
            self._require()  # but a closed index refuses, as Tantivy's does

    def search(
        self,
        scope: Scope,
        query: str,
        limit: int,
        query_repairs: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        if limit <= 0:
            return []
        terms = self._encoder.query_terms(query, query_repairs)
        where = scope_filter(scope)
        fixed = repairs(terms, self._vocabulary(where), edits=self._typos)
        indices, values = self._encoder.query(terms, fixed)
        if not indices:
            return []
        request = QueryRequest(
            limit=limit,
            query=Query.Nearest(SparseVector(indices, values), using=LEXICAL),
            filter=where,
            with_payload=[MEMORY_ID, TIME],
        )
        return ranked(self._query(request))

    def _vocabulary(self, where: EdgeFilter) -> Vocabulary:
        def request(dimensions: list[int], limit: int, vectors: bool) -> QueryRequest:
            weights = [1.0] * len(dimensions)
            return QueryRequest(
                limit=limit,
                query=Query.Nearest(SparseVector(dimensions, weights), using=LEXICAL),
                filter=where,
                with_vector=vectors,
            )

        def run(requests: list[QueryRequest]) -> list[Sequence[Any]]:
            with self._lock:
                return list(self._require().query_batch(QueryBatchRequest(requests)))

        return Vocabulary(request, run, lambda hit: hit.vector[LEXICAL].indices)


class QdrantLexicalIndex(QdrantIndex):
    """`LexicalIndex` over the collection `collection` of a Qdrant server (sparse
    vectors; qdrant_vectors.QdrantIndex says how writes and the applied seq work)."""

    def __init__(
        self,
        client: QdrantClient,
        collection: str,
        *,
        concurrent_searches: bool = False,
        layout: Layout = ONE_NODE,
        typos: bool = False,
    ) -> None:
        self._encoder = SparseEncoder()
        self._typos = typos
        super().__init__(client, collection, concurrent_searches=concurrent_searches, layout=layout)

    def _vectors(self) -> dict[str, models.VectorParams]:
        return {}

    def _sparse(self) -> dict[str, models.SparseVectorParams]:
        return {LEXICAL: models.SparseVectorParams(modifier=models.Modifier.IDF)}

    def _point_vector(self, turn: StoredTurn) -> dict[str, models.SparseVector]:
        indices, values = self._encoder.document(turn)
        return {LEXICAL: models.SparseVector(indices=indices, values=values)}

    def commit(self) -> None:
        """Nothing to write: `apply` is durable and searchable on return."""
        with self._lock:
            self._require_open()  # but a closed index refuses, as Tantivy's does

    def search(
        self,
        scope: Scope,
        query: str,
        limit: int,
        query_repairs: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        if limit <= 0:
            return []
        terms = self._encoder.query_terms(query, query_repairs)
        where = qdrant_vectors.scope_filter(scope)
        fixed = repairs(terms, self._vocabulary(where), edits=self._typos)
        indices, values = self._encoder.query(terms, fixed)
        if not indices:
            return []
        points = self._query(
            models.SparseVector(indices=indices, values=values),
            LEXICAL,
            where,
            limit,
            [MEMORY_ID, TIME],
        )
        return ranked(points)

    def _vocabulary(self, where: models.Filter) -> Vocabulary:
        def request(dimensions: list[int], limit: int, vectors: bool) -> models.QueryRequest:
            return models.QueryRequest(
                query=models.SparseVector(indices=dimensions, values=[1.0] * len(dimensions)),
                using=LEXICAL,
                filter=where,
                limit=limit,
                with_vector=[LEXICAL] if vectors else False,
            )

        def run(requests: list[models.QueryRequest]) -> list[Sequence[Any]]:
            return [response.points for response in self._query_batch(requests)]

        return Vocabulary(request, run, _sparse_indices)


def _sparse_indices(point: models.ScoredPoint) -> list[int]:
    """The dimensions of a point's `lexical` sparse vector (none if it came without)."""
    vectors = point.vector if isinstance(point.vector, dict) else {}
    vector = vectors.get(LEXICAL)
    return vector.indices if isinstance(vector, models.SparseVector) else []


__all__ = ["EdgeLexicalIndex", "QdrantLexicalIndex", "SparseEncoder", "term_id"]
