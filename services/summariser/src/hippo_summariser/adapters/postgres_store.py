"""Session state in PostgreSQL (cluster mode): the same tables, rules and guarantees as
sqlite_store.py (read its docstring first), shared by every replica of the service in
its schema (`hippo_summariser`, opened by hippo_core.postgres).

What sharing changes, and how each is kept:
- **One order per session.** Every write to a session (append, merge commit, claim,
  forget) locks its `sessions` row first, so two replicas' appends to one session are
  serialised like SQLite's writes: turn seqs commit in order, and a merge never sees a
  turn appear before turns it already merged.
- **One consistent view.** `load` reads in one REPEATABLE READ snapshot: never the
  summary of one commit beside the window of another.
- **Claims** (`merge_claims`: owner, lease end on the database's clock, so replicas'
  clocks do not matter): `claim` locks the session row with `FOR UPDATE SKIP LOCKED`:
  a replica never waits behind another's write, it leaves the session to that writer
  (which schedules the merge its write calls for). A merge commits only from the claim's
  holder with a live lease, under the same row lock, so a replica that stalled past its
  lease and was taken over changes nothing.
- **Audit outbox**: the merge's transaction queues its event under this replica's
  owner id (`hippo_core.outbox.postgres_insert`); the core `PostgresOutbox` with the
  same owner drains it, and adopts the rows of a replica that died.
- **Erasure**: Forget deletes the rows (and claims) in one transaction, then runs
  `VACUUM` on the tables it touched, outside it (`Database.vacuum`), so the dead row
  versions holding the erased text are reclaimed now rather than at the next
  autovacuum. What stays in heap pages, WAL, standbys and backups is in docs/sessions.md
  ("Cluster mode").

Tenancy is applied in SQL (`WHERE tenant = %s AND user_id = %s`) in every statement.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import psycopg

from hippo_core import outbox
from hippo_core.errors import HippoError
from hippo_core.postgres import Database
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

log = logging.getLogger(__name__)
T = TypeVar("T")
NAME = "session store"
SCHEMA = "hippo_summariser"

_SCHEMA_1 = f"""
CREATE TABLE sessions (
    tenant             text NOT NULL,
    user_id            text NOT NULL,
    session_id         text NOT NULL,
    version            bigint NOT NULL,
    summary            text NOT NULL DEFAULT '',
    summary_tokens     integer NOT NULL DEFAULT 0,
    summary_rev        bigint NOT NULL DEFAULT 0,
    updated_us         bigint NOT NULL,
    merges             bigint NOT NULL DEFAULT 0,
    turns_merged       bigint NOT NULL DEFAULT 0,
    facts              bigint NOT NULL DEFAULT 0,
    facts_kept_llm     bigint NOT NULL DEFAULT 0,
    facts_kept         bigint NOT NULL DEFAULT 0,
    last_retention_llm double precision NOT NULL DEFAULT 1.0,
    last_retention     double precision NOT NULL DEFAULT 1.0,
    llm_failures       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, user_id, session_id)
);
CREATE TABLE turns (
    seq        bigserial PRIMARY KEY,
    tenant     text NOT NULL,
    user_id    text NOT NULL,
    session_id text NOT NULL,
    memory_id  text NOT NULL,
    state      text NOT NULL CHECK (state IN ('window', 'merged', 'retired')),
    role       text NOT NULL,
    text       text,
    time_us    bigint NOT NULL,
    speaker    text NOT NULL,
    tokens     integer,
    UNIQUE (tenant, user_id, session_id, memory_id)
);
CREATE INDEX turns_by_state ON turns (tenant, user_id, session_id, state, seq);
CREATE INDEX turns_by_memory ON turns (tenant, user_id, memory_id);
CREATE TABLE merge_claims (
    tenant     text NOT NULL,
    user_id    text NOT NULL,
    session_id text NOT NULL,
    owner      text NOT NULL,
    until_us   bigint NOT NULL,
    PRIMARY KEY (tenant, user_id, session_id)
);
{outbox.postgres_schema(audit.TABLE)}
"""
MIGRATIONS: list[str] = [_SCHEMA_1]

# The database's clock, in the microseconds the claims hold: every replica judges a
# lease by the same clock.
_NOW = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
_SESSION_COLUMNS = (
    "version, summary, summary_tokens, summary_rev, updated_us, merges, turns_merged, facts, "
    "facts_kept_llm, facts_kept, last_retention_llm, last_retention, llm_failures"
)
_KEY = "tenant = %s AND user_id = %s AND session_id = %s"
_VACUUMED = ("turns", "sessions", "merge_claims")


def _args(key: SessionKey) -> tuple[str, str, str]:
    return (key.tenant, key.user, key.session)


class PostgresSessionStore:
    """`SessionStore` on a `Database` opened with `MIGRATIONS` (the caller owns and closes
    it). Thread-safe: every call takes a pooled connection."""

    def __init__(self, database: Database, *, owner: str = "") -> None:
        self._db = database
        self.owner = owner or outbox.new_owner()
        self._closed = False
        self._count = 0

    def _run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        return self._db.run(work, NAME)

    def _snapshot(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """`work` in one read-only snapshot: its statements see the same commits."""
        with self._db.transaction(NAME) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return work(conn)

    # -- reads -------------------------------------------------------------------------

    def load(self, key: SessionKey) -> Session | None:
        return self._snapshot(lambda conn: _load(conn, key))

    def versions(self, tenant: str, user: str, sessions: Sequence[str]) -> dict[str, int]:
        rows = self._snapshot(
            lambda conn: conn.execute(
                "SELECT session_id, version FROM sessions WHERE tenant = %s "
                "AND user_id = %s AND session_id = ANY(%s)",
                (tenant, user, list(sessions)),
            ).fetchall()
        )
        return {str(s): int(v) for s, v in rows}

    def pending(self, budget: int) -> list[SessionKey]:
        rows = self._snapshot(
            lambda conn: conn.execute(
                "SELECT t.tenant, t.user_id, t.session_id FROM turns t WHERE t.state = 'window' "
                "AND NOT EXISTS (SELECT 1 FROM merge_claims c WHERE c.tenant = t.tenant "
                "AND c.user_id = t.user_id AND c.session_id = t.session_id "
                f"AND c.owner <> %s AND c.until_us > {_NOW}) "
                "GROUP BY t.tenant, t.user_id, t.session_id "
                "HAVING SUM(COALESCE(t.tokens, 0)) > %s "
                "OR COUNT(*) FILTER (WHERE t.tokens IS NULL) > 0",
                (self.owner, budget),
            ).fetchall()
        )
        return [SessionKey(str(t), str(u), str(s)) for t, u, s in rows]

    def orphaned(self) -> list[SessionKey]:
        rows = self._snapshot(
            lambda conn: conn.execute(
                "SELECT tenant, user_id, session_id FROM merge_claims "
                f"WHERE owner <> %s AND until_us <= {_NOW}",
                (self.owner,),
            ).fetchall()
        )
        return [SessionKey(str(t), str(u), str(s)) for t, u, s in rows]

    def session_count(self) -> int:
        """Sessions in the database (every replica reports the same number). Read at
        scrape time; when the database does not answer, the last count, so a scrape
        never fails."""
        if self._closed:
            return 0
        try:
            self._count = self._snapshot(_count_sessions)
        except HippoError as exc:
            log.warning("session count unavailable: %s", exc.message)
        return self._count

    # -- writes ------------------------------------------------------------------------

    def append(self, key: SessionKey, turns: Sequence[TurnIn], now_us: int) -> tuple[Session, int]:
        first: dict[str, TurnIn] = {}
        for turn in turns:
            first.setdefault(turn.memory_id, turn)
        fresh = list(first.values())

        def work(conn: psycopg.Connection[Any]) -> tuple[Session, int]:
            conn.execute(
                "INSERT INTO sessions (tenant, user_id, session_id, version, updated_us) "
                "VALUES (%s, %s, %s, 0, %s) ON CONFLICT DO NOTHING",
                (*_args(key), now_us),
            )
            _lock(conn, key)
            added = conn.execute(
                "INSERT INTO turns (tenant, user_id, session_id, memory_id, state, role, text, "
                "time_us, speaker, tokens) "
                "SELECT %s, %s, %s, m, 'window', r, x, t, s, k FROM unnest("
                "%s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::integer[]"
                ") WITH ORDINALITY AS u(m, r, x, t, s, k, o) ORDER BY o "
                "ON CONFLICT (tenant, user_id, session_id, memory_id) DO NOTHING",
                (
                    *_args(key),
                    [t.memory_id for t in fresh],
                    [t.role.value for t in fresh],
                    [t.text for t in fresh],
                    [t.time_us for t in fresh],
                    [t.speaker for t in fresh],
                    [t.tokens for t in fresh],
                ),
            ).rowcount
            if added:
                _bump(conn, key, now_us)
            session = _load(conn, key)
            assert session is not None
            return session, int(added)

        return self._run(work)

    def set_tokens(self, key: SessionKey, tokens: Mapping[int, int], now_us: int) -> None:
        def work(conn: psycopg.Connection[Any]) -> None:
            _lock(conn, key)
            changed = conn.execute(
                "UPDATE turns SET tokens = u.n FROM unnest(%s::bigint[], %s::integer[]) "
                f"AS u(seq, n) WHERE turns.seq = u.seq AND {_KEY} "
                "AND state = 'window' AND tokens IS NULL",
                (list(tokens), list(tokens.values()), *_args(key)),
            ).rowcount
            if changed:
                _bump(conn, key, now_us)

        self._run(work)

    # -- claims ------------------------------------------------------------------------

    def claim(self, key: SessionKey, lease_seconds: float) -> Claim:
        def work(conn: psycopg.Connection[Any]) -> Claim:
            row = conn.execute(
                f"SELECT {_NOW} FROM sessions WHERE {_KEY} FOR UPDATE SKIP LOCKED", _args(key)
            ).fetchone()
            if row is None:
                # Being written this moment (that writer schedules what its write calls
                # for), or gone: not ours to merge now.
                return Claim.BUSY
            now = int(row[0])
            held = conn.execute(
                f"SELECT owner, until_us FROM merge_claims WHERE {_KEY}", _args(key)
            ).fetchone()
            result = Claim.judge(
                None if held is None else (str(held[0]), int(held[1])), self.owner, now
            )
            if result.held:
                conn.execute(
                    "INSERT INTO merge_claims (tenant, user_id, session_id, owner, until_us) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant, user_id, session_id) "
                    "DO UPDATE SET owner = EXCLUDED.owner, until_us = EXCLUDED.until_us",
                    (*_args(key), self.owner, now + _lease_us(lease_seconds)),
                )
            return result

        return self._run(work)

    def renew(self, key: SessionKey, lease_seconds: float) -> bool:
        return self._run(
            lambda conn: bool(
                conn.execute(
                    f"UPDATE merge_claims SET until_us = {_NOW} + %s WHERE {_KEY} AND owner = %s",
                    (_lease_us(lease_seconds), *_args(key), self.owner),
                ).rowcount
            )
        )

    def release(self, key: SessionKey) -> None:
        self._run(
            lambda conn: conn.execute(
                f"DELETE FROM merge_claims WHERE {_KEY} AND owner = %s", (*_args(key), self.owner)
            )
        )

    def release_all(self) -> int:
        return self._run(
            lambda conn: int(
                conn.execute("DELETE FROM merge_claims WHERE owner = %s", (self.owner,)).rowcount
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
        seqs = list(merged_seqs)

        def work(conn: psycopg.Connection[Any]) -> int | None:
            row = conn.execute(
                f"SELECT summary_rev, {_NOW} FROM sessions WHERE {_KEY} FOR UPDATE", _args(key)
            ).fetchone()
            if row is None or int(row[0]) != expected_rev:
                return None
            claim = conn.execute(
                f"SELECT owner, until_us FROM merge_claims WHERE {_KEY}", _args(key)
            ).fetchone()
            if claim is None or claim[0] != self.owner or int(claim[1]) <= int(row[1]):
                return None  # not ours (any more): another replica may be merging it
            moved = conn.execute(
                "UPDATE turns SET state = 'merged', text = NULL, speaker = '' "
                f"WHERE {_KEY} AND state = 'window' AND seq = ANY(%s::bigint[])",
                (*_args(key), seqs),
            ).rowcount
            if moved != len(set(seqs)):
                # A merged turn was forgotten meanwhile (its text is in `outcome`): undo.
                raise _Refused()
            version_row = conn.execute(
                "UPDATE sessions SET summary = %s, summary_tokens = %s, "
                "summary_rev = summary_rev + 1, version = version + 1, updated_us = %s, "
                "merges = merges + 1, turns_merged = turns_merged + %s, facts = facts + %s, "
                "facts_kept_llm = facts_kept_llm + %s, facts_kept = facts_kept + %s, "
                f"last_retention_llm = %s, last_retention = %s WHERE {_KEY} RETURNING version",
                (
                    outcome.summary,
                    outcome.summary_tokens,
                    now_us,
                    len(seqs),
                    outcome.facts,
                    outcome.kept_llm,
                    outcome.kept,
                    outcome.retention_llm,
                    outcome.retention,
                    *_args(key),
                ),
            ).fetchone()
            assert version_row is not None
            version = int(version_row[0])
            if event is not None:
                queued = dataclasses.replace(event, version=version)
                outbox.postgres_insert(conn, audit.TABLE, self.owner, [audit.encode(queued)])
            return version

        try:
            return self._run(work)
        except _Refused:
            return None

    def record_llm_failure(self, key: SessionKey) -> None:
        self._run(
            lambda conn: conn.execute(
                f"UPDATE sessions SET llm_failures = llm_failures + 1 WHERE {_KEY}", _args(key)
            )
        )

    def forget(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> Forgotten:
        where, params = "tenant = %s AND user_id = %s", [tenant, user]
        if session is not None:
            where += " AND session_id = %s"
            params.append(session)
        ids = list(dict.fromkeys(memory_ids))

        def by_ids(conn: psycopg.Connection[Any]) -> Forgotten:
            # Lock every session holding a listed turn before reading the turns' states,
            # so no merge commits (or append lands) between the read and the erasure: a
            # turn read as 'window' cannot be merged into the summary meanwhile.
            locked: set[str] = set()
            while True:
                victims = [
                    (int(seq), str(name), str(state))
                    for seq, name, state in conn.execute(
                        f"SELECT seq, session_id, state FROM turns WHERE {where} "
                        "AND memory_id = ANY(%s::text[])",
                        (*params, ids),
                    )
                ]
                wanted = {name for _, name, _ in victims} - locked
                if not wanted:
                    break
                conn.execute(
                    "SELECT 1 FROM sessions WHERE tenant = %s AND user_id = %s "
                    "AND session_id = ANY(%s::text[]) ORDER BY session_id FOR UPDATE",
                    (tenant, user, sorted(wanted)),
                )
                locked |= wanted
            erased = deleted = 0
            touched: list[SessionKey] = []
            for name in sorted({name for _, name, _ in victims}):
                key = SessionKey(tenant, user, name)
                if any(s == name and state == "merged" for _, s, state in victims):
                    # The summary quotes an erased turn: it goes, and the turns it was
                    # built from are retired (ids kept only to recognise retries).
                    conn.execute(
                        "UPDATE sessions SET summary = '', summary_tokens = 0, "
                        f"summary_rev = summary_rev + 1 WHERE {_KEY}",
                        _args(key),
                    )
                    conn.execute(
                        f"UPDATE turns SET state = 'retired' WHERE {_KEY} AND state = 'merged'",
                        _args(key),
                    )
                    erased += 1
                conn.execute(
                    f"DELETE FROM turns WHERE {_KEY} AND seq = ANY(%s::bigint[])",
                    (*_args(key), [seq for seq, s, _ in victims if s == name]),
                )
                left_row = conn.execute(
                    f"SELECT COUNT(*) FROM turns WHERE {_KEY}", _args(key)
                ).fetchone()
                if left_row is not None and int(left_row[0]) == 0:
                    # Nothing of the session is left: its row goes too (the session id
                    # and summary statistics are the user's data), and its claim.
                    conn.execute(f"DELETE FROM sessions WHERE {_KEY}", _args(key))
                    conn.execute(f"DELETE FROM merge_claims WHERE {_KEY}", _args(key))
                    deleted += 1
                else:
                    _bump(conn, key, time.time_ns() // 1000)
                    touched.append(key)
            removed = sum(1 for _, _, state in victims if state == "window")
            return Forgotten(deleted, removed, erased, tuple(touched))

        def whole(conn: psycopg.Connection[Any]) -> Forgotten:
            # Sessions first: their row locks make an append in flight finish before the
            # turns are read, and one that starts later waits for this commit.
            deleted = conn.execute(f"DELETE FROM sessions WHERE {where}", params).rowcount
            removed_row = conn.execute(
                f"SELECT COUNT(*) FROM turns WHERE {where} AND state = 'window'", params
            ).fetchone()
            conn.execute(f"DELETE FROM turns WHERE {where}", params)
            conn.execute(f"DELETE FROM merge_claims WHERE {where}", params)
            removed = int(removed_row[0]) if removed_row is not None else 0
            return Forgotten(int(deleted), removed, 0, ())

        result = self._run(by_ids if ids else whole)
        if result.sessions_deleted or result.turns_removed or result.summaries_erased or ids:
            self._vacuum()
        return result

    def _vacuum(self) -> None:
        """Reclaim the dead row versions an erasure left (they hold the erased text until
        VACUUM). Plain VACUUM, not FULL: a rewrite would lock every session of every
        tenant for its length (docs/sessions.md says when an operator runs one). Best
        effort: the erasure is committed, and autovacuum comes by anyway."""
        self._db.vacuum(*_VACUUMED)

    def close(self) -> None:
        """The database belongs to the caller; this store only stops answering counts."""
        self._closed = True


class _Refused(Exception):
    """Roll the merge's transaction back: the compare-and-set failed half-way."""


def _lease_us(seconds: float) -> int:
    return max(1, int(seconds * 1_000_000))


def _count_sessions(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()
    return int(row[0]) if row is not None else 0


def _lock(conn: psycopg.Connection[Any], key: SessionKey) -> None:
    conn.execute(f"SELECT 1 FROM sessions WHERE {_KEY} FOR UPDATE", _args(key))


def _bump(conn: psycopg.Connection[Any], key: SessionKey, now_us: int) -> None:
    conn.execute(
        f"UPDATE sessions SET version = version + 1, updated_us = %s WHERE {_KEY}",
        (now_us, *_args(key)),
    )


def _load(conn: psycopg.Connection[Any], key: SessionKey) -> Session | None:
    args = _args(key)
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
    total_row = conn.execute(f"SELECT COUNT(*) FROM turns WHERE {_KEY}", args).fetchone()
    total = int(total_row[0]) if total_row is not None else 0
    merges, turns_merged, facts, kept_llm, kept, ret_llm, ret, failures = stats
    return Session(
        key=key,
        window=window,
        summary=str(summary),
        summary_tokens=int(summary_tokens),
        version=int(version),
        turns_total=total,
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
