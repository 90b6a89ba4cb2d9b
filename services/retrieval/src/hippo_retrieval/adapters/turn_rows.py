"""How a turn is laid out as a row, the same in both turn stores (SQLite and PostgreSQL),
so the two engines store byte-equal values and one contract test suite covers both."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from hippo_core.errors import InvalidArgument
from hippo_retrieval.adapters.stopwords import ENGLISH
from hippo_retrieval.domain.models import (
    Change,
    Cursor,
    Deletion,
    NewTurn,
    Role,
    Scope,
    SessionStats,
    StoredTurn,
    UserStats,
    Vector,
)

_TERM = re.compile(r"[^\W_]+")


def content_terms(text: str) -> int:
    """How many words of `text` say something: 3+ letters or digits, not a stop word
    ("lol ok" 1, "haha yes!" 2, "I went to a pottery class" 3). Counted once, when the
    turn is written (column `terms`); the short-turn step of fusion reads it."""
    return sum(1 for w in _TERM.findall(text.lower()) if len(w) > 2 and w not in ENGLISH)


def backfill_terms(
    read: Callable[[int], Sequence[tuple[int, str]]],
    write: Callable[[list[tuple[int, int]]], object],
) -> None:
    """Count the content words of the turns stored before the `terms` column existed:
    `read(after)` gives the next batch of (seq, text) with seq > after, in seq order
    (empty at the end); `write` stores (terms, seq) pairs."""
    after = 0
    while rows := read(after):
        write([(content_terms(text), seq) for seq, text in rows])
        after = rows[-1][0]


# The columns of a turn, in the order `from_row` reads them (`t` is the turns table).
TURN_COLUMNS = (
    "t.seq, t.memory_id, t.tenant, t.user_id, t.session_id, t.role, t.text, t.time_us, "
    "t.client_id, t.metadata, t.vector, t.position, t.vector_model"
)

# memory_id, tenant, user_id, session_id, role, text, time_us, client_id, metadata, vector,
# vector_model, terms
Row = tuple[str, str, str, str, str, str, int, str, str, bytes | None, str, int]
# INSERT INTO turns's columns, in the order (seq, *row, position).
INSERT_COLUMNS = (
    "seq, memory_id, tenant, user_id, session_id, role, text, time_us, client_id, metadata, "
    "vector, vector_model, terms, position"
)


def insert_turn(mark: str) -> str:
    """INSERT INTO turns for one row (seq, *row, position), `mark` the engine's
    placeholder ("?" or "%s")."""
    marks = ", ".join([mark] * len(INSERT_COLUMNS.split(",")))
    return f"INSERT INTO turns ({INSERT_COLUMNS}) VALUES ({marks})"


def to_row(turn: NewTurn) -> Row:
    """The turn's stored values (before seq and position are known); raises
    InvalidArgument before anything is written."""
    blob: bytes | None = None
    if turn.vector is not None:
        vector = np.asarray(turn.vector)
        if vector.ndim != 1:
            raise InvalidArgument("vector", "must be one-dimensional")
        blob = encode_vector(vector)
    return (
        turn.memory_id,
        turn.tenant,
        turn.user,
        turn.session,
        Role(turn.role).value,
        turn.text,
        turn.time_us,
        turn.client_id,
        encode_metadata(turn.metadata),
        blob,
        turn.vector_model if blob is not None else "",
        content_terms(turn.text),
    )


def stored(turn: NewTurn, row: Row, seq: int, position: int) -> StoredTurn:
    """The turn as `append` reports it once written at `seq` and `position`."""
    return StoredTurn(
        seq=seq,
        memory_id=turn.memory_id,
        tenant=turn.tenant,
        user=turn.user,
        session=turn.session,
        role=Role(turn.role),
        text=turn.text,
        time_us=turn.time_us,
        client_id=turn.client_id,
        metadata=dict(turn.metadata),
        vector=decode_vector(row[9]),
        position=position,
        vector_model=row[10],
    )


def encode_metadata(metadata: Mapping[str, str]) -> str:
    # Sorted keys: equal metadata is byte-equal, so rows compare and hash stably.
    return json.dumps(dict(metadata), sort_keys=True, ensure_ascii=False)


def updated_metadata(
    old: Mapping[str, str], set_: Mapping[str, str], remove: Sequence[str]
) -> dict[str, str]:
    """`old` with `set_` added or replaced and `remove` dropped (UpdateMetadata)."""
    out = {k: v for k, v in old.items() if k not in remove}
    out.update(set_)
    return out


def decode_vector(blob: bytes | None) -> Vector | None:
    if blob is None:
        return None
    # frombuffer shares the (immutable) bytes; the copy gives callers their own array.
    return np.frombuffer(blob, dtype="<f4").astype(np.float32, copy=True)


def from_row(row: Sequence[Any]) -> StoredTurn:
    """A StoredTurn from the TURN_COLUMNS of one row."""
    seq, memory_id, tenant, user, session, role, text, time_us, client_id, meta, blob, pos = row[
        :12
    ]
    return StoredTurn(
        seq=int(seq),
        memory_id=str(memory_id),
        tenant=str(tenant),
        user=str(user),
        session=str(session),
        role=Role(role),
        text=str(text),
        time_us=int(time_us),
        client_id=str(client_id),
        metadata={str(k): str(v) for k, v in json.loads(meta).items()},
        vector=decode_vector(bytes(blob) if blob is not None else None),
        position=int(pos),
        vector_model=str(row[12]),
    )


def encode_vector(vector: Vector) -> bytes:
    """Fixed little-endian float32, so a stored vector means the same on any machine."""
    return np.asarray(vector).astype("<f4").tobytes()


def feed_entries(rows: Sequence[Sequence[Any]]) -> list[Change]:
    """Change-feed rows (seq, op, tenant, memory_id, TURN_COLUMNS...) as changes; a touch
    is the turn's current row carrying the touch's seq."""
    out: list[Change] = []
    for row in rows:
        seq, op, tenant, memory_id = row[:4]
        if op == "delete":
            out.append(Deletion(seq=int(seq), tenant=str(tenant), memory_id=str(memory_id)))
        else:
            out.append(replace(from_row(row[4:]), seq=int(seq)))
    return out


# -- listings: one statement per listing, the same text in both engines but for the
# placeholder (`mark`: "?" in SQLite, "%s" in PostgreSQL). Tenancy and the whole scope
# are in the WHERE clause. Pages are keysets: the next page starts after the last row's
# key, so no listing ever reads the rows of the pages before it.


# One metadata pair in each engine's JSON (the column is the turn's metadata as JSON text
# in both); the key and value are bound parameters, never spliced into a JSON path.
_METADATA_MATCH = {
    "?": "EXISTS (SELECT 1 FROM json_each(t.metadata) m WHERE m.key = ? AND m.value = ?)",
    "%s": "(t.metadata::jsonb ->> %s) = %s",
}


def list_turns_query(
    scope: Scope, newest_first: bool, after: Cursor | None, limit: int, mark: str
) -> tuple[str, list[Any]]:
    """A page of the scope's turns by (time_us, seq). turns_by_time (tenant, user_id,
    time_us) serves the range and the order (in SQLite the rowid, seq, ends every index
    entry, so it is the tie order for free; PostgreSQL sorts the ties incrementally)."""
    where = [f"t.tenant = {mark}", f"t.user_id = {mark}"]
    params: list[Any] = [scope.tenant, scope.user]
    if scope.session is not None:
        where.append(f"t.session_id = {mark}")
        params.append(scope.session)
    if scope.start_us is not None:
        where.append(f"t.time_us >= {mark}")
        params.append(scope.start_us)
    if scope.end_us is not None:
        where.append(f"t.time_us < {mark}")
        params.append(scope.end_us)
    if scope.roles:
        roles = sorted(r.value for r in scope.roles)
        where.append(f"t.role IN ({', '.join([mark] * len(roles))})")
        params += roles
    for key, value in scope.metadata:
        # Inside the user's rows (the index range above): at most one user's turns scanned.
        where.append(_METADATA_MATCH[mark])
        params += [key, value]
    if after is not None:
        # (time_us, seq) beyond the cursor, written with a plain bound on time_us first so
        # both planners use it as the index range.
        cmp, strict = ("<=", "<") if newest_first else (">=", ">")
        where.append(
            f"t.time_us {cmp} {mark} AND (t.time_us {strict} {mark} OR t.seq {strict} {mark})"
        )
        params += [after.time_us, after.time_us, after.seq]
    direction = "DESC" if newest_first else "ASC"
    sql = (
        f"SELECT {TURN_COLUMNS} FROM turns t WHERE {' AND '.join(where)} "
        f"ORDER BY t.time_us {direction}, t.seq {direction} LIMIT {mark}"
    )
    return sql, [*params, limit]


def list_sessions_query(
    tenant: str, user: str, after: str, limit: int, mark: str
) -> tuple[str, list[Any]]:
    """A page of the user's sessions, grouped along turns_by_session."""
    sql = (
        "SELECT session_id, COUNT(*), MIN(time_us), MAX(time_us) FROM turns "
        f"WHERE tenant = {mark} AND user_id = {mark} AND session_id > {mark} "
        f"GROUP BY session_id ORDER BY session_id LIMIT {mark}"
    )
    return sql, [tenant, user, after, limit]


def list_users_query(tenant: str, after: str, limit: int, mark: str) -> tuple[str, list[Any]]:
    """A page of the tenant's users, grouped along turns_by_time (which covers the counts
    and times); the session count from the sessions table's key (a session row lives
    exactly as long as the session holds a turn)."""
    sql = (
        "SELECT t.user_id, COUNT(*), (SELECT COUNT(*) FROM sessions s WHERE s.tenant = "
        "t.tenant AND s.user_id = t.user_id), MIN(t.time_us), MAX(t.time_us) FROM turns t "
        f"WHERE t.tenant = {mark} AND t.user_id > {mark} "
        f"GROUP BY t.tenant, t.user_id ORDER BY t.user_id LIMIT {mark}"
    )
    return sql, [tenant, after, limit]


def session_stats(row: Sequence[Any]) -> SessionStats:
    session, turns, first, last = row
    return SessionStats(str(session), int(turns), int(first), int(last))


def user_stats(row: Sequence[Any]) -> UserStats:
    user, turns, sessions, first, last = row
    return UserStats(str(user), int(turns), int(sessions), int(first), int(last))
