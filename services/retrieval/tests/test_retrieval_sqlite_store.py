"""The SQLite turn store: durable, idempotent, all-or-nothing, tenant-scoped, truly erasing."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes import memory_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hippo_core.errors import FailedPrecondition, InvalidArgument
from hippo_retrieval.adapters.sqlite_store import SqliteTurnStore
from hippo_retrieval.domain.models import Deletion, NewTurn, Role, StoredTurn


def _turn(
    n: int,
    *,
    tenant: str = "t1",
    user: str = "u1",
    session: str = "s1",
    text: str | None = None,
    client_id: str | None = None,
    **extra: Any,
) -> NewTurn:
    cid = client_id if client_id is not None else f"c{n}"
    return NewTurn(
        memory_id=memory_id(tenant, user, session, client_id=cid),
        tenant=tenant,
        user=user,
        session=session,
        role=Role.USER if n % 2 == 0 else Role.ASSISTANT,
        text=text if text is not None else f"turn {n}",
        time_us=1_700_000_000_000_000 + n,
        client_id=cid,
        **extra,
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "nested" / "dir" / "turns.db"


@pytest.fixture
def store(db: Path) -> Iterator[SqliteTurnStore]:
    s = SqliteTurnStore(db)
    yield s
    s.close()


def _raw(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


# -- setup -------------------------------------------------------------------------------


def test_opens_with_the_promised_settings(db: Path, store: SqliteTurnStore) -> None:
    assert db.exists()  # parent directories were created
    assert _raw(db, "PRAGMA journal_mode") == [("wal",)]
    assert _raw(db, "PRAGMA user_version") == [(1,)]
    conn = store._conn  # the pragmas below are per connection
    assert conn.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    assert conn.execute("PRAGMA secure_delete").fetchone() == (1,)
    assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0


def test_a_newer_schema_is_refused(db: Path) -> None:
    SqliteTurnStore(db).close()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(FailedPrecondition):
        SqliteTurnStore(db)


def test_use_after_close_is_refused(store: SqliteTurnStore) -> None:
    store.close()
    store.close()  # idempotent
    with pytest.raises(FailedPrecondition):
        store.last_seq()


# -- append / get ------------------------------------------------------------------------


def test_round_trip_keeps_every_field(store: SqliteTurnStore) -> None:
    vec = np.array([0.25, -1.5, 3.0e-7, 1.0], dtype=np.float32)
    a = _turn(0, metadata={"z": "last", "a": "first", "ü": "ñ"}, vector=vec)
    b = _turn(1)
    results = store.append([a, b])
    assert [created for _, created in results] == [True, True]

    got = store.get("t1", "u1", [b.memory_id, a.memory_id])
    assert [t.memory_id for t in got] == [b.memory_id, a.memory_id]  # order as asked
    ga, gb = got[1], got[0]
    assert (ga.tenant, ga.user, ga.session, ga.role, ga.text, ga.time_us, ga.client_id) == (
        "t1",
        "u1",
        "s1",
        Role.USER,
        "turn 0",
        a.time_us,
        "c0",
    )
    assert dict(ga.metadata) == {"a": "first", "z": "last", "ü": "ñ"}
    assert ga.vector is not None
    assert ga.vector.dtype == np.float32
    np.testing.assert_array_equal(ga.vector, vec)
    ga.vector[0] = 9.0  # callers own their copy
    assert store.get("t1", "u1", [a.memory_id])[0].vector[0] == np.float32(0.25)  # type: ignore[index]
    assert gb.vector is None
    assert dict(gb.metadata) == {}
    assert gb.role is Role.ASSISTANT
    assert (results[0][0].seq, results[0][0].memory_id) == (ga.seq, ga.memory_id)
    assert ga.seq < gb.seq


def test_metadata_is_stored_as_sorted_json(db: Path, store: SqliteTurnStore) -> None:
    store.append([_turn(0, metadata={"b": "2", "a": "1"})])
    assert _raw(db, "SELECT metadata FROM turns") == [('{"a": "1", "b": "2"}',)]


def test_vector_is_stored_as_little_endian_float32(db: Path, store: SqliteTurnStore) -> None:
    store.append([_turn(0, vector=np.array([1.0, 2.0], dtype=np.float64))])
    [(blob,)] = _raw(db, "SELECT vector FROM turns")
    assert blob == np.array([1.0, 2.0], dtype="<f4").tobytes()


def test_get_skips_missing_and_repeats(store: SqliteTurnStore) -> None:
    a = _turn(0)
    store.append([a])
    got = store.get("t1", "u1", ["nope", a.memory_id, a.memory_id])
    assert [t.memory_id for t in got] == [a.memory_id]
    assert store.get("t1", "u1", []) == []


def test_get_handles_more_ids_than_one_sql_statement_binds(store: SqliteTurnStore) -> None:
    turns = [_turn(n) for n in range(1200)]
    store.append(turns)
    asked = [t.memory_id for t in reversed(turns)]
    assert [t.memory_id for t in store.get("t1", "u1", asked)] == asked


def test_append_is_idempotent(store: SqliteTurnStore) -> None:
    turns = [_turn(0), _turn(1)]
    first = store.append(turns)
    seq = store.last_seq()
    # a retry with edited text must still not write: the stored turn wins
    retry = [_turn(0, text="changed"), _turn(1)]
    second = store.append(retry)
    assert [created for _, created in second] == [False, False]
    assert [t for t, _ in second] == [t for t, _ in first]  # the stored turns, unchanged
    assert second[0][0].text == "turn 0"
    assert store.last_seq() == seq
    assert store.count("t1", "u1") == 2
    assert len(store.changes(0, 100)) == 2


def test_duplicates_within_one_batch_are_written_once(store: SqliteTurnStore) -> None:
    a = _turn(0)
    out = store.append([a, _turn(1), a])
    assert [created for _, created in out] == [True, True, False]
    assert out[2][0].seq == out[0][0].seq
    assert store.count("t1", "u1") == 2
    assert store.last_seq() == 2


def test_same_id_in_another_tenant_is_a_different_turn(store: SqliteTurnStore) -> None:
    a = _turn(0, tenant="t1")
    b = NewTurn(**{**a.__dict__, "tenant": "t2", "text": "other tenant"})
    out = store.append([a, b])
    assert [created for _, created in out] == [True, True]
    assert store.get("t1", "u1", [a.memory_id])[0].text == "turn 0"
    assert store.get("t2", "u1", [a.memory_id])[0].text == "other tenant"


def test_reusing_another_users_id_is_refused_and_writes_nothing(store: SqliteTurnStore) -> None:
    a = _turn(0, user="alice", text="alice's secret")
    store.append([a])
    seq = store.last_seq()
    forged = NewTurn(**{**a.__dict__, "user": "bob", "text": "bob"})
    with pytest.raises(InvalidArgument) as err:
        store.append([_turn(1, user="bob"), forged])
    assert err.value.field == "memory_id"
    assert "secret" not in err.value.message
    assert store.count("t1", "bob") == 0
    assert store.last_seq() == seq


def test_a_failure_mid_batch_leaves_nothing(db: Path, store: SqliteTurnStore) -> None:
    store.append([_turn(0)])
    seq = store.last_seq()
    bad = _turn(3, text="x")
    object.__setattr__(bad, "text", None)  # violates NOT NULL inside the transaction
    with pytest.raises(sqlite3.IntegrityError):
        store.append([_turn(1), _turn(2), bad, _turn(4)])
    assert store.count("t1", "u1") == 1
    assert store.last_seq() == seq
    assert len(store.changes(0, 100)) == 1
    assert _raw(db, "SELECT COUNT(*) FROM changes") == [(1,)]
    # the connection is usable afterwards (not stuck inside the aborted transaction)
    assert [c for _, c in store.append([_turn(1), _turn(2)])] == [True, True]
    assert store.last_seq() == seq + 2


def test_an_exception_after_some_inserts_rolls_back(
    store: SqliteTurnStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = SqliteTurnStore._insert
    calls = 0

    def flaky(conn: sqlite3.Connection, turn: NewTurn, row: Any) -> StoredTurn:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError("disk went away")
        return real(conn, turn, row)

    monkeypatch.setattr(SqliteTurnStore, "_insert", staticmethod(flaky))
    with pytest.raises(OSError):
        store.append([_turn(n) for n in range(5)])
    assert calls == 3
    monkeypatch.undo()
    assert store.count("t1", "u1") == 0
    assert store.last_seq() == 0
    assert store.changes(0, 10) == []


def test_bad_vector_shape_is_refused_before_writing(store: SqliteTurnStore) -> None:
    with pytest.raises(InvalidArgument):
        store.append([_turn(0), _turn(1, vector=np.zeros((2, 2), dtype=np.float32))])
    assert store.count("t1", "u1") == 0


# -- sequence and change feed ------------------------------------------------------------


def test_seq_strictly_increases_across_puts_and_deletes(store: SqliteTurnStore) -> None:
    seen: list[int] = []
    for n in range(3):
        seen += [t.seq for t, _ in store.append([_turn(2 * n), _turn(2 * n + 1)])]
        store.delete("t1", "u1", memory_ids=[_turn(2 * n).memory_id])
        seen.append(store.last_seq())
    assert seen == sorted(seen)
    assert len(set(seen)) == len(seen)
    # each delete takes one seq for the erasure and one for touching the next turn of
    # the session (whose BM25 document quoted the erased one)
    assert seen == [1, 2, 4, 5, 6, 8, 9, 10, 12]
    # every seq appears once in the raw log, shared by both kinds
    feed = store.changes(0, 100)
    assert [c.seq for c in feed] == sorted({c.seq for c in feed})


def test_change_feed_order_and_content(store: SqliteTurnStore) -> None:
    a, b, c = _turn(0), _turn(1), _turn(2)
    store.append([a, b])  # seq 1, 2
    store.delete("t1", "u1", memory_ids=[a.memory_id])  # seq 3, and 4 touches b
    store.append([c])  # seq 5

    feed = store.changes(0, 100)
    assert [type(x) for x in feed] == [StoredTurn, Deletion, StoredTurn, StoredTurn]
    assert isinstance(feed[0], StoredTurn)
    assert (feed[0].seq, feed[0].memory_id, feed[0].text) == (2, b.memory_id, "turn 1")
    assert feed[1] == Deletion(seq=3, tenant="t1", memory_id=a.memory_id)
    assert isinstance(feed[2], StoredTurn)  # the touch: b's current row at the touch's seq
    assert (feed[2].seq, feed[2].memory_id, feed[2].position) == (4, b.memory_id, 2)
    assert isinstance(feed[3], StoredTurn)
    assert (feed[3].seq, feed[3].memory_id) == (5, c.memory_id)
    # the erased turn's put is not returned: no text of it leaves the store
    assert not any(isinstance(x, StoredTurn) and x.memory_id == a.memory_id for x in feed)
    # c's previous turn in the session is b now that a is gone; b has none
    previous = store.previous([feed[3], feed[2]])
    assert {k: v.memory_id for k, v in previous.items()} == {c.memory_id: b.memory_id}

    assert [x.seq for x in store.changes(2, 100)] == [3, 4, 5]
    assert store.changes(5, 100) == []
    # limit counts returned entries, skipping superseded puts
    assert [x.seq for x in store.changes(0, 1)] == [2]
    assert [x.seq for x in store.changes(0, 2)] == [2, 3]
    with pytest.raises(InvalidArgument):
        store.changes(0, 0)


def test_paging_the_feed_reaches_every_change(store: SqliteTurnStore) -> None:
    store.append([_turn(n) for n in range(25)])
    store.delete("t1", "u1", memory_ids=[_turn(n).memory_id for n in range(0, 25, 3)])
    pages: list[int] = []
    after = 0
    while page := store.changes(after, 4):
        pages += [c.seq for c in page]
        after = page[-1].seq
    assert pages == [c.seq for c in store.changes(0, 1000)]
    assert pages[-1] == store.last_seq()


# -- delete ------------------------------------------------------------------------------


def test_delete_by_session(store: SqliteTurnStore) -> None:
    s1 = [_turn(n, session="s1") for n in range(3)]
    s2 = [_turn(n, session="s2") for n in range(2)]
    store.append(s1 + s2)
    erased = store.delete("t1", "u1", session="s1")
    assert erased == [t.memory_id for t in s1]
    assert store.get("t1", "u1", [t.memory_id for t in s1]) == []
    assert len(store.get("t1", "u1", [t.memory_id for t in s2])) == 2
    assert store.delete("t1", "u1", session="s1") == []  # nothing left: no new changes
    assert store.last_seq() == 8


def test_delete_by_ids(store: SqliteTurnStore) -> None:
    turns = [_turn(n) for n in range(4)]
    store.append(turns)
    erased = store.delete(
        "t1", "u1", memory_ids=[turns[2].memory_id, "missing", turns[0].memory_id]
    )
    assert erased == [turns[0].memory_id, turns[2].memory_id]  # write order
    assert [t.memory_id for t in store.get("t1", "u1", [t.memory_id for t in turns])] == [
        turns[1].memory_id,
        turns[3].memory_id,
    ]


def test_delete_by_ids_within_a_session(store: SqliteTurnStore) -> None:
    a, b = _turn(0, session="s1"), _turn(0, session="s2")
    store.append([a, b])
    assert store.delete("t1", "u1", session="s1", memory_ids=[a.memory_id, b.memory_id]) == [
        a.memory_id
    ]
    assert store.count("t1", "u1") == 1


def test_delete_whole_user(store: SqliteTurnStore) -> None:
    mine = [_turn(n, session=f"s{n % 3}") for n in range(6)]
    theirs = [_turn(n, user="u2") for n in range(2)]
    store.append(mine + theirs)
    assert sorted(store.delete("t1", "u1")) == sorted(t.memory_id for t in mine)
    assert store.count("t1", "u1") == 0
    assert store.count("t1", "u2") == 2
    deletions = [c for c in store.changes(0, 100) if isinstance(c, Deletion)]
    assert sorted(d.memory_id for d in deletions) == sorted(t.memory_id for t in mine)


def test_a_deleted_id_can_be_written_again(store: SqliteTurnStore) -> None:
    a = _turn(0)
    first = store.append([a])[0][0]
    store.delete("t1", "u1", memory_ids=[a.memory_id])
    ((again, created),) = store.append([a])
    assert created
    assert again.seq > first.seq
    assert [type(c) for c in store.changes(0, 10)] == [Deletion, StoredTurn]


def test_other_scopes_are_untouched_by_get_and_delete(store: SqliteTurnStore) -> None:
    # same texts and client ids everywhere: only the scope tells them apart
    scopes = [("t1", "u1"), ("t1", "u2"), ("t2", "u1")]
    ids = {}
    for tenant, user in scopes:
        turns = [_turn(n, tenant=tenant, user=user, text="same text") for n in range(3)]
        store.append(turns)
        ids[(tenant, user)] = [t.memory_id for t in turns]
    every = [i for v in ids.values() for i in v]
    for tenant, user in scopes:
        got = store.get(tenant, user, every)
        assert {t.memory_id for t in got} == set(ids[(tenant, user)])
        assert {(t.tenant, t.user) for t in got} == {(tenant, user)}
    assert store.delete("t2", "u1", memory_ids=ids[("t1", "u1")]) == []
    assert store.delete("t1", "u2", memory_ids=ids[("t1", "u1")]) == []
    assert store.delete("t3", "u1") == []
    assert all(store.count(t, u) == 3 for t, u in scopes)


_TENANTS = st.sampled_from(["t1", "t2", "t3"])
_USERS = st.sampled_from(["u1", "u2"])
_SESSIONS = st.sampled_from(["s1", "s2"])
_TEXTS = st.sampled_from(["hello", "same words", ""])
_CLIENT_IDS = st.sampled_from(["a", "b", "c"])

_new_turns = st.lists(st.tuples(_TENANTS, _USERS, _SESSIONS, _TEXTS, _CLIENT_IDS), max_size=25)
_deletes = st.lists(
    st.tuples(
        _TENANTS,
        _USERS,
        st.none() | _SESSIONS,
        st.lists(st.tuples(_USERS, _SESSIONS, _CLIENT_IDS), max_size=4),
    ),
    max_size=5,
)


def _id(user: str, session: str, client: str) -> str:
    # The same raw id in every tenant: isolation must come from the tenant, not the id.
    return f"{user}/{session}/{client}"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(writes=_new_turns, deletes=_deletes)
def test_no_read_or_delete_crosses_its_scope(
    writes: list[tuple[str, str, str, str, str]],
    deletes: list[tuple[str, str, str | None, list[tuple[str, str, str]]]],
) -> None:
    model: dict[tuple[str, str], tuple[str, str, str]] = {}  # (tenant, id) -> user, sess, text
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteTurnStore(Path(tmp) / "t.db")
        try:
            batch = []
            for tenant, user, session, text, client in writes:
                mid = _id(user, session, client)
                batch.append(
                    NewTurn(mid, tenant, user, session, Role.USER, text, 1, client_id=client)
                )
                model.setdefault((tenant, mid), (user, session, text))
            store.append(batch)
            all_ids = sorted(
                {_id(u, s, c) for u in ["u1", "u2"] for s in ["s1", "s2"] for c in "abc"}
            )

            def check() -> None:
                for tenant in ["t1", "t2", "t3"]:
                    for user in ["u1", "u2"]:
                        got = store.get(tenant, user, all_ids)
                        expect = {
                            mid: v for (t, mid), v in model.items() if t == tenant and v[0] == user
                        }
                        assert {g.memory_id: (g.user, g.session, g.text) for g in got} == expect
                        assert all(g.tenant == tenant for g in got)
                        assert store.count(tenant, user) == len(expect)

            check()
            for tenant, user, only_session, targets in deletes:
                listed = [_id(*t) for t in targets]
                erased = store.delete(tenant, user, session=only_session, memory_ids=listed)
                expect = sorted(
                    mid
                    for (t, mid), (u, s, _) in model.items()
                    if t == tenant
                    and u == user
                    and (only_session is None or s == only_session)
                    and (not listed or mid in listed)
                )
                assert sorted(erased) == expect
                for mid in erased:
                    del model[(tenant, mid)]
                check()
        finally:
            store.close()


# -- durability --------------------------------------------------------------------------


def test_everything_survives_close_and_reopen(db: Path) -> None:
    s = SqliteTurnStore(db)
    turns = [_turn(n, vector=np.full(3, n, dtype=np.float32)) for n in range(5)]
    s.append(turns)
    s.delete("t1", "u1", memory_ids=[turns[1].memory_id])
    before = (s.last_seq(), s.changes(0, 100))
    s.close()

    s = SqliteTurnStore(db)
    try:
        assert s.last_seq() == before[0] == 7  # 5 puts, the erasure, a touch of turn 2
        after = s.changes(0, 100)
        assert [(c.seq, type(c), c.memory_id) for c in after] == [
            (c.seq, type(c), c.memory_id) for c in before[1]
        ]
        got = s.get("t1", "u1", [t.memory_id for t in turns])
        assert [g.text for g in got] == ["turn 0", "turn 2", "turn 3", "turn 4"]
        np.testing.assert_array_equal(got[-1].vector, np.full(3, 4, dtype=np.float32))
        # the sequence continues; it never reuses a seq, even one of an erased turn
        ((t, _),) = s.append([_turn(9)])
        assert t.seq == 8
    finally:
        s.close()


def test_the_sequence_is_not_reused_after_the_newest_turn_is_erased(db: Path) -> None:
    s = SqliteTurnStore(db)
    s.append([_turn(0)])
    s.delete("t1", "u1")
    s.close()
    s = SqliteTurnStore(db)
    try:
        assert s.last_seq() == 2
        assert s.append([_turn(1)])[0][0].seq == 3
    finally:
        s.close()


_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from hippo_retrieval.adapters.sqlite_store import SqliteTurnStore
    from hippo_retrieval.domain.models import NewTurn, Role

    store = SqliteTurnStore(Path(sys.argv[1]))
    turns = [
        NewTurn(f"m{n}", "t1", "u1", "s1", Role.USER, f"acked turn {n}", n, client_id=f"c{n}")
        for n in range(20)
    ]
    store.append(turns[:10])
    store.append(turns[10:])
    print("acked", flush=True)
    time.sleep(120)
    """
)


@pytest.mark.slow
def test_acknowledged_turns_survive_sigkill(db: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "acked", child.stderr.read() if child.stderr else line
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    # it really died without closing: the commits live only in the WAL
    wal = db.with_name(db.name + "-wal")
    assert wal.exists() and wal.stat().st_size > 0

    s = SqliteTurnStore(db)
    try:
        ids = [f"m{n}" for n in range(20)]
        got = s.get("t1", "u1", ids)
        assert [g.text for g in got] == [f"acked turn {n}" for n in range(20)]
        assert s.count("t1", "u1") == 20
        assert s.last_seq() == 20
        # and exactly once: a retry of the acknowledged batch writes nothing
        retry = [
            NewTurn(f"m{n}", "t1", "u1", "s1", Role.USER, f"acked turn {n}", n, client_id=f"c{n}")
            for n in range(20)
        ]
        assert not any(created for _, created in s.append(retry))
        assert s.last_seq() == 20
    finally:
        s.close()


# -- erasure -----------------------------------------------------------------------------


def _file_bytes(db: Path) -> dict[str, bytes]:
    out = {}
    for suffix in ("", "-wal", "-journal"):
        f = db.with_name(db.name + suffix)
        if f.exists():
            out[f.name] = f.read_bytes()
    return out


@pytest.mark.parametrize("size", [1, 400])  # short text, and text spilling to overflow pages
def test_erased_text_is_gone_from_the_files(db: Path, size: int) -> None:
    canary = "CANARY-7f3a91c0-erase-me"
    secret = " ".join([canary] * size)
    s = SqliteTurnStore(db)
    keep = [_turn(n, text=f"keeper {n}") for n in range(50)]
    doomed = _turn(100, text=secret)
    s.append(keep[:25])
    s.append([doomed])
    s.append(keep[25:])
    # the canary is really on disk before the delete, so the check below can fail
    assert any(canary.encode() in b for b in _file_bytes(db).values())

    s.delete("t1", "u1", memory_ids=[doomed.memory_id])
    # gone already while the store is open (the -wal file is truncated, pages zeroed)...
    for name, data in _file_bytes(db).items():
        assert canary.encode() not in data, name
    s.close()
    # ...and after close
    for name, data in _file_bytes(db).items():
        assert canary.encode() not in data, name

    s = SqliteTurnStore(db)
    try:
        assert s.count("t1", "u1") == 50
        assert s.get("t1", "u1", [doomed.memory_id]) == []
        assert all(canary not in getattr(c, "text", "") for c in s.changes(0, 1000))
    finally:
        s.close()


def test_erasing_a_session_removes_its_text_from_the_files(db: Path) -> None:
    s = SqliteTurnStore(db)
    try:
        s.append([_turn(n, session="gone", text=f"SESSION-CANARY-{n}") for n in range(30)])
        s.append([_turn(n, session="kept") for n in range(30)])
        assert len(s.delete("t1", "u1", session="gone")) == 30
        for name, data in _file_bytes(db).items():
            assert b"SESSION-CANARY" not in data, name
    finally:
        s.close()
