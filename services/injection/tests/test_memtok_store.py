"""The memtok store's rules (DESIGN.md §Influence), on each item store engine (SQLite and
PostgreSQL: `engine_url`) and the real key index (Qdrant edge), with a deterministic
embedder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from memtok_fakes import (
    DAY_US,
    BagEmbedder,
    FakeStates,
    FakeValues,
    close,
    obs,
    open_store,
    settings,
)

from hippo_injection import memtok_rebuild
from hippo_injection.__main__ import open_store as open_real
from hippo_injection.adapters.engine import TransformersEngine
from hippo_injection.domain.memtok import policy as rules
from hippo_injection.domain.memtok.models import Packing, Source, StoreModelMismatch
from hippo_injection.domain.memtok.policy import Policy
from hippo_injection.domain.memtok.store import MemtokStore
from hippo_injection.domain.memtok.values import EngineValues

T0 = 1_760_000_000_000_000


@pytest.fixture
def store(tmp_path: Path, engine_url: str) -> Iterator[MemtokStore]:
    s = open_store(tmp_path, Policy(capacity=100, min_rank=0.45), url=engine_url)
    yield s
    close(s)


def test_admission_threshold(store: MemtokStore) -> None:
    report = store.admit("t", "u", [obs("the", 0.2), obs("Lisbon", 0.45), obs("nurse", 0.9)], T0)
    outcome = {w.word: (w.outcome, w.reason) for w in report.written}
    assert outcome["the"] == ("rejected", "below_min_rank")
    assert outcome["Lisbon"][0] == "new"  # at the minimum rank: stored
    assert outcome["nurse"][0] == "new"
    assert sorted(m.word for m in store.items.by_user("t", "u")) == ["Lisbon", "nurse"]


def test_a_statement_with_no_word_above_the_threshold_keeps_its_best(
    store: MemtokStore,
) -> None:
    """Policy.min_rank_best: an operator turn whose words all rank below min_rank still
    stores its best word when that reaches the floor; a weaker turn, or the model's own
    words, store nothing."""
    plain = [obs("My", 0.34), obs("teal", 0.38, context="favourite colour is"), obs("is", 0.2)]
    report = store.admit("t", "u", plain, T0)
    assert [(w.word, w.outcome) for w in report.written if w.outcome != "rejected"] == [
        ("teal", "new")
    ]
    assert {w.word for w in report.written if w.outcome == "rejected"} == {"My", "is"}
    weak = store.admit("t", "u", [obs("the", 0.2), obs("a", 0.25)], T0)
    assert all(w.outcome == "rejected" for w in weak.written)
    said = store.admit("t", "u", [obs("violet", 0.38)], T0, Source.MODEL)
    assert all(w.outcome == "rejected" for w in said.written)
    assert [m.word for m in store.items.by_user("t", "u")] == ["teal"]


def test_only_operator_items_raise_counts(store: MemtokStore) -> None:
    store.admit("t", "u", [obs("Lisbon", context="moved to")], T0)
    second = store.admit("t", "u", [obs("Lisbon", context="moved to")], T0 + 1)
    assert [(w.outcome, w.count) for w in second.written] == [("merged", 2)]
    echoed = store.admit("t", "u", [obs("Lisbon", context="moved to")], T0 + 2, Source.MODEL)
    assert [(w.outcome, w.count) for w in echoed.written] == [("seen", 2)]
    (item,) = store.items.by_user("t", "u")
    assert item.count == 2 and item.last_seen_us == T0 + 1
    # A model item never gains a count from the model's own words either.
    store.admit("t", "u", [obs("Porto", context="trip to")], T0, Source.MODEL)
    store.admit("t", "u", [obs("Porto", context="trip to")], T0 + 5, Source.MODEL)
    porto = [m for m in store.items.by_user("t", "u") if m.word == "Porto"]
    assert len(porto) == 1 and porto[0].count == 1 and porto[0].source is Source.MODEL


def test_merge_is_a_running_mean(store: MemtokStore) -> None:
    a = store.admit("t", "u", [obs("Lisbon", context="moved to")], T0).written[0]
    before = store.items.get("t", "u", [a.memtok_id])[0].value.copy()
    store.admit("t", "u", [obs("Lisbon", context="moved to")], T0 + 1)
    store.admit("t", "u", [obs("Lisbon", context="moved to")], T0 + 2)
    after = store.items.get("t", "u", [a.memtok_id])[0]
    assert after.count == 3
    np.testing.assert_allclose(after.value, before, atol=2e-3)  # same vector averaged: same


def test_different_words_never_merge(store: MemtokStore) -> None:
    store.admit("t", "u", [obs("Lisbon", context="x y z")], T0)
    report = store.admit("t", "u", [obs("Porto", context="x y z")], T0)
    assert report.written[0].outcome == "new"


def test_eviction_order_and_grace_period(tmp_path: Path, engine_url: str) -> None:
    p = Policy(capacity=3, min_rank=0.1, grace_days=1.0, compress_below=0.0)
    s = open_store(tmp_path, p, url=engine_url)
    try:
        s.admit("t", "u", [obs("high", 0.9, surprise=12)], T0)
        s.admit("t", "u", [obs("low", 0.3, surprise=1)], T0)
        s.admit("t", "u", [obs("tie", 0.3, surprise=1)], T0)
        s.admit("t", "u", [obs("tie", 0.3, surprise=1)], T0 + 1)  # count 2 breaks the tie
        # Full, and every item is in its grace period: the newcomer is refused.
        full = s.admit("t", "u", [obs("new", 0.9)], T0 + DAY_US // 2)
        assert [(w.outcome, w.reason) for w in full.written] == [("rejected", "store_full")]
        # After the grace period the lowest keep score goes first, count breaking the tie.
        later = s.admit("t", "u", [obs("new", 0.9)], T0 + 2 * DAY_US)
        assert [r.word for r in later.removed if r.outcome == "evicted"] == ["low"]
        later = s.admit("t", "u", [obs("newer", 0.9)], T0 + 2 * DAY_US)
        assert [r.word for r in later.removed if r.outcome == "evicted"] == ["tie"]
        words = sorted(m.word for m in s.items.by_user("t", "u"))
        assert words == ["high", "new", "newer"]  # "new" and "newer" are in grace now
    finally:
        close(s)


def test_weak_items_are_compressed_before_deletion(tmp_path: Path, engine_url: str) -> None:
    p = Policy(capacity=3, min_rank=0.1, grace_days=0.0, compress_below=0.3)
    s = open_store(tmp_path, p, url=engine_url)
    try:
        s.admit("t", "u", [obs("weakA", 0.2, surprise=0)], T0)
        s.admit("t", "u", [obs("weakB", 0.25, surprise=0)], T0)
        s.admit("t", "u", [obs("strong", 0.9, surprise=12)], T0)
        first = s.admit("t", "u", [obs("new1", 0.9, surprise=12)], T0 + 1)
        # Packing both weak items to int8 frees a slot: nothing is deleted yet.
        assert [(r.word, r.outcome) for r in first.removed] == [
            ("weakA", "compressed"),
            ("weakB", "compressed"),
        ]
        packed = next(m for m in s.items.by_user("t", "u") if m.word == "weakA")
        want = s.values.values([packed.source_words])[0]
        assert packed.packing is Packing.INT8
        assert np.abs(packed.value - want).max() <= np.abs(want).max() / 127 + 1e-6
        second = s.admit("t", "u", [obs("new2", 0.9, surprise=12)], T0 + 2)
        # Now the compressed weak items go, lowest keep score first.
        assert [(r.word, r.outcome) for r in second.removed] == [
            ("weakA", "evicted"),
            ("weakB", "evicted"),
        ]
        assert sorted(m.word for m in s.items.by_user("t", "u")) == ["new1", "new2", "strong"]
    finally:
        close(s)


def test_decay_never_evicts(tmp_path: Path, engine_url: str) -> None:
    p = Policy(capacity=2, min_rank=0.1, grace_days=0.0, half_life_days=1.0, compress_below=0.0)
    s = open_store(tmp_path, p, url=engine_url)
    try:
        s.admit("t", "u", [obs("old", 0.9, surprise=12)], T0)  # strong, then never seen again
        s.admit("t", "u", [obs("fresh", 0.3, surprise=1)], T0 + 400 * DAY_US)
        old = next(m for m in s.items.by_user("t", "u") if m.word == "old")
        now = T0 + 400 * DAY_US
        assert rules.decay(old, now, p) < 1e-100  # its influence has faded to nothing
        report = s.admit("t", "u", [obs("newest", 0.5, surprise=3)], now)
        assert [r.word for r in report.removed] == ["fresh"]  # not the unreferenced old one
        s.consolidate("t", "u")
        assert "old" in {m.word for m in s.items.by_user("t", "u")}
    finally:
        close(s)


def test_conditional_wording_raises_rank_and_cap() -> None:
    p = Policy()
    assert rules.rank(1.0, 4.0, True, p) == pytest.approx(rules.rank(1.0, 4.0, False, p) + 0.15)
    assert rules.conditional("Never call me after 9pm") and not rules.conditional("Call me")
    s = open_store  # noqa: F841 - the cap needs an item: built by hand
    from hippo_injection.domain.memtok.models import Memtok

    def item(conditional: bool) -> Memtok:
        return Memtok(
            "id", "t", "u", "w", "w", np.ones(4, np.float32), np.ones(4, np.float32), 3, "m",
            count=100, keep=1, rank_max=1, surprise=1, emphasis=0, stakes=0,
            conditional=conditional, source=Source.OPERATOR, created_us=T0, last_seen_us=T0,
            grace_until_us=T0,
        )  # fmt: skip

    plain = rules.strength(item(False), 0.8, T0, p)
    assert rules.strength(item(True), 0.8, T0, p) == pytest.approx(plain * p.condition_cap)


def test_reply_words_enter_only_when_echoed(store: MemtokStore) -> None:
    buffered = store.buffer_reply("t", "u", [obs("Lisbon"), obs("tram"), obs("a", 0.1)], T0)
    assert buffered == 2  # below the minimum rank: not even buffered
    report = store.promote("t", "u", "How far is the tram from the beach?", T0 + 1)
    assert report.promoted == ["tram"]
    items = store.items.by_user("t", "u")
    assert [(m.word, m.source) for m in items] == [("tram", Source.MODEL)]
    assert store.buffered("t", "u") == []  # the rest was discarded
    assert store.promote("t", "u", "Lisbon?", T0 + 2).promoted == []


def test_store_of_another_model_is_refused_until_rebuilt(tmp_path: Path, engine_url: str) -> None:
    s = open_store(tmp_path, values=FakeValues("model-a"), url=engine_url)
    s.admit("t", "u", [obs("Lisbon")], T0)
    close(s)
    with pytest.raises(StoreModelMismatch, match="model-a"):
        open_store(tmp_path, values=FakeValues("model-b"), url=engine_url)
    s = open_store(tmp_path, values=FakeValues("model-b"), verify_model=False, url=engine_url)
    assert s.rebuild() == 1
    close(s)
    s = open_store(tmp_path, values=FakeValues("model-b"), url=engine_url)  # accepted now
    try:
        (item,) = s.items.by_user("t", "u")
        assert item.model_id == "model-b"
        np.testing.assert_allclose(
            item.value, FakeValues("model-b").values([item.source_words])[0], atol=1e-2
        )
    finally:
        close(s)


def test_reopen_keeps_items_and_search_is_scoped(tmp_path: Path, engine_url: str) -> None:
    s = open_store(tmp_path, url=engine_url)
    s.admit("t", "u", [obs("Lisbon", context="moved to")], T0)
    s.admit("t", "other", [obs("Lisbon", context="moved to")], T0)
    close(s)
    s = open_store(tmp_path, url=engine_url)
    try:
        key = s.embedder.embed(["moved to Lisbon"])[0]
        hits = s.search("t", "u", key, 10)
        assert [(m.word, m.user) for m, _ in hits] == [("Lisbon", "u")]
        assert hits[0][1] == pytest.approx(1.0, abs=1e-4)
        assert s.forget("t", "u") == 1 and s.search("t", "u", key, 10) == []
        assert len(s.search("t", "other", key, 10)) == 1
    finally:
        close(s)


def test_consolidation_merges_near_duplicates_counting_operator_items(
    tmp_path: Path, engine_url: str
) -> None:
    s = open_store(tmp_path, Policy(min_rank=0.1, compress_below=0.0), url=engine_url)
    try:
        s.admit("t", "u", [obs("Lisbon", context="moved to")], T0)
        s.admit("t", "u", [obs("Lisbon", context="moved to sunny")], T0 + 1)
        s.admit("t", "u", [obs("Lisbon", context="moved to rainy")], T0 + 2, Source.MODEL)
        assert len(s.items.by_user("t", "u")) == 3  # too far apart to merge at 0.9
        s.policy = Policy(min_rank=0.1, merge_similarity=0.5, compress_below=0.0)
        report = s.consolidate("t", "u")
        assert [r.outcome for r in report.removed] == ["merged", "merged"]
        (item,) = s.items.by_user("t", "u")
        assert item.count == 2  # two operator mentions; the model's adds no count
        assert item.source is Source.OPERATOR and item.last_seen_us == T0 + 2
        hits = s.search("t", "u", item.key, 10)
        assert [m.id for m, _ in hits] == [item.id]  # the merged-away keys are gone too
    finally:
        close(s)


def test_rebuild_moves_the_store_to_the_served_model(
    tmp_path: Path,
    engine_url: str,
    tiny_engine: TransformersEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`hippo memtok rebuild` in either mode (cluster mode: with a throwaway key index of
    its own), on the tiny model; the real model's run is in test_memtok_model.py."""
    hidden = tiny_engine.info.hidden_size
    s = open_store(tmp_path, values=FakeValues("another-model", 1, hidden), url=engine_url)
    s.admit("t", "u", [obs("cat", context="the")], T0)
    close(s)
    served = settings(tmp_path, engine_url, memtok_layer=1, memtok_attend_layer=1)
    with pytest.raises(StoreModelMismatch, match="another-model"):
        open_real(served, tiny_engine, BagEmbedder())
    monkeypatch.setattr("hippo_injection.__main__.load_engine", lambda _: tiny_engine)
    assert memtok_rebuild.missing(served) == ""
    assert memtok_rebuild.rebuild(served) == (tiny_engine.info.model, 1, 1)
    store = open_real(served, tiny_engine, BagEmbedder())  # accepted now
    try:
        (item,) = store.items.by_user("t", "u")
        want = EngineValues(tiny_engine, 1).values([item.source_words])[0]
        assert item.model_id == tiny_engine.info.model
        np.testing.assert_allclose(item.value, want, atol=1e-2 * float(np.abs(want).max()))
        assert [m.id for m, _ in store.search("t", "u", item.key, 5)] == [item.id]
        states = store.items.states("t", "u", [item.id])[item.id]  # the rebuild made them
        assert states.model_id == tiny_engine.info.model and states.from_layer == 1
    finally:
        close(store)
    if not engine_url:
        empty = settings(tmp_path / "elsewhere")
        assert memtok_rebuild.missing(empty) == str(tmp_path / "elsewhere" / "memtok.sqlite3")


# -- attendable states (issue 20) --------------------------------------------------------


def test_attendable_states_survive_a_restart_bit_exactly(tmp_path: Path, engine_url: str) -> None:
    s = open_store(tmp_path, attend=FakeStates(), url=engine_url)
    s.admit("t", "u", [obs("Lisbon", context="moved to"), obs("violin", context="plays the")], T0)
    ids = {m.word: m.id for m in s.items.by_user("t", "u")}
    assert all(m.states is None for m in s.items.by_user("t", "u"))  # read apart only
    close(s)
    s = open_store(tmp_path, attend=FakeStates(), url=engine_url)
    try:
        stored = s.items.states("t", "u", list(ids.values()))
        for word, source in (("Lisbon", "moved to Lisbon"), ("violin", "plays the violin")):
            (want,) = FakeStates().states([source])
            got = stored[ids[word]]
            assert got.model_id == "model-a" and got.from_layer == 1
            assert got.keys.dtype == np.float16
            assert np.array_equal(got.keys, want.keys)
            assert np.array_equal(got.values, want.values)
        assert s.items.states("t", "other", list(ids.values())) == {}  # scoped
    finally:
        close(s)


def test_compressed_items_keep_their_states_in_int8(tmp_path: Path, engine_url: str) -> None:
    p = Policy(capacity=3, min_rank=0.1, grace_days=0.0, compress_below=0.3)
    s = open_store(tmp_path, p, attend=FakeStates(), url=engine_url)
    try:
        s.admit("t", "u", [obs("weakA", 0.2, surprise=0)], T0)
        s.admit("t", "u", [obs("weakB", 0.25, surprise=0)], T0)
        s.admit("t", "u", [obs("strong", 0.9, surprise=12)], T0)
        report = s.admit("t", "u", [obs("new1", 0.9, surprise=12)], T0 + 1)
        assert ("weakA", "compressed") in [(r.word, r.outcome) for r in report.removed]
        weak = next(m for m in s.items.by_user("t", "u") if m.word == "weakA")
        assert weak.packing is Packing.INT8
        (want,) = FakeStates().states([weak.source_words])
        got = s.items.states("t", "u", [weak.id])[weak.id]
        for have, exact in ((got.keys, want.keys), (got.values, want.values)):
            peak = np.abs(exact.astype(np.float32)).max(axis=-1, keepdims=True)
            error = np.abs(have.astype(np.float32) - exact.astype(np.float32))
            assert (error <= peak / 127 + 1e-3).all() and not np.array_equal(have, exact)
    finally:
        close(s)


def test_a_store_attending_from_another_layer_is_refused_until_rebuilt(
    tmp_path: Path, engine_url: str
) -> None:
    s = open_store(tmp_path, attend=FakeStates(from_layer=1), url=engine_url)
    s.admit("t", "u", [obs("Lisbon")], T0)
    close(s)
    with pytest.raises(StoreModelMismatch, match="layer 1"):
        open_store(tmp_path, attend=FakeStates(from_layer=2), url=engine_url)
    s = open_store(tmp_path, attend=FakeStates(from_layer=2), verify_model=False, url=engine_url)
    assert s.rebuild() == 1
    close(s)
    s = open_store(tmp_path, attend=FakeStates(from_layer=2), url=engine_url)  # accepted now
    try:
        (item,) = s.items.by_user("t", "u")
        got = s.items.states("t", "u", [item.id])[item.id]
        assert got.from_layer == 2 and got.values.shape[0] == FakeStates.layers - 2
    finally:
        close(s)
    with pytest.raises(ValueError, match="one model"):
        open_store(tmp_path / "x", attend=FakeStates("model-b"), url=engine_url)


def test_forget_removes_the_states_with_the_items(tmp_path: Path, engine_url: str) -> None:
    s = open_store(tmp_path, attend=FakeStates(), url=engine_url)
    try:
        s.admit("t", "u", [obs("Lisbon", context="moved to")], T0)
        s.admit("t", "v", [obs("Lisbon", context="moved to")], T0)
        (mine,) = s.items.by_user("t", "u")
        (theirs,) = s.items.by_user("t", "v")
        assert s.forget("t", "u") == 1
        assert s.items.states("t", "u", [mine.id]) == {}
        assert list(s.items.states("t", "v", [theirs.id])) == [theirs.id]
    finally:
        close(s)


def test_the_served_store_keeps_states_the_model_attends_as_it_reads_them(
    tmp_path: Path, engine_url: str, tiny_engine: TransformersEngine
) -> None:
    """The service's wiring (memtok_attend_layer): a new item's states come from the
    served model and, read back from the store, are attended as reading its source words
    now would be."""
    import torch

    from hippo_injection.domain.types import Attendable, Sampling

    served = settings(tmp_path, engine_url, memtok_layer=1, memtok_attend_layer=1)
    store = open_real(served, tiny_engine, BagEmbedder())
    try:
        store.admit("t", "u", [obs("cat", context="the black")], T0)
        (item,) = store.items.by_user("t", "u")
        states = store.items.states("t", "u", [item.id])[item.id]
        assert states.model_id == tiny_engine.info.model and states.from_layer == 1
        prompt = [2, 14, 15]

        def last(attendable: Attendable) -> torch.Tensor:
            run = tiny_engine.open(prompt, [], attendable, Sampling())
            try:
                return run.forward(prompt, 1)[-1]
            finally:
                run.close()

        read = last(Attendable((item.source_words,), from_layer=1))
        stored = last(Attendable(from_layer=1, states=(states,)))
        torch.testing.assert_close(stored, read, atol=2e-3, rtol=2e-3)
    finally:
        close(store)
    with pytest.raises(StoreModelMismatch, match="attendable states from layer 1"):
        open_real(settings(tmp_path, engine_url, memtok_layer=1, memtok_attend_layer=2),
                  tiny_engine, BagEmbedder())  # fmt: skip
