"""gRPC edge of the gateway: authenticate, convert in, one domain call, convert out."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.errors import Unavailable, Unimplemented
from hippo_gateway import convert
from hippo_gateway.domain.audit_trail import AuditTrail
from hippo_gateway.domain.auth import Authenticator, Caller
from hippo_gateway.domain.chat import ChatService
from hippo_gateway.domain.context import ContextBuilder
from hippo_gateway.domain.listing import Listings
from hippo_gateway.domain.memory import MemoryService
from hippo_gateway.domain.quota import Quotas
from hippo_gateway.domain.transfer import Imported, Transfers


class MemoryServicer(memory_pb2_grpc.MemoryServiceServicer):
    """Registered when the port binds; given its domain service once warm-up reached the
    peers. Until then health is NOT_SERVING and calls get UNAVAILABLE."""

    def __init__(self, auth: Authenticator, quotas: Quotas) -> None:
        self._auth = auth
        self._quotas = quotas
        self.service: MemoryService | None = None
        self.context: ContextBuilder | None = None
        self.chat: ChatService | None = None
        self.audit: AuditTrail | None = None
        self.listings: Listings | None = None
        self.transfers: Transfers | None = None

    def _caller(self, context: grpc.aio.ServicerContext, rpc: str) -> Caller:
        """Authenticated, allowed by the key's roles, within the tenant's request rate."""
        caller = self._auth.caller(context.invocation_metadata(), rpc)
        self._quotas.admit(caller.tenant)
        return caller

    def _domain(self) -> MemoryService:
        if self.service is None:
            raise Unavailable("the gateway is still connecting to its peers; retry shortly")
        return self.service

    def _context(self) -> ContextBuilder:
        if self.context is None:
            raise Unavailable("the gateway is still connecting to its peers; retry shortly")
        return self.context

    def _audit(self) -> AuditTrail:
        if self.audit is None:
            if self.service is not None:  # warm: this deployment has no audit log
                raise Unimplemented("this deployment has no audit log (audit_addr is empty)")
            raise Unavailable("the gateway is still connecting to its peers; retry shortly")
        return self.audit

    def _listings(self) -> Listings:
        if self.listings is None:
            raise Unavailable("the gateway is still connecting to its peers; retry shortly")
        return self.listings

    def _transfers(self) -> Transfers:
        if self.transfers is None:
            raise Unavailable("the gateway is still connecting to its peers; retry shortly")
        return self.transfers

    def _chat(self) -> ChatService:
        if self.chat is None:
            raise Unavailable("the gateway is still connecting to its peers; retry shortly")
        return self.chat

    async def Remember(
        self, request: memory_pb2.RememberRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.RememberResponse:
        tenant = self._caller(context, "Remember").tenant
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
        tenant = self._caller(context, "Recall").tenant
        result = await self._domain().recall(tenant, convert.recall_query(request))
        return convert.recall_response(result)

    async def Forget(
        self, request: memory_pb2.ForgetRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.ForgetResponse:
        tenant = self._caller(context, "Forget").tenant
        result = await self._domain().forget(tenant, convert.forget_target(request))
        return convert.forget_response(result)

    async def BuildContext(
        self, request: memory_pb2.BuildContextRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.BuildContextResponse:
        tenant = self._caller(context, "BuildContext").tenant
        disclosed = await self._context().build_disclosed(
            tenant,
            request.scope.user_id,
            request.scope.session_id,
            request.query,
            budget=request.token_budget,
            layout=convert.layout(request.layout),
            mode=convert.mode(request.mode),
            top_k=request.top_k,
        )
        return convert.build_context_response(disclosed)

    async def Chat(
        self, request: memory_pb2.ChatRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[memory_pb2.ChatResponse]:
        tenant = self._caller(context, "Chat").tenant
        events = self._chat().chat(
            tenant,
            request.scope.user_id,
            request.scope.session_id,
            request.message,
            budget=request.token_budget,
            params=convert.generation(request.params),
            influence=convert.influence(request.influence),
        )
        async for event in events:
            yield convert.chat_response(event)

    async def GetSession(
        self, request: memory_pb2.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.GetSessionResponse:
        tenant = self._caller(context, "GetSession").tenant
        state, records = await self._domain().session_view(
            tenant, request.scope.user_id, request.scope.session_id
        )
        return convert.get_session_response(state, records)

    async def ListMemories(
        self, request: memory_pb2.ListMemoriesRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.ListMemoriesResponse:
        tenant = self._caller(context, "ListMemories").tenant
        memories, token = await self._listings().memories(
            tenant, convert.list_query(request), request.page_size, request.page_token
        )
        return convert.list_memories_response(memories, token)

    async def GetMemory(
        self, request: memory_pb2.GetMemoryRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.GetMemoryResponse:
        tenant = self._caller(context, "GetMemory").tenant
        found = await self._listings().memory(tenant, request.user_id, request.memory_id)
        return memory_pb2.GetMemoryResponse(memory=convert.record(found))

    async def ListSessions(
        self, request: memory_pb2.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.ListSessionsResponse:
        tenant = self._caller(context, "ListSessions").tenant
        sessions, token = await self._listings().sessions(
            tenant, request.user_id, request.page_size, request.page_token
        )
        return convert.list_sessions_response(sessions, token)

    async def ListUsers(
        self, request: memory_pb2.ListUsersRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.ListUsersResponse:
        tenant = self._caller(context, "ListUsers").tenant
        users, token = await self._listings().users(tenant, request.page_size, request.page_token)
        return convert.list_users_response(users, token)

    async def UpdateMemoryMetadata(
        self, request: memory_pb2.UpdateMemoryMetadataRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.UpdateMemoryMetadataResponse:
        tenant = self._caller(context, "UpdateMemoryMetadata").tenant
        updated, seq = await self._domain().update_metadata(
            tenant, request.user_id, request.memory_id, dict(request.set), list(request.remove)
        )
        return memory_pb2.UpdateMemoryMetadataResponse(
            memory=convert.record(updated), audit_seq=seq
        )

    async def ExportUser(
        self, request: memory_pb2.ExportUserRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[memory_pb2.ExportUserResponse]:
        tenant = self._caller(context, "ExportUser").tenant
        async for item in self._transfers().export(tenant, request.user_id):
            yield convert.export_item(item)

    async def ImportTurns(
        self,
        requests: AsyncIterator[memory_pb2.ImportTurnsRequest],
        context: grpc.aio.ServicerContext,
    ) -> memory_pb2.ImportTurnsResponse:
        tenant = self._caller(context, "ImportTurns").tenant
        transfers = self._transfers()
        total = Imported(0, 0)
        async for request in requests:
            done = await transfers.import_batch(tenant, convert.import_records(request))
            total = Imported(total.created + done.created, total.deduplicated + done.deduplicated)
        return memory_pb2.ImportTurnsResponse(
            created=total.created, deduplicated=total.deduplicated
        )

    async def VerifyAudit(
        self, request: memory_pb2.VerifyAuditRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.VerifyAuditResponse:
        caller = self._caller(context, "VerifyAudit")
        # Admins see the whole log; any other key only its tenant's entries and head.
        tenant = None if caller.admin else caller.tenant
        result = await self._audit().verify(request.from_seq, request.to_seq, tenant)
        return convert.verify_audit_response(result)

    async def ListAuditEntries(
        self, request: memory_pb2.ListAuditEntriesRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.ListAuditEntriesResponse:
        tenant = self._caller(context, "ListAuditEntries").tenant
        records, token = await self._audit().entries(
            tenant,
            request.scope.user_id,
            request.scope.session_id,
            request.page_size,
            request.page_token,
        )
        return convert.list_audit_response(records, token)

    async def ReportOutcome(
        self, request: memory_pb2.ReportOutcomeRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.ReportOutcomeResponse:
        tenant = self._caller(context, "ReportOutcome").tenant
        seq = await self._audit().report(tenant, convert.outcome(request))
        return memory_pb2.ReportOutcomeResponse(audit_seq=seq)
