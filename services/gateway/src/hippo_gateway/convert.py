"""Pure conversions between protobuf messages (public API and retrieval) and domain values."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from hippo.memory.v1 import memory_pb2
from hippo.retrieval.v1 import retrieval_pb2
from hippo_core.errors import InvalidArgument
from hippo_gateway.domain.memory import ForgetTarget
from hippo_gateway.domain.models import (
    Forgotten,
    Hit,
    Memory,
    Mode,
    Recalled,
    RecallQuery,
    Remembered,
    Role,
    TurnIn,
    TurnToStore,
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
    )


def search_request(tenant: str, q: RecallQuery, vector: bytes) -> retrieval_pb2.SearchRequest:
    request = retrieval_pb2.SearchRequest(
        tenant=tenant,
        user_id=q.user,
        session_id=q.session or "",
        roles=[ROLE_PB[r] for r in sorted(q.roles)],
        query=q.query,
        vector=vector,
        mode=MODE_PB[q.mode],
        top_k=q.top_k,
    )
    if q.start_us is not None:
        request.start_us = q.start_us
    if q.end_us is not None:
        request.end_us = q.end_us
    return request
