"""RRF as specified: 1-based ranks, k = 60, weights, deterministic ties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hippo_retrieval.domain.fusion import rrf
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
