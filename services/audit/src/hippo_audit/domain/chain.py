"""The hash chain: canonical encoding of an entry, its hash, and verification of stored rows.

    hash(entry) = SHA-256(prev_hash || encoding(entry)),  prev_hash of entry 1 = GENESIS

The encoding is binary and unambiguous, so no two different entries encode alike:

    MAGIC ("hippo.audit.v1 entry\\n")
    || u64 seq || i64 time_us || u64 key_id                      (big-endian)
    || u32 length of each of the 9 fields below, in this order  (big-endian)
    || tenant || actor || event_type || user || session || memory_ids || body || sealed
       || idempotency_key

Text fields are their UTF-8 bytes; memory_ids are joined by U+001F (ids may not contain
control characters); body is the canonical JSON text (sorted keys, no spaces, UTF-8,
integral numbers without a fraction); sealed is the ciphertext of the private body. The
hash therefore covers the ciphertext, never the plaintext: destroying a user's key makes
the private body unreadable while every hash still verifies.

Verification recomputes each hash from the stored fields (read as raw bytes, exactly as
hashed) and checks both the stored hash and the link to the previous entry. The format
is fixed: changing any byte of it changes every hash, so it is versioned by MAGIC.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hippo_audit.domain.models import Entry, NewEntry

GENESIS = hashlib.sha256(b"hippo.audit.v1 genesis").digest()
MAGIC = b"hippo.audit.v1 entry\n"
ID_SEPARATOR = "\x1f"
_HEAD = struct.Struct(">QqQ9I")
_MAX_SAFE_INT = 2**53  # integers a JSON reader in any language keeps exactly

# A stored row as verification reads it: seq, time_us, key_id, the 9 encoded fields as
# raw bytes (in encoding order), prev_hash, hash.
Row = tuple[Any, ...]


def _normalise(value: Any) -> Any:
    kind = type(value)  # exact types first: this runs for every value of every entry
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise ValueError("numbers must be finite")
        # protobuf Struct carries every number as a double: 3 arrives as 3.0. One form
        # per value keeps the encoding canonical whoever wrote the entry.
        return int(value) if value.is_integer() and abs(value) < _MAX_SAFE_INT else value
    if kind is dict:
        return {k if type(k) is str else str(k): _normalise(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_normalise(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _normalise(v) for k, v in value.items()}
    # Subclasses (a StrEnum member, an IntEnum) become their plain JSON value.
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _normalise(float(value))
    raise ValueError(f"unsupported JSON value of type {type(value).__name__}")


def canonical_json(value: Mapping[str, Any]) -> str:
    """The one text of a JSON object that the log stores and hashes. Raises ValueError
    for non-finite numbers and values JSON cannot hold."""
    return json.dumps(_normalise(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _encode(
    seq: int,
    time_us: int,
    key_id: int,
    tenant: str,
    actor: str,
    event_type: str,
    user: str,
    session: str,
    memory_ids: tuple[str, ...],
    body: str,
    sealed: bytes,
    idempotency_key: str,
) -> bytes:
    fields = (
        tenant.encode(),
        actor.encode(),
        event_type.encode(),
        user.encode(),
        session.encode(),
        ID_SEPARATOR.join(memory_ids).encode(),
        body.encode(),
        sealed,
        idempotency_key.encode(),
    )
    return MAGIC + _HEAD.pack(seq, time_us, key_id, *map(len, fields)) + b"".join(fields)


def encode(entry: Entry) -> bytes:
    """The canonical encoding of a stored entry (everything but its two hashes)."""
    return _encode(
        entry.seq,
        entry.time_us,
        entry.key_id,
        entry.tenant,
        entry.actor,
        entry.event_type,
        entry.user,
        entry.session,
        entry.memory_ids,
        entry.body,
        entry.sealed,
        entry.idempotency_key,
    )


def entry_hash(prev_hash: bytes, entry: Entry) -> bytes:
    """The hash `entry` must carry when it follows an entry hashing to `prev_hash`."""
    return hashlib.sha256(prev_hash + encode(entry)).digest()


def link(
    prev_hash: bytes,
    seq: int,
    time_us: int,
    key_id: int,
    new: NewEntry,
    memory_ids: tuple[str, ...],
    body: str,
    sealed: bytes,
) -> bytes:
    """The hash of the entry the writer is about to store (same as entry_hash of it)."""
    encoded = _encode(
        seq,
        time_us,
        key_id,
        new.tenant,
        new.actor,
        new.event_type,
        new.user,
        new.session,
        memory_ids,
        body,
        sealed,
        new.idempotency_key,
    )
    return hashlib.sha256(prev_hash + encoded).digest()


@dataclass(frozen=True)
class Problem:
    seq: int
    reason: str


@dataclass(frozen=True)
class Scan:
    problem: Problem | None
    checked: int
    last_seq: int
    last_hash: bytes


def verify_rows(rows: Iterable[Row], first_seq: int, prev_hash: bytes) -> Scan:
    """Check stored rows in seq order, starting at `first_seq` whose predecessor hashes to
    `prev_hash`. Stops at the first problem: a missing seq, a prev_hash that does not link
    to the previous entry, or a hash that does not match the entry's content."""
    sha256, pack, join, magic = hashlib.sha256, _HEAD.pack, b"".join, MAGIC
    expected, prev, checked = first_seq, prev_hash, 0
    # Unpacked and joined by hand: this loop runs once per entry of the log, and this
    # shape is ~1.5x faster than slicing the row (measured: bench/audit.py).
    for seq, t, k, f1, f2, f3, f4, f5, f6, f7, f8, f9, stored_prev, stored in rows:
        if seq != expected:
            return Scan(
                Problem(expected, f"entry missing: entry {expected} is absent (next is {seq})"),
                checked,
                expected - 1,
                prev,
            )
        try:
            lengths = pack(
                seq,
                t,
                k,
                len(f1),
                len(f2),
                len(f3),
                len(f4),
                len(f5),
                len(f6),
                len(f7),
                len(f8),
                len(f9),
            )
            computed = sha256(
                join((prev, magic, lengths, f1, f2, f3, f4, f5, f6, f7, f8, f9))
            ).digest()
        except (TypeError, struct.error):
            return Scan(
                Problem(seq, "malformed entry: a stored field has the wrong type"),
                checked,
                seq - 1,
                prev,
            )
        if stored_prev != prev:
            return Scan(
                Problem(seq, f"broken link: prev_hash is not the hash of entry {seq - 1}"),
                checked,
                seq - 1,
                prev,
            )
        checked += 1
        if stored != computed:
            return Scan(
                Problem(seq, "hash mismatch: the entry's content does not match its hash"),
                checked,
                seq - 1,
                prev,
            )
        prev = computed
        expected += 1
    return Scan(None, checked, expected - 1, prev)
