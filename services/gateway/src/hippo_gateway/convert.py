"""Pure conversions between protobuf messages (public API and retrieval) and domain values."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from hippo.memory.v1 import memory_pb2
from hippo.retrieval.v1 import retrieval_pb2
from hippo.summariser.v1 import summariser_pb2
from hippo_core.errors import InvalidArgument
from hippo_gateway.domain.audit_events import AuditRecord, Verification
from hippo_gateway.domain.audit_trail import Outcome
from hippo_gateway.domain.chat import ChatEvent, Influence, Started, Token
from hippo_gateway.domain.context import Disclosed
from hippo_gateway.domain.memory import ForgetTarget
from hippo_gateway.domain.models import (
    BuiltContext,
    ChatRole,
    Forgotten,
    Generation,
    Hit,
    Layout,
    ListKey,
    ListQuery,
    Memory,
    Mode,
    Recalled,
    RecallQuery,
    Remembered,
    Role,
    SessionInfo,
    SessionState,
    SessionTurn,
    TurnIn,
    TurnToStore,
    UserInfo,
    ZoneKind,
)
from hippo_gateway.domain.transfer import (
    ExportedSession,
    ExportFooter,
    ExportHeader,
    ExportItem,
    ImportRecord,
)
from hippo_gateway.domain.validation import DEFAULT_TOP_K, MAX_ROLES

_ROLES = {
    memory_pb2.ROLE_USER: Role.USER,
    memory_pb2.ROLE_ASSISTANT: Role.ASSISTANT,
    memory_pb2.ROLE_SYSTEM: Role.SYSTEM,
    memory_pb2.ROLE_TOOL: Role.TOOL,
}
ROLE_PB = {v: k for k, v in _ROLES.items()}
_MODES = {
    memory_pb2.RECALL_MODE_UNSPECIFIED: Mode.HYBRID,
    memory_pb2.RECALL_MODE_HYBRID: Mode.HYBRID,
    memory_pb2.RECALL_MODE_LEXICAL: Mode.LEXICAL,
    memory_pb2.RECALL_MODE_SEMANTIC: Mode.SEMANTIC,
}
MODE_PB = {
    Mode.HYBRID: memory_pb2.RECALL_MODE_HYBRID,
    Mode.LEXICAL: memory_pb2.RECALL_MODE_LEXICAL,
    Mode.SEMANTIC: memory_pb2.RECALL_MODE_SEMANTIC,
}
# Timestamp's valid range (0001-01-01 .. 9999-12-31), in seconds.
_MIN_S, _MAX_S = -62_135_596_800, 253_402_300_799


def role(value: int, field: str) -> Role:
    if value not in _ROLES:
        raise InvalidArgument(field, f"must be one of ROLE_USER..ROLE_TOOL, got {value}")
    return _ROLES[value]  # type: ignore[index]


def mode(value: int) -> Mode:
    if value not in _MODES:
        raise InvalidArgument("mode", f"unknown recall mode {value}")
    return _MODES[value]  # type: ignore[index]


def micros(ts: timestamp_pb2.Timestamp, field: str) -> int:
    if not _MIN_S <= ts.seconds <= _MAX_S or not 0 <= ts.nanos < 1_000_000_000:
        raise InvalidArgument(field, "is not a valid timestamp (years 1..9999)")
    return int(ts.ToMicroseconds())


def turns_in(request: memory_pb2.RememberRequest) -> list[TurnIn]:
    return [
        TurnIn(
            role=role(t.role, f"turns[{i}].role"),
            text=t.text,
            time_us=micros(t.time, f"turns[{i}].time") if t.HasField("time") else None,
            client_id=t.client_id,
            metadata=dict(t.metadata),
        )
        for i, t in enumerate(request.turns)
    ]


def remember_response(result: Remembered) -> memory_pb2.RememberResponse:
    return memory_pb2.RememberResponse(
        memory_ids=result.memory_ids, created=result.created, deduplicated=result.deduplicated
    )


def recall_query(request: memory_pb2.RecallRequest) -> RecallQuery:
    if len(request.roles) > MAX_ROLES:
        raise InvalidArgument("roles", f"at most {MAX_ROLES} entries, got {len(request.roles)}")
    window = request.time_range
    return RecallQuery(
        user=request.scope.user_id,
        session=request.scope.session_id or None,
        query=request.query,
        mode=mode(request.mode),
        top_k=request.top_k or DEFAULT_TOP_K,
        start_us=micros(window.start, "time_range.start") if window.HasField("start") else None,
        end_us=micros(window.end, "time_range.end") if window.HasField("end") else None,
        roles=frozenset(role(r, f"roles[{i}]") for i, r in enumerate(request.roles)),
        metadata=tuple(sorted(request.metadata.items())),
    )


def record(m: Memory) -> memory_pb2.MemoryRecord:
    out = memory_pb2.MemoryRecord(
        memory_id=m.memory_id,
        scope=memory_pb2.Scope(user_id=m.user, session_id=m.session),
        role=ROLE_PB[m.role],
        text=m.text,
        client_id=m.client_id,
        metadata=dict(m.metadata),
        sequence=m.sequence,
    )
    out.time.FromMicroseconds(m.time_us)
    return out


def memory(r: memory_pb2.MemoryRecord) -> Memory:
    return Memory(
        memory_id=r.memory_id,
        user=r.scope.user_id,
        session=r.scope.session_id,
        role=_ROLES[r.role],
        text=r.text,
        time_us=int(r.time.ToMicroseconds()),
        client_id=r.client_id,
        metadata=dict(r.metadata),
        sequence=r.sequence,
    )


def hit(h: memory_pb2.Hit) -> Hit:
    return Hit(
        memory=memory(h.memory),
        fused_score=h.fused_score,
        lexical_rank=h.lexical_rank,
        semantic_rank=h.semantic_rank,
        lexical_score=h.lexical_score,
        semantic_score=h.semantic_score,
    )


def recall_response(result: Recalled) -> memory_pb2.RecallResponse:
    return memory_pb2.RecallResponse(
        hits=[
            memory_pb2.Hit(
                memory=record(h.memory),
                fused_score=h.fused_score,
                lexical_rank=h.lexical_rank,
                semantic_rank=h.semantic_rank,
                lexical_score=h.lexical_score,
                semantic_score=h.semantic_score,
            )
            for h in result.hits
        ],
        lexical_candidates=result.lexical_candidates,
        semantic_candidates=result.semantic_candidates,
        query_repairs=result.query_repairs,
    )


def forget_target(request: memory_pb2.ForgetRequest) -> ForgetTarget:
    which = request.WhichOneof("target")
    if which == "memory_ids":
        scope = request.memory_ids.scope
        return ForgetTarget(
            kind="memories",
            user=scope.user_id,
            session=scope.session_id or None,
            memory_ids=list(request.memory_ids.memory_ids),
        )
    if which == "session":
        return ForgetTarget(
            kind="session", user=request.session.user_id, session=request.session.session_id
        )
    if which == "user_id":
        return ForgetTarget(kind="user", user=request.user_id)
    raise InvalidArgument("target", "one of memory_ids, session or user_id is required")


def forget_response(result: Forgotten) -> memory_pb2.ForgetResponse:
    return memory_pb2.ForgetResponse(
        memories_deleted=result.memories,
        sessions_deleted=result.sessions,
        memtoks_deleted=result.memtoks,
        cache_entries_dropped=result.cache_entries,
        audit_key_destroyed=result.audit_key_destroyed,
    )


# -- the retrieval service's messages ------------------------------------------------------


def new_turn(t: TurnToStore) -> retrieval_pb2.NewTurn:
    return retrieval_pb2.NewTurn(
        memory_id=t.memory_id,
        user_id=t.user,
        session_id=t.session,
        role=ROLE_PB[t.role],
        text=t.text,
        time_us=t.time_us,
        client_id=t.client_id,
        metadata=dict(t.metadata),
        vector=b"" if t.vector is None else t.vector.astype("<f4").tobytes(),
        vector_model=t.vector_model,
    )


def search_request(
    tenant: str, q: RecallQuery, vector: bytes, vector_model: str = ""
) -> retrieval_pb2.SearchRequest:
    request = retrieval_pb2.SearchRequest(
        tenant=tenant,
        user_id=q.user,
        session_id=q.session or "",
        roles=[ROLE_PB[r] for r in sorted(q.roles)],
        query=q.query,
        vector=vector,
        mode=MODE_PB[q.mode],
        top_k=q.top_k,
        vector_model=vector_model,
        metadata=dict(q.metadata),
        query_repairs=dict(q.repairs),
    )
    if q.start_us is not None:
        request.start_us = q.start_us
    if q.end_us is not None:
        request.end_us = q.end_us
    return request


# -- sessions, context and chat ------------------------------------------------------------

_LAYOUTS = {
    memory_pb2.CONTEXT_LAYOUT_UNSPECIFIED: Layout.BOUNDARY_WEIGHTED,
    memory_pb2.CONTEXT_LAYOUT_BOUNDARY_WEIGHTED: Layout.BOUNDARY_WEIGHTED,
    memory_pb2.CONTEXT_LAYOUT_CHRONOLOGICAL: Layout.CHRONOLOGICAL,
    memory_pb2.CONTEXT_LAYOUT_SUMMARY_IN_SYSTEM: Layout.SUMMARY_IN_SYSTEM,
}
_ZONES = {
    ZoneKind.SYSTEM: memory_pb2.ZONE_KIND_SYSTEM,
    ZoneKind.MEMORIES: memory_pb2.ZONE_KIND_MEMORIES,
    ZoneKind.SUMMARY: memory_pb2.ZONE_KIND_SUMMARY,
    ZoneKind.WINDOW: memory_pb2.ZONE_KIND_WINDOW,
    ZoneKind.QUERY: memory_pb2.ZONE_KIND_QUERY,
}
_CHAT_ROLES = {
    ChatRole.SYSTEM: memory_pb2.ROLE_SYSTEM,
    ChatRole.USER: memory_pb2.ROLE_USER,
    ChatRole.ASSISTANT: memory_pb2.ROLE_ASSISTANT,
}
_INFLUENCE = {
    memory_pb2.INFLUENCE_MODE_UNSPECIFIED: Influence.DEFAULT,
    memory_pb2.INFLUENCE_MODE_OFF: Influence.OFF,
    memory_pb2.INFLUENCE_MODE_DISCLOSE_ONLY: Influence.DISCLOSE_ONLY,
    memory_pb2.INFLUENCE_MODE_ON: Influence.ON,
}


def layout(value: int) -> Layout:
    if value not in _LAYOUTS:
        raise InvalidArgument("layout", f"unknown context layout {value}")
    return _LAYOUTS[value]  # type: ignore[index]


def influence(value: int) -> str:
    if value not in _INFLUENCE:
        raise InvalidArgument("influence", f"unknown influence mode {value}")
    return _INFLUENCE[value]  # type: ignore[index]


def generation(params: memory_pb2.GenerationParameters) -> Generation:
    return Generation(
        max_new_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=params.seed,
        stop=tuple(params.stop),
    )


def session_turn_pb(t: SessionTurn) -> summariser_pb2.SessionTurn:
    return summariser_pb2.SessionTurn(
        memory_id=t.memory_id,
        role=ROLE_PB[t.role],
        text=t.text,
        time_us=t.time_us,
        speaker=t.speaker,
    )


def session_state(r: summariser_pb2.GetSessionResponse) -> SessionState:
    return SessionState(
        window=[
            SessionTurn(t.memory_id, _ROLES[t.role], t.text, t.time_us, t.speaker) for t in r.window
        ],
        summary=r.summary,
        version=r.version,
        window_tokens=r.window_tokens,
        summary_tokens=r.summary_tokens,
        turns_total=r.turns_total,
        updated_us=r.updated_us,
    )


def token_counts(ctx: BuiltContext) -> memory_pb2.TokenCounts:
    return memory_pb2.TokenCounts(
        budget=ctx.budget,
        total=ctx.total_tokens,
        system=ctx.zone_tokens(ZoneKind.SYSTEM),
        memories=ctx.zone_tokens(ZoneKind.MEMORIES),
        summary=ctx.zone_tokens(ZoneKind.SUMMARY),
        window=ctx.zone_tokens(ZoneKind.WINDOW),
        query=ctx.zone_tokens(ZoneKind.QUERY),
    )


def build_context_response(disclosed: Disclosed) -> memory_pb2.BuildContextResponse:
    ctx = disclosed.context
    return memory_pb2.BuildContextResponse(
        messages=[
            memory_pb2.ChatMessage(role=_CHAT_ROLES[m.role], text=m.text) for m in ctx.messages
        ],
        zones=[
            memory_pb2.ContextZone(
                kind=_ZONES[z.kind], text=z.text, tokens=z.tokens, memory_ids=z.memory_ids
            )
            for z in ctx.zones
        ],
        tokens=token_counts(ctx),
        memory_ids_used=[h.memory.memory_id for h in ctx.memories_used],
        summary=ctx.summary,
        disclosure_note=disclosed.note,
        prompt=ctx.prompt,
        audit_seq=disclosed.audit_seq,
    )


def chat_response(event: ChatEvent) -> memory_pb2.ChatResponse:
    if isinstance(event, Started):
        ctx = event.context
        return memory_pb2.ChatResponse(
            start=memory_pb2.ChatStart(
                memory_ids_used=[h.memory.memory_id for h in ctx.memories_used],
                disclosure_note=event.note,
                tokens=token_counts(ctx),
            )
        )
    if isinstance(event, Token):
        return memory_pb2.ChatResponse(
            token=memory_pb2.ChatToken(text=event.text, index=event.index)
        )
    return memory_pb2.ChatResponse(
        end=memory_pb2.ChatEnd(
            finish_reason=event.finish_reason,
            generated_tokens=event.generated_tokens,
            user_memory_id=event.user_memory_id,
            assistant_memory_id=event.assistant_memory_id,
            influences=[
                memory_pb2.AppliedInfluence(
                    memtok_id=str(i["memtok_id"]),
                    source_words=str(i.get("source_words", "")),
                    layer=int(i["layer"]),
                    strength=float(i["strength"]),
                )
                for i in event.influences
            ],
            audit_seq=event.audit_seq,
        )
    )


def get_session_response(
    state: SessionState, records: list[Memory]
) -> memory_pb2.GetSessionResponse:
    by_id = {m.memory_id: m for m in records}
    out = memory_pb2.GetSessionResponse(
        window=[record(by_id[t.memory_id]) for t in state.window if t.memory_id in by_id],
        summary=state.summary,
        version=state.version,
        window_tokens=state.window_tokens,
        summary_tokens=state.summary_tokens,
        turns_total=state.turns_total,
    )
    if state.updated_us:
        out.updated.FromMicroseconds(state.updated_us)
    return out


# -- audit -------------------------------------------------------------------------------

_OUTCOMES = {
    memory_pb2.OUTCOME_KIND_ACCEPTED: "accepted",
    memory_pb2.OUTCOME_KIND_REJECTED: "rejected",
    memory_pb2.OUTCOME_KIND_CORRECTED: "corrected",
    memory_pb2.OUTCOME_KIND_NOTE: "note",
}


def outcome(request: memory_pb2.ReportOutcomeRequest) -> Outcome:
    return Outcome(
        scope_user=request.scope.user_id,
        scope_session=request.scope.session_id,
        audit_seq=request.audit_seq,
        kind=_OUTCOMES.get(request.kind, ""),  # the domain refuses "" naming `kind`
        note=request.note,
    )


def verify_audit_response(v: Verification) -> memory_pb2.VerifyAuditResponse:
    return memory_pb2.VerifyAuditResponse(
        ok=v.ok,
        entries_checked=v.entries_checked,
        first_bad_seq=v.first_bad_seq,
        reason=v.reason,
        head_seq=v.head_seq,
        head_hash=v.head_hash,
    )


def audit_entry(r: AuditRecord) -> memory_pb2.AuditEntry:
    """The public body is the entry's public details plus `private`: the decrypted private
    details, or the word "erased" once the user was forgotten."""
    body = dict(r.body)
    if r.private_state == "readable" and r.private is not None:
        body["private"] = dict(r.private)
    elif r.private_state == "erased":
        body["private"] = "erased"
    out = memory_pb2.AuditEntry(
        seq=r.seq,
        actor=r.actor,
        event_type=r.event_type,
        user_id=r.user,
        session_id=r.session,
        memory_ids=list(r.memory_ids),
        prev_hash=r.prev_hash,
        hash=r.hash,
    )
    out.body.update(body)
    out.time.FromMicroseconds(r.time_us)
    return out


def list_audit_response(
    records: list[AuditRecord], next_token: str
) -> memory_pb2.ListAuditEntriesResponse:
    return memory_pb2.ListAuditEntriesResponse(
        entries=[audit_entry(r) for r in records], next_page_token=next_token
    )


def list_query(request: memory_pb2.ListMemoriesRequest) -> ListQuery:
    if len(request.roles) > MAX_ROLES:
        raise InvalidArgument("roles", f"at most {MAX_ROLES} entries, got {len(request.roles)}")
    if request.order not in _ORDERS:
        raise InvalidArgument("order", f"unknown list order {request.order}")
    window = request.time_range
    return ListQuery(
        user=request.scope.user_id,
        session=request.scope.session_id or None,
        start_us=micros(window.start, "time_range.start") if window.HasField("start") else None,
        end_us=micros(window.end, "time_range.end") if window.HasField("end") else None,
        roles=frozenset(role(r, f"roles[{i}]") for i, r in enumerate(request.roles)),
        newest_first=_ORDERS[request.order],
        metadata=tuple(sorted(request.metadata.items())),
    )


# ListOrder -> newest first?
_ORDERS = {
    memory_pb2.LIST_ORDER_UNSPECIFIED: True,
    memory_pb2.LIST_ORDER_NEWEST_FIRST: True,
    memory_pb2.LIST_ORDER_OLDEST_FIRST: False,
}


def list_memories_response(memories: list[Memory], token: str) -> memory_pb2.ListMemoriesResponse:
    return memory_pb2.ListMemoriesResponse(
        memories=[record(m) for m in memories], next_page_token=token
    )


def _timestamp(time_us: int) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromMicroseconds(time_us)
    return out


def session_info_out(s: SessionInfo) -> memory_pb2.SessionInfo:
    return memory_pb2.SessionInfo(
        session_id=s.session,
        turn_count=s.turns,
        first_time=_timestamp(s.first_time_us),
        last_time=_timestamp(s.last_time_us),
        summary_version=s.summary_version,
    )


def list_sessions_response(
    sessions: list[SessionInfo], token: str
) -> memory_pb2.ListSessionsResponse:
    return memory_pb2.ListSessionsResponse(
        sessions=[session_info_out(s) for s in sessions], next_page_token=token
    )


def export_item(item: ExportItem) -> memory_pb2.ExportUserResponse:
    if isinstance(item, ExportHeader):
        return memory_pb2.ExportUserResponse(
            header=memory_pb2.ExportHeader(
                format_version=item.format_version,
                user_id=item.user,
                audit_seq=item.audit_seq,
                time=_timestamp(item.time_us),
            )
        )
    if isinstance(item, ExportedSession):
        return memory_pb2.ExportUserResponse(
            session=memory_pb2.ExportedSession(
                session=session_info_out(item.session), summary=item.summary, version=item.version
            )
        )
    if isinstance(item, ExportFooter):
        return memory_pb2.ExportUserResponse(
            footer=memory_pb2.ExportFooter(memories=item.memories, sessions=item.sessions)
        )
    return memory_pb2.ExportUserResponse(memory=record(item))


def import_records(request: memory_pb2.ImportTurnsRequest) -> list[ImportRecord]:
    """The records of one ImportTurns message; `sequence` is ignored (the store's own)."""
    return [
        ImportRecord(
            memory_id=r.memory_id,
            user=r.scope.user_id,
            session=r.scope.session_id,
            turn=TurnIn(
                role=role(r.role, f"records[{i}].role"),
                text=r.text,
                time_us=micros(r.time, f"records[{i}].time") if r.HasField("time") else None,
                client_id=r.client_id,
                metadata=dict(r.metadata),
            ),
        )
        for i, r in enumerate(request.records)
    ]


def list_users_response(users: list[UserInfo], token: str) -> memory_pb2.ListUsersResponse:
    return memory_pb2.ListUsersResponse(
        users=[
            memory_pb2.UserInfo(
                user_id=u.user,
                turn_count=u.turns,
                session_count=u.sessions,
                first_time=_timestamp(u.first_time_us),
                last_time=_timestamp(u.last_time_us),
            )
            for u in users
        ],
        next_page_token=token,
    )


def list_request(
    tenant: str, query: ListQuery, after: ListKey | None, limit: int
) -> retrieval_pb2.ListRequest:
    out = retrieval_pb2.ListRequest(
        tenant=tenant,
        user_id=query.user,
        session_id=query.session or "",
        roles=[ROLE_PB[r] for r in sorted(query.roles)],
        newest_first=query.newest_first,
        limit=limit,
        metadata=dict(query.metadata),
    )
    if query.start_us is not None:
        out.start_us = query.start_us
    if query.end_us is not None:
        out.end_us = query.end_us
    if after is not None:
        out.after.CopyFrom(retrieval_pb2.ListCursor(time_us=after[0], seq=after[1]))
    return out


def session_info(s: retrieval_pb2.SessionStats) -> SessionInfo:
    return SessionInfo(s.session_id, s.turns, s.first_time_us, s.last_time_us)


def user_info(u: retrieval_pb2.UserStats) -> UserInfo:
    return UserInfo(u.user_id, u.turns, u.sessions, u.first_time_us, u.last_time_us)
