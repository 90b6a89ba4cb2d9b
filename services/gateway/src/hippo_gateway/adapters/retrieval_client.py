"""The retrieval service through gRPC (the `TurnStore` port)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc

from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_core import client
from hippo_core.client import calling
from hippo_core.errors import NotFound
from hippo_gateway import convert
from hippo_gateway.adapters.embedding_model import LiveModel
from hippo_gateway.domain.models import (
    ListKey,
    ListQuery,
    Memory,
    Recalled,
    RecallQuery,
    SessionInfo,
    TurnToStore,
    UserInfo,
    Vectors,
)


class GrpcTurnStore:
    """Every reply that names the live index's embedding model updates `live`, which the
    embedder reads: after a reindex with another model the next turns and queries are
    embedded with it."""

    def __init__(self, channel: grpc.aio.Channel, live: LiveModel | None = None) -> None:
        self._stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        self._live = live or LiveModel()

    async def write(
        self, tenant: str, turns: Sequence[TurnToStore], wait_searchable: bool = False
    ) -> list[tuple[Memory, bool]]:
        request = retrieval_pb2.WriteRequest(
            tenant=tenant,
            turns=[convert.new_turn(t) for t in turns],
            wait_searchable=wait_searchable,
        )
        async with calling("retrieval"):
            # A batch of turns: it may take most of the caller's time, not one hop's.
            reply = await self._stub.Write(request, timeout=client.bulk_timeout())
        self._live.learn(reply.embedding_model)
        return [
            (convert.memory(r), bool(c)) for r, c in zip(reply.records, reply.created, strict=True)
        ]

    async def search(
        self, tenant: str, query: RecallQuery, vector: Vectors | None, vector_model: str = ""
    ) -> Recalled:
        packed = b"" if vector is None else vector.astype("<f4").tobytes()
        request = convert.search_request(tenant, query, packed, vector_model)
        async with calling("retrieval"):
            reply = await self._stub.Search(request)
        self._live.learn(reply.embedding_model)
        return Recalled(
            hits=[convert.hit(h) for h in reply.hits],
            lexical_candidates=reply.lexical_candidates,
            semantic_candidates=reply.semantic_candidates,
        )

    async def get(self, tenant: str, user: str, memory_ids: Sequence[str]) -> list[Memory]:
        request = retrieval_pb2.GetRequest(tenant=tenant, user_id=user, memory_ids=list(memory_ids))
        async with calling("retrieval"):
            reply = await self._stub.Get(request)
        return [convert.memory(r) for r in reply.records]

    async def tenant_turns(self, tenant: str) -> int:
        """Turns the tenant stores (its stored-turn quota)."""
        async with calling("retrieval"):
            reply = await self._stub.Status(retrieval_pb2.StatusRequest(tenant=tenant))
        self._live.learn(reply.embedding_model)
        return int(reply.tenant_turns)

    async def delete(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> list[str]:
        request = retrieval_pb2.DeleteRequest(
            tenant=tenant, user_id=user, session_id=session or "", memory_ids=list(memory_ids)
        )
        async with calling("retrieval"):
            reply = await self._stub.Delete(request)
        return list(reply.memory_ids)

    async def update_metadata(
        self,
        tenant: str,
        user: str,
        memory_id: str,
        set_: Mapping[str, str],
        remove: Sequence[str],
        vector: Vectors | None = None,
        vector_model: str = "",
    ) -> tuple[Memory, bool]:
        request = retrieval_pb2.UpdateMetadataRequest(
            tenant=tenant,
            user_id=user,
            memory_id=memory_id,
            set=dict(set_),
            remove=list(remove),
            vector=b"" if vector is None else vector.astype("<f4").tobytes(),
            vector_model=vector_model,
        )
        try:
            async with calling("retrieval"):
                reply = await self._stub.UpdateMetadata(request)
        except NotFound as exc:  # forgotten since the gateway read it
            raise NotFound(
                f"memory_id: no memory {memory_id!r} for this user", reason="MEMORY_NOT_FOUND"
            ) from exc
        return convert.memory(reply.record), reply.changed

    async def list_memories(
        self, tenant: str, query: ListQuery, after: ListKey | None, limit: int
    ) -> tuple[list[Memory], ListKey | None]:
        request = convert.list_request(tenant, query, after, limit)
        async with calling("retrieval"):
            reply = await self._stub.List(request)
        next_key = (reply.next.time_us, reply.next.seq) if reply.HasField("next") else None
        return [convert.memory(r) for r in reply.records], next_key

    async def list_sessions(
        self, tenant: str, user: str, after: str, limit: int
    ) -> tuple[list[SessionInfo], str]:
        request = retrieval_pb2.ListSessionsRequest(
            tenant=tenant, user_id=user, after=after, limit=limit
        )
        async with calling("retrieval"):
            reply = await self._stub.ListSessions(request)
        return [convert.session_info(s) for s in reply.sessions], reply.next

    async def list_users(self, tenant: str, after: str, limit: int) -> tuple[list[UserInfo], str]:
        request = retrieval_pb2.ListUsersRequest(tenant=tenant, after=after, limit=limit)
        async with calling("retrieval"):
            reply = await self._stub.ListUsers(request)
        return [convert.user_info(u) for u in reply.users], reply.next
