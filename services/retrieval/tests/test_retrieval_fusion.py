"""RRF: 1-based ranks, k, weights, deterministic ties; the neighbour step."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hippo_retrieval.domain.fusion import neighbour_boost, rrf
from hippo_retrieval.domain.models import Candidate


def _c(*ids: str) -> list[Candidate]:
    return [Candidate(i, 1.0 / (n + 1)) for n, i in enumerate(ids)]


def test_scores_follow_the_formula() -> None:
    hits = rrf({"lexical": _c("a", "b"), "semantic": _c("b", "c")}, k=60)
    by_id = {h.memory_id: h for h in hits}
    assert by_id["b"].fused_score == pytest.approx(1 / 62 + 1 / 61)
    assert by_id["a"].fused_score == pytest.approx(1 / 61)
    assert by_id["c"].fused_score == pytest.approx(1 / 62)
    assert [h.memory_id for h in hits] == ["b", "a", "c"]  # found by both ranks first
    assert by_id["b"].ranks == {"lexical": 2, "semantic": 1}
    assert by_id["a"].ranks == {"lexical": 1}


def test_weights_and_limit() -> None:
    hits = rrf({"lexical": _c("a"), "semantic": _c("b")}, weights={"semantic": 2.0}, limit=1)
    assert [h.memory_id for h in hits] == ["b"]


def test_ties_break_by_best_rank_then_id() -> None:
    hits = rrf({"lexical": _c("x", "y"), "semantic": _c("y", "x")})
    assert [h.memory_id for h in hits] == ["x", "y"]


def test_bad_k_is_refused() -> None:
    with pytest.raises(ValueError):
        rrf({"lexical": _c("a")}, k=0)


@given(
    st.dictionaries(
        st.sampled_from(["lexical", "semantic"]),
        st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8),
    )
)
def test_fusion_properties(lists: dict[str, list[str]]) -> None:
    hits = rrf({name: _c(*ids) for name, ids in lists.items()})
    everything = {i for ids in lists.values() for i in ids}
    assert {h.memory_id for h in hits} == everything  # nothing lost, nothing invented
    assert [h.fused_score for h in hits] == sorted((h.fused_score for h in hits), reverse=True)
    for h in hits:
        assert all(lists[name][rank - 1] == h.memory_id for name, rank in h.ranks.items())


def test_neighbour_boost_lifts_the_turn_next_to_a_strong_match() -> None:
    hits = rrf({"lexical": [Candidate("q", 9.0), Candidate("far", 5.0), Candidate("a", 1.0)]})
    places = {"q": ("s1", 4), "a": ("s1", 5), "far": ("s2", 1)}
    boosted = neighbour_boost(hits, places, 0.5)
    score = {h.memory_id: h.fused_score for h in boosted}
    assert score["a"] == pytest.approx(1 / 63 + 0.5 / 61)  # its neighbour q ranked first
    assert score["q"] == pytest.approx(1 / 61 + 0.5 / 63)
    assert score["far"] == pytest.approx(1 / 62)  # nobody next to it
    assert [h.memory_id for h in boosted] == ["q", "a", "far"]
    assert boosted[1].ranks == {"lexical": 3}  # ranks stay the retrievers' own
    assert neighbour_boost(hits, places, 0.0) == hits
