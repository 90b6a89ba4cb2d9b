"""Domain logic of retrieval: the projector and the retriever, over in-memory doubles."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from fakes import MemoryIndex, MemoryStore

from hippo_core.errors import InvalidArgument
from hippo_retrieval.domain.models import Mode, NewTurn, Role, Scope
from hippo_retrieval.domain.projector import Projector
from hippo_retrieval.domain.retriever import FusionConfig, Retriever


def _turn(i: int, text: str, vector: list[float], user: str = "u1", tenant: str = "t1") -> NewTurn:
    v = np.asarray(vector, np.float32)
    return NewTurn(
        f"m{i}", tenant, user, "s1", Role.USER, text, 1_000 + i, vector=v / np.linalg.norm(v)
    )


@pytest.fixture
def parts() -> tuple[MemoryStore, MemoryIndex, MemoryIndex]:
    return MemoryStore(), MemoryIndex(), MemoryIndex()


def test_catch_up_applies_only_what_each_index_missed(parts) -> None:  # type: ignore[no-untyped-def]
    store, lexical, vectors = parts
    store.append([_turn(i, f"text {i}", [1, i]) for i in range(5)])
    vectors.autocommit = True
    Projector(store, lexical, vectors).catch_up()
    assert lexical.applied_seq() == vectors.applied_seq() == 5 and len(lexical.docs) == 5
    store.append([_turn(9, "late", [1, 0])])
    store.delete("t1", "u1", memory_ids=["m0"])
    projector = Projector(store, lexical, vectors)
    assert projector.lag() == (2, 2)
    assert projector.catch_up() == 2
    assert "m0" not in lexical.docs and "m9" in vectors.docs and projector.lag() == (0, 0)


def test_commits_are_batched_not_per_write(parts) -> None:  # type: ignore[no-untyped-def]
    store, lexical, vectors = parts
    projector = Projector(store, lexical, vectors, commit_interval_s=0.2, commit_every=10_000)
    projector.start()
    try:
        for i in range(30):
            ((stored, _),) = store.append([_turn(i, f"t{i}", [1, i])])
            projector.notify()
        assert projector.wait_visible(stored.seq, timeout=2.0)
    finally:
        projector.close()
    assert lexical.commits < 10  # 30 writes, a handful of commits
    assert len(lexical.docs) == 30


def test_hybrid_ranks_documents_found_by_both_first(parts) -> None:  # type: ignore[no-untyped-def]
    store, lexical, vectors = parts
    store.append(
        [
            _turn(1, "handleSubmit throws on click", [0, 1, 0]),  # words only
            _turn(2, "the form submission crashes", [1, 0, 0]),  # meaning only
            _turn(3, "handleSubmit: the form submission crashes", [0.9, 0.1, 0]),  # both
        ]
    )
    vectors.autocommit = True
    Projector(store, lexical, vectors).catch_up()
    retriever = Retriever(store, lexical, vectors, FusionConfig())
    scope = Scope("t1", "u1")
    query = np.asarray([1, 0, 0], np.float32)
    hybrid = retriever.search(scope, "handleSubmit", query, Mode.HYBRID, top_k=3)
    assert hybrid.hits[0].turn.memory_id == "m3"
    assert set(hybrid.hits[0].fused.ranks) == {"lexical", "semantic"}
    lexical_only = retriever.search(scope, "handleSubmit", None, Mode.LEXICAL, top_k=3)
    assert {h.turn.memory_id for h in lexical_only.hits} == {"m1", "m3"}
    assert lexical_only.semantic_candidates == 0


def test_search_stays_in_scope_and_checks_arguments(parts) -> None:  # type: ignore[no-untyped-def]
    store, lexical, vectors = parts
    store.append([_turn(1, "secret plan", [1, 0]), _turn(2, "secret plan", [1, 0], user="u2")])
    vectors.autocommit = True
    Projector(store, lexical, vectors).catch_up()
    retriever = Retriever(store, lexical, vectors, FusionConfig(max_top_k=100))
    result = retriever.search(
        Scope("t1", "u2"), "secret", np.asarray([1, 0], np.float32), Mode.HYBRID, 10
    )
    assert [h.turn.user for h in result.hits] == ["u2"]
    with pytest.raises(InvalidArgument, match="top_k"):
        retriever.search(Scope("t1", "u1"), "x", None, Mode.LEXICAL, 101)
    with pytest.raises(InvalidArgument, match="vector"):
        retriever.search(Scope("t1", "u1"), "x", None, Mode.SEMANTIC, 5)


class OthersIndex(MemoryIndex):
    """A vector index another replica writes: never writable here; its applied seq is
    whatever that writer recorded."""

    def writable(self) -> bool:
        return False

    def apply(self, changes) -> None:  # type: ignore[no-untyped-def]
        raise AssertionError("a replica that is not the writer must not write")


def test_a_replica_that_does_not_write_the_shared_index_applies_only_its_own(parts) -> None:  # type: ignore[no-untyped-def]
    store, lexical, _ = parts
    shared = OthersIndex()
    store.append([_turn(i, f"text {i}", [1, i]) for i in range(3)])
    projector = Projector(store, lexical, shared)
    done: list[int] = []
    waiter = threading.Thread(target=lambda: done.append(projector.catch_up(wait_shared=True)))
    waiter.start()
    time.sleep(0.2)
    # Its own index is caught up, the shared one is not: it keeps waiting (not serving).
    assert lexical.applied_seq() == 3 and done == [] and projector.visible_seq() == 0
    shared.committed = 3  # the writer got there
    waiter.join(timeout=5)
    assert done == [3] and projector.visible_seq() == 3
    # Without waiting (a shutdown), it stops once its own index is done.
    store.append([_turn(9, "late", [1, 0])])
    assert projector.catch_up() == 1
    assert lexical.applied_seq() == 4 and projector.visible_seq() == 3
