"""The replicas of the retrieval service, through the PostgreSQL they share (cluster mode).

Each replica projects the shared change feed into indexes of its own, so "searchable" is
a per-replica fact. The `replicas` table (postgres_store.MIGRATIONS) holds, per replica:
`visible_seq` (searchable up to there in both of its indexes), `heartbeat_us` (the
database's clock, so replicas' clocks never need to agree) and `wanted_seq` (the highest
seq a writer on that replica waits to see everywhere).

- **Learning of writes**: every write NOTIFYs the `feed` channel in its transaction. One
  thread per replica LISTENs, re-reads the table (one small query answers a burst of
  notifications) and wakes the projector; *urgently* (commit the BM25 index now) when
  another replica's writer waits for a seq this one has not made searchable. Without a
  notification (a dropped connection) the same happens every `poll_s`, and the projector
  reads the feed at its own commit interval anyway.
- **Read-your-writes** (`want` + `others_visible`): a writer that waits for seq S records
  S as wanted and NOTIFYs; every replica hurries, then publishes its new visible seq and
  NOTIFYs; the writer returns once every replica with a fresh heartbeat is at S or
  beyond. A replica that stops heartbeating (killed, partitioned) is left out after
  `expiry_s`, so it delays writers by that much at most; one that leaves cleanly deletes
  its row and delays nobody. A replica joins only after catching up (the service's
  `open`), so it never holds a writer back while it starts.
- **Heartbeats**: a second thread writes this replica's visible seq every `heartbeat_s`,
  and at once when someone waits for more than it last published. Rows of replicas gone
  for `forget_s` are deleted, so the table does not grow with pod names.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from hippo_core.errors import HippoError
from hippo_core.postgres import Database
from hippo_retrieval import metrics
from hippo_retrieval.adapters.postgres_store import FEED_CHANNEL

log = logging.getLogger(__name__)

WHAT = "replicas"
# The database's clock in microseconds: liveness never depends on replicas' clocks.
NOW_US = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
# How long a burst of queued notifications may be drained before one re-read answers them.
DRAIN_S = 0.05


class PostgresReplicas:
    """`Replicas` over the `replicas` table and the `feed` channel of `database`."""

    def __init__(
        self,
        database: Database,
        replica_id: str,
        *,
        heartbeat_s: float = 1.0,
        expiry_s: float = 5.0,
        poll_s: float = 1.0,
        forget_s: float = 3600.0,
    ) -> None:
        if not 0 < heartbeat_s < expiry_s:
            raise ValueError("heartbeat_s must be positive and below expiry_s")
        self._db = database
        self.replica_id = replica_id
        self._heartbeat_s = heartbeat_s
        self._expiry_us = int(expiry_s * 1_000_000)
        self._forget_us = int(forget_s * 1_000_000)
        self._poll_s = poll_s
        self._cond = threading.Condition()
        self._wake: Callable[[bool], None] = lambda urgent: None
        self._visible = 0  # searchable here, as last reported by the projector
        self._published = -1  # the visible_seq last written to the table
        self._wanted = 0  # the highest seq another live replica's writer waits for
        self._others: int | None = None  # the lowest visible_seq of the other live replicas
        self._closed = False
        self._threads: list[threading.Thread] = []

    # -- Replicas ----------------------------------------------------------------------

    def join(self, visible_seq: int, wake: Callable[[bool], None]) -> None:
        with self._cond:
            self._wake = wake
            self._visible = visible_seq
        self._publish(visible_seq)  # in the table before this replica serves
        self._refresh()
        for target, name in ((self._listen, "replicas-listen"), (self._beat, "replicas-beat")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("replica %s joined at seq %d", self.replica_id, visible_seq)

    def progress(self, visible_seq: int) -> None:
        with self._cond:
            self._visible = visible_seq
            if self._wanted > self._published < visible_seq:
                self._cond.notify_all()  # someone waits: publish now, not at the heartbeat

    def want(self, seq: int) -> int | None:
        def work(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
            conn.execute(
                "INSERT INTO replicas (replica_id, visible_seq, wanted_seq, heartbeat_us) "
                f"VALUES (%s, %s, %s, {NOW_US}) ON CONFLICT (replica_id) "
                "DO UPDATE SET wanted_seq = greatest(replicas.wanted_seq, EXCLUDED.wanted_seq)",
                (self.replica_id, self._visible, seq),
            )
            self._db.notify(conn, FEED_CHANNEL)
            return self._read(conn)

        self._apply(self._db.run(work, WHAT))
        with self._cond:
            return self._others

    def others_visible(self) -> int | None:
        with self._cond:
            return self._others

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()

        def leave(conn: psycopg.Connection[Any]) -> None:
            conn.execute("DELETE FROM replicas WHERE replica_id = %s", (self.replica_id,))
            # Writers waiting for this replica look again; its own listener wakes and ends.
            self._db.notify(conn, FEED_CHANNEL)

        try:
            self._db.run(leave, WHAT)
        except HippoError as exc:
            log.warning("replica %s could not leave cleanly (%s): it expires instead", self, exc)
        for thread in self._threads:
            thread.join(timeout=self._poll_s + 5)

    # -- internals ---------------------------------------------------------------------

    def _read(self, conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
        return conn.execute(
            "SELECT replica_id, visible_seq, wanted_seq, "
            f"heartbeat_us >= {NOW_US} - %s FROM replicas",
            (self._expiry_us,),
        ).fetchall()

    def _refresh(self) -> None:
        with self._db.transaction(WHAT) as conn:
            rows = self._read(conn)
        self._apply(rows)

    def _apply(self, rows: list[tuple[Any, ...]]) -> None:
        live = [(str(r), int(v), int(w)) for r, v, w, fresh in rows if fresh]
        others = [(v, w) for r, v, w in live if r != self.replica_id]
        with self._cond:
            self._others = min(v for v, _ in others) if others else None
            self._wanted = max((w for _, w in others), default=0)
            if self._wanted > self._published < self._visible:
                self._cond.notify_all()
        metrics.REPLICAS.set(len(others) + 1)

    def _listen(self) -> None:
        listener = self._db.listener(FEED_CHANNEL)
        try:
            while not self._stopping():
                heard = listener.wait(self._poll_s)
                until = time.monotonic() + DRAIN_S
                while heard and time.monotonic() < until and listener.wait(0):
                    pass  # one re-read below answers the whole burst
                if self._stopping():
                    return
                try:
                    self._refresh()
                except (HippoError, psycopg.Error) as exc:
                    log.warning("replicas: reading the replicas table failed: %s", exc)
                with self._cond:
                    urgent = self._wanted > self._visible
                    wake = self._wake
                if heard or urgent:
                    wake(urgent)
        finally:
            listener.close()

    def _stopping(self) -> bool:
        with self._cond:
            return self._closed

    def _beat(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._closed or self._wanted > self._published < self._visible,
                    timeout=self._heartbeat_s,
                )
                if self._closed:
                    return
                visible = self._visible
            try:
                self._publish(visible)
            except (HippoError, psycopg.Error) as exc:
                log.warning("replicas: heartbeat failed: %s", exc)
                time.sleep(min(self._heartbeat_s, 1.0))

    def _publish(self, visible: int) -> None:
        changed = visible != self._published

        def work(conn: psycopg.Connection[Any]) -> None:
            conn.execute(
                "INSERT INTO replicas (replica_id, visible_seq, heartbeat_us) "
                f"VALUES (%s, %s, {NOW_US}) ON CONFLICT (replica_id) DO UPDATE "
                "SET visible_seq = EXCLUDED.visible_seq, heartbeat_us = EXCLUDED.heartbeat_us",
                (self.replica_id, visible),
            )
            conn.execute(
                f"DELETE FROM replicas WHERE heartbeat_us < {NOW_US} - %s", (self._forget_us,)
            )
            if changed:
                self._db.notify(conn, FEED_CHANNEL)  # writers waiting for us look again

        self._db.run(work, WHAT)
        with self._cond:
            self._published = visible

    def __str__(self) -> str:
        return self.replica_id
