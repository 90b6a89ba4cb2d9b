"""One Qdrant collection holding both vectors of each turn, fused by the engine
(hybrid_collection.py), over qdrant-client's local mode (a server's client API).

Covers: the engine's RRF with unit weights gives client-side RRF's very scores and order
(`engine_k`), and its weighted form is the one the docs describe; each point carries
both vectors, written once the vector side applies; a turn without a vector is found by
its words; deletions and tenancy hold for the fused search; a turn the lexical side was
not handed is still indexed by its own text; the Retriever's hybrid search is one engine
call followed by the neighbour and speaker steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from fakes import MemoryStore, memory_id
from qdrant_client import QdrantClient

from hippo_retrieval.adapters.generations import LocalIndexSet, QdrantServer
from hippo_retrieval.adapters.hybrid_collection import (
    DENSE,
    OneCollection,
    QdrantHybridIndex,
    engine_k,
    engine_weights,
)
from hippo_retrieval.adapters.sparse_lexical import LEXICAL
from hippo_retrieval.domain.documents import lexical_document
from hippo_retrieval.domain.fusion import rrf
from hippo_retrieval.domain.models import Deletion, Mode, NewTurn, Role, Scope, StoredTurn
from hippo_retrieval.domain.retriever import FusionConfig, Retriever

pytestmark = pytest.mark.filterwarnings(
    "ignore:Payload indexes have no effect in the local Qdrant:UserWarning"
)

DIM = 16
SCOPE = Scope("acme", "alice")
WORDS = ["harbour", "sailing", "engine", "garden", "tomato", "violin", "concert", "recipe"]


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def turn(seq: int, text: str, *, tenant: str = "acme", vector: bool = True) -> StoredTurn:
    return StoredTurn(
        seq=seq,
        memory_id=memory_id(tenant, "alice", "s1", client_id=f"c{seq}"),
        tenant=tenant,
        user="alice",
        session="s1",
        role=Role.USER,
        text=text,
        time_us=1_700_000_000_000_000 + seq,
        client_id=f"c{seq}",
        metadata={},
        vector=unit(seq) if vector else None,
        document=text,
    )


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[OneCollection]:
    index = QdrantHybridIndex(QdrantClient(path=str(tmp_path / "q")), "fused", DIM)
    both = OneCollection(index, index)
    yield both
    both.close()


def apply(pair: OneCollection, changes: list) -> None:  # type: ignore[type-arg]
    """As the projector does: the documents to the lexical side, then the vectors."""
    pair.lexical.apply(changes)
    pair.vectors.apply(changes)


def corpus(n: int = 40) -> list[StoredTurn]:
    """Turns of four topic words and i filler words: every length differs, so no two
    BM25 scores tie (the engine orders ties its own way, which would blur the checks)."""
    rng = np.random.default_rng(3)
    return [
        turn(i, " ".join([*rng.choice(WORDS, size=4, replace=True), *["so"] * i]))
        for i in range(1, n + 1)
    ]


def test_engine_k_maps_hippos_constant_to_the_engines() -> None:
    # Engine: 1 / (r + k' - 1); Hippo: 1 / (r + k).
    assert engine_k(5.0) == 6
    assert engine_k(60) == 61
    assert engine_k(0.2) == 1


def test_unit_weights_give_client_side_rrf_exactly(pair: OneCollection) -> None:
    turns = corpus()
    apply(pair, turns)
    query, vector = "harbour engine tomato", unit(7)
    lexical = pair.lexical.search(SCOPE, query, 20)
    semantic = pair.vectors.search(SCOPE, vector, 20)
    assert lexical and semantic
    expected = rrf({"lexical": lexical, "semantic": semantic}, k=5.0)
    fused = pair.vectors.hybrid(SCOPE, query, vector, 20, 5.0, (1.0, 1.0))
    assert [c.memory_id for c in fused][:10] == [h.memory_id for h in expected][:10]
    by_id = {h.memory_id: h.fused_score for h in expected}
    for c in fused:
        assert c.score == pytest.approx(by_id[c.memory_id], rel=1e-5)


def test_engine_weights_keep_the_ratio_around_hippos_offset() -> None:
    lexical, semantic = engine_weights((1.5, 1.0))
    assert lexical / semantic == pytest.approx(1.5)
    assert lexical * semantic == pytest.approx(1.0)  # geometric mean 1
    assert engine_weights((1.0, 1.0)) == (1.0, 1.0)
    assert engine_weights((0.0, 2.0)) == (0.0, 1.0)  # a list weighted 0 adds nothing
    assert engine_weights((0.0, 0.0)) == (0.0, 0.0)


def test_engine_weights_score_closer_to_hippos_rrf_than_the_weights_as_they_are() -> None:
    """Over ranks 1-100, the engine's scores with the mapped weights are proportional to
    Hippo's w / (k + rank) within a much smaller relative error (the module's claim)."""
    ranks = np.arange(1, 101)
    hippo = np.concatenate([1.5 / (5 + ranks), 1.0 / (5 + ranks)])

    def error(weights: tuple[float, float]) -> float:
        engine = np.concatenate([1 / (ranks / w + engine_k(5) - 1) for w in weights])
        scale = (engine @ hippo) / (engine @ engine)
        return float(np.sum(((scale * engine - hippo) / hippo) ** 2))

    assert error(engine_weights((1.5, 1.0))) * 4 < error((1.5, 1.0))


def test_weights_stretch_ranks_as_documented(pair: OneCollection) -> None:
    """Qdrant's weighted RRF: sum over retrievers of 1 / (rank / w' + k' - 1), with
    w' = engine_weights(w)."""
    apply(pair, corpus())
    query, vector, w = "violin concert", unit(11), engine_weights((1.5, 1.0))
    lexical = pair.lexical.search(SCOPE, query, 20)
    semantic = pair.vectors.search(SCOPE, vector, 20)
    score: dict[str, float] = {}
    for weight, found in zip(w, (lexical, semantic), strict=True):
        for rank, c in enumerate(found, start=1):
            score[c.memory_id] = score.get(c.memory_id, 0.0) + 1 / (rank / weight + 6 - 1)
    fused = pair.vectors.hybrid(SCOPE, query, vector, 20, 5.0, (1.5, 1.0))
    assert {c.memory_id for c in fused} == set(score)
    for c in fused:
        assert c.score == pytest.approx(score[c.memory_id], rel=1e-5)
    assert [c.score for c in fused] == sorted((c.score for c in fused), reverse=True)


def test_each_point_holds_both_vectors_once_the_vector_side_applied(
    pair: OneCollection,
) -> None:
    t = turn(1, "the harbour master")
    pair.lexical.apply([t])
    assert pair.vectors.count() == 0  # held, not written: never half a point
    pair.vectors.apply([t])
    points = pair.index._client.retrieve("fused", [t.memory_id], with_vectors=True)
    assert set(points[0].vector) == {DENSE, LEXICAL}  # type: ignore[arg-type]
    assert pair.lexical.applied_seq() == pair.vectors.applied_seq() == 1


def test_the_document_not_the_text_is_what_bm25_reads(pair: OneCollection) -> None:
    before = turn(1, "I ran a marathon in May")
    after = replace(turn(2, "it took four hours"), document="")
    after = replace(after, document=lexical_document(after, before))
    apply(pair, [before, after])
    found = {c.memory_id for c in pair.lexical.search(SCOPE, "marathon", 5)}
    assert found == {before.memory_id, after.memory_id}  # via the previous turn's words


def test_a_turn_without_a_vector_is_found_by_its_words(pair: OneCollection) -> None:
    words_only = turn(1, "zeppelin sketches", vector=False)
    other = turn(2, "tomato garden")
    apply(pair, [words_only, other])
    fused = pair.vectors.hybrid(SCOPE, "zeppelin", unit(2), 10, 5.0, (1.5, 1.0))
    assert fused[0].memory_id == words_only.memory_id
    assert words_only.memory_id not in {
        c.memory_id for c in pair.vectors.search(SCOPE, unit(1), 10)
    }


def test_the_fused_search_reads_the_callers_repairs(pair: OneCollection) -> None:
    """query_repairs reach the engine's BM25 list as they reach the lexical side's."""
    words_only = turn(1, "zeppelin sketches", vector=False)
    apply(pair, [words_only, turn(2, "tomato garden")])
    zero = np.zeros(DIM, dtype=np.float32)  # the words alone
    # Two slips from "zeppelin": only the caller's repair finds it.
    assert pair.vectors.hybrid(SCOPE, "zeplni", zero, 10, 5.0, (1.5, 1.0)) == []
    fused = pair.vectors.hybrid(SCOPE, "zeplni", zero, 10, 5.0, (1.5, 1.0), {"zeplni": "zeppelin"})
    assert [c.memory_id for c in fused] == [words_only.memory_id]


def test_deletions_and_tenancy_hold_for_the_fused_search(pair: OneCollection) -> None:
    mine = turn(1, "harbour engine")
    theirs = turn(2, "harbour engine", tenant="globex")
    apply(pair, [mine, theirs])
    fused = pair.vectors.hybrid(SCOPE, "harbour engine", unit(2), 10, 5.0, (1.5, 1.0))
    assert [c.memory_id for c in fused] == [mine.memory_id]  # the same text, another tenant
    apply(pair, [Deletion(3, "acme", mine.memory_id)])
    assert pair.vectors.hybrid(SCOPE, "harbour engine", unit(1), 10, 5.0, (1.5, 1.0)) == []
    assert pair.vectors.count() == 1  # theirs stays


def test_a_turn_the_lexical_side_never_saw_is_indexed_by_its_text(
    pair: OneCollection, caplog: pytest.LogCaptureFixture
) -> None:
    t = replace(turn(1, "violin lessons"), document="")
    pair.vectors.apply([t])
    assert [c.memory_id for c in pair.lexical.search(SCOPE, "violin", 5)] == [t.memory_id]
    assert "no BM25 document" in caplog.text


def test_empty_query_words_or_vector_fuse_what_remains(pair: OneCollection) -> None:
    apply(pair, corpus(10))
    zero = np.zeros(DIM, dtype=np.float32)
    only_words = pair.vectors.hybrid(SCOPE, "tomato", zero, 5, 5.0, (1.5, 1.0))
    assert [c.memory_id for c in only_words] == [
        c.memory_id for c in pair.lexical.search(SCOPE, "tomato", 5)
    ]
    only_vector = pair.vectors.hybrid(SCOPE, "the of", unit(4), 5, 5.0, (1.5, 1.0))
    assert [c.memory_id for c in only_vector] == [
        c.memory_id for c in pair.vectors.search(SCOPE, unit(4), 5)
    ]
    assert pair.vectors.hybrid(SCOPE, "", zero, 5, 5.0, (1.5, 1.0)) == []


def test_the_retriever_fuses_in_the_engine_then_boosts_neighbours(
    pair: OneCollection,
) -> None:
    store = MemoryStore()
    texts = ["did you book the ferry", "yes, for Tuesday", "tomato soup recipe"]
    stored = [
        s
        for s, _ in store.append(
            [
                NewTurn(memory_id("acme", "alice", "s1", client_id=f"c{i}"), "acme", "alice",
                        "s1", Role.USER, text, 1_700_000_000_000_000 + i, f"c{i}", {},
                        unit(i))
                for i, text in enumerate(texts)
            ]
        )
    ]  # fmt: skip
    apply(pair, [replace(t, document=t.text) for t in stored])
    engine = Retriever(store, pair.lexical, pair.vectors, FusionConfig())  # type: ignore[arg-type]
    found = engine.search(SCOPE, "ferry", unit(0), Mode.HYBRID, 3)
    assert found.engine_fused and found.lexical_candidates == found.semantic_candidates == 0
    order = [h.turn.memory_id for h in found.hits]
    assert order[:2] == [stored[0].memory_id, stored[1].memory_id]  # the answer next to it
    assert all(h.fused.ranks == {} for h in found.hits)
    plain = Retriever(store, pair.lexical, pair.vectors, FusionConfig(neighbour_weight=0.0))  # type: ignore[arg-type]
    unboosted = plain.search(SCOPE, "ferry", unit(0), Mode.HYBRID, 3)
    assert unboosted.hits[0].fused.fused_score < found.hits[0].fused.fused_score
    # LEXICAL and SEMANTIC stay each retriever's own ranking.
    lexical = engine.search(SCOPE, "ferry", None, Mode.LEXICAL, 3)
    assert not lexical.engine_fused and lexical.hits[0].fused.ranks == {"lexical": 1}


def test_fusion_in_the_engine_needs_one_server_collection(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one collection"):
        LocalIndexSet(tmp_path, lexical="qdrant", fused=True)  # no server
    server = QdrantServer("http://unused", None, "turns", 5.0)
    with pytest.raises(ValueError, match="one collection"):
        LocalIndexSet(tmp_path, server=server, lexical="tantivy", fused=True)
