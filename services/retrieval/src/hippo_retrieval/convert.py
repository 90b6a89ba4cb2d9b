"""Pure conversions between retrieval protobuf messages and domain values."""

from __future__ import annotations

import numpy as np

from hippo.memory.v1 import memory_pb2
from hippo.retrieval.v1 import retrieval_pb2
from hippo_core.errors import InvalidArgument
from hippo_retrieval.domain.models import (
    Cursor,
    Mode,
    NewTurn,
    Role,
    Scope,
    SessionStats,
    StoredTurn,
    UserStats,
    Vector,
)
from hippo_retrieval.domain.retriever import Hit, SearchResult
from hippo_retrieval.domain.service import ReindexProgress, Status, WriteResult

_ROLES = {
    memory_pb2.ROLE_USER: Role.USER,
    memory_pb2.ROLE_ASSISTANT: Role.ASSISTANT,
    memory_pb2.ROLE_SYSTEM: Role.SYSTEM,
    memory_pb2.ROLE_TOOL: Role.TOOL,
}
_ROLE_PB = {v: k for k, v in _ROLES.items()}
_MODES = {
    memory_pb2.RECALL_MODE_UNSPECIFIED: Mode.HYBRID,
    memory_pb2.RECALL_MODE_HYBRID: Mode.HYBRID,
    memory_pb2.RECALL_MODE_LEXICAL: Mode.LEXICAL,
    memory_pb2.RECALL_MODE_SEMANTIC: Mode.SEMANTIC,
}
US = 1_000_000


def role(value: int, field: str) -> Role:
    if value not in _ROLES:
        raise InvalidArgument(field, f"must be a role other than ROLE_UNSPECIFIED, got {value}")
    return _ROLES[value]  # type: ignore[index]


def vector(data: bytes, field: str) -> Vector | None:
    if not data:
        return None
    if len(data) % 4:
        raise InvalidArgument(field, f"must be packed float32 ('<f4'), got {len(data)} bytes")
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


def new_turns(request: retrieval_pb2.WriteRequest) -> list[NewTurn]:
    return [
        NewTurn(
            memory_id=t.memory_id,
            tenant=request.tenant,
            user=t.user_id,
            session=t.session_id,
            role=role(t.role, f"turns[{i}].role"),
            text=t.text,
            time_us=t.time_us,
            client_id=t.client_id,
            metadata=dict(t.metadata),
            vector=vector(t.vector, f"turns[{i}].vector"),
            vector_model=t.vector_model,
        )
        for i, t in enumerate(request.turns)
    ]


def record(turn: StoredTurn) -> memory_pb2.MemoryRecord:
    out = memory_pb2.MemoryRecord(
        memory_id=turn.memory_id,
        scope=memory_pb2.Scope(user_id=turn.user, session_id=turn.session),
        role=_ROLE_PB[turn.role],
        text=turn.text,
        client_id=turn.client_id,
        metadata=dict(turn.metadata),
        sequence=turn.position,
    )
    out.time.FromMicroseconds(turn.time_us)
    return out


def write_response(result: WriteResult) -> retrieval_pb2.WriteResponse:
    return retrieval_pb2.WriteResponse(
        created=[created for _, created in result.turns],
        records=[record(turn) for turn, _ in result.turns],
        searchable=result.searchable,
        embedding_model=result.embedding_model,
    )


def scope(request: retrieval_pb2.SearchRequest | retrieval_pb2.ListRequest) -> Scope:
    return Scope(
        tenant=request.tenant,
        user=request.user_id,
        session=request.session_id or None,
        start_us=request.start_us if request.HasField("start_us") else None,
        end_us=request.end_us if request.HasField("end_us") else None,
        roles=frozenset(role(r, f"roles[{i}]") for i, r in enumerate(request.roles)),
        metadata=tuple(sorted(request.metadata.items())),
    )


def mode(value: int) -> Mode:
    if value not in _MODES:
        raise InvalidArgument("mode", f"unknown recall mode {value}")
    return _MODES[value]  # type: ignore[index]


def hit(h: Hit) -> memory_pb2.Hit:
    return memory_pb2.Hit(
        memory=record(h.turn),
        fused_score=h.fused.fused_score,
        lexical_rank=h.fused.ranks.get("lexical", 0),
        semantic_rank=h.fused.ranks.get("semantic", 0),
        lexical_score=h.fused.scores.get("lexical", 0.0),
        semantic_score=h.fused.scores.get("semantic", 0.0),
    )


def search_response(result: SearchResult) -> retrieval_pb2.SearchResponse:
    return retrieval_pb2.SearchResponse(
        hits=[hit(h) for h in result.hits],
        lexical_candidates=result.lexical_candidates,
        semantic_candidates=result.semantic_candidates,
        embedding_model=result.embedding_model,
    )


def status_response(status: Status) -> retrieval_pb2.StatusResponse:
    return retrieval_pb2.StatusResponse(
        last_seq=status.last_seq,
        lexical_seq=status.lexical_seq,
        vector_seq=status.vector_seq,
        vector_backend=status.vector_backend,
        lexical_backend=status.lexical_backend,
        dimension=status.dimension,
        turns=status.turns,
        tenant_turns=status.tenant_turns,
        embedding_model=status.embedding_model,
        generation=status.generation,
        vectors_outside_graph=status.vectors_outside_graph,
        rebuilding=status.rebuilding,
    )


def reindex_response(progress: ReindexProgress) -> retrieval_pb2.ReindexResponse:
    return retrieval_pb2.ReindexResponse(
        applied=progress.applied,
        last_seq=progress.last_seq,
        done=progress.done,
        embedded=progress.embedded,
        embedding_model=progress.embedding_model,
    )


def cursor(request: retrieval_pb2.ListRequest) -> Cursor | None:
    if not request.HasField("after"):
        return None
    return Cursor(request.after.time_us, request.after.seq)


def list_response(turns: list[StoredTurn], next_key: Cursor | None) -> retrieval_pb2.ListResponse:
    out = retrieval_pb2.ListResponse(records=[record(t) for t in turns])
    if next_key is not None:
        out.next.CopyFrom(retrieval_pb2.ListCursor(time_us=next_key.time_us, seq=next_key.seq))
    return out


def list_sessions_response(
    sessions: list[SessionStats], next_after: str
) -> retrieval_pb2.ListSessionsResponse:
    return retrieval_pb2.ListSessionsResponse(
        sessions=[
            retrieval_pb2.SessionStats(
                session_id=s.session,
                turns=s.turns,
                first_time_us=s.first_time_us,
                last_time_us=s.last_time_us,
            )
            for s in sessions
        ],
        next=next_after,
    )


def list_users_response(users: list[UserStats], next_after: str) -> retrieval_pb2.ListUsersResponse:
    return retrieval_pb2.ListUsersResponse(
        users=[
            retrieval_pb2.UserStats(
                user_id=u.user,
                turns=u.turns,
                sessions=u.sessions,
                first_time_us=u.first_time_us,
                last_time_us=u.last_time_us,
            )
            for u in users
        ],
        next=next_after,
    )
