"""The listing reads of the public API: ListMemories, GetMemory, ListSessions, ListUsers,
always inside the caller's tenant.

Pages (AIP-158): page_size 0 is the default, a larger one than the maximum is served as
the maximum, a negative one is refused. The turn store pages by key (a memory's
(time_us, seq), a session's or user's id), never by offset, so writes and erasures
between calls neither shift nor repeat what is left of a listing.

Page tokens are opaque to callers: base64 of the last key and a digest of everything the
listing is bound to (which listing, the tenant, the user, the session, the filters and
the order). A token is only accepted by a request whose own digest matches, so a token of
one user, tenant (API key) or filter set cannot page another's data. Nothing in a token
needs to be secret: the tenant comes from the caller's key, and a hand-made key only
moves where a listing the caller may read anyway starts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import replace
from typing import Any

from hippo_core import limits
from hippo_core.errors import InvalidArgument, NotFound
from hippo_gateway.domain import audit_events, validation
from hippo_gateway.domain.audit_recorder import AuditRecorder
from hippo_gateway.domain.models import ListKey, ListQuery, Memory, SessionInfo, UserInfo
from hippo_gateway.domain.ports import Sessions, TurnStore

DEFAULT_PAGE = 50
MAX_PAGE = 1000
MAX_TOKEN_CHARS = 1024
MAX_TIME_US = 2**63 - 1


def page_size(value: int) -> int:
    """The page size served for `value`: 0 = the default, over the maximum = the maximum."""
    if value < 0:
        raise InvalidArgument(
            "page_size", f"must be 0 (default {DEFAULT_PAGE}) or positive, got {value}"
        )
    return min(value or DEFAULT_PAGE, MAX_PAGE)


class Listings:
    """The four listing reads. ListMemories and GetMemory return memory content, so each
    is recorded in the audit log as a `read` entry (as Recall is); ListSessions and
    ListUsers return ids, counts and times only, and are not (as GetSession is not)."""

    def __init__(
        self,
        store: TurnStore,
        audit: AuditRecorder | None = None,
        sessions: Sessions | None = None,
    ) -> None:
        self._store = store
        self._audit = audit
        self._sessions = sessions  # the summariser: each session's state version

    async def memories(
        self, tenant: str, query: ListQuery, size: int, token: str
    ) -> tuple[list[Memory], str]:
        validation.check_id("scope.user_id", query.user)
        if query.session is not None:
            validation.check_id("scope.session_id", query.session)
        start, end = query.start_us, query.end_us
        if start is not None and end is not None and start >= end:
            raise InvalidArgument("time_range", "start must be earlier than end")
        limit = page_size(size)
        bound = _digest(
            "memories",
            tenant,
            query.user,
            query.session or "",
            "" if query.start_us is None else str(query.start_us),
            "" if query.end_us is None else str(query.end_us),
            ",".join(sorted(r.value for r in query.roles)),
            "newest" if query.newest_first else "oldest",
            # Lengths first: keys and values may hold any character but NUL.
            *(f"{len(k)}:{k}{len(v)}:{v}" for k, v in query.metadata),
        )
        after = _memory_key(_read(token, bound)) if token else None
        memories, next_key = await self._store.list_memories(tenant, query, after, limit)
        if self._audit is not None:
            await self._audit.record(
                audit_events.read_event(tenant, "ListMemories", memories, query)
            )
        return memories, _token(list(next_key), bound) if next_key is not None else ""

    async def memory(self, tenant: str, user: str, memory_id: str) -> Memory:
        """The user's memory, or NotFound: never written, forgotten, or another user's or
        tenant's (the turn store looks inside tenant and user only, so they read as absent)."""
        validation.check_id("user_id", user)
        validation.check_memory_id("memory_id", memory_id)
        found = await self._store.get(tenant, user, [memory_id])
        if not found:
            raise NotFound(
                f"memory_id: no memory {memory_id!r} for this user", reason="MEMORY_NOT_FOUND"
            )
        if self._audit is not None:
            await self._audit.record(audit_events.read_event(tenant, "GetMemory", found))
        return found[0]

    async def sessions(
        self, tenant: str, user: str, size: int, token: str
    ) -> tuple[list[SessionInfo], str]:
        validation.check_id("user_id", user)
        limit = page_size(size)
        bound = _digest("sessions", tenant, user)
        after = _id_key(_read(token, bound)) if token else ""
        sessions, last = await self._store.list_sessions(tenant, user, after, limit)
        if self._sessions is not None and sessions:
            # One call per page (the summariser answers up to a page of ids at once).
            versions = await self._sessions.versions(tenant, user, [s.session for s in sessions])
            sessions = [replace(s, summary_version=versions.get(s.session, 0)) for s in sessions]
        return sessions, _token(last, bound) if last else ""

    async def users(self, tenant: str, size: int, token: str) -> tuple[list[UserInfo], str]:
        limit = page_size(size)
        bound = _digest("users", tenant)
        after = _id_key(_read(token, bound)) if token else ""
        users, last = await self._store.list_users(tenant, after, limit)
        return users, _token(last, bound) if last else ""


def _digest(*parts: str) -> str:
    # U+001F cannot occur in ids, and the numbers and role names hold none either, so the
    # join is unambiguous.
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def _token(key: Any, bound: str) -> str:
    raw = json.dumps({"k": key, "b": bound}, separators=(",", ":")).encode()
    return "v1." + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _read(token: str, bound: str) -> Any:
    """The key a page token carries, if it was issued for a request bound like this one."""
    refused = InvalidArgument("page_token", "is not a token this service issued")
    if len(token) > MAX_TOKEN_CHARS:
        raise refused
    try:
        version, _, data = token.partition(".")
        raw = json.loads(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
        key, issued_for = raw["k"], raw["b"]
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise refused from exc
    if version != "v1" or not isinstance(issued_for, str):
        raise refused
    if not hmac.compare_digest(issued_for.encode(), bound.encode()):
        raise InvalidArgument(
            "page_token",
            "was issued for another request (use it with the same user, session, filters "
            "and order, and the same tenant's key)",
        )
    return key


def _memory_key(key: Any) -> ListKey:
    valid = (
        isinstance(key, list)
        and len(key) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in key)
        and 0 <= key[0] <= MAX_TIME_US
        and 1 <= key[1] <= validation.MAX_SEQ
    )
    if not valid:
        raise InvalidArgument("page_token", "is not a token this service issued")
    return int(key[0]), int(key[1])


def _id_key(key: Any) -> str:
    if not isinstance(key, str) or not limits.is_id(key):
        raise InvalidArgument("page_token", "is not a token this service issued")
    return key
