"""Hybrid search: BM25 top-N and vector top-N inside the scope, fused by RRF.

Each retriever is asked for `candidates` results (more than top_k: RRF rewards documents
both retrievers rank reasonably, and those can sit below either one's top_k). After
fusion (HYBRID only), a candidate next to a strong one in its session gets part of its
neighbour's score (fusion.neighbour_boost), and when the query names one of the
candidates' speakers, that speaker's turns gain (fusion.named_speaker). The turn store
then supplies the winners' rows; an id deleted between search and fetch is simply absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hippo_core.errors import InvalidArgument
from hippo_retrieval.domain.fusion import fuse
from hippo_retrieval.domain.models import Candidate, FusedHit, Mode, Scope, StoredTurn, Vector
from hippo_retrieval.domain.ports import LexicalIndex, TurnStore, VectorIndex

LEXICAL, SEMANTIC = "lexical", "semantic"


@dataclass(frozen=True)
class FusionConfig:
    # k = 5, not the customary 60: with flat 1/(60 + rank) scores the two lists' top
    # ranks barely differ and fusion blurs them (docs/recall.md: +9 points R@5 on LoCoMo,
    # chosen leave-one-conversation-out; flat from 2 to 10).
    k: float = 5.0
    # BM25 outweighs vectors a little: over turns indexed in context it is the stronger
    # retriever (bench/recall_locomo.py; flat from 1.0 to 2.0).
    weights: dict[str, float] = field(default_factory=lambda: {LEXICAL: 1.5, SEMANTIC: 1.0})
    candidates: int = 100  # per retriever
    max_top_k: int = 100
    neighbour_weight: float = 0.5  # fusion.neighbour_boost; 0 turns it off
    # A query that names one speaker is mostly answered by that speaker's own turns
    # (83% of LoCoMo's evidence): their scores x (1 + this). 0 turns it off.
    speaker_weight: float = 0.3


@dataclass(frozen=True)
class Hit:
    turn: StoredTurn
    fused: FusedHit


@dataclass(frozen=True)
class SearchResult:
    hits: list[Hit]
    lexical_candidates: int
    semantic_candidates: int
    embedding_model: str = ""  # the searched index's model (set by the service)


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
        # Hybrid only: LEXICAL and SEMANTIC show one retriever's own ranking.
        hybrid = mode == Mode.HYBRID
        steps = self._config.neighbour_weight > 0 or self._config.speaker_weight > 0
        fused = fuse(
            lists,
            k=self._config.k,
            weights=self._config.weights,
            limit=top_k,
            places=(lambda ids: self._store.locate(scope.tenant, scope.user, ids))
            if hybrid and steps
            else None,
            neighbour_weight=self._config.neighbour_weight,
            query=query,
            speaker_weight=self._config.speaker_weight,
        )
        turns = {
            t.memory_id: t
            for t in self._store.get(scope.tenant, scope.user, [h.memory_id for h in fused])
        }
        hits = [Hit(turns[h.memory_id], h) for h in fused if h.memory_id in turns]
        return SearchResult(hits, len(lists.get(LEXICAL, [])), len(lists.get(SEMANTIC, [])))
