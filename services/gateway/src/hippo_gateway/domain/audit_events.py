"""What the gateway records in the audit log: the events, and the one builder per entry type.

Every Remember, Recall, BuildContext, Chat, Forget, memory read (GetMemory,
ListMemories), metadata change and reported outcome becomes an entry, built here by code
(never by a model). The entry's `body` is public for the life of the log, so it holds
ids, counts, scores, ranks and reasons, never user text; what is derived from user content
(a query's fingerprint, an operator's note, the words of a memtok, a metadata value) goes
in `private`, which the audit service seals under the user's key and which becomes
unreadable when the user is forgotten. Every use case builds its entries through these
functions, so an entry type has one shape wherever it is recorded.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hippo_core.errors import HippoError
from hippo_gateway.domain.models import Hit, ListQuery, Memory, Recalled, RecallQuery

Json = Mapping[str, Any]
ACTOR = "gateway"


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class AuditEvent:
    """One decision to record. `event_id` is the idempotency key of its delivery."""

    tenant: str
    event_type: str
    user: str = ""
    session: str = ""
    memory_ids: tuple[str, ...] = ()
    body: Json = field(default_factory=dict)  # public: never user text
    private: Json | None = None  # derived from user content: sealed under the user's key
    actor: str = ACTOR
    event_id: str = field(default_factory=new_id)
    # The W3C traceparent of the call that decided it, set when it is spooled: the
    # delivery, later and batched, then shows up in that call's trace. Opaque here,
    # never sent.
    trace_parent: str = ""


@dataclass(frozen=True)
class EraseUser:
    """Destroy the user's key in the audit service (after every event spooled before it)."""

    tenant: str
    user: str
    actor: str = ACTOR
    event_id: str = field(default_factory=new_id)
    trace_parent: str = ""  # as AuditEvent.trace_parent


AuditItem = AuditEvent | EraseUser


@dataclass(frozen=True)
class AuditRecord:
    """An entry as the audit service returns it."""

    seq: int
    time_us: int
    actor: str
    event_type: str
    user: str
    session: str
    memory_ids: tuple[str, ...]
    body: Json
    private: Json | None
    private_state: str  # "none" | "sealed" | "readable" | "erased"
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class Verification:
    ok: bool
    entries_checked: int
    first_bad_seq: int
    reason: str
    head_seq: int
    head_hash: str
    # When asked for one tenant: its entries in the range and its last entry there.
    tenant_entries: int = 0
    tenant_head_seq: int = 0
    tenant_head_hash: str = ""


# -- the builders -----------------------------------------------------------------------------


def hit_json(hit: Hit, rank: int) -> dict[str, Any]:
    """A recalled memory as the log keeps it: ids, date, scores, ranks; never its text."""
    return {
        "memory_id": hit.memory.memory_id,
        "session_id": hit.memory.session,
        "time_us": hit.memory.time_us,
        "rank": rank,
        "fused_score": round(hit.fused_score, 6),
        "lexical_rank": hit.lexical_rank,
        "semantic_rank": hit.semantic_rank,
    }


def remember_event(
    tenant: str, user: str, session: str, memory_ids: Sequence[str], turns: int
) -> AuditEvent:
    return AuditEvent(tenant, "remember", user, session, tuple(memory_ids), body={"turns": turns})


def write_failed_event(recorded: AuditEvent, error: HippoError) -> AuditEvent:
    """Follows a write's entry (`remember`, `metadata`) recorded before the write, which
    then failed: `remember_failed`, `metadata_failed`."""
    body: dict[str, Any] = {"ref_event": recorded.event_id, "code": error.code.value}
    if recorded.event_type == "remember":
        body["turns"] = 0
    return AuditEvent(
        recorded.tenant,
        f"{recorded.event_type}_failed",
        recorded.user,
        recorded.session,
        recorded.memory_ids,
        body=body,
    )


def recall_event(tenant: str, query: RecallQuery, result: Recalled, fingerprint: str) -> AuditEvent:
    body: dict[str, Any] = {
        "mode": query.mode.value,
        "top_k": query.top_k,
        "candidates": {
            "lexical": result.lexical_candidates,
            "semantic": result.semantic_candidates,
        },
        "hits": [hit_json(h, i) for i, h in enumerate(result.hits, start=1)],
    }
    if query.start_us is not None or query.end_us is not None:
        body["time_range_us"] = [query.start_us, query.end_us]
    if query.roles:
        body["roles"] = sorted(r.value for r in query.roles)
    if query.metadata:  # the keys only: a value may be content
        body["metadata_keys"] = [k for k, _ in query.metadata]
    return AuditEvent(
        tenant,
        "recall",
        query.user,
        query.session or "",
        tuple(h.memory.memory_id for h in result.hits),
        body=body,
        private={"query_fingerprint": fingerprint},
    )


def read_event(
    tenant: str, rpc: str, memories: Sequence[Memory], query: ListQuery | None = None
) -> AuditEvent:
    """A read of stored memories by id or listing (GetMemory, ListMemories): which were
    returned to the caller. The body holds the filters, never text."""
    body: dict[str, Any] = {"rpc": rpc, "returned": len(memories)}
    user = memories[0].user if memories else ""
    session = ""
    if query is not None:
        user, session = query.user, query.session or ""
        body["order"] = "newest_first" if query.newest_first else "oldest_first"
        if query.start_us is not None or query.end_us is not None:
            body["time_range_us"] = [query.start_us, query.end_us]
        if query.roles:
            body["roles"] = sorted(r.value for r in query.roles)
        if query.metadata:  # the keys only: a value may be content
            body["metadata_keys"] = [k for k, _ in query.metadata]
    return AuditEvent(
        tenant, "read", user, session, tuple(m.memory_id for m in memories), body=body
    )


def export_event(tenant: str, user: str) -> AuditEvent:
    """An ExportUser starting: everything of the user acknowledged before it is exported."""
    return AuditEvent(tenant, "export", user, "", (), body={"format_version": 1})


def metadata_event(
    tenant: str,
    memory: Memory,
    set_: Mapping[str, str],
    remove: Sequence[str],
    reembedded: bool,
) -> AuditEvent:
    """UpdateMemoryMetadata: which keys were set and dropped on which memory (public), and
    the values set (private: a value may be content)."""
    body = {"set_keys": sorted(set_), "removed_keys": sorted(remove), "reembedded": reembedded}
    return AuditEvent(
        tenant,
        "metadata",
        memory.user,
        memory.session,
        (memory.memory_id,),
        body=body,
        private={"set": dict(set_)} if set_ else None,
    )


class SkipLike(Protocol):
    """A memory recalled but not used (the context builder's `Skipped` fits)."""

    @property
    def memory_id(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def fused_score(self) -> float: ...


def context_event(
    tenant: str,
    user: str,
    session: str,
    fingerprint: str,
    *,
    used: Sequence[Hit],
    skipped: Sequence[SkipLike],
    candidates: int,
    lexical_candidates: int | None = None,
    semantic_candidates: int | None = None,
    mode: str = "hybrid",
    event_type: str = "context",
    extra: Json | None = None,
) -> AuditEvent:
    """BuildContext's (or Chat's start) decision: what was used, in prompt order, with
    dates, fused scores and ranks; what was skipped and why; how many candidates there
    were. `extra` adds public fields (token counts, layout, influences...)."""
    counts: dict[str, int] = {"total": candidates}
    if lexical_candidates is not None:
        counts["lexical"] = lexical_candidates
    if semantic_candidates is not None:
        counts["semantic"] = semantic_candidates
    body: dict[str, Any] = {
        "mode": mode,
        "candidates": counts,
        "used": [hit_json(h, i) for i, h in enumerate(used, start=1)],
        "skipped": [
            {"memory_id": s.memory_id, "reason": s.reason, "fused_score": round(s.fused_score, 6)}
            for s in skipped
        ],
        **(extra or {}),
    }
    return AuditEvent(
        tenant,
        event_type,
        user,
        session,
        tuple(h.memory.memory_id for h in used),
        body=body,
        private={"query_fingerprint": fingerprint},
    )


def influence_event(
    tenant: str, user: str, session: str, body: Json, private: Json | None = None
) -> AuditEvent:
    """Chat's influence decision: the memtok pipeline's steps as the injection service
    reported them (selected words' scores, shortlist, LLM2, applied and skipped, and why),
    or just the mode and the influences selected; the words themselves only in `private`."""
    return AuditEvent(
        tenant,
        "influence",
        user,
        session,
        body=dict(body),
        private=dict(private) if private is not None else None,
    )


def memtok_write_event(
    tenant: str, user: str, session: str, written: Json, words: Json
) -> AuditEvent:
    """What Chat stored in the memtok store after the exchange: ids and numbers in the
    body, the words in `private`."""
    return AuditEvent(
        tenant, "memtok_write", user, session, body=dict(written), private=dict(words)
    )


def chat_event(
    tenant: str,
    user: str,
    session: str,
    memory_ids: Sequence[str],
    *,
    context_seq: int,
    finish_reason: str,
    generated_tokens: int,
    influence: Json,
) -> AuditEvent:
    """The exchange Chat stored: the ids of its turns, the `context` entry it was built
    from, how generation ended, and the influence mode with the influences selected."""
    body = {
        "context_seq": context_seq,
        "finish_reason": finish_reason,
        "generated_tokens": generated_tokens,
        **influence,
    }
    return AuditEvent(tenant, "chat", user, session, tuple(memory_ids), body=body)


def forget_event(
    tenant: str,
    kind: str,
    user: str,
    session: str | None,
    requested: Sequence[str],
    erased: Sequence[str],
    sessions: int,
    memtoks: int = 0,
) -> AuditEvent:
    body = {
        "target": kind,
        "requested": len(requested),
        "memories_deleted": len(erased),
        "sessions_deleted": sessions,
        "memtoks_deleted": memtoks,
        "user_key_erased": kind == "user",
    }
    return AuditEvent(tenant, "forget", user, session or "", tuple(erased), body=body)


def outcome_event(tenant: str, earlier: AuditRecord, kind: str, note: str) -> AuditEvent:
    """ReportOutcome: a verdict on an earlier entry of the same user; the operator's note
    (free text) only in `private`."""
    return AuditEvent(
        tenant,
        "outcome",
        earlier.user,
        earlier.session,
        earlier.memory_ids,
        body={"ref_seq": earlier.seq, "ref_event_type": earlier.event_type, "kind": kind},
        private={"note": note} if note else None,
    )
