"""The durable outbox and its drainer: events written beside the work that caused them,
delivered later, in order, at least once, to a receiver that is idempotent per event.

Used for the audit log by the gateway (its spool: every decision it records) and the
summariser (every committed merge, queued by the merge's own transaction). One table
shape, one drainer, one set of metrics (`hippo_outbox_*{outbox}`) for both.

Storage. An item is a text (JSON, the caller's encoding) in a table with an id that
grows with time, the writing process (`owner`), the time it was written and `dead`
(NULL while it waits; the reason once the receiver refused it for good):
- SQLite (embedded): one process per store, so `owner` is not used;
- PostgreSQL (cluster mode): every replica writes and drains only its own rows, so each
  replica's items keep their order and a caller waiting for "its" event is answered by
  its own drainer. A replica holds a lease on its owner id for its life; a replica that
  finds the lease of another owner free (that process died) adopts its rows, which keep
  their ids and so their place in the order.

Delivery. The drainer delivers the oldest items in batches through `deliver`, which
may deliver a prefix (the gateway sends a key erasure alone) and returns one result
per delivered item; delivered items are removed. An item the receiver refuses for good
(INVALID_ARGUMENT: a bug, never a transient fault) is found by retrying one by one and
buried, never silently dropped. Anything else is retried with capped, jittered backoff
while items wait, durable, in the table: a crash at any point loses nothing and at
worst delivers an item twice, which the receiver's idempotency key absorbs.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import Counter, Gauge

from hippo_core import backoff
from hippo_core import sqlite as hippo_sqlite
from hippo_core.errors import HippoError, InvalidArgument

log = logging.getLogger(__name__)

T = TypeVar("T")

DEPTH = Gauge(
    "hippo_outbox_depth", "Items waiting in the outbox for delivery (this process's).", ["outbox"]
)
DEAD = Gauge(
    "hippo_outbox_dead",
    "Items the receiver refused for good, set aside in the outbox for an operator.",
    ["outbox"],
)
OLDEST = Gauge(
    "hippo_outbox_oldest_seconds",
    "Age of the oldest item waiting (0 when none): how far delivery is behind.",
    ["outbox"],
)
WRITTEN = Counter("hippo_outbox_written", "Items written to the outbox.", ["outbox"])
DELIVERED = Counter("hippo_outbox_delivered", "Items delivered and removed.", ["outbox"])
FAILURES = Counter(
    "hippo_outbox_failures",
    "Delivery attempts that failed and will be retried, by the error's status code.",
    ["outbox", "code"],
)
ADOPTED = Counter(
    "hippo_outbox_adopted",
    "Items taken over from a replica that stopped (cluster mode).",
    ["outbox"],
)
# Codes a failed delivery can report; exported at 0 from the start (no gaps in rate()).
FAILURE_CODES = (
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "INTERNAL",
)


def now_us() -> int:
    return time.time_ns() // 1000


# -- storage ------------------------------------------------------------------------------


class OutboxStore(Protocol):
    """Where items wait. Synchronous; the drainer calls it from one worker thread."""

    def put(self, items: Sequence[str]) -> None:
        """Durable (committed, synced) before it returns; kept in the order given."""
        ...

    def peek(self, limit: int) -> list[tuple[int, str, int]]:
        """Up to `limit` oldest waiting items of this process: (id, item, written_us)."""
        ...

    def remove(self, ids: Sequence[int]) -> None: ...

    def bury(self, item_id: int, reason: str) -> None:
        """Refused for good: keep it aside, out of the queue."""
        ...

    def depth(self) -> tuple[int, int, int]:
        """(items waiting, items buried, written_us of the oldest waiting or 0) of this
        process."""
        ...

    def adopt(self) -> int:
        """Take over the items of writers that are gone; how many (0 where there is one
        writer per store, as in SQLite)."""
        ...

    def close(self) -> None: ...


def sqlite_schema(table: str) -> str:
    """The outbox table in a SQLite store's migrations (the owning store creates it)."""
    return f"""
CREATE TABLE {table} (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    item       TEXT NOT NULL,
    created_us INTEGER NOT NULL,
    dead       TEXT
);
CREATE INDEX {table}_live ON {table} (dead, id);
"""


def sqlite_insert(conn: sqlite3.Connection, table: str, items: Sequence[str]) -> None:
    """Queue items inside the caller's open transaction (the transactional outbox)."""
    created = now_us()
    conn.executemany(
        f"INSERT INTO {table} (item, created_us) VALUES (?, ?)", [(i, created) for i in items]
    )


class SqliteOutbox:
    """`OutboxStore` over a table in a SQLite file (one connection of its own, WAL: the
    store that owns the file may write it meanwhile). `migrations` are the file's, when
    the outbox is the only thing in it (the gateway's spool); else the owning store has
    migrated it already."""

    def __init__(
        self, path: Path, table: str, *, migrations: Sequence[hippo_sqlite.Migration] = ()
    ) -> None:
        self._table = table
        self._lock = threading.Lock()
        if migrations:
            self._conn = hippo_sqlite.open_store(path, f"outbox {table}", migrations)
        else:
            self._conn = hippo_sqlite.connect(path)

    def put(self, items: Sequence[str]) -> None:
        with self._lock, hippo_sqlite.transaction(self._conn) as conn:
            sqlite_insert(conn, self._table, items)

    def peek(self, limit: int) -> list[tuple[int, str, int]]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT id, item, created_us FROM {self._table} WHERE dead IS NULL "
                "ORDER BY id LIMIT ?",
                (limit,),
            ).fetchall()
        return [(int(i), str(item), int(created)) for i, item, created in rows]

    def remove(self, ids: Sequence[int]) -> None:
        with self._lock, hippo_sqlite.transaction(self._conn) as conn:
            for chunk in hippo_sqlite.chunks(ids):
                marks = ",".join("?" * len(chunk))
                conn.execute(f"DELETE FROM {self._table} WHERE id IN ({marks})", tuple(chunk))

    def bury(self, item_id: int, reason: str) -> None:
        with self._lock, hippo_sqlite.transaction(self._conn) as conn:
            conn.execute(
                f"UPDATE {self._table} SET dead = ? WHERE id = ?", (reason or "refused", item_id)
            )

    def depth(self) -> tuple[int, int, int]:
        with self._lock:
            live, dead, oldest = self._conn.execute(
                f"SELECT COUNT(*) - COUNT(dead), COUNT(dead), "
                f"coalesce(MIN(created_us) FILTER (WHERE dead IS NULL), 0) FROM {self._table}"
            ).fetchone()
        return int(live), int(dead), int(oldest)

    def adopt(self) -> int:
        return 0

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def postgres_schema(table: str) -> str:
    """The outbox table in a PostgreSQL store's migrations."""
    return f"""
CREATE TABLE {table} (
    id         bigserial PRIMARY KEY,
    owner      text NOT NULL,
    item       text NOT NULL,
    created_us bigint NOT NULL,
    dead       text
);
CREATE INDEX {table}_live ON {table} (owner, id) WHERE dead IS NULL;
"""


def new_owner() -> str:
    """This process's owner id: new at every start (a restarted replica's old rows are
    adopted like any other's)."""
    return uuid.uuid4().hex[:16]


def postgres_insert(conn: Any, table: str, owner: str, items: Sequence[str]) -> None:
    """Queue items inside the caller's open transaction (the transactional outbox)."""
    created = now_us()
    with conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} (owner, item, created_us) VALUES (%s, %s, %s)",
            [(owner, i, created) for i in items],
        )


class PostgresOutbox:
    """`OutboxStore` over a table in the service's PostgreSQL schema; see the module
    docstring for owners and adoption."""

    def __init__(self, database: Any, table: str, owner: str) -> None:
        from hippo_core.postgres import Database  # cluster mode only: psycopg on demand

        assert isinstance(database, Database)
        self._db = database
        self._table = table
        self.owner = owner
        self._lease = database.lease(self._lease_name(owner))
        # Held for this process's life: while it is, nobody adopts our rows.
        self._lease.acquire()

    def _lease_name(self, owner: str) -> str:
        return f"outbox:{self._table}:{owner}"

    def put(self, items: Sequence[str]) -> None:
        with self._db.transaction(f"outbox {self._table}") as conn:
            postgres_insert(conn, self._table, self.owner, items)

    def peek(self, limit: int) -> list[tuple[int, str, int]]:
        def work(conn: Any) -> list[tuple[int, str, int]]:
            rows = conn.execute(
                f"SELECT id, item, created_us FROM {self._table} "
                "WHERE owner = %s AND dead IS NULL ORDER BY id LIMIT %s",
                (self.owner, limit),
            ).fetchall()
            return [(int(i), str(item), int(created)) for i, item, created in rows]

        result: list[tuple[int, str, int]] = self._db.read(work, f"outbox {self._table}")
        return result

    def remove(self, ids: Sequence[int]) -> None:
        with self._db.transaction(f"outbox {self._table}") as conn:
            conn.execute(f"DELETE FROM {self._table} WHERE id = ANY(%s)", (list(ids),))

    def bury(self, item_id: int, reason: str) -> None:
        with self._db.transaction(f"outbox {self._table}") as conn:
            conn.execute(
                f"UPDATE {self._table} SET dead = %s WHERE id = %s", (reason or "refused", item_id)
            )

    def depth(self) -> tuple[int, int, int]:
        def work(conn: Any) -> tuple[int, int, int]:
            live, dead, oldest = conn.execute(
                f"SELECT COUNT(*) - COUNT(dead), COUNT(dead), "
                f"coalesce(MIN(created_us) FILTER (WHERE dead IS NULL), 0) "
                f"FROM {self._table} WHERE owner = %s",
                (self.owner,),
            ).fetchone()
            return int(live), int(dead), int(oldest)

        result: tuple[int, int, int] = self._db.read(work, f"outbox {self._table}")
        return result

    def adopt(self) -> int:
        if not self._lease.held():
            self._lease.acquire()  # our own connection dropped: take our lease back
        others = self._db.read(
            lambda conn: [
                str(r[0])
                for r in conn.execute(
                    f"SELECT DISTINCT owner FROM {self._table} WHERE owner <> %s AND dead IS NULL",
                    (self.owner,),
                )
            ],
            f"outbox {self._table}",
        )
        taken = 0
        for other in others:
            lease = self._db.lease(self._lease_name(other))
            if not lease.acquire():
                continue  # that replica is alive and drains its own rows
            try:
                with self._db.transaction(f"outbox {self._table}") as conn:
                    taken += conn.execute(
                        f"UPDATE {self._table} SET owner = %s WHERE owner = %s",
                        (self.owner, other),
                    ).rowcount
            finally:
                lease.release()
            log.info("outbox %s: adopted the items of stopped writer %s", self._table, other)
        return taken

    def close(self) -> None:
        self._lease.release()


# -- delivery ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrainConfig:
    batch: int = 100
    retry_min_seconds: float = 0.25
    retry_max_seconds: float = 5.0
    # Items another process may write without telling this one (a second process on a
    # SQLite file; adoption of a stopped replica's rows): how often to look anyway.
    poll_seconds: float = 5.0


Deliver = Callable[[Sequence[T]], Awaitable[Sequence[Any]]]


class Outbox(Generic[T]):
    """The async face of an `OutboxStore`, and its one drainer. Create inside the running
    loop; `start()` once; `put()` (group commit) or `notify()` after a transaction that
    queued items itself; `close()` at stop (what is undelivered stays for the next start).

    `decode` turns a stored text into the item `deliver` takes; `encode` the reverse.
    `on_delivered(item, result)` and `on_buried(item)` tell the owner (the gateway
    answers callers waiting for their event's audit seq)."""

    def __init__(
        self,
        name: str,
        store: OutboxStore,
        *,
        deliver: Deliver[T],
        encode: Callable[[T], str],
        decode: Callable[[str], T],
        config: DrainConfig | None = None,
        on_delivered: Callable[[T, Any], None] | None = None,
        on_buried: Callable[[T], None] | None = None,
        jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2),
    ) -> None:
        self.name = name
        self._store = store
        self._deliver, self._encode, self._decode = deliver, encode, decode
        self._config = config or DrainConfig()
        self._on_delivered = on_delivered or (lambda item, result: None)
        self._on_buried = on_buried or (lambda item: None)
        self._jitter = jitter
        # One thread for every store call: a SQLite connection stays on one thread, and
        # concurrent puts queue up behind one commit instead of racing for the lock.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"outbox-{name}")
        self._pending: list[tuple[Sequence[T], asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._delivering = asyncio.Lock()  # one delivery at a time keeps the order
        self._task: asyncio.Task[None] | None = None
        self._depth = 0
        self.reachable = True  # False while deliveries fail
        DEPTH.labels(name)
        DEAD.labels(name)
        OLDEST.labels(name)
        WRITTEN.labels(name)
        DELIVERED.labels(name)
        ADOPTED.labels(name)
        for code in FAILURE_CODES:
            FAILURES.labels(name, code)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def depth(self) -> int:
        """Items waiting, as this process last saw (no I/O: cheap on a hot path)."""
        return self._depth

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self._refresh()
        if self._task is None:
            # A fresh context: no inbound call's deadline may leak into deliveries.
            self._task = asyncio.create_task(
                self._run(), name=f"outbox-{self.name}", context=contextvars.Context()
            )
        self.notify()  # whatever a previous run left

    def notify(self) -> None:
        """Items were queued (by `put`, or by the caller's own transaction): deliver."""
        self._idle.clear()
        self._wake.set()

    async def drained(self, timeout: float) -> bool:
        """Wait until nothing waits (True) or `timeout` passes (False)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._call(self._store.close)
        self._pool.shutdown(wait=True)

    # -- writing ---------------------------------------------------------------------------

    async def put(self, items: Sequence[T]) -> None:
        """Durable when this returns. Concurrent callers share one transaction (and one
        fsync): the cost on a call's path is one local commit, not a network round trip."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((items, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await future
        self.notify()

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            texts = [self._encode(i) for items, _ in batch for i in items]
            try:
                await self._call(self._store.put, texts)
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self._depth += len(texts)
            WRITTEN.labels(self.name).inc(len(texts))
            DEPTH.labels(self.name).set(self._depth)
            for _, future in batch:
                if not future.done():
                    future.set_result(None)

    # -- delivering ------------------------------------------------------------------------

    async def drain_now(self) -> None:
        """Deliver everything waiting before returning; raises what delivery raised. For a
        caller that must put something in the receiver after what waits (in order)."""
        async with self._delivering:
            while await self._deliver_batch(self._config.batch):
                pass

    async def _run(self) -> None:
        failures = 0
        last_adopt = 0.0
        while True:
            self._wake.clear()
            try:
                if time.monotonic() - last_adopt >= self._config.poll_seconds:
                    last_adopt = time.monotonic()
                    adopted = await self._call(self._store.adopt)
                    if adopted:
                        ADOPTED.labels(self.name).inc(adopted)
                async with self._delivering:
                    delivered = await self._deliver_batch(self._config.batch)
            except asyncio.CancelledError:
                raise
            except HippoError as exc:
                failures += 1
                self.reachable = False
                FAILURES.labels(self.name, exc.code.value).inc()
                await self._backoff(failures, exc)
                continue
            except Exception as exc:  # a bug: log it, back off, keep the items
                failures += 1
                self.reachable = False
                FAILURES.labels(self.name, "INTERNAL").inc()
                log.exception("outbox %s: delivery failed", self.name)
                await self._backoff(failures, exc)
                continue
            failures = 0
            if delivered:
                continue
            if not self._wake.is_set():  # nothing was queued since the empty peek
                self._idle.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._config.poll_seconds)

    async def _deliver_batch(self, limit: int) -> int:
        """Deliver up to `limit` of the oldest items; how many left the queue."""
        rows = await self._call(self._store.peek, limit)
        if not rows:
            await self._refresh()
            return 0
        items = [self._decode(text) for _, text, _ in rows]
        try:
            results = list(await self._deliver(items))
        except InvalidArgument as exc:
            if len(rows) > 1:
                return await self._one_by_one(len(rows))
            log.error("outbox %s: item %d refused for good: %s", self.name, rows[0][0], exc)
            await self._call(self._store.bury, rows[0][0], str(exc))
            self._on_buried(items[0])
            await self._refresh()
            return 1
        done = len(results)
        # Reachable as soon as the delivery succeeded, before its rows leave the store: a
        # caller that sees the queue empty must not still be told the peer is down.
        self.reachable = True
        await self._call(self._store.remove, [i for i, _, _ in rows[:done]])
        DELIVERED.labels(self.name).inc(done)
        self._depth = max(0, self._depth - done)
        for item, result in zip(items[:done], results, strict=True):
            self._on_delivered(item, result)
        await self._refresh()
        return done

    async def _one_by_one(self, count: int) -> int:
        """A batch was refused: deliver its items singly, burying the one refused."""
        total = 0
        for _ in range(count):
            moved = await self._deliver_batch(1)
            if not moved:
                break
            total += moved
        return total

    async def _refresh(self) -> None:
        live, dead, oldest_us = await self._call(self._store.depth)
        self._depth = live
        DEPTH.labels(self.name).set(live)
        DEAD.labels(self.name).set(dead)
        OLDEST.labels(self.name).set(max(0.0, (now_us() - oldest_us) / 1e6) if oldest_us else 0.0)

    async def _backoff(self, failures: int, exc: BaseException) -> None:
        cfg = self._config
        wait = backoff.delay(failures, cfg.retry_min_seconds, cfg.retry_max_seconds, self._jitter())
        log.warning(
            "outbox %s: delivery failed (%s); %d waiting; retrying in %.2f s",
            self.name,
            getattr(exc, "message", None) or repr(exc),
            self._depth,
            wait,
        )
        with contextlib.suppress(TimeoutError):
            # A new item does not cut the backoff short; close() does (cancellation).
            await asyncio.sleep(wait)
