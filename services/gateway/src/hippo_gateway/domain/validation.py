"""The public API's limits (documented field by field in memory.proto), checked before any
work so a bad request costs nothing and writes nothing. Messages name the field path as
the proto spells it, and the limit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hippo_core.embedding import SPEAKER
from hippo_core.errors import InvalidArgument
from hippo_core.limits import (
    ID,
    MAX_ID_CHARS,
    MAX_METADATA_VALUE_BYTES,
    MAX_SPEAKER_CHARS,
    MAX_TEXT_BYTES,
    MAX_TURNS,
    is_blank,
)
from hippo_core.limits import utf8_bytes as _bytes
from hippo_gateway.domain.models import RecallQuery, TurnIn

MAX_QUERY_BYTES = 4 * 1024
MAX_TOP_K = 100
DEFAULT_TOP_K = 10
MAX_ROLES = 4
MAX_METADATA = 32
MAX_METADATA_KEY_BYTES = 64
MAX_FORGET_IDS = 1000
# Seqs are uint64 on the wire but int64 in every store (SQLite INTEGER, PostgreSQL bigint).
MAX_SEQ = 2**63 - 1


def check_id(field: str, value: str) -> None:
    """Identifiers: 1..128 characters of [A-Za-z0-9._:@-]."""
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > MAX_ID_CHARS:
        raise InvalidArgument(field, f"at most {MAX_ID_CHARS} characters, got {len(value)}")
    if not ID.fullmatch(value):
        bad = next(c for c in value if not ID.fullmatch(c))
        raise InvalidArgument(field, f"may only hold [A-Za-z0-9._:@-], found {bad!r}")


def check_memory_id(field: str, value: str) -> None:
    """Memory ids are opaque: 1..128 characters without NUL."""
    if not 1 <= len(value) <= MAX_ID_CHARS:
        raise InvalidArgument(field, f"must be 1..{MAX_ID_CHARS} characters, got {len(value)}")
    _no_nul(field, value)


def check_text(field: str, text: str, limit: int, *, blank_ok: bool = False) -> None:
    size = _bytes(text)
    if size == 0 or (not blank_ok and is_blank(text)):
        raise InvalidArgument(
            field, "is required (empty, or only whitespace or invisible characters)"
        )
    if size > limit:
        raise InvalidArgument(field, f"{size} bytes exceeds the limit of {limit}")
    _no_nul(field, text)


def _no_nul(field: str, text: str) -> None:
    # PostgreSQL text cannot hold U+0000: refused here, before any store sees it, so both
    # engines accept exactly the same input.
    if "\x00" in text:
        raise InvalidArgument(field, "must not contain NUL (U+0000) characters")


def check_top_k(top_k: int) -> None:
    """`top_k` as sent: 0 (the default) or 1..MAX_TOP_K."""
    if not 0 <= top_k <= MAX_TOP_K:
        raise InvalidArgument(
            "top_k", f"must be 0 (default {DEFAULT_TOP_K}) or 1..{MAX_TOP_K}, got {top_k}"
        )


def check_seq(field: str, seq: int) -> None:
    if seq > MAX_SEQ:
        raise InvalidArgument(field, f"must be at most {MAX_SEQ} (2^63-1), got {seq}")


def check_remember(user: str, session: str, turns: Sequence[TurnIn], key: str) -> None:
    check_id("scope.user_id", user)
    check_id("scope.session_id", session)
    if key:
        check_id("idempotency_key", key)
    if not 1 <= len(turns) <= MAX_TURNS:
        raise InvalidArgument("turns", f"must hold 1..{MAX_TURNS} turns, got {len(turns)}")
    seen: dict[str, int] = {}
    for i, turn in enumerate(turns):
        check_turn(f"turns[{i}]", turn)
        if turn.client_id:
            if turn.client_id in seen:
                raise InvalidArgument(
                    f"turns[{i}].client_id",
                    f"repeats turns[{seen[turn.client_id]}].client_id (unique within a request)",
                )
            seen[turn.client_id] = i


def check_turn(at: str, turn: TurnIn) -> None:
    """One turn's limits, its fields named under `at` (`turns[3]`, `records[3]`)."""
    check_text(f"{at}.text", turn.text, MAX_TEXT_BYTES)
    if turn.time_us is not None and turn.time_us < 0:
        # The session window (summariser) and the dates in prompts count from the epoch.
        raise InvalidArgument(
            f"{at}.time", "must be 1970-01-01T00:00:00Z or later (the Unix epoch)"
        )
    if turn.client_id:
        check_id(f"{at}.client_id", turn.client_id)
    check_metadata(f"{at}.metadata", turn.metadata)


def check_metadata(field: str, metadata: Mapping[str, str]) -> None:
    """A turn's metadata as stored: entries, key and value sizes, no NUL, the speaker."""
    if len(metadata) > MAX_METADATA:
        raise InvalidArgument(field, f"at most {MAX_METADATA} entries, got {len(metadata)}")
    for k, v in metadata.items():
        check_metadata_key(field, k)
        if _bytes(v) > MAX_METADATA_VALUE_BYTES:
            raise InvalidArgument(
                f"{field}[{k}]",
                f"{_bytes(v)} bytes exceeds the limit of {MAX_METADATA_VALUE_BYTES}",
            )
        _no_nul(f"{field}[{k}]", v)
    speaker = metadata.get(SPEAKER, "")
    if len(speaker) > MAX_SPEAKER_CHARS:
        raise InvalidArgument(
            f"{field}[{SPEAKER}]",
            f"at most {MAX_SPEAKER_CHARS} characters, got {len(speaker)}",
        )


def check_metadata_key(field: str, key: str) -> None:
    if not 1 <= _bytes(key) <= MAX_METADATA_KEY_BYTES:
        raise InvalidArgument(field, f"key {key[:80]!r} must be 1..{MAX_METADATA_KEY_BYTES} bytes")
    _no_nul(field, key)


def check_metadata_update(
    user: str, memory_id: str, set_: Mapping[str, str], remove: Sequence[str]
) -> None:
    """UpdateMemoryMetadata's request; the merged metadata is checked once it is known."""
    check_id("user_id", user)
    check_memory_id("memory_id", memory_id)
    if not set_ and not remove:
        raise InvalidArgument("set", "set and remove may not both be empty")
    if len(remove) > MAX_METADATA:
        raise InvalidArgument("remove", f"at most {MAX_METADATA} entries, got {len(remove)}")
    for i, key in enumerate(remove):
        check_metadata_key(f"remove[{i}]", key)
        if key in set_:
            raise InvalidArgument(f"remove[{i}]", f"key {key[:80]!r} is also in set")
    check_metadata("set", set_)


def check_recall(q: RecallQuery) -> None:
    check_id("scope.user_id", q.user)
    if q.session is not None:
        check_id("scope.session_id", q.session)
    check_text("query", q.query, MAX_QUERY_BYTES)
    check_top_k(q.top_k)
    if q.start_us is not None and q.end_us is not None and q.start_us >= q.end_us:
        raise InvalidArgument("time_range", "start must be earlier than end")


def check_forget_ids(user: str, session: str | None, memory_ids: Sequence[str]) -> None:
    check_id("memory_ids.scope.user_id", user)
    if session is not None:
        check_id("memory_ids.scope.session_id", session)
    if not 1 <= len(memory_ids) <= MAX_FORGET_IDS:
        raise InvalidArgument(
            "memory_ids.memory_ids", f"must hold 1..{MAX_FORGET_IDS} ids, got {len(memory_ids)}"
        )
    for i, memory_id in enumerate(memory_ids):
        if not 1 <= len(memory_id) <= MAX_ID_CHARS:
            raise InvalidArgument(
                f"memory_ids.memory_ids[{i}]", f"must be 1..{MAX_ID_CHARS} characters"
            )
        _no_nul(f"memory_ids.memory_ids[{i}]", memory_id)
