"""Session state in SQLite: WAL, synchronous=FULL, one transaction per change.

Per (tenant, user, session) a `sessions` row holds the rolling summary, its token count,
the version, the summary's revision (the compare-and-set token of merges) and merge
statistics. `turns` holds every turn the session was given, by memory id, in one of
three states:
- window: in the working window, with its text and token count;
- merged: folded into the current summary; the text is dropped (the summary holds what
  was kept, and the full transcript lives in the retrieval service's turn store);
- retired: was merged into a summary that Forget has since erased. Only the id is kept,
  so a retried Append of that turn is still recognised and skipped.
Knowing which ids built the summary is what lets Forget erase a summary that quotes a
forgotten turn: a merged text cannot be un-merged.

Durability: Append returns after its transaction is committed and fsynced (FULL: in WAL
mode NORMAL may lose the last commits on power loss). A merge commit moves its turns out
of the window and stores the new summary in the same transaction, so a crash at any
point leaves either the old window and summary or the new ones.

Audit outbox: a merge commit also queues its audit event (`audit_outbox`, ids and figures,
no text) in the same transaction, and domain/audit.py delivers the queue to the audit
service; so a merge is never committed unrecorded, whatever crashes when.

Erasure: `secure_delete` zeroes freed content and every Forget ends with a truncating
WAL checkpoint, so erased text is gone from the files, not only unreachable.

Tenancy is applied in SQL (`WHERE tenant = ? AND user_id = ?`) in every statement.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hippo_core.errors import Aborted, FailedPrecondition
from hippo_summariser.domain.models import (
    Forgotten,
    MergeEvent,
    MergeOutcome,
    MergeStats,
    Role,
    Session,
    SessionKey,
    TurnIn,
    WindowTurn,
)

_log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
_MAX_IN = 500  # bound parameters per IN (...): portable to old SQLite builds
_ATTEMPTS = 3  # each waits busy_timeout for a lock another process holds

_TABLES = """
CREATE TABLE sessions (
    tenant             TEXT NOT NULL,
    user_id            TEXT NOT NULL,
    session_id         TEXT NOT NULL,
    version            INTEGER NOT NULL,
    summary            TEXT NOT NULL DEFAULT '',
    summary_tokens     INTEGER NOT NULL DEFAULT 0,
    summary_rev        INTEGER NOT NULL DEFAULT 0,
    updated_us         INTEGER NOT NULL,
    merges             INTEGER NOT NULL DEFAULT 0,
    turns_merged       INTEGER NOT NULL DEFAULT 0,
    facts              INTEGER NOT NULL DEFAULT 0,
    facts_kept_llm     INTEGER NOT NULL DEFAULT 0,
    facts_kept         INTEGER NOT NULL DEFAULT 0,
    last_retention_llm REAL NOT NULL DEFAULT 1.0,
    last_retention     REAL NOT NULL DEFAULT 1.0,
    llm_failures       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, user_id, session_id)
) WITHOUT ROWID;
CREATE TABLE turns (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    session_id TEXT NOT NULL,
    memory_id  TEXT NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('window', 'merged', 'retired')),
    role       TEXT NOT NULL,
    text       TEXT,
    time_us    INTEGER NOT NULL,
    speaker    TEXT NOT NULL,
    tokens     INTEGER,
    UNIQUE (tenant, user_id, session_id, memory_id)
);
CREATE INDEX turns_by_state ON turns (tenant, user_id, session_id, state, seq);
CREATE INDEX turns_by_memory ON turns (tenant, user_id, memory_id);
"""
# Schema 2: merge events waiting for the audit service (delivered, then deleted; `dead`
# holds the reason for one the service refused for good).
_OUTBOX = """
CREATE TABLE audit_outbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    event      TEXT NOT NULL,
    created_us INTEGER NOT NULL,
    dead       TEXT
);
CREATE INDEX audit_outbox_live ON audit_outbox (dead, id);
"""
_SCHEMA = _TABLES + _OUTBOX

_SESSION_COLUMNS = (
    "version, summary, summary_tokens, summary_rev, updated_us, merges, turns_merged, facts, "
    "facts_kept_llm, facts_kept, last_retention_llm, last_retention, llm_failures"
)
_KEY = "tenant = ? AND user_id = ? AND session_id = ?"


def _chunks(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), _MAX_IN):
        yield items[start : start + _MAX_IN]


class SqliteSessionStore:
    """`SessionStore` on one SQLite file. One connection behind one lock: the domain calls
    it from worker threads. Several processes may share the file (SQLite's write lock
    serialises them; merges compare-and-set on the summary's revision)."""

    def __init__(self, path: Path, *, busy_timeout_ms: int = 5000) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._closed = False
        # isolation_level=None: every write opens its own BEGIN IMMEDIATE, taking the
        # write lock up front instead of failing on upgrade mid-transaction.
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise FailedPrecondition(f"session store: journal_mode WAL unavailable ({mode})")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA secure_delete = ON")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version in (0, 1):
                # 1 -> 2 added the audit outbox; a fresh file gets everything.
                for statement in (_SCHEMA if version == 0 else _OUTBOX).split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise FailedPrecondition(
                    f"session store: schema version {version} is not supported "
                    f"(this build knows {SCHEMA_VERSION})"
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise FailedPrecondition("session store is closed")
            yield self._conn

    def _write(self, work: Any) -> Any:
        """Run `work(conn)` in one BEGIN IMMEDIATE transaction. If another process holds
        the write lock past busy_timeout, retry; ABORTED if it never lets go."""
        for attempt in range(_ATTEMPTS):
            with self._locked() as conn:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    result = work(conn)
                    conn.execute("COMMIT")
                    return result
                except sqlite3.OperationalError as exc:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    if "locked" not in str(exc) and "busy" not in str(exc):
                        raise
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            time.sleep(0.05 * (attempt + 1))
        raise Aborted("session: another writer held the session store; retry the call")

    # -- reads -------------------------------------------------------------------------

    def load(self, key: SessionKey) -> Session | None:
        with self._locked() as conn:
            return _load(conn, key)

    def pending(self, budget: int) -> list[SessionKey]:
        with self._locked() as conn:
            rows = conn.execute(
                "SELECT tenant, user_id, session_id FROM turns WHERE state = 'window' "
                "GROUP BY tenant, user_id, session_id "
                "HAVING SUM(COALESCE(tokens, 0)) > ? OR SUM(tokens IS NULL) > 0",
                (budget,),
            ).fetchall()
        return [SessionKey(str(t), str(u), str(s)) for t, u, s in rows]

    # -- writes ------------------------------------------------------------------------

    def append(self, key: SessionKey, turns: Sequence[TurnIn], now_us: int) -> tuple[Session, int]:
        def work(conn: sqlite3.Connection) -> tuple[Session, int]:
            conn.execute(
                "INSERT INTO sessions (tenant, user_id, session_id, version, updated_us) "
                "VALUES (?, ?, ?, 0, ?) ON CONFLICT DO NOTHING",
                (key.tenant, key.user, key.session, now_us),
            )
            ids = list(dict.fromkeys(t.memory_id for t in turns))
            held: set[str] = set()
            for chunk in _chunks(ids):
                marks = ",".join("?" * len(chunk))
                held.update(
                    str(r[0])
                    for r in conn.execute(
                        f"SELECT memory_id FROM turns WHERE {_KEY} AND memory_id IN ({marks})",
                        (key.tenant, key.user, key.session, *chunk),
                    )
                )
            added = 0
            for turn in turns:
                if turn.memory_id in held:
                    continue
                held.add(turn.memory_id)
                conn.execute(
                    "INSERT INTO turns (tenant, user_id, session_id, memory_id, state, role, "
                    "text, time_us, speaker, tokens) VALUES (?, ?, ?, ?, 'window', ?, ?, ?, ?, ?)",
                    (
                        key.tenant,
                        key.user,
                        key.session,
                        turn.memory_id,
                        turn.role.value,
                        turn.text,
                        turn.time_us,
                        turn.speaker,
                        turn.tokens,
                    ),
                )
                added += 1
            if added:
                _bump(conn, key, now_us)
            session = _load(conn, key)
            assert session is not None
            return session, added

        result: tuple[Session, int] = self._write(work)
        return result

    def set_tokens(self, key: SessionKey, tokens: Mapping[int, int], now_us: int) -> None:
        def work(conn: sqlite3.Connection) -> None:
            changed = 0
            for seq, n in tokens.items():
                changed += conn.execute(
                    f"UPDATE turns SET tokens = ? WHERE seq = ? AND {_KEY} "
                    "AND state = 'window' AND tokens IS NULL",
                    (n, seq, key.tenant, key.user, key.session),
                ).rowcount
            if changed:
                _bump(conn, key, now_us)

        self._write(work)

    def commit_merge(
        self,
        key: SessionKey,
        expected_rev: int,
        merged_seqs: Sequence[int],
        outcome: MergeOutcome,
        now_us: int,
        event: MergeEvent | None = None,
    ) -> int | None:
        def work(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(
                f"SELECT summary_rev FROM sessions WHERE {_KEY}",
                (key.tenant, key.user, key.session),
            ).fetchone()
            if row is None or int(row[0]) != expected_rev:
                return None
            present = 0
            for chunk in _chunks(merged_seqs):
                marks = ",".join("?" * len(chunk))
                present += conn.execute(
                    f"SELECT COUNT(*) FROM turns WHERE {_KEY} AND state = 'window' "
                    f"AND seq IN ({marks})",
                    (key.tenant, key.user, key.session, *chunk),
                ).fetchone()[0]
            if present != len(merged_seqs):
                return None  # a merged turn was forgotten meanwhile: its text is in `outcome`
            for chunk in _chunks(merged_seqs):
                marks = ",".join("?" * len(chunk))
                conn.execute(
                    f"UPDATE turns SET state = 'merged', text = NULL, speaker = '' "
                    f"WHERE {_KEY} AND seq IN ({marks})",
                    (key.tenant, key.user, key.session, *chunk),
                )
            (version,) = conn.execute(
                "UPDATE sessions SET summary = ?, summary_tokens = ?, "
                "summary_rev = summary_rev + 1, version = version + 1, updated_us = ?, "
                "merges = merges + 1, turns_merged = turns_merged + ?, facts = facts + ?, "
                "facts_kept_llm = facts_kept_llm + ?, facts_kept = facts_kept + ?, "
                f"last_retention_llm = ?, last_retention = ? WHERE {_KEY} RETURNING version",
                (
                    outcome.summary,
                    outcome.summary_tokens,
                    now_us,
                    len(merged_seqs),
                    outcome.facts,
                    outcome.kept_llm,
                    outcome.kept,
                    outcome.retention_llm,
                    outcome.retention,
                    key.tenant,
                    key.user,
                    key.session,
                ),
            ).fetchone()
            if event is not None:
                conn.execute(
                    "INSERT INTO audit_outbox (event, created_us) VALUES (?, ?)",
                    (_dump_event(dataclasses.replace(event, version=int(version))), now_us),
                )
            return int(version)

        result: int | None = self._write(work)
        return result

    # -- audit outbox ------------------------------------------------------------------

    def outbox_peek(self, limit: int) -> list[tuple[int, MergeEvent]]:
        with self._locked() as conn:
            rows = conn.execute(
                "SELECT id, event FROM audit_outbox WHERE dead IS NULL ORDER BY id LIMIT ?",
                (limit,),
            ).fetchall()
        return [(int(i), _load_event(text)) for i, text in rows]

    def outbox_remove(self, ids: Sequence[int]) -> None:
        def work(conn: sqlite3.Connection) -> None:
            for chunk in _chunks(ids):
                marks = ",".join("?" * len(chunk))
                conn.execute(f"DELETE FROM audit_outbox WHERE id IN ({marks})", tuple(chunk))

        self._write(work)

    def outbox_bury(self, outbox_id: int, reason: str) -> None:
        self._write(
            lambda conn: conn.execute(
                "UPDATE audit_outbox SET dead = ? WHERE id = ?", (reason or "refused", outbox_id)
            )
        )

    def session_count(self) -> int:
        """Sessions held (the store-size gauge, read at scrape time: a primary-key count,
        milliseconds at 100k sessions, briefly holding the lock). 0 once closed, so a
        scrape during shutdown does not fail."""
        with self._lock:
            if self._closed:
                return 0
            return int(self._conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])

    def outbox_depth(self) -> tuple[int, int]:
        with self._locked() as conn:
            live, dead = conn.execute(
                "SELECT COUNT(*) - COUNT(dead), COUNT(dead) FROM audit_outbox"
            ).fetchone()
        return int(live), int(dead)

    def record_llm_failure(self, key: SessionKey) -> None:
        self._write(
            lambda conn: conn.execute(
                f"UPDATE sessions SET llm_failures = llm_failures + 1 WHERE {_KEY}",
                (key.tenant, key.user, key.session),
            )
        )

    def forget(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> Forgotten:
        where, params = "tenant = ? AND user_id = ?", [tenant, user]
        if session is not None:
            where += " AND session_id = ?"
            params.append(session)
        ids = list(dict.fromkeys(memory_ids))

        def by_ids(conn: sqlite3.Connection) -> Forgotten:
            victims: list[tuple[int, str, str]] = []
            for chunk in _chunks(ids):
                marks = ",".join("?" * len(chunk))
                victims += conn.execute(
                    f"SELECT seq, session_id, state FROM turns WHERE {where} "
                    f"AND memory_id IN ({marks})",
                    (*params, *chunk),
                ).fetchall()
            sessions = sorted({str(s) for _, s, _ in victims})
            erased = deleted = 0
            touched: list[SessionKey] = []
            for name in sessions:
                key = SessionKey(tenant, user, name)
                if any(s == name and state == "merged" for _, s, state in victims):
                    # The summary quotes an erased turn: it goes, and the turns it was
                    # built from are retired (ids kept only to recognise retries).
                    conn.execute(
                        "UPDATE sessions SET summary = '', summary_tokens = 0, "
                        f"summary_rev = summary_rev + 1 WHERE {_KEY}",
                        (tenant, user, name),
                    )
                    conn.execute(
                        f"UPDATE turns SET state = 'retired' WHERE {_KEY} AND state = 'merged'",
                        (tenant, user, name),
                    )
                    erased += 1
                for seq, s, _ in victims:
                    if s == name:
                        conn.execute("DELETE FROM turns WHERE seq = ?", (seq,))
                left = conn.execute(
                    f"SELECT COUNT(*) FROM turns WHERE {_KEY}", (tenant, user, name)
                ).fetchone()[0]
                if left == 0:
                    # Nothing of the session is left: its row goes too (the session id
                    # and summary statistics are the user's data).
                    conn.execute(f"DELETE FROM sessions WHERE {_KEY}", (tenant, user, name))
                    deleted += 1
                else:
                    _bump(conn, key, _now_us())
                    touched.append(key)
            removed = sum(1 for _, _, state in victims if state == "window")
            return Forgotten(deleted, removed, erased, tuple(touched))

        def whole(conn: sqlite3.Connection) -> Forgotten:
            deleted = conn.execute(f"DELETE FROM sessions WHERE {where}", params).rowcount
            removed = conn.execute(
                f"SELECT COUNT(*) FROM turns WHERE {where} AND state = 'window'", params
            ).fetchone()[0]
            conn.execute(f"DELETE FROM turns WHERE {where}", params)
            return Forgotten(int(deleted), int(removed), 0, ())

        result: Forgotten = self._write(by_ids if ids else whole)
        if result.sessions_deleted or result.turns_removed or result.summaries_erased or ids:
            self._purge_wal()
        return result

    def close(self) -> None:
        """Idempotent. The last connection to close checkpoints and removes the WAL."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()

    # -- internals ---------------------------------------------------------------------

    def _purge_wal(self) -> None:
        # The WAL still holds frames written while the erased text was live, and a
        # normal checkpoint only rewinds it without shrinking. TRUNCATE copies the zeroed
        # pages into the main file and cuts the WAL to zero bytes.
        with self._locked() as conn:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            # The erasure is committed; only the scrub waits for a reader in another
            # process. The next Forget or the last close completes it.
            _log.warning("session store: WAL checkpoint after forget was blocked by a reader")


def _now_us() -> int:
    return time.time_ns() // 1000


def _bump(conn: sqlite3.Connection, key: SessionKey, now_us: int) -> None:
    conn.execute(
        f"UPDATE sessions SET version = version + 1, updated_us = ? WHERE {_KEY}",
        (now_us, key.tenant, key.user, key.session),
    )


def _load(conn: sqlite3.Connection, key: SessionKey) -> Session | None:
    args = (key.tenant, key.user, key.session)
    row = conn.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE {_KEY}", args).fetchone()
    if row is None:
        return None
    (version, summary, summary_tokens, summary_rev, updated_us, *stats) = row
    window = tuple(
        WindowTurn(
            seq=int(seq),
            memory_id=str(memory_id),
            role=Role(role),
            text=str(text),
            time_us=int(time_us),
            speaker=str(speaker),
            tokens=None if tokens is None else int(tokens),
        )
        for seq, memory_id, role, text, time_us, speaker, tokens in conn.execute(
            "SELECT seq, memory_id, role, text, time_us, speaker, tokens FROM turns "
            f"WHERE {_KEY} AND state = 'window' ORDER BY seq",
            args,
        )
    )
    (total,) = conn.execute(f"SELECT COUNT(*) FROM turns WHERE {_KEY}", args).fetchone()
    merges, turns_merged, facts, kept_llm, kept, ret_llm, ret, failures = stats
    return Session(
        key=key,
        window=window,
        summary=str(summary),
        summary_tokens=int(summary_tokens),
        version=int(version),
        turns_total=int(total),
        updated_us=int(updated_us),
        summary_rev=int(summary_rev),
        stats=MergeStats(
            merges=int(merges),
            turns_merged=int(turns_merged),
            facts=int(facts),
            facts_kept_llm=int(kept_llm),
            facts_kept=int(kept),
            last_retention_llm=float(ret_llm),
            last_retention=float(ret),
            llm_failures=int(failures),
        ),
    )


def _dump_event(event: MergeEvent) -> str:
    fields = dataclasses.asdict(event)
    fields["key"] = [event.key.tenant, event.key.user, event.key.session]
    fields["merged_memory_ids"] = list(event.merged_memory_ids)
    return json.dumps(fields, sort_keys=True)


def _load_event(text: str) -> MergeEvent:
    fields: dict[str, Any] = json.loads(text)
    tenant, user, session = fields.pop("key")
    ids = tuple(fields.pop("merged_memory_ids"))
    return MergeEvent(key=SessionKey(tenant, user, session), merged_memory_ids=ids, **fields)
