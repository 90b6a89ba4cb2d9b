"""Pure conversions between the summariser's protobuf messages and domain values."""

from __future__ import annotations

from collections.abc import Sequence

from hippo.memory.v1 import memory_pb2
from hippo.summariser.v1 import summariser_pb2 as pb
from hippo_core.errors import InvalidArgument
from hippo_summariser.domain.models import (
    Appended,
    Forgotten,
    Role,
    SessionKey,
    SessionView,
    TurnIn,
)

_ROLES = {
    memory_pb2.ROLE_USER: Role.USER,
    memory_pb2.ROLE_ASSISTANT: Role.ASSISTANT,
    memory_pb2.ROLE_SYSTEM: Role.SYSTEM,
    memory_pb2.ROLE_TOOL: Role.TOOL,
}
_ROLE_PB = {v: k for k, v in _ROLES.items()}


def key(request: pb.AppendRequest | pb.GetSessionRequest | pb.FlushRequest) -> SessionKey:
    return SessionKey(request.tenant, request.user_id, request.session_id)


def turns_in(turns: Sequence[pb.SessionTurn]) -> list[TurnIn]:
    out = []
    for i, t in enumerate(turns):
        if t.role not in _ROLES:
            raise InvalidArgument(
                f"turns[{i}].role", f"must be one of ROLE_USER..ROLE_TOOL, got {t.role}"
            )
        out.append(
            TurnIn(
                memory_id=t.memory_id,
                role=_ROLES[t.role],
                text=t.text,
                time_us=t.time_us,
                speaker=t.speaker,
            )
        )
    return out


def append_response(result: Appended) -> pb.AppendResponse:
    return pb.AppendResponse(
        version=result.version, appended=result.appended, merge_pending=result.merge_pending
    )


def session(view: SessionView) -> pb.GetSessionResponse:
    s, stats = view.session, view.session.stats
    return pb.GetSessionResponse(
        window=[
            pb.SessionTurn(
                memory_id=t.memory_id,
                role=_ROLE_PB[t.role],
                text=t.text,
                time_us=t.time_us,
                speaker=t.speaker,
                tokens=t.tokens or 0,
            )
            for t in s.window
        ],
        summary=s.summary,
        version=s.version,
        window_tokens=s.window_tokens,
        summary_tokens=s.summary_tokens,
        turns_total=s.turns_total,
        updated_us=s.updated_us,
        merge_pending=view.merge_pending,
        window_budget=view.window_budget,
        merge_stats=pb.MergeStats(
            merges=stats.merges,
            turns_merged=stats.turns_merged,
            facts=stats.facts,
            facts_kept_llm=stats.facts_kept_llm,
            facts_kept=stats.facts_kept,
            last_retention_llm=stats.last_retention_llm,
            last_retention=stats.last_retention,
            llm_failures=stats.llm_failures,
        ),
        summary_budget=view.summary_budget,
    )


def forget_response(result: Forgotten) -> pb.ForgetResponse:
    return pb.ForgetResponse(
        sessions_deleted=result.sessions_deleted,
        turns_removed=result.turns_removed,
        summaries_erased=result.summaries_erased,
    )
