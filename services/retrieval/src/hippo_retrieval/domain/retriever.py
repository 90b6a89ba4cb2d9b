"""Hybrid search: BM25 top-N and vector top-N inside the scope, fused by RRF.

Each retriever is asked for `candidates` results (more than top_k: RRF rewards documents
both retrievers rank reasonably, and those can sit below either one's top_k). The turn
store then supplies the fused winners' rows; an id deleted between search and fetch is
simply absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hippo_core.errors import InvalidArgument
from hippo_retrieval.domain.fusion import rrf
from hippo_retrieval.domain.models import Candidate, FusedHit, Mode, Scope, StoredTurn, Vector
from hippo_retrieval.domain.ports import LexicalIndex, TurnStore, VectorIndex

LEXICAL, SEMANTIC = "lexical", "semantic"


@dataclass(frozen=True)
class FusionConfig:
    k: float = 60.0
    weights: dict[str, float] = field(default_factory=lambda: {LEXICAL: 1.0, SEMANTIC: 1.0})
    candidates: int = 100  # per retriever
    max_top_k: int = 100


@dataclass(frozen=True)
class Hit:
    turn: StoredTurn
    fused: FusedHit


@dataclass(frozen=True)
class SearchResult:
    hits: list[Hit]
    lexical_candidates: int
    semantic_candidates: int


class Retriever:
    def __init__(
        self, store: TurnStore, lexical: LexicalIndex, vectors: VectorIndex, config: FusionConfig
    ) -> None:
        self._store = store
        self._lexical = lexical
        self._vectors = vectors
        self._config = config

    def search(
        self, scope: Scope, query: str, vector: Vector | None, mode: Mode, top_k: int
    ) -> SearchResult:
        if not 1 <= top_k <= self._config.max_top_k:
            raise InvalidArgument("top_k", f"must be 1..{self._config.max_top_k}, got {top_k}")
        lists: dict[str, list[Candidate]] = {}
        if mode in (Mode.HYBRID, Mode.LEXICAL):
            lists[LEXICAL] = self._lexical.search(scope, query, self._config.candidates)
        if mode in (Mode.HYBRID, Mode.SEMANTIC):
            if vector is None:
                raise InvalidArgument("query", "a semantic search needs the query's vector")
            lists[SEMANTIC] = self._vectors.search(scope, vector, self._config.candidates)
        fused = rrf(lists, k=self._config.k, weights=self._config.weights, limit=top_k)
        turns = {
            t.memory_id: t
            for t in self._store.get(scope.tenant, scope.user, [h.memory_id for h in fused])
        }
        hits = [Hit(turns[h.memory_id], h) for h in fused if h.memory_id in turns]
        return SearchResult(hits, len(lists.get(LEXICAL, [])), len(lists.get(SEMANTIC, [])))
