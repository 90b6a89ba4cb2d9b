"""Hybrid search: BM25 top-N and vector top-N inside the scope, fused by RRF.

Each retriever is asked for `candidates` results (more than top_k: RRF rewards documents
both retrievers rank reasonably, and those can sit below either one's top_k). After
fusion (HYBRID only), a candidate next to a strong one in its session gets part of its
neighbour's score (fusion.neighbour_boost), and when the query names one of the
candidates' speakers, that speaker's turns gain (fusion.named_speaker). The turn store
then supplies the winners' rows; an id deleted between search and fetch is simply absent.

Where the vector index also holds the BM25 vectors and fuses in the engine
(`EngineFusion`, Qdrant's weighted RRF over one collection: adapters/hybrid_collection.py),
a hybrid search is one call to it, and the same two steps follow on the fused scores.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from hippo_core.errors import InvalidArgument
from hippo_retrieval.domain.fusion import fuse, refine
from hippo_retrieval.domain.models import Candidate, FusedHit, Mode, Scope, StoredTurn, Vector
from hippo_retrieval.domain.ports import LexicalIndex, TurnStore, VectorIndex

LEXICAL, SEMANTIC = "lexical", "semantic"


def speaker_text(query: str, query_repairs: Mapping[str, str] | None) -> str:
    """What the speaker step reads for names: the query as typed and the caller's
    repairs of its words ("carolin" and "caroline" both name Caroline)."""
    if not query_repairs:
        return query
    return " ".join([query, *query_repairs.values()])


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
    # A turn with n content words, n under this, keeps √(n / this) of its score: "lol" and
    # "ok" match through the turn they answer and crowd out the facts. Off by default:
    # in a store of a few turns it can put a longer turn that does not match above a
    # terse one that does (docs/recall.md: the short-turn step). 8 where chats are short.
    short_turn_terms: int = 0

    @property
    def reads_places(self) -> bool:
        """Whether a step after fusion runs, and so needs the candidates' places."""
        return self.neighbour_weight > 0 or self.speaker_weight > 0 or self.short_turn_terms > 0


@runtime_checkable
class EngineFusion(Protocol):
    """A vector index that holds the BM25 vectors too and fuses both lists itself."""

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
        """`candidates` from each retriever, fused by weighted RRF (BM25, vector), best
        first, with their fused scores; `query_repairs` as LexicalIndex.search's."""
        ...


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
    # Fused in the engine: each retriever's candidates and ranks are unknown (0).
    engine_fused: bool = False


class Retriever:
    def __init__(
        self, store: TurnStore, lexical: LexicalIndex, vectors: VectorIndex, config: FusionConfig
    ) -> None:
        self._store = store
        self._lexical = lexical
        self._vectors = vectors
        self._config = config
        self._engine = vectors if isinstance(vectors, EngineFusion) else None

    def search(
        self,
        scope: Scope,
        query: str,
        vector: Vector | None,
        mode: Mode,
        top_k: int,
        query_repairs: Mapping[str, str] | None = None,
    ) -> SearchResult:
        """`query_repairs`: the caller's spelling repairs of words of `query` (typed ->
        repaired), for BM25 (LexicalIndex.search) and the speaker step."""
        if not 1 <= top_k <= self._config.max_top_k:
            raise InvalidArgument("top_k", f"must be 1..{self._config.max_top_k}, got {top_k}")
        if mode == Mode.HYBRID and self._engine is not None:
            return self._engine_search(scope, query, vector, top_k, query_repairs)
        lists: dict[str, list[Candidate]] = {}
        if mode in (Mode.HYBRID, Mode.LEXICAL):
            lists[LEXICAL] = self._lexical.search(
                scope, query, self._config.candidates, query_repairs=query_repairs
            )
        if mode in (Mode.HYBRID, Mode.SEMANTIC):
            if vector is None:
                raise InvalidArgument("query", "a semantic search needs the query's vector")
            lists[SEMANTIC] = self._vectors.search(scope, vector, self._config.candidates)
        # Hybrid only: LEXICAL and SEMANTIC show one retriever's own ranking.
        hybrid = mode == Mode.HYBRID
        fused = fuse(
            lists,
            k=self._config.k,
            weights=self._config.weights,
            limit=top_k,
            places=(lambda ids: self._store.locate(scope.tenant, scope.user, ids))
            if hybrid and self._config.reads_places
            else None,
            neighbour_weight=self._config.neighbour_weight,
            query=speaker_text(query, query_repairs),
            speaker_weight=self._config.speaker_weight,
            short_terms=self._config.short_turn_terms,
        )
        hits = self._hits(scope, fused)
        return SearchResult(hits, len(lists.get(LEXICAL, [])), len(lists.get(SEMANTIC, [])))

    def _engine_search(
        self,
        scope: Scope,
        query: str,
        vector: Vector | None,
        top_k: int,
        query_repairs: Mapping[str, str] | None,
    ) -> SearchResult:
        assert self._engine is not None
        if vector is None:
            raise InvalidArgument("query", "a semantic search needs the query's vector")
        weights = self._config.weights
        fused = self._engine.hybrid(
            scope,
            query,
            vector,
            self._config.candidates,
            self._config.k,
            (weights.get(LEXICAL, 1.0), weights.get(SEMANTIC, 1.0)),
            query_repairs,
        )
        refined = refine(
            fused,
            limit=top_k,
            places=(lambda ids: self._store.locate(scope.tenant, scope.user, ids))
            if self._config.reads_places
            else None,
            neighbour_weight=self._config.neighbour_weight,
            query=speaker_text(query, query_repairs),
            speaker_weight=self._config.speaker_weight,
            short_terms=self._config.short_turn_terms,
        )
        return SearchResult(self._hits(scope, refined), 0, 0, engine_fused=True)

    def _hits(self, scope: Scope, fused: list[FusedHit]) -> list[Hit]:
        """The fused hits' turns (an id erased since the search is left out)."""
        turns = {
            t.memory_id: t
            for t in self._store.get(scope.tenant, scope.user, [h.memory_id for h in fused])
        }
        return [Hit(turns[h.memory_id], h) for h in fused if h.memory_id in turns]
