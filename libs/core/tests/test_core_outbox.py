"""The shared outbox: both stores pass one contract, and the one drainer delivers in
order, at least once, burying what the receiver refuses for good and retrying the rest."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from hippo_core import outbox as ob
from hippo_core import sqlite as hippo_sqlite
from hippo_core.errors import InvalidArgument, Unavailable
from hippo_core.postgres import Database
from hippo_core.settings import DatabaseSettings


def _database(url: str) -> Database:
    db = Database(DatabaseSettings(url=SecretStr(url)), schema="hippo_test", application="t")
    db.open([ob.postgres_schema("events")])
    return db


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A factory of outbox stores on one table: a second call is another writer process
    (another replica, for PostgreSQL)."""
    made: list[ob.OutboxStore] = []
    dbs: list[Database] = []
    if request.param == "sqlite":

        def make(owner: str = "") -> ob.OutboxStore:
            store = ob.SqliteOutbox(
                tmp_path / "o.sqlite3", "events", migrations=[ob.sqlite_schema("events")]
            )
            made.append(store)
            return store

    else:
        url = request.getfixturevalue("postgres_url")

        def make(owner: str = "") -> ob.OutboxStore:
            db = _database(url)
            dbs.append(db)
            store = ob.PostgresOutbox(db, "events", owner or ob.new_owner())
            made.append(store)
            return store

    yield make
    for store in made:
        store.close()
    for db in dbs:
        db.close()


def test_store_contract(make_store: Any) -> None:
    store = make_store()
    assert store.depth() == (0, 0, 0) and store.peek(10) == []
    store.put(["a", "b", "c"])
    store.put(["d"])
    rows = store.peek(3)
    assert [item for _, item, _ in rows] == ["a", "b", "c"]
    assert rows[0][0] < rows[1][0] < rows[2][0] and rows[0][2] > 0
    live, dead, oldest = store.depth()
    assert (live, dead) == (4, 0) and oldest == rows[0][2]
    store.bury(rows[1][0], "refused: bad field")
    store.remove([rows[0][0]])
    assert [item for _, item, _ in store.peek(10)] == ["c", "d"]
    assert store.depth()[:2] == (2, 1)
    assert store.adopt() == 0  # nobody else wrote


def test_postgres_replicas_keep_to_their_own_rows_and_adopt_a_stopped_ones(
    postgres_url: str,
) -> None:
    a_db, b_db = _database(postgres_url), _database(postgres_url)
    a = ob.PostgresOutbox(a_db, "events", "replica-a")
    b = ob.PostgresOutbox(b_db, "events", "replica-b")
    a.put(["a1", "a2"])
    b.put(["b1"])
    assert [i for _, i, _ in a.peek(10)] == ["a1", "a2"]
    assert [i for _, i, _ in b.peek(10)] == ["b1"]
    assert b.adopt() == 0  # a is alive: its rows stay its own
    a.close()  # a stops (its lease goes with its connection)
    assert b.adopt() == 2
    assert [i for _, i, _ in b.peek(10)] == ["a1", "a2", "b1"]  # ids keep the order
    b.close()
    a_db.close()
    b_db.close()


class Receiver:
    """An idempotent receiver double: appends items, refuses the ones marked `bad`, and
    is down while `down` is set."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.calls: list[int] = []
        self.down = False

    async def deliver(self, items: Sequence[dict[str, Any]]) -> list[int]:
        self.calls.append(len(items))
        if self.down:
            raise Unavailable("receiver is down")
        if any(i.get("bad") for i in items):
            raise InvalidArgument("body", "not allowed")
        out = []
        for item in items:
            if item["id"] not in self.log:
                self.log.append(item["id"])
            out.append(self.log.index(item["id"]) + 1)
        return out


def _outbox(store: ob.OutboxStore, receiver: Receiver, **kw: Any) -> ob.Outbox[dict[str, Any]]:
    return ob.Outbox(
        "test",
        store,
        deliver=receiver.deliver,
        encode=json.dumps,
        decode=json.loads,
        config=ob.DrainConfig(batch=10, retry_min_seconds=0.01, retry_max_seconds=0.05),
        jitter=lambda: 1.0,
        **kw,
    )


async def test_delivers_in_order_once_and_buries_what_is_refused(make_store: Any) -> None:
    receiver = Receiver()
    delivered: dict[str, int] = {}
    buried: list[str] = []
    box = _outbox(
        make_store(),
        receiver,
        on_delivered=lambda item, seq: delivered.__setitem__(item["id"], seq),
        on_buried=lambda item: buried.append(item["id"]),
    )
    await box.start()
    await box.put([{"id": f"e{i}", "bad": i == 3} for i in range(6)])
    assert await box.drained(10)
    assert receiver.log == ["e0", "e1", "e2", "e4", "e5"]
    assert buried == ["e3"]
    assert delivered == {"e0": 1, "e1": 2, "e2": 3, "e4": 4, "e5": 5}
    assert box.depth() == 0
    assert ob.DEAD.labels("test")._value.get() == 1
    await box.close()


async def test_a_receiver_that_is_down_loses_nothing(make_store: Any) -> None:
    receiver = Receiver()
    receiver.down = True
    box = _outbox(make_store(), receiver)
    await box.start()
    await box.put([{"id": "x"}, {"id": "y"}])
    await asyncio.sleep(0.2)
    assert receiver.log == [] and len(receiver.calls) >= 2  # retried, with backoff
    assert not box.reachable and box.depth() == 2
    failures = ob.FAILURES.labels("test", "UNAVAILABLE")._value.get()
    assert failures >= 2
    receiver.down = False
    assert await box.drained(10)
    assert receiver.log == ["x", "y"] and box.reachable
    await box.close()


async def test_undelivered_items_survive_a_restart(make_store: Any) -> None:
    receiver = Receiver()
    receiver.down = True
    store = make_store(owner="same")
    first = _outbox(store, receiver)
    await first.start()
    await first.put([{"id": "kept"}])
    await first.close()  # stops: the item stays in the table
    receiver.down = False
    second = _outbox(make_store(owner="same"), receiver)
    await second.start()
    assert await second.drained(10)
    assert receiver.log == ["kept"]
    await second.close()


async def test_a_prefix_delivery_leaves_the_rest_queued_in_order(make_store: Any) -> None:
    """A deliverer may send only the first items (the gateway sends a key erasure alone):
    the rest stay, in order, for the next round."""
    seen: list[list[str]] = []

    async def one_at_a_time(items: Sequence[dict[str, Any]]) -> list[int]:
        seen.append([i["id"] for i in items])
        return [1]

    box = ob.Outbox(
        "prefix", make_store(), deliver=one_at_a_time, encode=json.dumps, decode=json.loads
    )
    await box.start()
    await box.put([{"id": "a"}, {"id": "b"}, {"id": "c"}])
    assert await box.drained(10)
    assert [s[0] for s in seen] == ["a", "b", "c"]
    await box.close()


async def test_concurrent_puts_share_commits(tmp_path: Path) -> None:
    class Counting(ob.SqliteOutbox):
        commits = 0

        def put(self, items: Sequence[str]) -> None:
            Counting.commits += 1
            super().put(items)

    receiver = Receiver()
    receiver.down = True  # keep them queued
    store = Counting(tmp_path / "o.sqlite3", "events", migrations=[ob.sqlite_schema("events")])
    box = _outbox(store, receiver)
    await box.start()
    await asyncio.gather(*(box.put([{"id": str(i)}]) for i in range(50)))
    assert box.depth() == 50
    assert Counting.commits < 50
    await box.close()


def test_the_transactional_insert_commits_with_the_callers_work(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    conn = hippo_sqlite.open_store(
        path, "s", ["CREATE TABLE work (x);" + ob.sqlite_schema("events")]
    )
    with pytest.raises(RuntimeError), hippo_sqlite.transaction(conn):
        conn.execute("INSERT INTO work VALUES (1)")
        ob.sqlite_insert(conn, "events", ["lost with its work"])
        raise RuntimeError
    with hippo_sqlite.transaction(conn):
        conn.execute("INSERT INTO work VALUES (2)")
        ob.sqlite_insert(conn, "events", ["kept with its work"])
    store = ob.SqliteOutbox(path, "events")
    assert [i for _, i, _ in store.peek(10)] == ["kept with its work"]
    store.close()
    conn.close()
