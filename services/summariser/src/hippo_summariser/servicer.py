"""gRPC edge of the summariser: convert in, one domain call, convert out."""

from __future__ import annotations

import grpc

from hippo.summariser.v1 import summariser_pb2 as pb
from hippo.summariser.v1 import summariser_pb2_grpc
from hippo_core.errors import Unavailable
from hippo_summariser import convert
from hippo_summariser.domain.service import SummariserService


class SummariserServicer(summariser_pb2_grpc.SummariserServiceServicer):
    """Registered when the port binds; given its domain service once warm-up has opened
    the store. Until then health is NOT_SERVING and calls get UNAVAILABLE."""

    def __init__(self) -> None:
        self.service: SummariserService | None = None

    def _domain(self) -> SummariserService:
        if self.service is None:
            raise Unavailable("the session store is still opening; retry shortly")
        return self.service

    async def Append(
        self, request: pb.AppendRequest, context: grpc.aio.ServicerContext
    ) -> pb.AppendResponse:
        result = await self._domain().append(convert.key(request), convert.turns_in(request.turns))
        return convert.append_response(result)

    async def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSessionResponse:
        return convert.session(await self._domain().get(convert.key(request)))

    async def SessionVersions(
        self, request: pb.SessionVersionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.SessionVersionsResponse:
        versions = await self._domain().versions(
            request.tenant, request.user_id, list(request.session_ids)
        )
        return pb.SessionVersionsResponse(versions=versions)

    async def Forget(
        self, request: pb.ForgetRequest, context: grpc.aio.ServicerContext
    ) -> pb.ForgetResponse:
        result = await self._domain().forget(
            request.tenant, request.user_id, request.session_id, list(request.memory_ids)
        )
        return convert.forget_response(result)

    async def Flush(
        self, request: pb.FlushRequest, context: grpc.aio.ServicerContext
    ) -> pb.FlushResponse:
        view = await self._domain().flush(convert.key(request), context.time_remaining())
        return pb.FlushResponse(session=convert.session(view))
