"""Reciprocal Rank Fusion (Cormack et al. 2009): score(d) = sum_m w_m / (k + rank_m(d)).

Ranks are 1-based; a retriever that did not return d adds nothing. RRF needs no score
normalisation, which is why BM25 scores (unbounded) and cosines ([-1, 1]) can be fused.
Ties in the fused score break by the best single rank, then by memory id, so results
are deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence

from hippo_retrieval.domain.models import Candidate, FusedHit


def rrf(
    lists: Mapping[str, Sequence[Candidate]],
    *,
    k: float = 60.0,
    weights: Mapping[str, float] | None = None,
    limit: int | None = None,
) -> list[FusedHit]:
    if k <= 0:
        raise ValueError("k must be positive")
    fused: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    scores: dict[str, dict[str, float]] = {}
    for name, candidates in lists.items():
        weight = 1.0 if weights is None else weights.get(name, 1.0)
        seen: set[str] = set()
        for position, candidate in enumerate(candidates, start=1):
            if candidate.memory_id in seen:  # a retriever lists each document once
                continue
            seen.add(candidate.memory_id)
            fused[candidate.memory_id] = fused.get(candidate.memory_id, 0.0) + weight / (
                k + position
            )
            ranks.setdefault(candidate.memory_id, {})[name] = position
            scores.setdefault(candidate.memory_id, {})[name] = candidate.score
    order = sorted(fused, key=lambda m: (-fused[m], min(ranks[m].values()), m))
    if limit is not None:
        order = order[:limit]
    return [FusedHit(m, fused[m], ranks[m], scores[m]) for m in order]


def neighbour_boost(
    hits: Sequence[FusedHit], places: Mapping[str, tuple[str, int]], weight: float
) -> list[FusedHit]:
    """score'(d) = score(d) + weight * max(score(prev d), score(next d)), where prev/next are
    the turns right before and after d in its session (by position) among the candidates.

    A turn next to a strong match is likely part of the same exchange ("Yes, last
    Tuesday!" answers the question above it); only candidates count, so this costs no
    extra search. Ranks and per-retriever scores are kept as the retrievers gave them.
    """
    if weight <= 0:
        return list(hits)
    score_at = {places[h.memory_id]: h.fused_score for h in hits if h.memory_id in places}
    boosted = []
    for h in hits:
        place = places.get(h.memory_id)
        bonus = 0.0
        if place is not None:
            session, position = place
            bonus = max(
                score_at.get((session, position - 1), 0.0),
                score_at.get((session, position + 1), 0.0),
            )
        boosted.append(FusedHit(h.memory_id, h.fused_score + weight * bonus, h.ranks, h.scores))
    boosted.sort(key=lambda h: (-h.fused_score, min(h.ranks.values()), h.memory_id))
    return boosted


def fuse(
    lists: Mapping[str, Sequence[Candidate]],
    *,
    k: float,
    weights: Mapping[str, float] | None,
    limit: int,
    places: Callable[[list[str]], Mapping[str, tuple[str, int]]] | None = None,
    neighbour_weight: float = 0.0,
) -> list[FusedHit]:
    """`neighbour_boost(rrf(lists), places(ids), w)[:limit]` (or `rrf(...)[:limit]` without
    `places`), computed on plain dicts: the search path fuses ~200 candidates to return 10,
    and building, boosting and sorting a FusedHit per candidate twice was a large share
    of retrieval's CPU per Recall. Same scores, same order, same tie-breaks (a property
    test checks it against the two reference functions above)."""
    if k <= 0:
        raise ValueError("k must be positive")
    fused: dict[str, float] = {}
    best: dict[str, int] = {}  # best single rank: the first tie-break
    firsts: dict[str, dict[str, tuple[int, float]]] = {}  # list -> id -> (rank, score)
    for name, candidates in lists.items():
        weight = 1.0 if weights is None else weights.get(name, 1.0)
        first = firsts[name] = {}
        for position, candidate in enumerate(candidates, start=1):
            m = candidate.memory_id
            if m in first:  # a retriever lists each document once
                continue
            first[m] = (position, candidate.score)
            fused[m] = fused.get(m, 0.0) + weight / (k + position)
            if position < best.get(m, position + 1):
                best[m] = position
    final = fused
    if places is not None and neighbour_weight > 0 and fused:
        # The reference boosts the rrf order: ties in the unboosted score keep no
        # special order there, and the boost reads scores only, so the dict is enough.
        where = places(list(fused))
        score_at = {where[m]: s for m, s in fused.items() if m in where}
        final = {}
        for m, s in fused.items():
            place = where.get(m)
            bonus = 0.0
            if place is not None:
                session, position = place
                bonus = max(
                    score_at.get((session, position - 1), 0.0),
                    score_at.get((session, position + 1), 0.0),
                )
            final[m] = s + neighbour_weight * bonus
    order = heapq.nsmallest(limit, final, key=lambda m: (-final[m], best[m], m))
    out = []
    for m in order:
        found = {name: first[m] for name, first in firsts.items() if m in first}
        ranks = {name: rank for name, (rank, _) in found.items()}
        scores = {name: score for name, (_, score) in found.items()}
        out.append(FusedHit(m, final[m], ranks, scores))
    return out
