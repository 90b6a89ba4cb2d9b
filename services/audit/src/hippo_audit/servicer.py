"""gRPC edge of the audit service: convert in, one domain call, convert out."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo_audit import convert
from hippo_audit.domain import validation
from hippo_audit.domain.log import AuditLog
from hippo_core.errors import Unavailable


class AuditServicer(audit_pb2_grpc.AuditServiceServicer):
    """Registered when the port binds; given the log once warm-up has opened it. Until
    then health is NOT_SERVING and calls get UNAVAILABLE."""

    def __init__(self) -> None:
        self.log: AuditLog | None = None

    def _log(self) -> AuditLog:
        if self.log is None:
            raise Unavailable("the audit log is still opening; retry shortly")
        return self.log

    async def Append(
        self, request: audit_pb2.AppendRequest, context: grpc.aio.ServicerContext
    ) -> audit_pb2.AppendResponse:
        log = self._log()
        expected = validation.expected_hash(request.expected_prev_hash)
        results = await log.append(convert.new_entries(request), expected)
        return convert.append_response(results, log.head().seq)

    async def Head(
        self, request: audit_pb2.HeadRequest, context: grpc.aio.ServicerContext
    ) -> audit_pb2.HeadResponse:
        return convert.head_response(await self._log().current_head())

    async def Read(
        self, request: audit_pb2.ReadRequest, context: grpc.aio.ServicerContext
    ) -> audit_pb2.ReadResponse:
        limit = validation.check_read(
            request.tenant, request.user_id, request.session_id, request.event_types, request.limit
        )
        page = await self._log().read(
            convert.selection(request),
            request.after_seq,
            request.to_seq,
            limit,
            request.include_private,
        )
        return audit_pb2.ReadResponse(
            entries=[convert.entry(e) for e in page.entries], next_after_seq=page.next_after_seq
        )

    async def Stream(
        self, request: audit_pb2.StreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[audit_pb2.StreamResponse]:
        validation.check_read(
            request.tenant, request.user_id, request.session_id, request.event_types, 0
        )
        follow = self._log().follow(
            convert.selection(request), request.after_seq, request.include_private
        )
        async for entries in follow:
            yield audit_pb2.StreamResponse(entries=[convert.entry(e) for e in entries])

    async def Verify(
        self, request: audit_pb2.VerifyRequest, context: grpc.aio.ServicerContext
    ) -> audit_pb2.VerifyResponse:
        verdict = await self._log().verify(
            request.from_seq, request.to_seq, request.chain_only, request.tenant
        )
        return convert.verify_response(verdict)

    async def ForgetUser(
        self, request: audit_pb2.ForgetUserRequest, context: grpc.aio.ServicerContext
    ) -> audit_pb2.ForgetUserResponse:
        erased = await self._log().forget_user(
            request.tenant, request.user_id, request.actor, request.idempotency_key
        )
        return convert.forget_response(erased)
