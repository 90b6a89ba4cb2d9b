"""gRPC edge of the retrieval service: convert in, one domain call, convert out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_core.errors import Unavailable
from hippo_retrieval import convert
from hippo_retrieval.domain.service import RetrievalService


class RetrievalServicer(retrieval_pb2_grpc.RetrievalServiceServicer):
    """Registered when the port binds; given its domain service once warm-up has opened
    the stores. Until then health is NOT_SERVING and calls get UNAVAILABLE."""

    def __init__(self) -> None:
        self.service: RetrievalService | None = None

    def _domain(self) -> RetrievalService:
        if self.service is None:
            raise Unavailable("the retrieval stores are still opening; retry shortly")
        return self.service

    async def Write(
        self, request: retrieval_pb2.WriteRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.WriteResponse:
        result = await self._domain().write(
            request.tenant,
            convert.new_turns(request),
            request.wait_searchable,
            context.time_remaining(),
        )
        return convert.write_response(result)

    async def Search(
        self, request: retrieval_pb2.SearchRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.SearchResponse:
        result = await self._domain().search(
            convert.scope(request),
            request.query,
            convert.vector(request.vector, "vector"),
            convert.mode(request.mode),
            request.top_k or 10,
            request.vector_model,
            dict(request.query_repairs),
        )
        return convert.search_response(result)

    async def Get(
        self, request: retrieval_pb2.GetRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.GetResponse:
        turns = await self._domain().get(request.tenant, request.user_id, list(request.memory_ids))
        return retrieval_pb2.GetResponse(records=[convert.record(t) for t in turns])

    async def UpdateMetadata(
        self, request: retrieval_pb2.UpdateMetadataRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.UpdateMetadataResponse:
        turn, changed = await self._domain().update_metadata(
            request.tenant,
            request.user_id,
            request.memory_id,
            dict(request.set),
            list(request.remove),
            convert.vector(request.vector, "vector"),
            request.vector_model,
        )
        return retrieval_pb2.UpdateMetadataResponse(record=convert.record(turn), changed=changed)

    async def List(
        self, request: retrieval_pb2.ListRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.ListResponse:
        turns, next_key = await self._domain().list_turns(
            convert.scope(request), request.newest_first, convert.cursor(request), request.limit
        )
        return convert.list_response(turns, next_key)

    async def ListSessions(
        self, request: retrieval_pb2.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.ListSessionsResponse:
        sessions, next_after = await self._domain().list_sessions(
            request.tenant, request.user_id, request.after, request.limit
        )
        return convert.list_sessions_response(sessions, next_after)

    async def ListUsers(
        self, request: retrieval_pb2.ListUsersRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.ListUsersResponse:
        users, next_after = await self._domain().list_users(
            request.tenant, request.after, request.limit
        )
        return convert.list_users_response(users, next_after)

    async def Delete(
        self, request: retrieval_pb2.DeleteRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.DeleteResponse:
        erased = await self._domain().delete(
            request.tenant,
            request.user_id,
            request.session_id or None,
            list(request.memory_ids),
            context.time_remaining(),
        )
        return retrieval_pb2.DeleteResponse(memory_ids=erased)

    async def Status(
        self, request: retrieval_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.StatusResponse:
        # A thread: counting a tenant's turns is a query on the turn store.
        status = await asyncio.to_thread(self._domain().status, request.tenant)
        return convert.status_response(status)

    async def Reindex(
        self, request: retrieval_pb2.ReindexRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[retrieval_pb2.ReindexResponse]:
        async for progress in self._domain().reindex(request.embedding_model):
            yield convert.reindex_response(progress)
