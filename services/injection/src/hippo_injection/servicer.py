"""gRPC edge of the injection service: convert in, one domain call, convert out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc

from hippo.injection.v1 import injection_pb2 as pb
from hippo.injection.v1 import injection_pb2_grpc
from hippo_core.errors import FailedPrecondition, Unavailable
from hippo_injection import convert
from hippo_injection.domain import queue
from hippo_injection.domain.memtok.service import MemtokService
from hippo_injection.domain.service import InjectionService
from hippo_injection.settings import InjectionSettings

# The caller's priority class (docs/injection.md#priorities): "background" marks work
# nobody waits for; the model queue serves every other caller first.
PRIORITY_KEY = "x-hippo-priority"


def _classed(context: grpc.aio.ServicerContext) -> None:
    """Set this RPC's class for its model leases (the RPC runs in a task of its own)."""
    value = dict(context.invocation_metadata() or ()).get(PRIORITY_KEY)
    queue.priority.set(queue.parse_priority(value if isinstance(value, str) else None))


class InjectionServicer(injection_pb2_grpc.InjectionServiceServicer):
    """Registered when the port binds; given its domain service once warm-up has loaded
    the model. Health is NOT_SERVING until then, and an early call gets UNAVAILABLE."""

    def __init__(self, settings: InjectionSettings) -> None:
        self._settings = settings
        self.service: InjectionService | None = None
        self.memtok: MemtokService | None = None  # set at warm-up when a store is configured

    def _domain(self) -> InjectionService:
        if self.service is None:
            raise Unavailable("the model is still loading; retry shortly")
        return self.service

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        _classed(context)
        # aclosing: a caller that cancels between two tokens still runs the domain's
        # clean-up (hook removal) at once, not whenever the generator is collected.
        stream = self._domain().generate(convert.generate_request(request))
        async with aclosing(stream) as items:
            async for item in items:
                yield convert.generate_response(item)

    async def Score(
        self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> pb.ScoreResponse:
        _classed(context)
        result = await self._domain().score(convert.score_request(request))
        return convert.score_response(result)

    async def CountTokens(
        self, request: pb.CountTokensRequest, context: grpc.aio.ServicerContext
    ) -> pb.CountTokensResponse:
        _classed(context)
        domain = self._domain()
        result = domain.count_tokens(convert.count_request(request))
        return convert.count_response(result, domain.limits)

    async def MakeValueVector(
        self, request: pb.MakeValueVectorRequest, context: grpc.aio.ServicerContext
    ) -> pb.MakeValueVectorResponse:
        _classed(context)
        result = await self._domain().make_value_vector(convert.value_vector_request(request))
        return convert.value_vector_response(result)

    async def Info(
        self, request: pb.InfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.InfoResponse:
        domain = self._domain()
        return convert.info_response(domain.info, domain.limits, self._settings.max_waiting)

    def _memtok(self) -> MemtokService:
        self._domain()  # UNAVAILABLE while the model loads
        if self.memtok is None:
            raise FailedPrecondition(
                "this deployment has no memtok store (HIPPO_INJECTION_EMBEDDING_ADDR is empty)"
            )
        return self.memtok

    async def PlanInfluence(
        self, request: pb.PlanInfluenceRequest, context: grpc.aio.ServicerContext
    ) -> pb.PlanInfluenceResponse:
        _classed(context)
        plan = await self._memtok().plan(
            request.tenant, request.user_id, request.query, convert.mode(request.mode),
            request.time_us,
        )  # fmt: skip
        return convert.plan_response(plan)

    async def WriteMemtoks(
        self, request: pb.WriteMemtoksRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteMemtoksResponse:
        _classed(context)
        report = await self._memtok().write(
            request.tenant, request.user_id, request.query, request.reply, request.time_us
        )
        return convert.write_response(report)

    async def SetUserInfluence(
        self, request: pb.SetUserInfluenceRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetUserInfluenceResponse:
        _classed(context)
        mode = await self._memtok().set_user_mode(
            request.tenant, request.user_id, convert.mode(request.mode)
        )
        return pb.SetUserInfluenceResponse(mode=convert.mode_value(mode))

    async def ForgetUser(
        self, request: pb.ForgetUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.ForgetUserResponse:
        _classed(context)
        erased = await self._memtok().forget(request.tenant, request.user_id)
        return pb.ForgetUserResponse(memtoks_deleted=erased)
