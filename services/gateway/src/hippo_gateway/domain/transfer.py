"""ExportUser and ImportTurns: a user's memory out as a stream, and records back in.

An export starts with an `export` audit entry, then reads the turn store page by page
(oldest first, keyset: writes made meanwhile neither shift nor repeat what is left), then
each session with its summary. Everything acknowledged before the entry is in it.

An import keeps each record's memory id, so importing the same records again stores
nothing new: a failed import is resumed by sending it again. Each batch is validated
whole before anything of it is stored (as Remember is), then written session by session
through Remember's own write path (MemoryService.store: turn store, audit entry, session
window and so its summary, quotas), each session's run of records all or none.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from itertools import groupby

from hippo_core.errors import InvalidArgument
from hippo_gateway.domain import audit_events, validation
from hippo_gateway.domain.audit_recorder import AuditRecorder
from hippo_gateway.domain.listing import MAX_PAGE
from hippo_gateway.domain.memory import MemoryService
from hippo_gateway.domain.models import (
    ListKey,
    ListQuery,
    Memory,
    SessionInfo,
    TurnIn,
    TurnToStore,
)
from hippo_gateway.domain.ports import Sessions, TurnStore

FORMAT_VERSION = 1
MAX_RECORDS = 256


@dataclass(frozen=True)
class ExportHeader:
    user: str
    audit_seq: int
    time_us: int
    format_version: int = FORMAT_VERSION


@dataclass(frozen=True)
class ExportedSession:
    session: SessionInfo
    summary: str
    version: int


@dataclass(frozen=True)
class ExportFooter:
    memories: int
    sessions: int


ExportItem = ExportHeader | Memory | ExportedSession | ExportFooter


@dataclass(frozen=True)
class ImportRecord:
    """A record to import: a stored turn, with the id it keeps."""

    memory_id: str
    user: str
    session: str
    turn: TurnIn


@dataclass(frozen=True)
class Imported:
    created: int
    deduplicated: int


class Transfers:
    def __init__(
        self,
        memory: MemoryService,
        store: TurnStore,
        sessions: Sessions | None = None,
        audit: AuditRecorder | None = None,
    ) -> None:
        self._memory = memory
        self._store = store
        self._sessions = sessions
        self._audit = audit

    async def export(self, tenant: str, user: str) -> AsyncIterator[ExportItem]:
        validation.check_id("user_id", user)
        seq = 0
        if self._audit is not None:
            seq = await self._audit.record(audit_events.export_event(tenant, user), wait=True)
        yield ExportHeader(user, seq, time.time_ns() // 1000)
        memories = 0
        query = ListQuery(user, newest_first=False)
        after: ListKey | None = None
        while True:
            page, after = await self._store.list_memories(tenant, query, after, MAX_PAGE)
            for memory in page:
                yield memory
            memories += len(page)
            if after is None:
                break
        sessions = 0
        last = ""
        while True:
            infos, last = await self._store.list_sessions(tenant, user, last, MAX_PAGE)
            for info in infos:
                summary, version = "", 0
                if self._sessions is not None:
                    state = await self._sessions.get(tenant, user, info.session)
                    summary, version = state.summary, state.version
                yield ExportedSession(replace(info, summary_version=version), summary, version)
            sessions += len(infos)
            if not last:
                break
        yield ExportFooter(memories, sessions)

    async def import_batch(self, tenant: str, records: Sequence[ImportRecord]) -> Imported:
        """One ImportTurns message: validated whole, then stored session by session."""
        if not 1 <= len(records) <= MAX_RECORDS:
            raise InvalidArgument(
                "records", f"must hold 1..{MAX_RECORDS} records, got {len(records)}"
            )
        for i, record in enumerate(records):
            validation.check_memory_id(f"records[{i}].memory_id", record.memory_id)
            validation.check_id(f"records[{i}].scope.user_id", record.user)
            validation.check_id(f"records[{i}].scope.session_id", record.session)
            if record.turn.time_us is None:
                raise InvalidArgument(f"records[{i}].time", "is required (the turn's time)")
            validation.check_turn(f"records[{i}]", record.turn)
        await self._memory.admit_turns(tenant, len(records))
        created = deduplicated = 0
        for (user, session), run in groupby(records, key=lambda r: (r.user, r.session)):
            group = list(run)
            embedding = await self._memory.embed_turns([r.turn for r in group])
            to_store = [
                TurnToStore(
                    memory_id=r.memory_id,
                    user=user,
                    session=session,
                    role=r.turn.role,
                    text=r.turn.text,
                    time_us=r.turn.time_us or 0,
                    client_id=r.turn.client_id,
                    metadata=dict(r.turn.metadata),
                    vector=embedding.vectors[i],
                    vector_model=embedding.model,
                )
                for i, r in enumerate(group)
            ]
            stored = await self._memory.store(tenant, user, session, to_store)
            created += stored.created
            deduplicated += stored.deduplicated
        return Imported(created, deduplicated)
