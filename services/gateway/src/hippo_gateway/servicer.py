"""gRPC edge of the gateway: authenticate, convert in, one domain call, convert out."""

from __future__ import annotations

import grpc

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.errors import Unavailable, Unimplemented
from hippo_gateway import convert
from hippo_gateway.domain.auth import Authenticator
from hippo_gateway.domain.memory import MemoryService


class MemoryServicer(memory_pb2_grpc.MemoryServiceServicer):
    """Registered when the port binds; given its domain service once warm-up reached the
    peers. Until then health is NOT_SERVING and calls get UNAVAILABLE."""

    def __init__(self, auth: Authenticator) -> None:
        self._auth = auth
        self.service: MemoryService | None = None

    def _domain(self) -> MemoryService:
        if self.service is None:
            raise Unavailable("the gateway is still connecting to its peers; retry shortly")
        return self.service

    async def Remember(
        self, request: memory_pb2.RememberRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.RememberResponse:
        tenant = self._auth.tenant(context.invocation_metadata())
        result = await self._domain().remember(
            tenant,
            request.scope.user_id,
            request.scope.session_id,
            convert.turns_in(request),
            request.idempotency_key,
            request.wait_searchable,
        )
        return convert.remember_response(result)

    async def Recall(
        self, request: memory_pb2.RecallRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.RecallResponse:
        tenant = self._auth.tenant(context.invocation_metadata())
        result = await self._domain().recall(tenant, convert.recall_query(request))
        return convert.recall_response(result)

    async def Forget(
        self, request: memory_pb2.ForgetRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.ForgetResponse:
        tenant = self._auth.tenant(context.invocation_metadata())
        result = await self._domain().forget(tenant, convert.forget_target(request))
        return convert.forget_response(result)

    # Not served yet: they arrive with the summariser, the LLM host and the audit log.
    async def BuildContext(self, request: object, context: grpc.aio.ServicerContext) -> None:
        self._auth.tenant(context.invocation_metadata())
        raise Unimplemented("BuildContext is not served by this deployment yet")

    async def Chat(self, request: object, context: grpc.aio.ServicerContext) -> None:
        self._auth.tenant(context.invocation_metadata())
        raise Unimplemented("Chat is not served by this deployment yet")

    async def GetSession(self, request: object, context: grpc.aio.ServicerContext) -> None:
        self._auth.tenant(context.invocation_metadata())
        raise Unimplemented("GetSession is not served by this deployment yet")

    async def VerifyAudit(self, request: object, context: grpc.aio.ServicerContext) -> None:
        self._auth.tenant(context.invocation_metadata())
        raise Unimplemented("VerifyAudit is not served by this deployment yet")

    async def ListAuditEntries(self, request: object, context: grpc.aio.ServicerContext) -> None:
        self._auth.tenant(context.invocation_metadata())
        raise Unimplemented("ListAuditEntries is not served by this deployment yet")

    async def ReportOutcome(self, request: object, context: grpc.aio.ServicerContext) -> None:
        self._auth.tenant(context.invocation_metadata())
        raise Unimplemented("ReportOutcome is not served by this deployment yet")
