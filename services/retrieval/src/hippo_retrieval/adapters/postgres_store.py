"""The turn store in PostgreSQL: the source of truth in cluster mode, shared by every
retrieval replica (the embedded default is `sqlite_store.py`; one contract test suite
runs against both, so the semantics are the same).

The change feed. Every replica projects the feed into indexes of its own and remembers
the last seq it applied; it reads `changes(after_seq)` and moves on. That is only safe if
no change can ever appear *below* a seq a reader has already passed, so **seq order must
be commit order**. A PostgreSQL sequence does not give that: two writers draw 7 and 8,
8 commits first, a projector reads "8" and records 8, then 7 commits and is never read.
So every write transaction first locks the one-row `feed` head (`SELECT ... FOR UPDATE`)
and takes its seqs from it: writers serialise on that row until they commit, seqs are
gapless, and a transaction with lower seqs has always committed before one with higher
seqs can take the row. A reader's snapshot therefore always holds a prefix of the feed.
The cost is one writer at a time across all replicas (a write transaction is a few
statements, pipelined; the commit's fsync dominates); reads never wait for it.

The head also counts the turns (`size()` in O(1): a replica's turn gauge shows the shared
total, not the writes it happened to serve). Each write also NOTIFYs the `feed` channel in
its transaction (delivered at commit, never for a rolled-back write), so the other
replicas' projectors wake at once instead of at their next poll (adapters/replicas.py).

Tenancy is in every statement (`tenant = ...` and the user where there is one). Values
are laid out as in SQLite (turn_rows.py): vectors as bytea of little-endian float32,
metadata as sorted-key JSON text (text, not jsonb: byte-equal to the embedded store, and
nothing queries inside it).

Erasure. The delete is one transaction (turns, their feed entries, touches, emptied
sessions). PostgreSQL keeps a deleted row's bytes as a dead tuple until VACUUM, so after
the commit the store vacuums `turns` and `sessions` (`Database.vacuum`, outside any
transaction, as VACUUM must run); that removes the dead tuples (TOAST included) and their
index entries (tested: the text is gone from the database's files). What still holds
erased text afterwards: the WAL segments written meanwhile (until recycled after
checkpoints, or as long as an archive keeps them), streaming replicas' WAL likewise, and
backups. docs/recall.md ("Cluster mode") says so.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from hippo_core.errors import FailedPrecondition, InvalidArgument
from hippo_core.postgres import Database, Migration
from hippo_retrieval.adapters.turn_rows import (
    TURN_COLUMNS,
    Row,
    backfill_terms,
    decode_vector,
    encode_metadata,
    encode_vector,
    feed_entries,
    from_row,
    insert_turn,
    list_sessions_query,
    list_turns_query,
    list_users_query,
    session_stats,
    stored,
    to_row,
    updated_metadata,
    user_stats,
)
from hippo_retrieval.domain.models import (
    Change,
    Cursor,
    NewTurn,
    Place,
    Scope,
    SessionStats,
    StoredTurn,
    UserStats,
    Vector,
)

SCHEMA = "hippo_retrieval"
WHAT = "turn store"
# LISTEN/NOTIFY channel: "the feed or a replica's state changed" (adapters/replicas.py).
FEED_CHANNEL = "feed"
NUL = "\x00"


def _add_terms(conn: psycopg.Connection[Any]) -> None:
    conn.execute("ALTER TABLE turns ADD COLUMN terms integer NOT NULL DEFAULT -1")

    def write(pairs: list[tuple[int, int]]) -> None:
        with conn.cursor() as cursor:
            cursor.executemany("UPDATE turns SET terms = %s WHERE seq = %s", pairs)

    backfill_terms(
        lambda after: conn.execute(
            "SELECT seq, text FROM turns WHERE seq > %s ORDER BY seq LIMIT 5000", (after,)
        ).fetchall(),
        write,
    )


MIGRATIONS: list[Migration] = [
    """
CREATE TABLE feed (
    id       smallint PRIMARY KEY CHECK (id = 1),
    last_seq bigint NOT NULL,
    turns    bigint NOT NULL
);
INSERT INTO feed (id, last_seq, turns) VALUES (1, 0, 0);
CREATE TABLE changes (
    seq       bigint PRIMARY KEY,
    op        text NOT NULL CHECK (op IN ('put', 'delete', 'touch')),
    tenant    text NOT NULL,
    memory_id text NOT NULL
);
CREATE TABLE turns (
    seq        bigint PRIMARY KEY,
    memory_id  text NOT NULL,
    tenant     text NOT NULL,
    user_id    text NOT NULL,
    session_id text NOT NULL,
    role       text NOT NULL,
    text       text NOT NULL,
    time_us    bigint NOT NULL,
    client_id  text NOT NULL,
    metadata   text NOT NULL,
    vector     bytea,
    position   bigint NOT NULL,
    UNIQUE (tenant, memory_id)
);
CREATE TABLE sessions (
    tenant        text NOT NULL,
    user_id       text NOT NULL,
    session_id    text NOT NULL,
    last_position bigint NOT NULL,
    PRIMARY KEY (tenant, user_id, session_id)
);
CREATE INDEX turns_by_session ON turns (tenant, user_id, session_id, position);
CREATE INDEX turns_by_time ON turns (tenant, user_id, time_us);
-- The replicas of the service and what each can search (adapters/replicas.py).
CREATE TABLE replicas (
    replica_id   text PRIMARY KEY,
    visible_seq  bigint NOT NULL,
    wanted_seq   bigint NOT NULL DEFAULT 0,
    heartbeat_us bigint NOT NULL
);
""",
    # 2: vectors keyed by embedding model (sqlite_store.py's migration 2). Erasing a
    # turn erases its other models' vectors in the same statement (the foreign key), so
    # a re-embedding that races an erasure cannot leave a vector of erased text behind.
    """
ALTER TABLE turns ADD COLUMN vector_model text NOT NULL DEFAULT '';
CREATE TABLE model_vectors (
    tenant    text NOT NULL,
    memory_id text NOT NULL,
    model     text NOT NULL,
    vector    bytea NOT NULL,
    PRIMARY KEY (tenant, memory_id, model),
    FOREIGN KEY (tenant, memory_id) REFERENCES turns (tenant, memory_id) ON DELETE CASCADE
);
""",
    # 3: each turn's content words (sqlite_store.py's migration 4). Only adds: a replica
    # of an older build still writes, its turns' count -1 (unknown: no short-turn step).
    _add_terms,
]


def _storable(*values: str) -> bool:
    """False if a value cannot be in the store at all (PostgreSQL text holds no NUL; the
    domain refuses NUL on writes): a read for it finds nothing, as in SQLite."""
    return not any(NUL in v for v in values)


class PostgresTurnStore:
    """`TurnStore` in the service's schema of a PostgreSQL database. Thread-safe (a pool).
    `database` must be open and migrated with MIGRATIONS; the caller closes it."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._closed = False
        self._vacuum_lock = threading.Lock()  # one VACUUM at a time from this process

    def _check_open(self) -> None:
        if self._closed:
            raise FailedPrecondition("turn store is closed")

    # -- TurnStore ---------------------------------------------------------------------

    def append(self, turns: Sequence[NewTurn]) -> list[tuple[StoredTurn, bool]]:
        """As SqliteTurnStore.append: all or none, an existing id answered with the stored
        turn, another user's id refused with nothing written. Returns once committed."""
        if not turns:
            return []
        rows = [to_row(turn) for turn in turns]
        self._check_open()
        return self._db.run(lambda conn: self._append(conn, turns, rows), WHAT)

    def _append(
        self, conn: psycopg.Connection[Any], turns: Sequence[NewTurn], rows: list[Row]
    ) -> list[tuple[StoredTurn, bool]]:
        # The head first: from here on no other writer commits, so the existence check
        # below cannot race another replica writing the same id.
        head = _lock_feed(conn)
        existing = _existing(conn, turns)
        first: dict[tuple[str, str], int] = {}  # key -> index of its first new occurrence
        fresh: list[int] = []
        for i, turn in enumerate(turns):
            key = (turn.tenant, turn.memory_id)
            owner = existing[key].user if key in existing else None
            if key in first:
                owner = turns[first[key]].user
            if owner is not None and owner != turn.user:
                raise InvalidArgument("memory_id", "already used by another user in this tenant")
            if owner is None:
                first[key] = i
                fresh.append(i)
        written: dict[int, StoredTurn] = {}
        if fresh:
            positions = _positions(conn, [turns[i] for i in fresh])
            items = [(head + n + 1, turns[i], rows[i], positions[n]) for n, i in enumerate(fresh)]
            self._insert_all(conn, items)
            conn.execute(
                "UPDATE feed SET last_seq = %s, turns = turns + %s WHERE id = 1",
                (head + len(items), len(items)),
            )
            self._db.notify(conn, FEED_CHANNEL)
            for i, (seq, turn, row, position) in zip(fresh, items, strict=True):
                written[i] = stored(turn, row, seq, position)
        out: list[tuple[StoredTurn, bool]] = []
        for i, turn in enumerate(turns):
            key = (turn.tenant, turn.memory_id)
            if i in written:
                out.append((written[i], True))
            elif key in existing:
                out.append((existing[key], False))
            else:
                out.append((written[first[key]], False))
        return out

    @staticmethod
    def _insert_all(
        conn: psycopg.Connection[Any], items: Sequence[tuple[int, NewTurn, Row, int]]
    ) -> None:
        """The feed entries and rows of new turns (seq, turn, row, position). The put's
        seq is the turn's seq, as in SQLite."""
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO changes (seq, op, tenant, memory_id) VALUES (%s, 'put', %s, %s)",
                [(seq, turn.tenant, turn.memory_id) for seq, turn, _, _ in items],
            )
            cursor.executemany(
                insert_turn("%s"),
                [(seq, *row, position) for seq, _, row, position in items],
            )

    def get(self, tenant: str, user: str, memory_ids: Sequence[str]) -> list[StoredTurn]:
        wanted = [i for i in dict.fromkeys(memory_ids) if _storable(i)]
        if not wanted or not _storable(tenant, user):
            return []
        self._check_open()
        with self._db.transaction(WHAT) as conn:
            rows = conn.execute(
                f"SELECT {TURN_COLUMNS} FROM turns t "
                "WHERE t.tenant = %s AND t.user_id = %s AND t.memory_id = ANY(%s)",
                (tenant, user, wanted),
            ).fetchall()
        found = {turn.memory_id: turn for turn in map(from_row, rows)}
        return [found[i] for i in wanted if i in found]

    def update_metadata(
        self,
        tenant: str,
        user: str,
        memory_id: str,
        set_: Mapping[str, str],
        remove: Sequence[str],
        vector: Vector | None = None,
        vector_model: str = "",
    ) -> tuple[StoredTurn, bool] | None:
        """As SqliteTurnStore.update_metadata."""
        if not _storable(tenant, user, memory_id):
            return None
        self._check_open()

        def update(conn: psycopg.Connection[Any]) -> tuple[StoredTurn, bool] | None:
            head = _lock_feed(conn)
            row = conn.execute(
                f"SELECT {TURN_COLUMNS} FROM turns t "
                "WHERE t.tenant = %s AND t.user_id = %s AND t.memory_id = %s",
                (tenant, user, memory_id),
            ).fetchone()
            if row is None:
                return None
            turn = from_row(row)
            metadata = updated_metadata(turn.metadata, set_, remove)
            if metadata == dict(turn.metadata):
                return turn, False
            conn.execute(
                "UPDATE turns SET metadata = %s WHERE seq = %s",
                (encode_metadata(metadata), turn.seq),
            )
            if vector is not None:
                conn.execute(
                    "UPDATE turns SET vector = %s, vector_model = %s WHERE seq = %s",
                    (encode_vector(vector), vector_model, turn.seq),
                )
                conn.execute(
                    "DELETE FROM model_vectors WHERE tenant = %s AND memory_id = %s",
                    (tenant, memory_id),
                )
            conn.execute(
                "INSERT INTO changes (seq, op, tenant, memory_id) VALUES (%s, 'touch', %s, %s)",
                (head + 1, tenant, memory_id),
            )
            conn.execute("UPDATE feed SET last_seq = %s WHERE id = 1", (head + 1,))
            self._db.notify(conn, FEED_CHANNEL)
            updated = conn.execute(
                f"SELECT {TURN_COLUMNS} FROM turns t WHERE t.seq = %s", (turn.seq,)
            ).fetchone()
            assert updated is not None  # the row this transaction holds
            return from_row(updated), True

        return self._db.run(update, WHAT)

    def list_turns(
        self, scope: Scope, *, newest_first: bool, after: Cursor | None, limit: int
    ) -> list[StoredTurn]:
        """As SqliteTurnStore.list_turns (the same statement)."""
        if not _storable(scope.tenant, scope.user, scope.session or ""):
            return []
        self._check_open()
        sql, params = list_turns_query(scope, newest_first, after, limit, "%s")
        with self._db.transaction(WHAT) as conn:
            rows = conn.execute(sql, params).fetchall()
        return [from_row(row) for row in rows]

    def list_sessions(self, tenant: str, user: str, after: str, limit: int) -> list[SessionStats]:
        """As SqliteTurnStore.list_sessions."""
        if not _storable(tenant, user, after):
            return []
        self._check_open()
        sql, params = list_sessions_query(tenant, user, after, limit, "%s")
        with self._db.transaction(WHAT) as conn:
            rows = conn.execute(sql, params).fetchall()
        return [session_stats(row) for row in rows]

    def list_users(self, tenant: str, after: str, limit: int) -> list[UserStats]:
        """As SqliteTurnStore.list_users."""
        if not _storable(tenant, after):
            return []
        self._check_open()
        sql, params = list_users_query(tenant, after, limit, "%s")
        with self._db.transaction(WHAT) as conn:
            rows = conn.execute(sql, params).fetchall()
        return [user_stats(row) for row in rows]

    def changes(self, after_seq: int, limit: int) -> list[Change]:
        """As SqliteTurnStore.changes. One statement, so one snapshot: a prefix of the feed
        (see the module docstring)."""
        if limit < 1:
            raise InvalidArgument("limit", "must be at least 1")
        self._check_open()
        with self._db.transaction(WHAT) as conn:
            rows = conn.execute(
                f"SELECT c.seq, c.op, c.tenant, c.memory_id, {TURN_COLUMNS} "
                "FROM changes c LEFT JOIN turns t ON t.tenant = c.tenant "
                "AND t.memory_id = c.memory_id AND (c.op = 'touch' OR t.seq = c.seq) "
                "WHERE c.seq > %s AND (c.op = 'delete' OR t.seq IS NOT NULL) "
                "ORDER BY c.seq LIMIT %s",
                (after_seq, limit),
            ).fetchall()
        return feed_entries(rows)

    def previous(self, turns: Sequence[StoredTurn]) -> dict[str, StoredTurn]:
        if not turns:
            return {}
        self._check_open()
        # One statement for the whole page (a round trip per turn would dominate a
        # projector step over the network).
        keys = [(t.memory_id, t.tenant, t.user, t.session, t.position) for t in turns]
        columns = [list(column) for column in zip(*keys, strict=True)]
        with self._db.transaction(WHAT) as conn:
            rows = conn.execute(
                f"SELECT k.memory_id, {TURN_COLUMNS} FROM unnest("
                "%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[]"
                ") AS k(memory_id, tenant, user_id, session_id, position) "
                "CROSS JOIN LATERAL (SELECT * FROM turns p WHERE p.tenant = k.tenant "
                "AND p.user_id = k.user_id AND p.session_id = k.session_id "
                "AND p.position < k.position ORDER BY p.position DESC LIMIT 1) t",
                columns,
            ).fetchall()
        return {str(row[0]): from_row(row[1:]) for row in rows}

    def locate(self, tenant: str, user: str, memory_ids: Sequence[str]) -> dict[str, Place]:
        wanted = [i for i in dict.fromkeys(memory_ids) if _storable(i)]
        if not wanted or not _storable(tenant, user):
            return {}
        self._check_open()
        with self._db.transaction(WHAT) as conn:
            rows = conn.execute(
                "SELECT memory_id, session_id, position, metadata::jsonb ->> 'speaker', terms "
                "FROM turns WHERE tenant = %s AND user_id = %s AND memory_id = ANY(%s)",
                (tenant, user, wanted),
            ).fetchall()
        return {str(m): Place(str(s), int(p), str(sp or ""), int(t)) for m, s, p, sp, t in rows}

    def delete(
        self, tenant: str, user: str, *, session: str | None = None, memory_ids: Sequence[str] = ()
    ) -> list[str]:
        """As SqliteTurnStore.delete; then VACUUM (see the module docstring)."""
        ids = list(dict.fromkeys(memory_ids))
        listed = [i for i in ids if _storable(i)]
        if (ids and not listed) or not _storable(tenant, user, session or ""):
            return []  # nothing with such a value can be stored
        self._check_open()
        erased = self._db.run(lambda conn: self._delete(conn, tenant, user, session, listed), WHAT)
        if erased:
            self._vacuum()
        return erased

    def _delete(
        self,
        conn: psycopg.Connection[Any],
        tenant: str,
        user: str,
        session: str | None,
        ids: list[str],
    ) -> list[str]:
        head = _lock_feed(conn)
        where = "tenant = %s AND user_id = %s"
        params: list[Any] = [tenant, user]
        if session is not None:
            where += " AND session_id = %s"
            params.append(session)
        listed = " AND memory_id = ANY(%s)" if ids else ""
        victims = conn.execute(
            f"DELETE FROM turns WHERE {where}{listed} "
            "RETURNING seq, memory_id, session_id, position",
            (*params, ids) if ids else params,
        ).fetchall()
        if not victims:
            return []
        victims.sort()
        # The next surviving turn after each erased one, whose BM25 document quoted it
        # (see SqliteTurnStore.delete), in the order of the erased turns.
        following = conn.execute(
            "SELECT n.memory_id FROM unnest(%s::text[], %s::bigint[]) WITH ORDINALITY "
            "AS v(session_id, position, ord) CROSS JOIN LATERAL (SELECT memory_id FROM turns t "
            "WHERE t.tenant = %s AND t.user_id = %s AND t.session_id = v.session_id "
            "AND t.position > v.position ORDER BY t.position LIMIT 1) n ORDER BY v.ord",
            ([v[2] for v in victims], [v[3] for v in victims], tenant, user),
        ).fetchall()
        touched = list(dict.fromkeys(str(m) for (m,) in following))
        entries = [("delete", str(v[1])) for v in victims] + [("touch", m) for m in touched]
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO changes (seq, op, tenant, memory_id) VALUES (%s, %s, %s, %s)",
                [(head + n + 1, op, tenant, m) for n, (op, m) in enumerate(entries)],
            )
        # A session left without turns is forgotten whole, as in SQLite.
        conn.execute(
            f"DELETE FROM sessions s WHERE {where} AND NOT EXISTS (SELECT 1 FROM turns t "
            "WHERE t.tenant = s.tenant AND t.user_id = s.user_id "
            "AND t.session_id = s.session_id)",
            params,
        )
        conn.execute(
            "UPDATE feed SET last_seq = %s, turns = turns - %s WHERE id = 1",
            (head + len(entries), len(victims)),
        )
        self._db.notify(conn, FEED_CHANNEL)
        return [str(v[1]) for v in victims]

    def _vacuum(self) -> None:
        """Remove the erased rows' dead tuples now rather than at autovacuum's leisure.
        The erasure is committed either way: when VACUUM cannot run (another replica's
        holds the table past the lock timeout) it is logged, and the next one (or
        autovacuum) completes the scrub."""
        with self._vacuum_lock:  # this process's deletes queue here, not on the lock
            self._db.vacuum("turns", "sessions", "model_vectors")

    def model_vectors(
        self, model: str, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], Vector]:
        """As SqliteTurnStore.model_vectors."""
        keys = [k for k in keys if _storable(*k)]
        if not keys:
            return {}
        self._check_open()
        with self._db.transaction(WHAT) as conn:
            rows = conn.execute(
                "SELECT v.tenant, v.memory_id, v.vector FROM unnest(%s::text[], %s::text[]) "
                "AS k(tenant, memory_id) JOIN model_vectors v ON v.tenant = k.tenant "
                "AND v.memory_id = k.memory_id AND v.model = %s",
                ([k[0] for k in keys], [k[1] for k in keys], model),
            ).fetchall()
        out: dict[tuple[str, str], Vector] = {}
        for tenant, memory_id, blob in rows:
            vector = decode_vector(bytes(blob))
            assert vector is not None
            out[(str(tenant), str(memory_id))] = vector
        return out

    def put_model_vectors(self, model: str, rows: Sequence[tuple[str, str, Vector]]) -> int:
        """As SqliteTurnStore.put_model_vectors. The foreign key's check locks the turn,
        so an erasure that committed first leaves nothing to join (or fails the check,
        and the projector's retry finds the turn gone), and one that comes after erases
        the vector with the turn (ON DELETE CASCADE)."""
        if not rows:
            return 0
        self._check_open()

        def put(conn: psycopg.Connection[Any]) -> int:
            result = conn.execute(
                "INSERT INTO model_vectors (tenant, memory_id, model, vector) "
                "SELECT t.tenant, t.memory_id, %s, k.vector FROM unnest(%s::text[], "
                "%s::text[], %s::bytea[]) AS k(tenant, memory_id, vector) JOIN turns t "
                "ON t.tenant = k.tenant AND t.memory_id = k.memory_id "
                "ON CONFLICT (tenant, memory_id, model) DO UPDATE SET vector = EXCLUDED.vector",
                (
                    model,
                    [r[0] for r in rows],
                    [r[1] for r in rows],
                    [encode_vector(r[2]) for r in rows],
                ),
            )
            return result.rowcount

        return self._db.run(put, WHAT)

    def last_seq(self) -> int:
        """The feed head: the highest committed seq (0 for a new store)."""
        return self._head()[0]

    def size(self) -> int:
        return self._head()[1]

    def _head(self) -> tuple[int, int]:
        self._check_open()
        with self._db.transaction(WHAT) as conn:
            row = conn.execute("SELECT last_seq, turns FROM feed WHERE id = 1").fetchone()
        if row is None:
            raise FailedPrecondition("turn store: the feed head row is missing")
        return int(row[0]), int(row[1])

    def tenant_size(self, tenant: str) -> int:
        """Turns stored in one tenant (its stored-turn quota)."""
        self._check_open()
        with self._db.transaction(WHAT) as conn:
            row = conn.execute("SELECT count(*) FROM turns WHERE tenant = %s", (tenant,)).fetchone()
        return int(row[0]) if row else 0

    def count(self, tenant: str, user: str) -> int:
        """How many turns the user has stored in the tenant."""
        if not _storable(tenant, user):
            return 0
        self._check_open()
        with self._db.transaction(WHAT) as conn:
            row = conn.execute(
                "SELECT count(*) FROM turns WHERE tenant = %s AND user_id = %s", (tenant, user)
            ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Refuse further use (idempotent); the Database belongs to the caller."""
        self._closed = True


def _lock_feed(conn: psycopg.Connection[Any]) -> int:
    """Lock the feed head for this transaction (every writer queues here) and read it."""
    row = conn.execute("SELECT last_seq FROM feed WHERE id = 1 FOR UPDATE").fetchone()
    if row is None:
        raise FailedPrecondition("turn store: the feed head row is missing")
    return int(row[0])


def _existing(
    conn: psycopg.Connection[Any], turns: Sequence[NewTurn]
) -> dict[tuple[str, str], StoredTurn]:
    keys = list(dict.fromkeys((t.tenant, t.memory_id) for t in turns))
    rows = conn.execute(
        f"SELECT {TURN_COLUMNS} FROM unnest(%s::text[], %s::text[]) AS k(tenant, memory_id) "
        "JOIN turns t ON t.tenant = k.tenant AND t.memory_id = k.memory_id",
        ([k[0] for k in keys], [k[1] for k in keys]),
    ).fetchall()
    return {(t.tenant, t.memory_id): t for t in map(from_row, rows)}


def _positions(conn: psycopg.Connection[Any], turns: Sequence[NewTurn]) -> list[int]:
    """Each new turn's position in its session, in order: one counter per session, never
    MAX(position)+1, so a forgotten turn's number is never handed out again."""
    counts: dict[tuple[str, str, str], int] = {}
    for t in turns:
        key = (t.tenant, t.user, t.session)
        counts[key] = counts.get(key, 0) + 1
    next_of: dict[tuple[str, str, str], int] = {}
    for key, count in counts.items():
        row = conn.execute(
            "INSERT INTO sessions AS s (tenant, user_id, session_id, last_position) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (tenant, user_id, session_id) "
            "DO UPDATE SET last_position = s.last_position + EXCLUDED.last_position "
            "RETURNING last_position",
            (*key, count),
        ).fetchone()
        assert row is not None
        next_of[key] = int(row[0]) - count + 1
    out = []
    for t in turns:
        key = (t.tenant, t.user, t.session)
        out.append(next_of[key])
        next_of[key] += 1
    return out
