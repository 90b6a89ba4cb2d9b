"""Reciprocal Rank Fusion (Cormack et al. 2009): score(d) = sum_m w_m / (k + rank_m(d)).

Ranks are 1-based; a retriever that did not return d adds nothing. RRF needs no score
normalisation, which is why BM25 scores (unbounded) and cosines ([-1, 1]) can be fused.
Ties in the fused score break by the best single rank, then by memory id, so results
are deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
