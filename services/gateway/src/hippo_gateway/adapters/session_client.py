"""The summariser service through gRPC (the `Sessions` port)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from hippo.summariser.v1 import summariser_pb2, summariser_pb2_grpc
from hippo_core.client import calling
from hippo_gateway import convert
from hippo_gateway.domain.models import SessionState, SessionTurn


class NoSessions:
    """A deployment without bounded sessions (`summariser_addr` empty): no window, no
    summary; BuildContext then holds memories and the query only."""

    async def append(
        self, tenant: str, user: str, session: str, turns: Sequence[SessionTurn]
    ) -> None:
        return None

    async def get(self, tenant: str, user: str, session: str) -> SessionState:
        return SessionState([], "", 0)

    async def versions(self, tenant: str, user: str, sessions: Sequence[str]) -> dict[str, int]:
        return {}

    async def forget(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> int:
        return 0


class GrpcSessions:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = summariser_pb2_grpc.SummariserServiceStub(channel)

    async def append(
        self, tenant: str, user: str, session: str, turns: Sequence[SessionTurn]
    ) -> None:
        request = summariser_pb2.AppendRequest(
            tenant=tenant,
            user_id=user,
            session_id=session,
            turns=[convert.session_turn_pb(t) for t in turns],
        )
        async with calling("summariser"):
            await self._stub.Append(request)

    async def get(self, tenant: str, user: str, session: str) -> SessionState:
        request = summariser_pb2.GetSessionRequest(tenant=tenant, user_id=user, session_id=session)
        async with calling("summariser"):
            reply = await self._stub.GetSession(request)
        return convert.session_state(reply)

    async def versions(self, tenant: str, user: str, sessions: Sequence[str]) -> dict[str, int]:
        if not sessions:
            return {}
        request = summariser_pb2.SessionVersionsRequest(
            tenant=tenant, user_id=user, session_ids=list(sessions)
        )
        async with calling("summariser"):
            reply = await self._stub.SessionVersions(request)
        return dict(reply.versions)

    async def forget(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> int:
        request = summariser_pb2.ForgetRequest(
            tenant=tenant, user_id=user, session_id=session or "", memory_ids=list(memory_ids)
        )
        async with calling("summariser"):
            reply = await self._stub.Forget(request)
        return int(reply.sessions_deleted)
