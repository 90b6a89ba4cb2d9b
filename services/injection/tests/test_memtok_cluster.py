"""Replicas of the injection service share one memtok store in PostgreSQL, each with its
own key index under its own data dir (two MemtokStores here = two replicas). What one
writes, the other finds and merges into; a user forgotten through one is gone from the
other's search and key index; reply words buffered by one are promoted by the other;
concurrent writers leave every index equal to the store; a replica that comes back
after the feed was trimmed rebuilds; a replica of another model is refused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from memtok_fakes import FakeValues, close, obs, open_store

from hippo_injection.adapters.engine import TransformersEngine
from hippo_injection.domain.memtok.models import StoreModelMismatch, Vector
from hippo_injection.domain.memtok.pipeline import InfluencePipeline, Mode, PipelineSettings
from hippo_injection.domain.memtok.policy import Policy
from hippo_injection.domain.memtok.service import MemtokService
from hippo_injection.domain.memtok.store import MemtokStore
from hippo_injection.domain.queue import ModelQueue

T0 = 1_760_000_000_000_000
POLICY = Policy(capacity=100, min_rank=0.1)


def key_of(store: MemtokStore, text: str) -> Vector:
    return np.asarray(store.embedder.embed([text])[0], dtype=np.float32)


def indexed(store: MemtokStore, tenant: str, user: str) -> set[str]:
    """The ids in this replica's own key index for the user (no catch-up, no read back)."""
    probe = np.ones(384, dtype=np.float32)
    return {i for i, _ in store.keys.search(tenant, user, probe, 1000)}


@pytest.fixture
def replicas(tmp_path: Path, postgres_url: str) -> Iterator[tuple[MemtokStore, MemtokStore]]:
    a = open_store(tmp_path / "a", POLICY, url=postgres_url)
    b = open_store(tmp_path / "b", POLICY, url=postgres_url)
    yield a, b
    close(a)
    close(b)


def test_writes_of_one_replica_are_found_and_merged_by_the_other(
    replicas: tuple[MemtokStore, MemtokStore],
) -> None:
    a, b = replicas
    first = a.admit("t", "u", [obs("Lisbon", context="moved to")], T0).written[0]
    assert indexed(b, "t", "u") == set()  # B has not looked yet
    # B's merge target is A's item: one item, counted twice, whichever replica wrote.
    again = b.admit("t", "u", [obs("Lisbon", context="moved to")], T0 + 1).written[0]
    assert (again.outcome, again.memtok_id, again.count) == ("merged", first.memtok_id, 2)
    porto = a.admit("t", "u", [obs("Porto", context="trip to")], T0 + 2).written[0]
    hits = b.search("t", "u", key_of(b, "trip to Porto"), 1)
    assert [(m.id, m.word) for m, _ in hits] == [(porto.memtok_id, "Porto")]
    assert b.keys.applied_seq() == b.items.head()
    (seen,) = a.search("t", "u", key_of(a, "moved to Lisbon"), 1)
    assert seen[0].id == first.memtok_id and seen[0].count == 2


def test_a_user_forgotten_through_one_replica_is_gone_from_the_other(
    replicas: tuple[MemtokStore, MemtokStore],
) -> None:
    a, b = replicas
    a.admit("t", "u", [obs("Lisbon", context="moved to"), obs("Porto", context="trip")], T0)
    a.admit("t", "other", [obs("Lisbon", context="moved to")], T0)
    a.items.set_user_mode("t", "u", "on")
    b.buffer_reply("t", "u", [obs("tram")], T0)
    b.sync()
    assert len(indexed(a, "t", "u")) == 2 and len(indexed(b, "t", "u")) == 2
    assert b.forget("t", "u") == 2
    # A has not caught up yet: its index still names the ids, but nothing reaches a
    # caller (items are read back from the store).
    assert len(indexed(a, "t", "u")) == 2
    key = key_of(a, "moved to Lisbon")
    assert a.search("t", "u", key, 10) == []  # the search caught up...
    assert indexed(a, "t", "u") == set() and indexed(b, "t", "u") == set()  # ...keys gone
    assert a.items.user_mode("t", "u") is None and a.buffered("t", "u") == []
    assert [m.user for m, _ in a.search("t", "other", key, 10)] == ["other"]
    assert b.forget("t", "u") == 0  # a retry erases nothing more


def test_reply_words_buffered_by_one_replica_are_promoted_by_the_other(
    replicas: tuple[MemtokStore, MemtokStore],
) -> None:
    a, b = replicas
    a.buffer_reply("t", "u", [obs("Lisbon"), obs("tram")], T0)
    assert b.buffered("t", "u") == ["Lisbon", "tram"]
    report = b.promote("t", "u", "How far is the tram from the beach?", T0 + 1)
    assert report.promoted == ["tram"] and a.buffered("t", "u") == []
    assert [m.word for m in a.items.by_user("t", "u")] == ["tram"]


def test_concurrent_writers_leave_every_index_equal_to_the_store(
    replicas: tuple[MemtokStore, MemtokStore],
) -> None:
    a, b = replicas
    words = [f"word{i}" for i in range(12)]
    failures: list[BaseException] = []

    def write(store: MemtokStore, user: str) -> None:
        try:
            for i, w in enumerate(words):
                store.admit("t", user, [obs(w, context=f"ctx {i}")], T0 + i)
                if i % 4 == 3:
                    store.consolidate("t", user)
            store.forget("t", f"{user}-gone")
        except BaseException as exc:  # reported below
            failures.append(exc)

    a.admit("t", "ua-gone", [obs("erased")], T0)
    b.admit("t", "ub-gone", [obs("erased")], T0)
    threads = [threading.Thread(target=write, args=(s, u)) for s, u in ((a, "ua"), (b, "ub"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures
    head = a.items.head()
    for store in (a, b):
        store.sync()
        assert store.keys.applied_seq() == head
        for user in ("ua", "ub", "ua-gone", "ub-gone"):
            want = {m.id for m in store.items.by_user("t", user)}
            assert indexed(store, "t", user) == want, user
    assert len(indexed(a, "t", "ua")) == len(words)


def test_a_replica_behind_the_trimmed_feed_rebuilds(tmp_path: Path, postgres_url: str) -> None:
    a = open_store(tmp_path / "a", POLICY, url=postgres_url)
    b = open_store(tmp_path / "b", POLICY, url=postgres_url)
    try:
        kept = a.admit("t", "u", [obs("Lisbon", context="moved to")], T0).written[0].memtok_id
        gone = a.admit("t", "v", [obs("Porto", context="trip")], T0).written[0].memtok_id
        b.sync()
        close(b)  # B stops with both in its index
        a.forget("t", "v")
        assert a.trim_feed(now_us=2**62, retention_us=0) == 1  # the tombstone is trimmed
        b = open_store(tmp_path / "b", POLICY, url=postgres_url)  # rebuilt at open
        assert indexed(b, "t", "v") == set() and indexed(b, "t", "u") == {kept}
        assert gone not in indexed(b, "t", "u")
        # A fresh replica (empty data dir) starts from the items as well.
        c = open_store(tmp_path / "c", POLICY, url=postgres_url)
        try:
            assert indexed(c, "t", "u") == {kept} and c.keys.applied_seq() == c.items.head()
        finally:
            close(c)
    finally:
        close(a)
        close(b)


def test_a_replica_of_another_model_is_refused(tmp_path: Path, postgres_url: str) -> None:
    a = open_store(tmp_path / "a", values=FakeValues("model-a"), url=postgres_url)
    try:
        with pytest.raises(StoreModelMismatch, match="model-a"):
            open_store(tmp_path / "b", values=FakeValues("model-b"), url=postgres_url)
    finally:
        close(a)


async def test_the_service_erases_a_user_and_records_modes_in_the_shared_store(
    tmp_path: Path, postgres_url: str, tiny_engine: TransformersEngine
) -> None:
    values = FakeValues("tiny-gemma3", layer=1, hidden=tiny_engine.info.hidden_size)
    a = open_store(tmp_path / "a", POLICY, values, url=postgres_url)
    b = open_store(tmp_path / "b", POLICY, values, url=postgres_url)
    queue_a, queue_b = ModelQueue(4), ModelQueue(4)
    pipe = PipelineSettings(layer=1, llm2_layer=1)
    service_a = MemtokService(InfluencePipeline(tiny_engine, a, pipe), queue_a)
    service_b = MemtokService(InfluencePipeline(tiny_engine, b, pipe), queue_b)
    try:
        a.admit("t", "u", [obs("cat", context="the")], T0)
        await service_a.set_user_mode("t", "u", Mode.DISCLOSE_ONLY)
        assert await service_b.resolve("t", "u", None) is Mode.DISCLOSE_ONLY
        assert await service_b.forget("t", "u") == 1
        assert await service_a.resolve("t", "u", None) is Mode.OFF
        assert a.search("t", "u", key_of(a, "the cat"), 10) == []
    finally:
        service_a.close()
        service_b.close()
        await queue_a.close()
        await queue_b.close()
