"""The audit service's contract, checked before anything is queued: a bad request fails
whole, naming the field as the proto spells it and the limit."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hippo_audit.domain.chain import canonical_json
from hippo_audit.domain.models import NewEntry
from hippo_core.errors import InvalidArgument

MAX_ID = 128
MAX_NAME = 64
MAX_MEMORY_IDS = 1000
MAX_EVENT_TYPES = 32
MAX_READ = 1000
# Seqs are uint64 on the wire, int64 in both stores (SQLite INTEGER, PostgreSQL bigint).
MAX_SEQ = 2**63 - 1
DEFAULT_READ = 100
_ACTOR = re.compile(r"[A-Za-z0-9._:@-]{1,64}")
_EVENT = re.compile(r"[a-z0-9_.-]{1,64}")
_HEX_HASH = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Prepared:
    """A checked entry with its bodies already in canonical form (done once, here)."""

    new: NewEntry
    body: str
    private: bytes | None


@dataclass(frozen=True)
class Limits:
    max_entries: int = 1000
    max_body_bytes: int = 64 * 1024


def text(field: str, value: str, limit: int = MAX_ID, *, required: bool = False) -> None:
    if required and not value:
        raise InvalidArgument(field, "is required")
    if len(value) > limit:
        raise InvalidArgument(field, f"at most {limit} characters, got {len(value)}")
    if _CONTROL.search(value):
        raise InvalidArgument(field, "may not hold control characters")


def seq(field: str, value: int) -> None:
    if value > MAX_SEQ:
        raise InvalidArgument(field, f"must be at most {MAX_SEQ} (2^63-1), got {value}")


def actor(field: str, value: str) -> None:
    if not _ACTOR.fullmatch(value):
        raise InvalidArgument(field, "must be 1..64 characters of [A-Za-z0-9._:@-]")


def event_type(field: str, value: str) -> None:
    if not _EVENT.fullmatch(value):
        raise InvalidArgument(field, "must be 1..64 characters of [a-z0-9_.-]")


def expected_hash(value: str) -> bytes | None:
    if not value:
        return None
    if not _HEX_HASH.fullmatch(value):
        raise InvalidArgument("expected_prev_hash", "must be 64 lowercase hex digits")
    return bytes.fromhex(value)


def json_size(field: str, value: Mapping[str, Any], limit: int) -> str:
    """The canonical JSON of `value`, checked against `limit` bytes."""
    try:
        text_ = canonical_json(value)
    except ValueError as exc:
        raise InvalidArgument(field, str(exc)) from exc
    size = len(text_.encode())
    if size > limit:
        raise InvalidArgument(field, f"{size} bytes of canonical JSON exceeds the limit of {limit}")
    return text_


def check_entries(entries: Sequence[NewEntry], limits: Limits) -> list[Prepared]:
    if not 1 <= len(entries) <= limits.max_entries:
        raise InvalidArgument(
            "entries", f"must hold 1..{limits.max_entries} entries, got {len(entries)}"
        )
    out = []
    for i, e in enumerate(entries):
        at = f"entries[{i}]"
        text(f"{at}.tenant", e.tenant, required=True)
        actor(f"{at}.actor", e.actor)
        event_type(f"{at}.event_type", e.event_type)
        text(f"{at}.user_id", e.user)
        text(f"{at}.session_id", e.session)
        text(f"{at}.idempotency_key", e.idempotency_key)
        if len(e.memory_ids) > MAX_MEMORY_IDS:
            raise InvalidArgument(
                f"{at}.memory_ids", f"at most {MAX_MEMORY_IDS} ids, got {len(e.memory_ids)}"
            )
        for j, memory_id in enumerate(e.memory_ids):
            text(f"{at}.memory_ids[{j}]", memory_id, required=True)
        body = json_size(f"{at}.body", e.body, limits.max_body_bytes)
        private = None
        if e.private:
            if not e.user:
                raise InvalidArgument(
                    f"{at}.user_id", "is required when private_body is set (it is the user's key)"
                )
            private = json_size(f"{at}.private_body", e.private, limits.max_body_bytes).encode()
        out.append(Prepared(e, body, private))
    return out


def check_read(tenant: str, user: str, session: str, event_types: Sequence[str], limit: int) -> int:
    """Validate a Read/Stream selection; returns the effective limit."""
    text("tenant", tenant, required=True)
    text("user_id", user)
    text("session_id", session)
    if len(event_types) > MAX_EVENT_TYPES:
        raise InvalidArgument(
            "event_types", f"at most {MAX_EVENT_TYPES} entries, got {len(event_types)}"
        )
    for i, kind in enumerate(event_types):
        event_type(f"event_types[{i}]", kind)
    if limit == 0:
        return DEFAULT_READ
    if not 1 <= limit <= MAX_READ:
        raise InvalidArgument("limit", f"must be 0 (default {DEFAULT_READ}) or 1..{MAX_READ}")
    return limit
