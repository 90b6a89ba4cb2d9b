"""The entries table's columns, as both engines store them."""

from __future__ import annotations

from typing import Any

from hippo_audit.domain.chain import ID_SEPARATOR
from hippo_audit.domain.models import Entry

# Column order = chain.Row: seq, time_us, key_id, the 9 encoded fields, prev_hash, hash.
COLUMNS = (
    "seq, time_us, key_id, tenant, actor, event_type, user_id, session_id, memory_ids, "
    "body, sealed, idempotency_key, prev_hash, hash"
)


def entry_row(e: Entry) -> tuple[Any, ...]:
    """An entry as the columns hold it."""
    return (
        e.seq,
        e.time_us,
        e.key_id,
        e.tenant,
        e.actor,
        e.event_type,
        e.user,
        e.session,
        ID_SEPARATOR.join(e.memory_ids),
        e.body,
        e.sealed,
        e.idempotency_key,
        e.prev_hash,
        e.hash,
    )


def entry_of(row: tuple[Any, ...]) -> Entry:
    """A stored row (columns in COLUMNS order) as an entry."""
    ids = str(row[8])
    return Entry(
        seq=int(row[0]),
        time_us=int(row[1]),
        key_id=int(row[2]),
        tenant=str(row[3]),
        actor=str(row[4]),
        event_type=str(row[5]),
        user=str(row[6]),
        session=str(row[7]),
        memory_ids=tuple(ids.split(ID_SEPARATOR)) if ids else (),
        body=str(row[9]),
        sealed=bytes(row[10]),
        idempotency_key=str(row[11]),
        prev_hash=bytes(row[12]),
        hash=bytes(row[13]),
    )
