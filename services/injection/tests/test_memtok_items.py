"""The memtok item store's contract, on both engines (SQLite, the embedded default, and
PostgreSQL, cluster mode): rows and vector packing, tenancy in SQL, change numbers,
meta, user modes, erasure, the write hold and the upkeep lease, and the reply buffer.
Then what each engine adds: the SQLite file of the unversioned store still opens and an
erasure leaves no word in its files; PostgreSQL's change feed and its trimming, and the
VACUUM after an erasure."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
from memtok_fakes import settings

from hippo_core.errors import FailedPrecondition
from hippo_injection.__main__ import open_items
from hippo_injection.adapters import memtok_rows
from hippo_injection.adapters.memtok_sqlite import SqliteMemtokStore
from hippo_injection.domain.memtok.buffer import MemoryReplyBuffer
from hippo_injection.domain.memtok.models import Memtok, Observation, Packing, Source
from hippo_injection.domain.memtok.ports import ItemStore, ReplyBuffer

T0 = 1_760_000_000_000_000
SECRET = "Zanzibarique"  # a word that occurs nowhere else in the files


def item(memtok_id: str, tenant: str = "t", user: str = "u", **kw: object) -> Memtok:
    rng = np.random.default_rng(abs(hash(memtok_id)) % 2**32)
    key = rng.standard_normal(384).astype(np.float32)
    fields: dict[str, object] = dict(
        id=memtok_id, tenant=tenant, user=user, word="Lisbon", source_words="moved to Lisbon",
        key=key / np.linalg.norm(key), value=rng.standard_normal(16).astype(np.float32),
        layer=3, model_id="model-a", count=2, keep=0.5, rank_max=0.8, surprise=6.0,
        emphasis=0.1, stakes=0.2, conditional=True, source=Source.OPERATOR, created_us=T0,
        last_seen_us=T0 + 1, grace_until_us=T0 + 2, resurface_at_us=T0 + 3,
    )  # fmt: skip
    fields.update(kw)
    return Memtok(**fields)  # type: ignore[arg-type]


@pytest.fixture
def stores(tmp_path: Path, engine_url: str) -> Iterator[tuple[ItemStore, ReplyBuffer]]:
    items, buffer = open_items(settings(tmp_path, engine_url))
    yield items, buffer or MemoryReplyBuffer()
    items.close()


@pytest.fixture
def items(stores: tuple[ItemStore, ReplyBuffer]) -> ItemStore:
    return stores[0]


def test_rows_round_trip_with_their_packing(items: ItemStore) -> None:
    plain = item("a")
    packed = item("b", packing=Packing.INT8, conditional=False, source=Source.MODEL)
    items.put([plain, packed])
    got = {m.id: m for m in items.get("t", "u", ["a", "b", "missing"])}
    assert set(got) == {"a", "b"}
    for want in (plain, packed):
        m = got[want.id]
        np.testing.assert_array_equal(m.key, want.key)  # float32, exact
        step = np.abs(want.value).max() / 127 if m.packing is Packing.INT8 else 1e-2
        np.testing.assert_allclose(m.value, want.value, atol=step)
        for field in ("tenant", "user", "word", "source_words", "layer", "model_id", "count",
                      "keep", "rank_max", "surprise", "emphasis", "stakes", "conditional",
                      "source", "packing", "created_us", "last_seen_us", "grace_until_us",
                      "resurface_at_us"):  # fmt: skip
            assert getattr(m, field) == getattr(want, field), field
    assert [m.id for m in items.get("t", "u", ["b", "a"])] == ["b", "a"]  # in the order asked


def test_reads_and_writes_are_scoped_by_tenant_and_user(items: ItemStore) -> None:
    items.put([item("a"), item("b", user="v"), item("c", tenant="t2")])
    assert items.get("t", "v", ["a"]) == [] and items.get("t2", "u", ["a"]) == []
    assert [m.id for m in items.by_user("t", "u")] == ["a"]
    assert items.users() == [("t", "u"), ("t", "v"), ("t2", "u")]
    assert (items.count("t", "u"), items.count("t", "w")) == (1, 0)
    items.delete("t", "v", ["a"])  # another user's id: nothing happens to it
    items.put([item("a", tenant="t2", user="x", word="stolen")])  # nor here
    (a,) = items.get("t", "u", ["a"])
    assert a.word == "Lisbon" and items.get("t2", "x", ["a"]) == []


def test_every_write_is_numbered_after_the_last(items: ItemStore) -> None:
    assert items.head() == 0
    first = items.put([item("a"), item("b")])
    second = items.delete("t", "u", ["a"])
    assert 0 < first < second == items.head()
    assert items.put([]) == 0 and items.delete("t", "u", []) == 0
    assert items.head() == second
    assert [m.id for m in items.by_user("t", "u")] == ["b"]


def test_the_first_model_claims_the_store(items: ItemStore) -> None:
    assert items.claim_meta({"model_id": "a", "layer": "3"}) == {"model_id": "a", "layer": "3"}
    assert items.claim_meta({"model_id": "b", "layer": "4"}) == {"model_id": "a", "layer": "3"}
    items.set_meta({"model_id": "b"})  # a rebuild moves it
    assert items.meta() == {"model_id": "b", "layer": "3"}


def test_user_modes(items: ItemStore) -> None:
    assert items.user_mode("t", "u") is None
    items.set_user_mode("t", "u", "on")
    items.set_user_mode("t", "u", "disclose_only")
    items.set_user_mode("t", "v", "off")
    assert (items.user_mode("t", "u"), items.user_mode("t2", "u")) == ("disclose_only", None)
    items.set_user_mode("t", "u", None)
    assert items.user_mode("t", "u") is None and items.user_mode("t", "v") == "off"


def test_erase_leaves_nothing_of_the_user(items: ItemStore) -> None:
    items.put([item("a"), item("b"), item("c", user="v"), item("d", tenant="t2")])
    items.set_user_mode("t", "u", "on")
    items.set_user_mode("t", "v", "on")
    before = items.head()
    ids, seq = items.erase("t", "u")
    assert ids == ["a", "b"] and seq > before
    assert items.by_user("t", "u") == [] and items.user_mode("t", "u") is None
    assert [m.id for m in items.by_user("t", "v")] == ["c"] and items.user_mode("t", "v") == "on"
    assert [m.id for m in items.by_user("t2", "u")] == ["d"]
    assert items.erase("t", "u")[0] == []  # a retry finds nothing more


def test_the_write_hold_is_reentrant(items: ItemStore) -> None:
    with items.writing("t", "u"), items.writing("t", "u"):
        items.put([item("a")])
    assert items.count("t", "u") == 1


def test_reply_buffer(stores: tuple[ItemStore, ReplyBuffer]) -> None:
    _, buffer = stores
    words = [Observation(w, f"say {w}", 0.5 + i / 10, 3.0, 1.0, 0.1, 0.2, i == 1)
             for i, w in enumerate(["tram", "beach", "Lisbon"])]  # fmt: skip
    buffer.replace("t", "u", [(o, T0 + i) for i, o in enumerate(words)])
    buffer.replace("t", "v", [(words[0], T0)])
    assert buffer.peek("t", "u") == [(o, T0 + i) for i, o in enumerate(words)]  # in order
    buffer.replace("t", "u", [(words[2], T0 + 9)])  # a new reply replaces the last one's
    assert buffer.take("t", "u") == [(words[2], T0 + 9)]
    assert buffer.take("t", "u") == [] and buffer.peek("t", "v") == [(words[0], T0)]
    buffer.drop("t", "v")
    assert buffer.peek("t", "v") == []


# -- SQLite --------------------------------------------------------------------------------

LEGACY_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS memtoks (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, user_id TEXT NOT NULL, word TEXT NOT NULL,
  source_words TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, packing TEXT NOT NULL,
  scale REAL NOT NULL, layer INTEGER NOT NULL, model_id TEXT NOT NULL, count INTEGER NOT NULL,
  keep REAL NOT NULL, rank_max REAL NOT NULL, surprise REAL NOT NULL, emphasis REAL NOT NULL,
  stakes REAL NOT NULL, conditional INTEGER NOT NULL, source TEXT NOT NULL,
  created_us INTEGER NOT NULL, last_seen_us INTEGER NOT NULL, grace_until_us INTEGER NOT NULL,
  resurface_at_us INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS memtoks_user ON memtoks (tenant, user_id);
CREATE TABLE IF NOT EXISTS user_modes (
  tenant TEXT NOT NULL, user_id TEXT NOT NULL, mode TEXT NOT NULL,
  PRIMARY KEY (tenant, user_id)
);
"""


def test_a_store_written_before_versions_opens_and_keeps_its_rows(tmp_path: Path) -> None:
    """The unversioned store (user_version 0, its tables already there) opens, migrated
    to the current version (2: attendable states), with every row and its change
    number; its rows have no states."""
    path = tmp_path / "memtok.sqlite3"
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    old.executescript(LEGACY_SCHEMA)
    old.execute(
        f"INSERT INTO memtoks ({memtok_rows.COLUMNS}) VALUES ({','.join('?' * 23)})",
        memtok_rows.to_row(item("a")),
    )
    old.executemany("INSERT INTO meta VALUES (?, ?)", [("model_id", "model-a"), ("key_seq", "7")])
    old.close()
    store = SqliteMemtokStore(path)
    try:
        assert [m.id for m in store.by_user("t", "u")] == ["a"]
        assert store.head() == 7 and store.meta()["model_id"] == "model-a"
        assert store.put([item("b")]) == 8
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == 2
        assert store._db.execute("PRAGMA secure_delete").fetchone()[0] == 1
        assert int(store._db.execute("PRAGMA busy_timeout").fetchone()[0]) > 0
        assert store.states("t", "u", ["a", "b"]) == {}
    finally:
        store.close()
    newer = sqlite3.connect(path)
    newer.execute("PRAGMA user_version = 3")
    newer.close()
    with pytest.raises(FailedPrecondition, match="version 3"):
        SqliteMemtokStore(path)


def test_sqlite_erasure_leaves_no_word_in_the_files(tmp_path: Path) -> None:
    path = tmp_path / "memtok.sqlite3"
    store = SqliteMemtokStore(path)
    try:
        store.put([item("a", word=SECRET, source_words=f"my {SECRET} code")])
        store.put([item("b", user="v")])
        files = [path, path.with_name(path.name + "-wal")]
        assert any(SECRET.encode() in f.read_bytes() for f in files if f.exists())
        store.erase("t", "u")
        for f in files:
            assert not f.exists() or SECRET.encode() not in f.read_bytes(), f.name
        assert path.with_name(path.name + "-wal").stat().st_size == 0  # purged
        assert [m.id for m in store.by_user("t", "v")] == ["b"]
    finally:
        store.close()


def test_sqlite_has_one_writer_and_no_feed(tmp_path: Path) -> None:
    store = SqliteMemtokStore(tmp_path / "memtok.sqlite3")
    try:
        seq = store.put([item("a")])
        assert not store.shared and store.owns_upkeep()
        assert store.changes(0, seq) is None and store.trim_changes(T0 * 10) == 0
    finally:
        store.close()


# -- PostgreSQL ---------------------------------------------------------------------------


@pytest.fixture
def pg(tmp_path: Path, postgres_url: str) -> Iterator[ItemStore]:
    items, _ = open_items(settings(tmp_path, postgres_url))
    yield items
    items.close()


def test_the_feed_names_each_change_as_it_stands_now(pg: ItemStore) -> None:
    assert pg.shared
    s1 = pg.put([item("a"), item("b")])
    s2 = pg.put([item("c", tenant="t2")])
    s3 = pg.delete("t", "u", ["a"])
    changes = pg.changes(0, s3)
    assert changes is not None
    assert sorted(m.id for m in changes.live) == ["b", "c"]  # "a" is gone by now
    assert changes.gone == [("t", "a")]
    first = pg.changes(0, s1)
    assert first is not None and [m.id for m in first.live] == ["b"] and first.gone == []
    # "a" moved on to s3: a replica that applied s1 already learns of it from s3 on.
    later = pg.changes(s1, s3)
    assert later is not None and [m.id for m in later.live] == ["c"]
    assert later.gone == [("t", "a")]
    assert pg.changes(s2, s2) is not None and pg.changes(s2, s2).live == []  # type: ignore[union-attr]


def test_trimming_drops_old_tombstones_only(pg: ItemStore) -> None:
    pg.put([item("a"), item("b")])
    deleted = pg.delete("t", "u", ["a"])
    assert pg.trim_changes(0) == 0  # nothing is that old
    assert pg.trim_changes(2**62) == 1  # the tombstone of "a"; "b" lives on
    assert pg.changes(0, pg.head()) is None  # a reader from before the trim must rebuild
    rest = pg.changes(deleted, pg.head())
    assert rest is not None and rest.live == [] and rest.gone == []
    # A reader past the floor still catches up.
    after = pg.put([item("b", count=5)])
    tail = pg.changes(deleted, after)
    assert tail is not None and [(m.id, m.count) for m in tail.live] == [("b", 5)]


def test_one_writer_of_a_user_at_a_time_across_replicas(tmp_path: Path, postgres_url: str) -> None:
    a, _ = open_items(settings(tmp_path / "a", postgres_url))
    b, _ = open_items(settings(tmp_path / "b", postgres_url))
    entered = {"u": threading.Event(), "v": threading.Event()}

    def other(user: str) -> None:
        with b.writing("t", user):
            entered[user].set()

    waiting = threading.Thread(target=other, args=("u",))
    try:
        with a.writing("t", "u"):
            waiting.start()
            free = threading.Thread(target=other, args=("v",))
            free.start()
            assert entered["v"].wait(5)  # another user's writer goes ahead
            assert not entered["u"].wait(0.5)  # the same user's waits for A
        assert entered["u"].wait(5)  # and enters once A lets go
    finally:
        waiting.join(5)
        a.close()
        b.close()


def test_upkeep_runs_in_one_replica_and_moves_when_it_stops(
    tmp_path: Path, postgres_url: str
) -> None:
    a, _ = open_items(settings(tmp_path / "a", postgres_url))
    b, _ = open_items(settings(tmp_path / "b", postgres_url))
    try:
        assert a.owns_upkeep() and a.owns_upkeep()
        assert not b.owns_upkeep()
        a.close()
        # The server frees the lock when A's backend has gone: a moment after the close.
        deadline = time.monotonic() + 10
        while not b.owns_upkeep() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.owns_upkeep()
    finally:
        b.close()


def test_postgres_erasure_vacuums_the_tables(pg: ItemStore, postgres_url: str) -> None:
    pg.put([item("a", word=SECRET), item("b", user="v")])
    pg.erase("t", "u")
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, last_vacuum IS NOT NULL, n_dead_tup FROM pg_stat_user_tables "
            "WHERE schemaname = 'hippo_injection' AND relname IN ('memtoks', 'feed')"
        ).fetchall()
        words = conn.execute(
            "SELECT count(*) FROM hippo_injection.memtoks WHERE word = %s", (SECRET,)
        )
        assert words.fetchone() == (0,)
    assert sorted(rows) == [("feed", True, 0), ("memtoks", True, 0)]


def test_states_records_round_trip_and_refuse_what_is_not_one() -> None:
    from hippo_injection.adapters.states_codec import pack_states, unpack_states
    from hippo_injection.domain.types import MemoryStates

    rng = np.random.default_rng(5)
    keys = rng.standard_normal((4, 1, 3, 8)).astype(np.float16)
    values = rng.standard_normal((2, 1, 3, 8)).astype(np.float16)
    states = MemoryStates("gemma-ü", 2, keys, values)
    back = unpack_states(pack_states(states))
    assert (back.model_id, back.from_layer) == ("gemma-ü", 2)
    assert np.array_equal(back.keys, keys) and np.array_equal(back.values, values)
    small = unpack_states(pack_states(states, Packing.INT8))
    peak = np.abs(keys.astype(np.float32)).max(axis=-1, keepdims=True)
    assert (np.abs(small.keys.astype(np.float32) - keys) <= peak / 254 + 1e-3).all()
    record = pack_states(states)
    for bad in (b"", b"HMS1", record[:-1], record + b"\0", b"XXXX" + record[4:]):
        with pytest.raises(ValueError, match="not a memory states record"):
            unpack_states(bad)
