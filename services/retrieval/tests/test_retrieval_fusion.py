"""RRF: 1-based ranks, k, weights, deterministic ties; the neighbour step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hippo_retrieval.domain.fusion import fuse, named_speaker, neighbour_boost, refine, rrf
from hippo_retrieval.domain.models import Candidate, Place
from hippo_retrieval.domain.retriever import speaker_text


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
    places = {"q": Place("s1", 4), "a": Place("s1", 5), "far": Place("s2", 1)}
    boosted = neighbour_boost(hits, places, 0.5)
    score = {h.memory_id: h.fused_score for h in boosted}
    assert score["a"] == pytest.approx(1 / 63 + 0.5 / 61)  # its neighbour q ranked first
    assert score["q"] == pytest.approx(1 / 61 + 0.5 / 63)
    assert score["far"] == pytest.approx(1 / 62)  # nobody next to it
    assert [h.memory_id for h in boosted] == ["q", "a", "far"]
    assert boosted[1].ranks == {"lexical": 3}  # ranks stay the retrievers' own
    assert neighbour_boost(hits, places, 0.0) == hits


_ids = st.sampled_from([f"m{i}" for i in range(12)])
_lists = st.lists(
    st.tuples(_ids, st.floats(-10, 10, allow_nan=False)).map(lambda t: Candidate(*t)),
    max_size=15,
)


@settings(max_examples=300, deadline=None)
@given(
    lexical=_lists,
    semantic=_lists,
    # Small round k and weights make equal fused scores common (k=1, w=2: lexical rank 3
    # ties semantic rank 1), so the tie-breaks are exercised, not only the scores.
    k=st.one_of(st.sampled_from([1.0, 2.0, 60.0]), st.floats(0.5, 100)),
    w=st.one_of(st.sampled_from([1.0, 1.5, 2.0]), st.floats(0.1, 3)),
    limit=st.integers(1, 20),
    boost=st.sampled_from([0.0, 0.5, 1.5]),
    where=st.dictionaries(_ids, st.builds(Place, st.sampled_from(["s1", "s2"]), st.integers(0, 6))),
)
def test_fuse_is_rrf_then_the_neighbour_boost_then_the_cut(
    lexical: list[Candidate],
    semantic: list[Candidate],
    k: float,
    w: float,
    limit: int,
    boost: float,
    where: dict[str, Place],
) -> None:
    """The search path's one-pass fusion gives exactly what the reference functions give:
    the same hits, scores, ranks, per-retriever scores and order (ties included)."""
    lists = {"lexical": lexical, "semantic": semantic}
    weights = {"lexical": w}
    places = {m: p for m, p in where.items()}  # one place per id, as the store has
    by_place: dict[tuple[str, int], str] = {}
    for m, p in list(places.items()):
        if (p.session, p.position) in by_place:
            del places[m]  # two turns never share a session position
        else:
            by_place[p.session, p.position] = m
    asked: list[list[str]] = []

    def locate(ids: list[str]) -> dict[str, Place]:
        asked.append(ids)
        return {m: places[m] for m in ids if m in places}

    expected = neighbour_boost(rrf(lists, k=k, weights=weights), places, boost)[:limit]
    got = fuse(lists, k=k, weights=weights, limit=limit, places=locate, neighbour_weight=boost)
    assert got == expected
    if boost == 0:
        assert asked == []  # no boost, no store read


@settings(max_examples=200, deadline=None)
@given(
    lexical=_lists,
    semantic=_lists,
    limit=st.integers(1, 20),
    boost=st.sampled_from([0.0, 0.5, 1.5]),
    where=st.dictionaries(_ids, st.builds(Place, st.sampled_from(["s1", "s2"]), st.integers(0, 6))),
)
def test_refine_runs_the_same_steps_on_scores_fused_elsewhere(
    lexical: list[Candidate],
    semantic: list[Candidate],
    limit: int,
    boost: float,
    where: dict[str, Place],
) -> None:
    """Given the fused list (as an engine returns it: ids and fused scores, best first),
    `refine` boosts and cuts exactly as `fuse` does after its own RRF: the same scores;
    ties keep the engine's order; no per-retriever ranks."""
    lists = {"lexical": lexical, "semantic": semantic}
    places: dict[str, Place] = {}
    taken: set[tuple[str, int]] = set()
    for m, p in where.items():
        if (p.session, p.position) not in taken:  # two turns never share a position
            taken.add((p.session, p.position))
            places[m] = p
    fused = rrf(lists, k=5.0)
    engine = [Candidate(h.memory_id, h.fused_score) for h in fused]
    got = refine(engine, limit=limit, places=lambda ids: places, neighbour_weight=boost)
    expected = neighbour_boost(fused, places, boost)
    score = {h.memory_id: h.fused_score for h in expected}
    assert len(got) == min(limit, len(fused))
    assert all(h.ranks == {} and h.fused_score == score[h.memory_id] for h in got)
    assert [h.fused_score for h in got] == sorted(score.values(), reverse=True)[:limit]
    if boost == 0:
        assert [h.memory_id for h in got] == [h.memory_id for h in fused][:limit]


def test_the_speaker_step_lifts_the_named_speakers_turns() -> None:
    lists = {
        "lexical": [Candidate("mel1", 3.0), Candidate("car1", 2.0), Candidate("car2", 1.0)],
    }
    where = {
        "mel1": Place("s1", 1, "Melanie"),
        "car1": Place("s2", 1, "Caroline"),
        "car2": Place("s3", 1, "Caroline"),
    }

    def locate(ids: list[str]) -> dict[str, Place]:
        return {m: where[m] for m in ids}

    def ranked(query: str, weight: float = 1.0) -> list[str]:
        hits = fuse(
            lists, k=5, weights=None, limit=3, places=locate, query=query, speaker_weight=weight
        )
        return [h.memory_id for h in hits]

    # 1/6, 1/7, 1/8 before; Caroline's two turns doubled: 2/7 and 2/8 pass 1/6.
    assert ranked("what did caroline research?") == ["car1", "car2", "mel1"]
    assert ranked("wat did carline reserch") == ["car1", "car2", "mel1"]  # one slip
    assert ranked("what did caroline research?", weight=0.0) == ["mel1", "car1", "car2"]
    # Both named, or nobody: no speaker is favoured.
    assert ranked("what do Caroline and Melanie share?") == ["mel1", "car1", "car2"]
    assert ranked("what did she research?") == ["mel1", "car1", "car2"]


def test_the_short_turn_step_lowers_turns_that_say_little() -> None:
    """A turn of n content words, n under short_terms, keeps √(n / short_terms) of its
    score (none counts as half a word); a turn with enough of them, or one not located
    or not counted (-1), keeps all of it; 0 turns the step off."""
    lists = {
        "lexical": [Candidate("lol", 4.0), Candidate("fact", 3.0), Candidate("gone", 2.0)],
        "semantic": [Candidate("old", 1.0), Candidate("long", 0.5)],
    }
    where = {
        "lol": Place("s1", 2, "Ana", terms=1),
        "fact": Place("s1", 1, "Ben", terms=3),
        "old": Place("s2", 1, "Ben", terms=-1),  # written before counts existed
        "long": Place("s3", 1, "Ben", terms=8),
    }

    def scores(short_terms: int, places: dict[str, Place] = where) -> dict[str, float]:
        hits = fuse(
            lists, k=5, weights=None, limit=5, places=lambda ids: {m: places[m] for m in ids
            if m in places}, short_terms=short_terms,
        )  # fmt: skip
        return {h.memory_id: h.fused_score for h in hits}

    got = scores(8)  # 1/6, 1/7, 1/8 (lexical); 1/6, 1/7 (semantic) before
    assert got["lol"] == pytest.approx(1 / 6 * (1 / 8) ** 0.5)
    assert got["fact"] == pytest.approx(1 / 7 * (3 / 8) ** 0.5)
    assert (got["gone"], got["old"], got["long"]) == pytest.approx((1 / 8, 1 / 6, 1 / 7))
    assert list(got) == ["old", "long", "gone", "fact", "lol"]
    assert list(scores(0)) == ["lol", "old", "fact", "long", "gone"]  # off: RRF's order
    none = dict(where, lol=Place("s1", 2, "Ana", terms=0))  # "ok": half a word
    assert scores(8, none)["lol"] == pytest.approx(1 / 6 * (0.5 / 8) ** 0.5)
    # The engine-fused path takes the same step.
    refined = refine(
        [Candidate("lol", 0.3), Candidate("fact", 0.2)], limit=2,
        places=lambda ids: {m: where[m] for m in ids}, short_terms=8,
    )  # fmt: skip
    assert [h.memory_id for h in refined] == ["fact", "lol"]


def test_named_speaker_matches_whole_names() -> None:
    speakers = {"Caroline", "Mel", "Dr. Ana Smith", ""}
    assert named_speaker("When did Caroline go?", speakers) == "Caroline"
    assert named_speaker("when did carolin go", speakers) == "Caroline"  # dropped letter
    assert named_speaker("when did carloine go", speakers) == "Caroline"  # swapped pair
    assert named_speaker("the carolina trip", speakers) == "Caroline"  # one letter off
    assert named_speaker("where did mel go", speakers) == "Mel"
    assert named_speaker("where did melt go", speakers) is None  # short names: exact only
    assert named_speaker("dr. smith's advice", speakers) == "Dr. Ana Smith"  # any name
    assert named_speaker("what did ana say", speakers) == "Dr. Ana Smith"
    assert named_speaker("caroline and mel", speakers) is None
    assert named_speaker("anyone", speakers) is None
    # A possessive without its apostrophe, as chats type it, with a slip or without.
    assert named_speaker("wat was carolimes idea", speakers) == "Caroline"
    assert named_speaker("whats mels job", speakers) == "Mel"
    assert named_speaker("the melts", speakers) is None


def test_the_speaker_step_reads_the_callers_repairs_beside_the_typed_words() -> None:
    speakers = {"Caroline", "Melanie"}
    typed = "wat did carlnie say abt it"  # two slips: no name the step can match
    assert named_speaker(speaker_text(typed, {}), speakers) is None
    assert named_speaker(speaker_text(typed, {"carlnie": "caroline"}), speakers) == "Caroline"
    # The typed words stay: a repair never hides a name the user typed right.
    asked = speaker_text("does melanie destress", {"destress": "distress"})
    assert named_speaker(asked, speakers) == "Melanie"
