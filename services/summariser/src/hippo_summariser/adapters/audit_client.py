"""The audit service through gRPC (the `AuditSink` port)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import struct_pb2

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo_core.client import calling
from hippo_summariser.domain.audit import ACTOR, EVENT_TYPE, MAX_IDS, body
from hippo_summariser.domain.models import MergeEvent


def new_entry(event: MergeEvent) -> audit_pb2.NewEntry:
    fields = struct_pb2.Struct()
    fields.update(body(event))  # type: ignore[arg-type]
    return audit_pb2.NewEntry(
        tenant=event.key.tenant,
        actor=ACTOR,
        event_type=EVENT_TYPE,
        user_id=event.key.user,
        session_id=event.key.session,
        memory_ids=list(event.merged_memory_ids[:MAX_IDS]),
        body=fields,
        idempotency_key=event.event_id,
    )


class GrpcAuditSink:
    """Calls run under the channel's default deadline (the drainer has no caller)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = audit_pb2_grpc.AuditServiceStub(channel)

    async def append(self, events: Sequence[MergeEvent]) -> None:
        request = audit_pb2.AppendRequest(entries=[new_entry(e) for e in events])
        async with calling("audit"):
            await self._stub.Append(request)
