"""The audit service through gRPC (the `AuditLog` port)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import json_format, struct_pb2

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo_core import tracing
from hippo_core.client import calling
from hippo_gateway.domain.audit_events import AuditEvent, AuditRecord, EraseUser, Verification

VERIFY_TIMEOUT_S = 600.0
_STATES = {
    audit_pb2.PRIVATE_STATE_NONE: "none",
    audit_pb2.PRIVATE_STATE_SEALED: "sealed",
    audit_pb2.PRIVATE_STATE_READABLE: "readable",
    audit_pb2.PRIVATE_STATE_ERASED: "erased",
}


def _struct(value: object) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)  # type: ignore[arg-type]
    return out


def new_entry(event: AuditEvent) -> audit_pb2.NewEntry:
    entry = audit_pb2.NewEntry(
        tenant=event.tenant,
        actor=event.actor,
        event_type=event.event_type,
        user_id=event.user,
        session_id=event.session,
        memory_ids=list(event.memory_ids),
        body=_struct(event.body),
        idempotency_key=event.event_id,
    )
    if event.private:
        entry.private_body.CopyFrom(_struct(event.private))
    return entry


def record(e: audit_pb2.Entry) -> AuditRecord:
    return AuditRecord(
        seq=e.seq,
        time_us=e.time_us,
        actor=e.actor,
        event_type=e.event_type,
        user=e.user_id,
        session=e.session_id,
        memory_ids=tuple(e.memory_ids),
        body=json_format.MessageToDict(e.body),
        private=json_format.MessageToDict(e.private_body) if e.HasField("private_body") else None,
        private_state=_STATES.get(e.private_state, "none"),
        prev_hash=e.prev_hash,
        hash=e.hash,
    )


class GrpcAuditLog:
    """Calls carry the caller's remaining time (the channel's policy) or, from the
    background drainer, the channel's default deadline."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = audit_pb2_grpc.AuditServiceStub(channel)

    async def append(self, events: Sequence[AuditEvent]) -> list[int]:
        request = audit_pb2.AppendRequest(entries=[new_entry(e) for e in events])
        # Spooled events are delivered later, in batches: rejoin their callers' traces.
        with tracing.resumed("audit.deliver", [e.trace_parent for e in events]):
            async with calling("audit"):
                reply = await self._stub.Append(request)
        return [a.seq for a in reply.entries]

    async def erase_user(self, erase: EraseUser) -> int:
        request = audit_pb2.ForgetUserRequest(
            tenant=erase.tenant,
            user_id=erase.user,
            actor=erase.actor,
            idempotency_key=erase.event_id,
        )
        with tracing.resumed("audit.deliver", [erase.trace_parent]):
            async with calling("audit"):
                reply = await self._stub.ForgetUser(request)
        return int(reply.audit_seq)

    async def read(
        self, tenant: str, user: str, session: str, after_seq: int, to_seq: int, limit: int
    ) -> tuple[list[AuditRecord], int]:
        request = audit_pb2.ReadRequest(
            tenant=tenant,
            user_id=user,
            session_id=session,
            after_seq=after_seq,
            to_seq=to_seq,
            limit=limit,
            include_private=True,
        )
        async with calling("audit"):
            reply = await self._stub.Read(request)
        return [record(e) for e in reply.entries], int(reply.next_after_seq)

    async def verify(self, from_seq: int, to_seq: int, tenant: str = "") -> Verification:
        request = audit_pb2.VerifyRequest(from_seq=from_seq, to_seq=to_seq, tenant=tenant)
        # A long log takes a while (about 10 s per million entries): the caller's own
        # deadline bounds it, not the channel's short default.
        async with calling("audit"):
            reply = await self._stub.Verify(request, timeout=VERIFY_TIMEOUT_S)
        return Verification(
            ok=reply.ok,
            entries_checked=reply.entries_checked,
            first_bad_seq=reply.first_bad_seq,
            reason=reply.reason,
            head_seq=reply.head_seq,
            head_hash=reply.head_hash,
            tenant_entries=reply.tenant_entries,
            tenant_head_seq=reply.tenant_head_seq,
            tenant_head_hash=reply.tenant_head_hash,
        )
