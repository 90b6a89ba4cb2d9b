"""The gateway's durable audit spool: SQLite under the gateway's data dir.

An audit event is written here (WAL, `synchronous=FULL`: fsynced) before the call that
caused it is answered, and deleted only once the audit service has acknowledged it; a
crash or a down audit service loses nothing, and a restart delivers what was left, in
order. Concurrent callers share one transaction and one fsync (group commit): the cost
on a call's path is one local fsync, not a network round trip.

Items hold no user text (fingerprints, ids, scores); freed rows are zeroed anyway
(`secure_delete`). Items the audit service refuses for good move to `dead`, where an
operator finds them (hippo_gateway_audit_dead_letters counts them).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from hippo_core import tracing
from hippo_core.errors import FailedPrecondition
from hippo_gateway.domain.audit import AuditEvent, EraseUser, Item

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spool (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    item       TEXT NOT NULL,
    spooled_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dead (
    id         INTEGER PRIMARY KEY,
    item       TEXT NOT NULL,
    spooled_us INTEGER NOT NULL,
    reason     TEXT NOT NULL,
    buried_us  INTEGER NOT NULL
);
"""


def dump(item: Item) -> str:
    if isinstance(item, EraseUser):
        return json.dumps({"erase": item.__dict__}, sort_keys=True)
    fields = {**item.__dict__, "memory_ids": list(item.memory_ids)}
    return json.dumps({"event": fields}, sort_keys=True)


def load(text: str) -> Item:
    raw: dict[str, Any] = json.loads(text)
    if "erase" in raw:
        return EraseUser(**raw["erase"])
    fields = raw["event"]
    return AuditEvent(**{**fields, "memory_ids": tuple(fields["memory_ids"])})


class SqliteSpool:
    """`Spool`. One connection on one thread; `put` batches concurrent callers."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-spool")
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            conn.close()
            raise FailedPrecondition(f"audit spool: journal_mode WAL not available ({mode})")
        # FULL: a spooled event is the only copy until the audit service has it.
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA secure_delete = ON")
        conn.executescript(_SCHEMA)
        self._conn = conn
        self._depth = int(conn.execute("SELECT count(*) FROM spool").fetchone()[0])
        self._pending: list[tuple[Sequence[Item], asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    def depth(self) -> int:
        return self._depth

    def dead(self) -> int:
        return int(self._conn.execute("SELECT count(*) FROM dead").fetchone()[0])

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def put(self, items: Sequence[Item]) -> None:
        origin = tracing.traceparent()  # the caller's span; `_flush` runs in another task
        if origin:
            items = [i if i.trace_parent else replace(i, trace_parent=origin) for i in items]
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((items, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await future

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self._run(self._insert, [dump(i) for items, _ in batch for i in items])
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
            else:
                for _, future in batch:
                    if not future.done():
                        future.set_result(None)

    def _insert(self, texts: list[str]) -> None:
        now = time.time_ns() // 1000
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._conn.executemany(
                "INSERT INTO spool (item, spooled_us) VALUES (?, ?)", [(t, now) for t in texts]
            )
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._depth += len(texts)

    async def peek(self, limit: int) -> list[tuple[int, Item]]:
        rows = await self._run(self._select, limit)
        return [(int(r[0]), load(r[1])) for r in rows]

    def _select(self, limit: int) -> list[tuple[int, str]]:
        return list(self._conn.execute("SELECT id, item FROM spool ORDER BY id LIMIT ?", (limit,)))

    async def remove(self, ids: Sequence[int]) -> None:
        await self._run(self._delete, list(ids))

    def _delete(self, ids: list[int]) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._conn.executemany("DELETE FROM spool WHERE id = ?", [(i,) for i in ids])
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._depth -= len(ids)

    async def bury(self, spool_id: int, reason: str) -> None:
        await self._run(self._bury, spool_id, reason)

    def _bury(self, spool_id: int, reason: str) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._conn.execute(
                "INSERT INTO dead (id, item, spooled_us, reason, buried_us) "
                "SELECT id, item, spooled_us, ?, ? FROM spool WHERE id = ?",
                (reason, time.time_ns() // 1000, spool_id),
            )
            self._conn.execute("DELETE FROM spool WHERE id = ?", (spool_id,))
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._depth -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._conn.close()


def local_secret(configured: str, path: Path) -> bytes:
    """A 32-byte secret: the configured one (base64), else the file at `path`, created
    (mode 0600) on first start. Replicas that must agree (fingerprints that match across
    gateways) need the same configured value."""
    if configured:
        return base64.b64decode(configured, validate=True)
    if path.exists():
        return base64.b64decode(path.read_bytes().strip(), validate=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, base64.b64encode(secret) + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    return secret
