"""Pure conversions between audit protobuf messages and domain values."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from google.protobuf import struct_pb2

from hippo.audit.v1 import audit_pb2
from hippo_audit.domain.models import (
    Appended,
    Checkpoint,
    Erased,
    Filter,
    Head,
    NewEntry,
    PrivateState,
    ReadEntry,
    Verdict,
)

_PRIVATE_STATE = {
    PrivateState.NONE: audit_pb2.PRIVATE_STATE_NONE,
    PrivateState.SEALED: audit_pb2.PRIVATE_STATE_SEALED,
    PrivateState.READABLE: audit_pb2.PRIVATE_STATE_READABLE,
    PrivateState.ERASED: audit_pb2.PRIVATE_STATE_ERASED,
}


def _value(v: struct_pb2.Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "struct_value":
        return struct_dict(v.struct_value)
    if kind == "list_value":
        return [_value(x) for x in v.list_value.values]
    if kind == "string_value":
        return v.string_value
    if kind == "number_value":
        return v.number_value
    if kind == "bool_value":
        return v.bool_value
    return None


def struct_dict(value: struct_pb2.Struct) -> dict[str, Any]:
    """A Struct as plain Python values (json_format.MessageToDict, at twice the speed:
    it runs for every entry of every Append)."""
    return {k: _value(v) for k, v in value.fields.items()}


def to_struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def new_entries(request: audit_pb2.AppendRequest) -> list[NewEntry]:
    return [
        NewEntry(
            tenant=e.tenant,
            actor=e.actor,
            event_type=e.event_type,
            user=e.user_id,
            session=e.session_id,
            memory_ids=tuple(e.memory_ids),
            body=struct_dict(e.body),
            private=struct_dict(e.private_body) if e.HasField("private_body") else None,
            idempotency_key=e.idempotency_key,
        )
        for e in request.entries
    ]


def append_response(results: list[Appended], head_seq: int) -> audit_pb2.AppendResponse:
    return audit_pb2.AppendResponse(
        entries=[
            audit_pb2.Appended(seq=a.seq, hash=a.hash.hex(), duplicate=a.duplicate) for a in results
        ],
        head_seq=head_seq,
    )


def checkpoint(cp: Checkpoint) -> audit_pb2.Checkpoint:
    return audit_pb2.Checkpoint(
        size=cp.size,
        hash=cp.hash.hex(),
        time_us=cp.time_us,
        key_id=cp.key_id,
        signature=cp.signature,
    )


def head_response(head: Head) -> audit_pb2.HeadResponse:
    out = audit_pb2.HeadResponse(
        seq=head.seq,
        hash=head.hash.hex(),
        public_key=head.public_key,
        key_id=head.key_id,
        writable=head.writable,
        problem=head.problem,
    )
    if head.checkpoint is not None:
        out.latest_checkpoint.CopyFrom(checkpoint(head.checkpoint))
    return out


def selection(request: audit_pb2.ReadRequest | audit_pb2.StreamRequest) -> Filter:
    return Filter(
        tenant=request.tenant,
        user=request.user_id,
        session=request.session_id,
        event_types=frozenset(request.event_types),
    )


def entry(item: ReadEntry) -> audit_pb2.Entry:
    e = item.entry
    out = audit_pb2.Entry(
        seq=e.seq,
        time_us=e.time_us,
        tenant=e.tenant,
        actor=e.actor,
        event_type=e.event_type,
        user_id=e.user,
        session_id=e.session,
        memory_ids=list(e.memory_ids),
        body=to_struct(json.loads(e.body)),
        private_state=_PRIVATE_STATE[item.private_state],
        idempotency_key=e.idempotency_key,
        prev_hash=e.prev_hash.hex(),
        hash=e.hash.hex(),
    )
    if item.private is not None:
        out.private_body.CopyFrom(to_struct(item.private))
    return out


def verify_response(v: Verdict) -> audit_pb2.VerifyResponse:
    out = audit_pb2.VerifyResponse(
        ok=v.ok,
        entries_checked=v.entries_checked,
        first_bad_seq=v.first_bad_seq,
        reason=v.reason,
        head_seq=v.head_seq,
        head_hash=v.head_hash.hex(),
        checkpoints_checked=v.checkpoints_checked,
        tenant_entries=v.tenant_entries,
        tenant_head_seq=v.tenant_head_seq,
        tenant_head_hash=v.tenant_head_hash.hex(),
    )
    if v.latest_checkpoint is not None:
        out.latest_checkpoint.CopyFrom(checkpoint(v.latest_checkpoint))
    return out


def forget_response(erased: Erased) -> audit_pb2.ForgetUserResponse:
    return audit_pb2.ForgetUserResponse(keys_destroyed=erased.keys_destroyed, audit_seq=erased.seq)
