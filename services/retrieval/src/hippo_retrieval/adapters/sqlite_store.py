"""The turn store: SQLite, the retrieval service's source of truth.

Every turn is written here before any index sees it; Tantivy and Qdrant are projections
that can be rebuilt from this file alone (the vector is kept for that reason, so a rebuild
never re-embeds). The file is opened by `hippo_core.sqlite.open_store` (WAL checked,
`synchronous=FULL`, `secure_delete`, `busy_timeout`, numbered migrations), so `append`
returns only after its transaction is committed and fsynced — an acknowledged turn
survives a crash or power cut. The cluster engine is `postgres_store.py`, with the same
contract (the store tests run against both).

Puts and deletions draw their seq from ONE monotonically increasing sequence (the
`changes` table's AUTOINCREMENT key; a turn's seq is the seq of its put). A projection
that remembers the last seq it applied can therefore catch up after a restart by reading
`changes(after_seq, ...)` and applying entries in that order: a deletion always sorts
after the put it erases, so no index can resurrect an erased turn by replaying late.

Tenancy is applied in SQL (`WHERE tenant = ? AND user_id = ?`) in every read and delete,
never by filtering rows in Python afterwards.

Erasure means the text is gone from the file, not just unreachable: `secure_delete`
zeroes freed content, and a delete ends with a truncating WAL checkpoint (`purge_wal`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hippo_core import sqlite as hippo_sqlite
from hippo_core.errors import FailedPrecondition, InvalidArgument
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

NAME = "turn store"


def _add_terms(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE turns ADD COLUMN terms INTEGER NOT NULL DEFAULT -1")
    backfill_terms(
        lambda after: conn.execute(
            "SELECT seq, text FROM turns WHERE seq > ? ORDER BY seq LIMIT 5000", (after,)
        ).fetchall(),
        lambda pairs: conn.executemany("UPDATE turns SET terms = ? WHERE seq = ?", pairs),
    )
    conn.execute("DROP INDEX turns_places")
    conn.execute(
        "CREATE INDEX turns_places ON turns (tenant, memory_id, user_id, session_id, position, "
        "json_extract(metadata, '$.speaker'), terms)"
    )


# Version 1 is the layout every earlier build wrote (under user_version 1): it must never
# change, or files written by those builds would no longer open. Changes are new entries.
MIGRATIONS: list[hippo_sqlite.Migration] = [
    """
CREATE TABLE changes (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    op        TEXT NOT NULL CHECK (op IN ('put', 'delete', 'touch')),
    tenant    TEXT NOT NULL,
    memory_id TEXT NOT NULL
);
CREATE TABLE turns (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    memory_id  TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    session_id TEXT NOT NULL,
    role       TEXT NOT NULL,
    text       TEXT NOT NULL,
    time_us    INTEGER NOT NULL,
    client_id  TEXT NOT NULL,
    metadata   TEXT NOT NULL,
    vector     BLOB,
    position   INTEGER NOT NULL,
    UNIQUE (tenant, memory_id)
);
CREATE TABLE sessions (
    tenant        TEXT NOT NULL,
    user_id       TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    last_position INTEGER NOT NULL,
    PRIMARY KEY (tenant, user_id, session_id)
) WITHOUT ROWID;
CREATE INDEX turns_by_session ON turns (tenant, user_id, session_id, position);
CREATE INDEX turns_by_time ON turns (tenant, user_id, time_us);
""",
    # 2: vectors keyed by embedding model. A turn's own vector records its model (""
    # for rows written before: the legacy model, RetrievalSettings.embedding_model); the
    # vectors an index rebuilt with another model needed are kept per model beside it,
    # so the next rebuild (a purge after an erasure) does not embed everything again.
    """
ALTER TABLE turns ADD COLUMN vector_model TEXT NOT NULL DEFAULT '';
CREATE TABLE model_vectors (
    tenant    TEXT NOT NULL,
    memory_id TEXT NOT NULL,
    model     TEXT NOT NULL,
    vector    BLOB NOT NULL,
    PRIMARY KEY (tenant, memory_id, model)
) WITHOUT ROWID;
""",
    # 3: what the neighbour and speaker steps read of each candidate (`locate`, ~200 ids
    # per hybrid Recall), covered by one index: no probe of the table's rows, which hold
    # the text and the vector (0.8 -> 0.4 ms for 180 ids at 10k turns).
    """
CREATE INDEX turns_places ON turns
    (tenant, memory_id, user_id, session_id, position, json_extract(metadata, '$.speaker'));
""",
    # 4: each turn's content words (turn_rows.content_terms), for the short-turn step,
    # counted for the turns already stored and added to the covering index.
    _add_terms,
]


# Lookups by id: `+` keeps the user term out of index selection. With a long id list SQLite
# would otherwise pick the user's own index (turns_by_time) and scan every turn of the user
# (105 ms at 100k turns for 200 ids), instead of probing UNIQUE (tenant, memory_id) (2 ms).
# The user is still checked on every row found.
BY_ID_USER = "+t.user_id = ?"


class SqliteTurnStore:
    """`TurnStore` on one SQLite file. Thread-safe: one connection behind one lock, because
    the service calls it from worker threads and a sqlite3 connection is not safe to share
    unguarded."""

    def __init__(self, path: Path, *, busy_timeout_ms: int = 5000) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._conn = hippo_sqlite.open_store(
            Path(path), NAME, MIGRATIONS, busy_timeout_ms=busy_timeout_ms
        )

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise FailedPrecondition("turn store is closed")
            yield self._conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._locked() as conn, hippo_sqlite.transaction(conn):
            yield conn

    # -- TurnStore ---------------------------------------------------------------------

    def append(self, turns: Sequence[NewTurn]) -> list[tuple[StoredTurn, bool]]:
        """Store all turns in one transaction, or none; returns after the commit is fsynced.

        An id already stored in the tenant — or repeated earlier in this batch — is not
        written again: (the stored turn, False). Reusing an id of another user in the same
        tenant is refused (InvalidArgument, nothing written): answering with that user's
        turn would leak it across the user boundary.
        """
        if not turns:
            return []
        rows = [to_row(turn) for turn in turns]  # validate before taking the write lock
        out: list[tuple[StoredTurn, bool]] = []
        with self._transaction() as conn:
            for turn, row in zip(turns, rows, strict=True):
                existing = self._find(conn, turn.tenant, turn.memory_id)
                if existing is not None:
                    if existing.user != turn.user:
                        raise InvalidArgument(
                            "memory_id", "already used by another user in this tenant"
                        )
                    out.append((existing, False))
                    continue
                out.append((self._insert(conn, turn, row), True))
        return out

    def get(self, tenant: str, user: str, memory_ids: Sequence[str]) -> list[StoredTurn]:
        """The turns with these ids inside tenant and user, in the order asked; missing
        ids are skipped and a repeated id is returned once (at its first position)."""
        wanted = list(dict.fromkeys(memory_ids))
        found: dict[str, StoredTurn] = {}
        with self._locked() as conn:
            for chunk in hippo_sqlite.chunks(wanted):
                marks = ",".join("?" * len(chunk))
                cursor = conn.execute(
                    f"SELECT {TURN_COLUMNS} FROM turns t "
                    f"WHERE t.tenant = ? AND {BY_ID_USER} AND t.memory_id IN ({marks})",
                    (tenant, user, *chunk),
                )
                for row in cursor:
                    turn = from_row(row)
                    found[turn.memory_id] = turn
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
        """Change one turn's metadata (and, given, its vector: the metadata is part of
        what is embedded) in one transaction, with a touch in the feed so both indexes
        re-apply the turn. None when the turn is not the user's; (turn, False) when the
        metadata already was as asked (nothing written)."""
        with self._transaction() as conn:
            row = conn.execute(
                f"SELECT {TURN_COLUMNS} FROM turns t "
                f"WHERE t.tenant = ? AND {BY_ID_USER} AND t.memory_id = ?",
                (tenant, user, memory_id),
            ).fetchone()
            if row is None:
                return None
            turn = from_row(row)
            metadata = updated_metadata(turn.metadata, set_, remove)
            if metadata == dict(turn.metadata):
                return turn, False
            conn.execute(
                "UPDATE turns SET metadata = ? WHERE seq = ?", (encode_metadata(metadata), turn.seq)
            )
            if vector is not None:
                conn.execute(
                    "UPDATE turns SET vector = ?, vector_model = ? WHERE seq = ?",
                    (encode_vector(vector), vector_model, turn.seq),
                )
                # Other models' vectors of the old metadata would come back on a rebuild.
                conn.execute(
                    "DELETE FROM model_vectors WHERE tenant = ? AND memory_id = ?",
                    (tenant, memory_id),
                )
            conn.execute(
                "INSERT INTO changes (op, tenant, memory_id) VALUES ('touch', ?, ?)",
                (tenant, memory_id),
            )
            updated = conn.execute(
                f"SELECT {TURN_COLUMNS} FROM turns t WHERE t.seq = ?", (turn.seq,)
            ).fetchone()
        return from_row(updated), True

    def list_turns(
        self, scope: Scope, *, newest_first: bool, after: Cursor | None, limit: int
    ) -> list[StoredTurn]:
        """A page of the scope's turns by (time_us, seq), after `after` (turn_rows.py)."""
        sql, params = list_turns_query(scope, newest_first, after, limit, "?")
        with self._locked() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [from_row(row) for row in rows]

    def list_sessions(self, tenant: str, user: str, after: str, limit: int) -> list[SessionStats]:
        """A page of the user's sessions by id, after `after`."""
        sql, params = list_sessions_query(tenant, user, after, limit, "?")
        with self._locked() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [session_stats(row) for row in rows]

    def list_users(self, tenant: str, after: str, limit: int) -> list[UserStats]:
        """A page of the tenant's users by id, after `after`."""
        sql, params = list_users_query(tenant, after, limit, "?")
        with self._locked() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [user_stats(row) for row in rows]

    def changes(self, after_seq: int, limit: int) -> list[Change]:
        """Puts, touches and deletions with seq > after_seq, in seq order, at most `limit`.

        A put whose turn has since been erased is left out: its Deletion, later in the
        feed, supersedes it, and the text no longer exists to be sent. So seqs in the
        result may have gaps; `limit` counts returned entries, so a short page means the
        feed is exhausted. A touch (the turn's neighbourhood changed: see `delete`) comes
        back as the turn's current row carrying the touch's seq.
        """
        if limit < 1:
            raise InvalidArgument("limit", "must be at least 1")
        with self._locked() as conn:
            rows = conn.execute(
                f"SELECT c.seq, c.op, c.tenant, c.memory_id, {TURN_COLUMNS} "
                "FROM changes c LEFT JOIN turns t ON t.tenant = c.tenant "
                "AND t.memory_id = c.memory_id AND (c.op = 'touch' OR t.seq = c.seq) "
                "WHERE c.seq > ? AND (c.op = 'delete' OR t.seq IS NOT NULL) "
                "ORDER BY c.seq LIMIT ?",
                (after_seq, limit),
            ).fetchall()
        return feed_entries(rows)

    def previous(self, turns: Sequence[StoredTurn]) -> dict[str, StoredTurn]:
        """For each turn, the live turn just before it in its session (by position), keyed
        by the turn's memory_id; a session's first turn has none."""
        out: dict[str, StoredTurn] = {}
        with self._locked() as conn:
            for turn in turns:
                row = conn.execute(
                    f"SELECT {TURN_COLUMNS} FROM turns t WHERE t.tenant = ? AND t.user_id = ? "
                    "AND t.session_id = ? AND t.position < ? ORDER BY t.position DESC LIMIT 1",
                    (turn.tenant, turn.user, turn.session, turn.position),
                ).fetchone()
                if row is not None:
                    out[turn.memory_id] = from_row(row)
        return out

    def locate(self, tenant: str, user: str, memory_ids: Sequence[str]) -> dict[str, Place]:
        """Session, position, speaker and content words (`content_terms`) of each of the
        user's turns among `memory_ids`."""
        wanted = list(dict.fromkeys(memory_ids))
        out: dict[str, Place] = {}
        with self._locked() as conn:
            for chunk in hippo_sqlite.chunks(wanted):
                marks = ",".join("?" * len(chunk))
                # INDEXED BY: the planner's choice between this and UNIQUE (tenant,
                # memory_id) is a tie it may break either way (it did after ANALYZE).
                for memory_id, session, position, speaker, terms in conn.execute(
                    "SELECT memory_id, session_id, position, json_extract(metadata, '$.speaker'), "
                    f"terms FROM turns t INDEXED BY turns_places WHERE t.tenant = ? "
                    f"AND {BY_ID_USER} AND t.memory_id IN ({marks})",
                    (tenant, user, *chunk),
                ):
                    out[str(memory_id)] = Place(
                        str(session), int(position), str(speaker or ""), int(terms)
                    )
        return out

    def delete(
        self, tenant: str, user: str, *, session: str | None = None, memory_ids: Sequence[str] = ()
    ) -> list[str]:
        """Erase the user's turns — all of them, one session's, or the listed ids (given
        both, the listed ids within that session) — in one transaction, recording a
        Deletion per erased turn. Returns the erased ids in the order they were written."""
        where = "tenant = ? AND user_id = ?"
        by_ids = "tenant = ? AND +user_id = ?"  # as BY_ID_USER, for the unaliased table
        params: list[Any] = [tenant, user]
        if session is not None:
            where += " AND session_id = ?"
            by_ids += " AND session_id = ?"
            params.append(session)
        ids = list(dict.fromkeys(memory_ids))
        with self._transaction() as conn:
            victims: list[tuple[int, str, str, int]] = []
            columns = "seq, memory_id, session_id, position"
            if ids:
                for chunk in hippo_sqlite.chunks(ids):
                    marks = ",".join("?" * len(chunk))
                    victims += conn.execute(
                        f"SELECT {columns} FROM turns WHERE {by_ids} AND memory_id IN ({marks})",
                        (*params, *chunk),
                    ).fetchall()
            else:
                victims = conn.execute(
                    f"SELECT {columns} FROM turns WHERE {where}", params
                ).fetchall()
            victims.sort()
            for seq, memory_id, _, _ in victims:
                conn.execute("DELETE FROM turns WHERE seq = ?", (seq,))
                conn.execute(
                    "DELETE FROM model_vectors WHERE tenant = ? AND memory_id = ?",
                    (tenant, memory_id),
                )
                conn.execute(
                    "INSERT INTO changes (op, tenant, memory_id) VALUES ('delete', ?, ?)",
                    (tenant, memory_id),
                )
            # A turn's lexical document quotes the turn before it (see domain/documents.py):
            # the next surviving turn after each erased one is touched, so the indexes
            # rebuild its document without the erased text.
            touched: dict[str, None] = {}
            for _, _, session_id, position in victims:
                row = conn.execute(
                    "SELECT memory_id FROM turns WHERE tenant = ? AND user_id = ? "
                    "AND session_id = ? AND position > ? ORDER BY position LIMIT 1",
                    (tenant, user, session_id, position),
                ).fetchone()
                if row is not None:
                    touched.setdefault(str(row[0]), None)
            for memory_id in touched:
                conn.execute(
                    "INSERT INTO changes (op, tenant, memory_id) VALUES ('touch', ?, ?)",
                    (tenant, memory_id),
                )
            # A session left without turns is forgotten whole: its counter goes too (the
            # session id is user data), and a later turn in it starts again at 1.
            conn.execute(
                f"DELETE FROM sessions WHERE {where} AND NOT EXISTS (SELECT 1 FROM turns t "
                "WHERE t.tenant = sessions.tenant AND t.user_id = sessions.user_id "
                "AND t.session_id = sessions.session_id)",
                params,
            )
        if victims:
            # The WAL still holds the frames written while the erased turns were live;
            # a reader in another process can block the purge (logged): the erasure is
            # committed and the next purge or the last close completes the scrub.
            with self._locked() as conn:
                hippo_sqlite.purge_wal(conn, NAME)
        return [str(memory_id) for _, memory_id, _, _ in victims]

    def model_vectors(
        self, model: str, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], Vector]:
        """The kept vectors of `model` for these (tenant, memory_id) turns; missing skipped."""
        out: dict[tuple[str, str], Vector] = {}
        with self._locked() as conn:
            for tenant, memory_id in keys:
                row = conn.execute(
                    "SELECT vector FROM model_vectors WHERE tenant = ? AND memory_id = ? "
                    "AND model = ?",
                    (tenant, memory_id, model),
                ).fetchone()
                if row is not None:
                    vector = decode_vector(bytes(row[0]))
                    assert vector is not None
                    out[(tenant, memory_id)] = vector
        return out

    def put_model_vectors(self, model: str, rows: Sequence[tuple[str, str, Vector]]) -> int:
        """Keep `model`'s vectors of these turns, durably; a turn erased meanwhile gets
        none (checked in the same transaction as the write). Returns how many were kept."""
        kept = 0
        with self._transaction() as conn:
            for tenant, memory_id, vector in rows:
                cursor = conn.execute(
                    "INSERT OR REPLACE INTO model_vectors (tenant, memory_id, model, vector) "
                    "SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM turns "
                    "WHERE tenant = ? AND memory_id = ?)",
                    (tenant, memory_id, model, encode_vector(vector), tenant, memory_id),
                )
                kept += cursor.rowcount
        return kept

    def last_seq(self) -> int:
        """The highest seq ever handed out (0 for a new store); survives restarts."""
        with self._locked() as conn:
            row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'changes'").fetchone()
        return int(row[0]) if row is not None else 0

    def size(self) -> int:
        """Turns stored, all tenants."""
        with self._locked() as conn:
            row = conn.execute("SELECT COUNT(*) FROM turns").fetchone()
        return int(row[0])

    def tenant_size(self, tenant: str) -> int:
        """Turns stored in one tenant (its stored-turn quota)."""
        with self._locked() as conn:
            row = conn.execute("SELECT COUNT(*) FROM turns WHERE tenant = ?", (tenant,)).fetchone()
        return int(row[0])

    def count(self, tenant: str, user: str) -> int:
        """How many turns the user has stored in the tenant."""
        with self._locked() as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM turns WHERE tenant = ? AND user_id = ?", (tenant, user)
            ).fetchone()
        return int(row[0])

    def close(self) -> None:
        """Close the connection (idempotent). The last close checkpoints and removes the WAL."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()

    # -- internals ---------------------------------------------------------------------

    @staticmethod
    def _find(conn: sqlite3.Connection, tenant: str, memory_id: str) -> StoredTurn | None:
        row = conn.execute(
            f"SELECT {TURN_COLUMNS} FROM turns t WHERE t.tenant = ? AND t.memory_id = ?",
            (tenant, memory_id),
        ).fetchone()
        return from_row(row) if row is not None else None

    @staticmethod
    def _insert(conn: sqlite3.Connection, turn: NewTurn, row: Row) -> StoredTurn:
        # The put's change-log seq becomes the turn's seq: one sequence for puts and
        # deletes, so the feed and the rows can never disagree about order.
        cursor = conn.execute(
            "INSERT INTO changes (op, tenant, memory_id) VALUES ('put', ?, ?)",
            (turn.tenant, turn.memory_id),
        )
        seq = cursor.lastrowid
        assert seq is not None
        # The turn's position in its session: a counter per session, not MAX(position)+1,
        # so the number of a forgotten turn is never handed out again.
        (position,) = conn.execute(
            "INSERT INTO sessions (tenant, user_id, session_id, last_position) "
            "VALUES (?, ?, ?, 1) ON CONFLICT (tenant, user_id, session_id) "
            "DO UPDATE SET last_position = last_position + 1 RETURNING last_position",
            (turn.tenant, turn.user, turn.session),
        ).fetchone()
        conn.execute(
            insert_turn("?"),
            (seq, *row, position),
        )
        return stored(turn, row, seq, int(position))
