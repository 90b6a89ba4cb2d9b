"""Pure conversion between the SDK's plain Python and the protobuf messages.

Inputs: strings for enums, `datetime`s (a naive one is taken as UTC), `(role, text)`
pairs or `Turn`s. Outputs: the frozen dataclasses of `types.py`. An input the API cannot
express (an unknown role name) raises `InvalidArgument` naming the parameter, before any
call is made.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar, cast

from google.protobuf import json_format, timestamp_pb2

from hippo.memory.v1 import memory_pb2 as pb
from hippo_client import types
from hippo_client.errors import InvalidArgument

V = TypeVar("V")

ROLES: dict[str, pb.Role] = {
    "user": pb.ROLE_USER,
    "assistant": pb.ROLE_ASSISTANT,
    "system": pb.ROLE_SYSTEM,
    "tool": pb.ROLE_TOOL,
}
MODES: dict[str, pb.RecallMode] = {
    "hybrid": pb.RECALL_MODE_HYBRID,
    "lexical": pb.RECALL_MODE_LEXICAL,
    "semantic": pb.RECALL_MODE_SEMANTIC,
}
LAYOUTS: dict[str, pb.ContextLayout] = {
    "boundary_weighted": pb.CONTEXT_LAYOUT_BOUNDARY_WEIGHTED,
    "chronological": pb.CONTEXT_LAYOUT_CHRONOLOGICAL,
    "summary_in_system": pb.CONTEXT_LAYOUT_SUMMARY_IN_SYSTEM,
}
INFLUENCE: dict[str, pb.InfluenceMode] = {
    "off": pb.INFLUENCE_MODE_OFF,
    "disclose_only": pb.INFLUENCE_MODE_DISCLOSE_ONLY,
    "on": pb.INFLUENCE_MODE_ON,
}
OUTCOMES: dict[str, pb.OutcomeKind] = {
    "accepted": pb.OUTCOME_KIND_ACCEPTED,
    "rejected": pb.OUTCOME_KIND_REJECTED,
    "corrected": pb.OUTCOME_KIND_CORRECTED,
    "note": pb.OUTCOME_KIND_NOTE,
}
ZONES: dict[int, types.ZoneKind] = {
    pb.ZONE_KIND_SYSTEM: "system",
    pb.ZONE_KIND_MEMORIES: "memories",
    pb.ZONE_KIND_SUMMARY: "summary",
    pb.ZONE_KIND_WINDOW: "window",
    pb.ZONE_KIND_QUERY: "query",
}
ORDERS: dict[str, pb.ListOrder] = {
    "newest": pb.LIST_ORDER_NEWEST_FIRST,
    "oldest": pb.LIST_ORDER_OLDEST_FIRST,
}
_ROLE_NAMES: dict[int, str] = {number: name for name, number in ROLES.items()}


def enum_in(table: Mapping[str, V], value: str | None, param: str) -> V:
    """The enum number of a name; None is the proto's UNSPECIFIED (the server default)."""
    if value is None:
        return cast(V, 0)
    try:
        return table[value]
    except KeyError:
        names = ", ".join(repr(name) for name in table)
        raise InvalidArgument(f"{param}: {value!r} is not one of {names}", field=param) from None


def role_out(number: int) -> Any:
    # A role this SDK does not know (a newer server's) passes through, never fails a read.
    if number in _ROLE_NAMES:
        return _ROLE_NAMES[number]
    try:
        return pb.Role.Name(number).removeprefix("ROLE_").lower()
    except ValueError:
        return f"role_{number}"


def timestamp(value: datetime) -> timestamp_pb2.Timestamp:
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(value)
    return out


def time_out(message: Any, name: str) -> datetime | None:
    if not message.HasField(name):
        return None
    stamp: timestamp_pb2.Timestamp = getattr(message, name)
    return stamp.ToDatetime(tzinfo=timezone.utc)


def scope(user: str, session: str | None = None) -> pb.Scope:
    return pb.Scope(user_id=user, session_id=session or "")


def turn_in(turn: types.Turn | tuple[str, str], index: int) -> pb.Turn:
    if not isinstance(turn, types.Turn):
        role, text = turn
        turn = types.Turn(role=role, text=text)  # type: ignore[arg-type]
    return pb.Turn(
        role=enum_in(ROLES, turn.role, f"turns[{index}].role"),
        text=turn.text,
        time=timestamp(turn.time) if turn.time is not None else None,
        client_id=turn.client_id,
        metadata=dict(turn.metadata),
    )


def turns_in(turns: Iterable[types.Turn | tuple[str, str]]) -> list[pb.Turn]:
    return [turn_in(turn, i) for i, turn in enumerate(turns)]


def time_range(since: datetime | None, until: datetime | None) -> pb.TimeRange | None:
    if since is None and until is None:
        return None
    return pb.TimeRange(
        start=timestamp(since) if since is not None else None,
        end=timestamp(until) if until is not None else None,
    )


def roles_in(roles: Sequence[str] | None) -> list[pb.Role]:
    if isinstance(roles, str):  # "user" would otherwise be four one-letter roles
        roles = [roles]
    return [enum_in(ROLES, role, f"roles[{i}]") for i, role in enumerate(roles or ())]


def memory(record: pb.MemoryRecord) -> types.Memory:
    return types.Memory(
        id=record.memory_id,
        user=record.scope.user_id,
        session=record.scope.session_id,
        role=role_out(record.role),
        text=record.text,
        time=time_out(record, "time"),
        client_id=record.client_id,
        metadata=dict(record.metadata),
        sequence=record.sequence,
    )


def remember_result(reply: pb.RememberResponse) -> types.RememberResult:
    return types.RememberResult(tuple(reply.memory_ids), reply.created, reply.deduplicated)


def hit(message: pb.Hit) -> types.Hit:
    return types.Hit(
        memory=memory(message.memory),
        fused_score=message.fused_score,
        lexical_rank=message.lexical_rank,
        semantic_rank=message.semantic_rank,
        lexical_score=message.lexical_score,
        semantic_score=message.semantic_score,
    )


def recall_result(reply: pb.RecallResponse) -> types.RecallResult:
    return types.RecallResult(
        hits=tuple(hit(h) for h in reply.hits),
        lexical_candidates=reply.lexical_candidates,
        semantic_candidates=reply.semantic_candidates,
        query_repairs=dict(reply.query_repairs),
    )


def token_counts(message: pb.TokenCounts) -> types.TokenCounts:
    return types.TokenCounts(
        budget=message.budget,
        total=message.total,
        system=message.system,
        memories=message.memories,
        summary=message.summary,
        window=message.window,
        query=message.query,
    )


def context(reply: pb.BuildContextResponse) -> types.Context:
    return types.Context(
        messages=tuple(types.ChatMessage(role_out(m.role), m.text) for m in reply.messages),
        zones=tuple(
            types.ContextZone(
                kind=ZONES.get(z.kind, "system"),
                text=z.text,
                tokens=z.tokens,
                memory_ids=tuple(z.memory_ids),
            )
            for z in reply.zones
        ),
        tokens=token_counts(reply.tokens),
        memory_ids_used=tuple(reply.memory_ids_used),
        summary=reply.summary,
        disclosure_note=reply.disclosure_note,
        prompt=reply.prompt,
        audit_seq=reply.audit_seq,
    )


def chat_start(message: pb.ChatStart) -> types.ChatStart:
    return types.ChatStart(
        memory_ids_used=tuple(message.memory_ids_used),
        disclosure_note=message.disclosure_note,
        tokens=token_counts(message.tokens),
    )


def chat_end(message: pb.ChatEnd) -> types.ChatEnd:
    return types.ChatEnd(
        finish_reason=message.finish_reason,
        generated_tokens=message.generated_tokens,
        user_memory_id=message.user_memory_id,
        assistant_memory_id=message.assistant_memory_id,
        influences=tuple(
            types.AppliedInfluence(i.memtok_id, i.source_words, i.layer, i.strength)
            for i in message.influences
        ),
        audit_seq=message.audit_seq,
    )


def forget_result(reply: pb.ForgetResponse) -> types.ForgetResult:
    return types.ForgetResult(
        memories_deleted=reply.memories_deleted,
        sessions_deleted=reply.sessions_deleted,
        memtoks_deleted=reply.memtoks_deleted,
        cache_entries_dropped=reply.cache_entries_dropped,
        audit_key_destroyed=reply.audit_key_destroyed,
    )


def session(user: str, name: str, reply: pb.GetSessionResponse) -> types.Session:
    return types.Session(
        user=user,
        session=name,
        window=tuple(memory(r) for r in reply.window),
        summary=reply.summary,
        version=reply.version,
        window_tokens=reply.window_tokens,
        summary_tokens=reply.summary_tokens,
        turns_total=reply.turns_total,
        updated=time_out(reply, "updated"),
    )


def verification(reply: pb.VerifyAuditResponse) -> types.AuditVerification:
    return types.AuditVerification(
        ok=reply.ok,
        entries_checked=reply.entries_checked,
        first_bad_seq=reply.first_bad_seq,
        reason=reply.reason,
        head_seq=reply.head_seq,
        head_hash=reply.head_hash,
    )


def audit_entry(entry: pb.AuditEntry) -> types.AuditEntry:
    return types.AuditEntry(
        seq=entry.seq,
        time=time_out(entry, "time"),
        actor=entry.actor,
        event_type=entry.event_type,
        user=entry.user_id,
        session=entry.session_id,
        memory_ids=tuple(entry.memory_ids),
        body=json_format.MessageToDict(entry.body),
        prev_hash=entry.prev_hash,
        hash=entry.hash,
    )


def audit_page(reply: pb.ListAuditEntriesResponse) -> types.Page[types.AuditEntry]:
    return types.Page(tuple(audit_entry(e) for e in reply.entries), reply.next_page_token)


def record_in(memory: types.Memory) -> pb.MemoryRecord:
    """A memory back into a record, as ImportTurns takes it (`sequence` is the store's)."""
    out = pb.MemoryRecord(
        memory_id=memory.id,
        scope=scope(memory.user, memory.session),
        role=enum_in(ROLES, memory.role, "role"),
        text=memory.text,
        client_id=memory.client_id,
        metadata=dict(memory.metadata),
    )
    if memory.time is not None:
        out.time.CopyFrom(timestamp(memory.time))
    return out


def memories_page(reply: pb.ListMemoriesResponse) -> types.Page[types.Memory]:
    return types.Page(tuple(memory(m) for m in reply.memories), reply.next_page_token)


def session_info(message: pb.SessionInfo) -> types.SessionInfo:
    return types.SessionInfo(
        session=message.session_id,
        turn_count=message.turn_count,
        first_time=time_out(message, "first_time"),
        last_time=time_out(message, "last_time"),
        summary_version=message.summary_version,
    )


def sessions_page(reply: pb.ListSessionsResponse) -> types.Page[types.SessionInfo]:
    return types.Page(tuple(session_info(s) for s in reply.sessions), reply.next_page_token)


def users_page(reply: pb.ListUsersResponse) -> types.Page[types.UserInfo]:
    users = (
        types.UserInfo(
            user=u.user_id,
            turn_count=u.turn_count,
            session_count=u.session_count,
            first_time=time_out(u, "first_time"),
            last_time=time_out(u, "last_time"),
        )
        for u in reply.users
    )
    return types.Page(tuple(users), reply.next_page_token)


def metadata_update(reply: pb.UpdateMemoryMetadataResponse) -> types.MetadataUpdate:
    return types.MetadataUpdate(memory(reply.memory), reply.audit_seq)


def export_item(message: pb.ExportUserResponse) -> types.ExportItem | None:
    """One export item; None for an item kind this SDK does not know (a newer server's)."""
    kind = message.WhichOneof("item")
    if kind == "header":
        h = message.header
        return types.ExportHeader(h.format_version, h.user_id, h.audit_seq, time_out(h, "time"))
    if kind == "memory":
        return memory(message.memory)
    if kind == "session":
        s = message.session
        return types.ExportedSession(session_info(s.session), s.summary, s.version)
    if kind == "footer":
        return types.ExportFooter(message.footer.memories, message.footer.sessions)
    return None


def import_result(reply: pb.ImportTurnsResponse) -> types.ImportResult:
    return types.ImportResult(reply.created, reply.deduplicated)
