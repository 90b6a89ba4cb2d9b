"""Session state in SQLite (the embedded default): one file, opened by hippo_core.sqlite
(WAL, synchronous=FULL, secure_delete, numbered migrations), one transaction per change.

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

`merge_claims` holds the claim of each session being merged (owner, lease end): one
process at a time merges a session, also when several share the file (the domain's
merge.py); a merge commits only from the claim's holder.

Durability: Append returns after its transaction is committed and fsynced. A merge
commit moves its turns out of the window and stores the new summary in the same
transaction, so a crash at any point leaves either the old window and summary or the new
ones.

Audit outbox: a merge commit also queues its audit event (`audit_outbox`, the shape of
hippo_core.outbox: ids and figures, no text) in the same transaction; the core drainer
(`SqliteOutbox` on this file) delivers it, so a merge is never committed unrecorded.

Erasure: `secure_delete` zeroes freed content and every Forget ends with a truncating
WAL checkpoint, so erased text is gone from the files, not only unreachable.

Tenancy is applied in SQL (`WHERE tenant = ? AND user_id = ?`) in every statement.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from hippo_core import outbox
from hippo_core import sqlite as hippo_sqlite
from hippo_core.errors import Aborted, FailedPrecondition
from hippo_summariser.domain import audit
from hippo_summariser.domain.models import (
    Claim,
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

T = TypeVar("T")
NAME = "session store"
_ATTEMPTS = 3  # each waits busy_timeout for a lock another process holds

# Schema 1 (kept as it was: files written by older builds migrate from it).
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
# Schema 3: the outbox takes the shape of hippo_core.outbox.sqlite_schema, so the core
# drainer delivers it (the index already has that shape; the events keep their format).
_CORE_OUTBOX = "ALTER TABLE audit_outbox RENAME COLUMN event TO item;"
# Schema 4: merge claims (a row while a process merges the session).
_CLAIMS = """
CREATE TABLE merge_claims (
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    session_id TEXT NOT NULL,
    owner      TEXT NOT NULL,
    until_us   INTEGER NOT NULL,
    PRIMARY KEY (tenant, user_id, session_id)
) WITHOUT ROWID;
"""
MIGRATIONS: list[hippo_sqlite.Migration] = [_TABLES, _OUTBOX, _CORE_OUTBOX, _CLAIMS]

_SESSION_COLUMNS = (
    "version, summary, summary_tokens, summary_rev, updated_us, merges, turns_merged, facts, "
    "facts_kept_llm, facts_kept, last_retention_llm, last_retention, llm_failures"
)
_KEY = "tenant = ? AND user_id = ? AND session_id = ?"


class SqliteSessionStore:
    """`SessionStore` on one SQLite file. One connection behind one lock: the domain calls
    it from worker threads. Several processes may share the file (SQLite's write lock
    serialises them; claims keep their merges apart)."""

    def __init__(self, path: Path, *, owner: str = "", busy_timeout_ms: int = 5000) -> None:
        self.path = Path(path)
        self.owner = owner or outbox.new_owner()
        self._lock = threading.Lock()
        self._closed = False
        self._conn = hippo_sqlite.open_store(
            self.path, NAME, MIGRATIONS, busy_timeout_ms=busy_timeout_ms
        )

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise FailedPrecondition("session store is closed")
            yield self._conn

    def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work(conn)` in one BEGIN IMMEDIATE transaction. If another process holds
        the write lock past busy_timeout, retry; ABORTED if it never lets go."""
        for attempt in range(_ATTEMPTS):
            with self._locked() as conn:
                try:
                    with hippo_sqlite.transaction(conn):
                        return work(conn)
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) and "busy" not in str(exc):
                        raise
            time.sleep(0.05 * (attempt + 1))
        raise Aborted("session: another writer held the session store; retry the call")

    # -- reads -------------------------------------------------------------------------

    def load(self, key: SessionKey) -> Session | None:
        # Its statements run in one read transaction: one snapshot of the file.
        with self._locked() as conn:
            conn.execute("BEGIN")
            try:
                return _load(conn, key)
            finally:
                conn.execute("COMMIT")

    def versions(self, tenant: str, user: str, sessions: Sequence[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        with self._locked() as conn:
            for chunk in hippo_sqlite.chunks(list(dict.fromkeys(sessions))):
                marks = ",".join("?" * len(chunk))
                found.update(
                    conn.execute(
                        "SELECT session_id, version FROM sessions WHERE tenant = ? "
                        f"AND user_id = ? AND session_id IN ({marks})",
                        (tenant, user, *chunk),
                    ).fetchall()
                )
        return found

    def pending(self, budget: int) -> list[SessionKey]:
        with self._locked() as conn:
            rows = conn.execute(
                "SELECT t.tenant, t.user_id, t.session_id FROM turns t WHERE t.state = 'window' "
                "AND NOT EXISTS (SELECT 1 FROM merge_claims c WHERE c.tenant = t.tenant "
                "AND c.user_id = t.user_id AND c.session_id = t.session_id "
                "AND c.owner <> ? AND c.until_us > ?) "
                "GROUP BY t.tenant, t.user_id, t.session_id "
                "HAVING SUM(COALESCE(t.tokens, 0)) > ? OR SUM(t.tokens IS NULL) > 0",
                (self.owner, _now_us(), budget),
            ).fetchall()
        return [SessionKey(str(t), str(u), str(s)) for t, u, s in rows]

    def orphaned(self) -> list[SessionKey]:
        with self._locked() as conn:
            rows = conn.execute(
                "SELECT tenant, user_id, session_id FROM merge_claims "
                "WHERE owner <> ? AND until_us <= ?",
                (self.owner, _now_us()),
            ).fetchall()
        return [SessionKey(str(t), str(u), str(s)) for t, u, s in rows]

    def session_count(self) -> int:
        """Sessions held (the store-size gauge, read at scrape time: a primary-key count,
        milliseconds at 100k sessions, briefly holding the lock). 0 once closed, so a
        scrape during shutdown does not fail."""
        with self._lock:
            if self._closed:
                return 0
            return int(self._conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])

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
            for chunk in hippo_sqlite.chunks(ids):
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

        return self._write(work)

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

    # -- claims ------------------------------------------------------------------------

    def claim(self, key: SessionKey, lease_seconds: float) -> Claim:
        args = (key.tenant, key.user, key.session)

        def work(conn: sqlite3.Connection) -> Claim:
            if conn.execute(f"SELECT 1 FROM sessions WHERE {_KEY}", args).fetchone() is None:
                return Claim.BUSY  # gone (forgotten): nothing to merge
            now = _now_us()
            row = conn.execute(
                f"SELECT owner, until_us FROM merge_claims WHERE {_KEY}", args
            ).fetchone()
            result = Claim.judge(
                None if row is None else (str(row[0]), int(row[1])), self.owner, now
            )
            if result.held:
                conn.execute(
                    "INSERT INTO merge_claims (tenant, user_id, session_id, owner, until_us) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, user_id, session_id) "
                    "DO UPDATE SET owner = excluded.owner, until_us = excluded.until_us",
                    (*args, self.owner, now + _lease_us(lease_seconds)),
                )
            return result

        return self._write(work)

    def renew(self, key: SessionKey, lease_seconds: float) -> bool:
        until = _now_us() + _lease_us(lease_seconds)

        def work(conn: sqlite3.Connection) -> bool:
            return bool(
                conn.execute(
                    f"UPDATE merge_claims SET until_us = ? WHERE {_KEY} AND owner = ?",
                    (until, key.tenant, key.user, key.session, self.owner),
                ).rowcount
            )

        return self._write(work)

    def release(self, key: SessionKey) -> None:
        self._write(
            lambda conn: conn.execute(
                f"DELETE FROM merge_claims WHERE {_KEY} AND owner = ?",
                (key.tenant, key.user, key.session, self.owner),
            )
        )

    def release_all(self) -> int:
        return self._write(
            lambda conn: int(
                conn.execute("DELETE FROM merge_claims WHERE owner = ?", (self.owner,)).rowcount
            )
        )

    def commit_merge(
        self,
        key: SessionKey,
        expected_rev: int,
        merged_seqs: Sequence[int],
        outcome: MergeOutcome,
        now_us: int,
        event: MergeEvent | None = None,
    ) -> int | None:
        args = (key.tenant, key.user, key.session)

        def work(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(f"SELECT summary_rev FROM sessions WHERE {_KEY}", args).fetchone()
            if row is None or int(row[0]) != expected_rev:
                return None
            claim = conn.execute(
                f"SELECT owner, until_us FROM merge_claims WHERE {_KEY}", args
            ).fetchone()
            if claim is None or claim[0] != self.owner or int(claim[1]) <= _now_us():
                return None  # not ours (any more): another process may be merging it
            present = 0
            for chunk in hippo_sqlite.chunks(merged_seqs):
                marks = ",".join("?" * len(chunk))
                present += conn.execute(
                    f"SELECT COUNT(*) FROM turns WHERE {_KEY} AND state = 'window' "
                    f"AND seq IN ({marks})",
                    (*args, *chunk),
                ).fetchone()[0]
            if present != len(merged_seqs):
                return None  # a merged turn was forgotten meanwhile: its text is in `outcome`
            for chunk in hippo_sqlite.chunks(merged_seqs):
                marks = ",".join("?" * len(chunk))
                conn.execute(
                    f"UPDATE turns SET state = 'merged', text = NULL, speaker = '' "
                    f"WHERE {_KEY} AND seq IN ({marks})",
                    (*args, *chunk),
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
                    *args,
                ),
            ).fetchone()
            if event is not None:
                queued = dataclasses.replace(event, version=int(version))
                outbox.sqlite_insert(conn, audit.TABLE, [audit.encode(queued)])
            return int(version)

        return self._write(work)

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
            for chunk in hippo_sqlite.chunks(ids):
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
                    # and summary statistics are the user's data), and its claim.
                    conn.execute(f"DELETE FROM sessions WHERE {_KEY}", (tenant, user, name))
                    conn.execute(f"DELETE FROM merge_claims WHERE {_KEY}", (tenant, user, name))
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
            conn.execute(f"DELETE FROM merge_claims WHERE {where}", params)
            return Forgotten(int(deleted), int(removed), 0, ())

        result = self._write(by_ids if ids else whole)
        if result.sessions_deleted or result.turns_removed or result.summaries_erased or ids:
            with self._locked() as conn:
                # False (logged) when a reader in another process blocked it: the erasure
                # is committed, and the next Forget or the last close completes the scrub.
                hippo_sqlite.purge_wal(conn, NAME)
        return result

    def close(self) -> None:
        """Idempotent. The last connection to close checkpoints and removes the WAL."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()


def _now_us() -> int:
    return time.time_ns() // 1000


def _lease_us(seconds: float) -> int:
    return max(1, int(seconds * 1_000_000))


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
