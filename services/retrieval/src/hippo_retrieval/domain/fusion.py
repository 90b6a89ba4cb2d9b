"""Reciprocal Rank Fusion (Cormack et al. 2009): score(d) = sum_m w_m / (k + rank_m(d)).

Ranks are 1-based; a retriever that did not return d adds nothing. RRF needs no score
normalisation, which is why BM25 scores (unbounded) and cosines ([-1, 1]) can be fused.
Ties in the fused score break by the best single rank, then by memory id, so results
are deterministic.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from hippo_retrieval.domain.models import Candidate, FusedHit, Place


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
    hits: Sequence[FusedHit], places: Mapping[str, Place], weight: float
) -> list[FusedHit]:
    """score'(d) = score(d) + weight * max(score(prev d), score(next d)), where prev/next are
    the turns right before and after d in its session (by position) among the candidates.

    A turn next to a strong match is likely part of the same exchange ("Yes, last
    Tuesday!" answers the question above it); only candidates count, so this costs no
    extra search. Ranks and per-retriever scores are kept as the retrievers gave them.
    """
    if weight <= 0:
        return list(hits)
    score_at = {places[h.memory_id][:2]: h.fused_score for h in hits if h.memory_id in places}
    boosted = []
    for h in hits:
        place = places.get(h.memory_id)
        bonus = 0.0
        if place is not None:
            session, position = place.session, place.position
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
    places: Callable[[list[str]], Mapping[str, Place]] | None = None,
    neighbour_weight: float = 0.0,
    query: str = "",
    speaker_weight: float = 0.0,
    short_terms: int = 0,
) -> list[FusedHit]:
    """`neighbour_boost(rrf(lists), places(ids), w)[:limit]` (or `rrf(...)[:limit]` without
    `places`), computed on plain dicts: the search path fuses ~200 candidates to return 10,
    and building, boosting and sorting a FusedHit per candidate twice was a large share
    of retrieval's CPU per Recall. Same scores, same order, same tie-breaks (a property
    test checks it against the two reference functions above). Then the speaker step:
    when the query names exactly one of the candidates' speakers (`named_speaker`), that
    speaker's turns' scores are multiplied by 1 + speaker_weight. Then the short-turn
    step (`short_terms` > 0): a turn whose own text holds n < short_terms content words
    (Place.terms; none counts as half a word) keeps √(n / short_terms) of its score."""
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
    return _steps(
        fused, best, firsts, limit, places, neighbour_weight, query, speaker_weight, short_terms
    )


def refine(
    fused: Sequence[Candidate],
    *,
    limit: int,
    places: Callable[[list[str]], Mapping[str, Place]] | None = None,
    neighbour_weight: float = 0.0,
    query: str = "",
    speaker_weight: float = 0.0,
    short_terms: int = 0,
) -> list[FusedHit]:
    """`fuse`'s neighbour, speaker and short-turn steps over candidates fused elsewhere (by the
    engine, their scores its fused scores, best first): ties break by the engine's
    order. Each retriever's ranks are unknown, so the hits carry none."""
    scores: dict[str, float] = {}
    best: dict[str, int] = {}
    for position, candidate in enumerate(fused, start=1):
        if candidate.memory_id not in scores:
            scores[candidate.memory_id] = candidate.score
            best[candidate.memory_id] = position
    return _steps(
        scores, best, {}, limit, places, neighbour_weight, query, speaker_weight, short_terms
    )


def _steps(
    fused: dict[str, float],
    best: dict[str, int],
    firsts: dict[str, dict[str, tuple[int, float]]],
    limit: int,
    places: Callable[[list[str]], Mapping[str, Place]] | None,
    neighbour_weight: float,
    query: str,
    speaker_weight: float,
    short_terms: int = 0,
) -> list[FusedHit]:
    """The neighbour, speaker and short-turn steps on fused scores, then the best
    `limit`, ties by the best single rank (`best`), then id; `firsts`: each list's (rank,
    score) per id."""
    final = fused
    neighbours, speakers = neighbour_weight > 0, speaker_weight > 0 and bool(query)
    # One store read serves every step; none when none runs.
    wanted = places is not None and fused and (neighbours or speakers or short_terms > 0)
    where = places(list(fused)) if wanted and places is not None else {}
    if neighbours and where:
        # The reference boosts the rrf order: ties in the unboosted score keep no
        # special order there, and the boost reads scores only, so the dict is enough.
        score_at = {(p.session, p.position): fused[m] for m, p in where.items() if m in fused}
        final = {}
        for m, s in fused.items():
            place = where.get(m)
            bonus = 0.0
            if place is not None:
                bonus = max(
                    score_at.get((place.session, place.position - 1), 0.0),
                    score_at.get((place.session, place.position + 1), 0.0),
                )
            final[m] = s + neighbour_weight * bonus
    if speakers and where:
        speaker = named_speaker(query, {p.speaker for p in where.values() if p.speaker})
        if speaker is not None:
            factor = 1.0 + speaker_weight
            final = {
                m: s * factor if m in where and where[m].speaker == speaker else s
                for m, s in final.items()
            }
    if short_terms > 0 and where:
        # A turn that says little ("lol", "ok", "haha yes") matches through the previous
        # turn its BM25 document quotes, or is near anything in vector space, and would
        # crowd out the turn that holds the fact (docs/recall.md, the short-turn step).
        # The square root: a filler falls far (1 of 8: x 0.35), a terse fact ("moved to
        # Lisbon in May", 3: x 0.61) less. Still enough to reorder a store of a few
        # turns, whose fused scores sit within a few percent: hence off by default.
        final = {
            m: s * _short_factor(where[m].terms, short_terms) if m in where else s
            for m, s in final.items()
        }
    order = heapq.nsmallest(limit, final, key=lambda m: (-final[m], best[m], m))
    out = []
    for m in order:
        found = {name: first[m] for name, first in firsts.items() if m in first}
        ranks = {name: rank for name, (rank, _) in found.items()}
        scores = {name: score for name, (_, score) in found.items()}
        out.append(FusedHit(m, final[m], ranks, scores))
    return out


def _short_factor(terms: int, short_terms: int) -> float:
    """What a turn of `terms` content words keeps of its score (-1: unknown, all of it)."""
    if terms < 0 or terms >= short_terms:
        return 1.0
    return math.sqrt(max(terms, 0.5) / short_terms)


_WORD = re.compile(r"\w+")
TYPO_MIN_NAME = 5  # names this long still match with one slip ("carline" for Caroline)


def named_speaker(query: str, speakers: Iterable[str]) -> str | None:
    """The one speaker the query names (by any of their names of 3+ letters, any case;
    one of 5+ letters also with one typing slip), or None when it names none or
    several: "What did Caroline research?" is about Caroline's own turns; "What do
    Caroline and Melanie share?" is about both, and boosting one would hurt. A
    possessive typed without its apostrophe ("carolines", "jons") names them too, slip
    or not."""
    words = {w.lower() for w in _WORD.findall(query)}
    words |= {w[:-1] for w in words if len(w) > 3 and w.endswith("s")}
    found = []
    for speaker in speakers:
        names = [n for n in _WORD.findall(speaker.lower()) if len(n) >= 3]
        if any(
            name in words or (len(name) >= TYPO_MIN_NAME and any(_one_slip(name, w) for w in words))
            for name in names
        ):
            found.append(speaker)
    return found[0] if len(found) == 1 else None


def _one_slip(a: str, b: str) -> bool:
    """True when b is a one edit from a (a letter dropped, added, replaced, or two
    neighbours swapped)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and a[diff[0]] == b[diff[1]]
            and a[diff[1]] == b[diff[0]]
        )
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    i = 0
    while i < len(short) and short[i] == long_[i]:
        i += 1
    return short[i:] == long_[i + 1 :]
