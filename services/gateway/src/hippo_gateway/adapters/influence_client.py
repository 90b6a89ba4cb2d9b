"""The injection service's memtok pipeline (PlanInfluence, WriteMemtoks) and influenced
generation (Generate with the plan's influences) over gRPC: the `Influencer` port."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc

from hippo.injection.v1 import injection_pb2 as pb
from hippo.injection.v1 import injection_pb2_grpc
from hippo_core.client import calling
from hippo_core.errors import FailedPrecondition
from hippo_gateway.domain.models import Generation, InfluencePlan, Piece

_MODES = {
    "off": pb.INFLUENCE_MODE_OFF,
    "disclose_only": pb.INFLUENCE_MODE_DISCLOSE_ONLY,
    "on": pb.INFLUENCE_MODE_ON,
}
_NAMES = {value: name for name, value in _MODES.items()}
_FINISH = {
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_EOS_TOKEN: "eos_token",
    pb.FINISH_REASON_STOP_SEQUENCE: "stop_sequence",
}


class GrpcInfluencer:
    def __init__(self, channel: grpc.aio.Channel, timeout_s: float) -> None:
        # The LLM's timeout, not the peer default: these calls run model passes and wait
        # behind other requests for the model (capped by the caller's remaining time).
        self._stub = injection_pb2_grpc.InjectionServiceStub(channel)
        self._timeout = timeout_s

    async def plan(self, tenant: str, user: str, query: str, mode: str | None) -> InfluencePlan:
        request = pb.PlanInfluenceRequest(
            tenant=tenant,
            user_id=user,
            query=query,
            mode=_MODES[mode] if mode else pb.INFLUENCE_MODE_UNSPECIFIED,
        )
        async with calling("injection"):
            reply = await self._stub.PlanInfluence(request, timeout=self._timeout)
        influences = tuple((i.vector, int(i.layer), float(i.strength)) for i in reply.influences)
        attendable = reply.attendable.SerializeToString() if reply.HasField("attendable") else b""
        return InfluencePlan(
            _NAMES.get(reply.mode, "off"),
            json.loads(reply.audit_json),
            json.loads(reply.private_json or "{}"),
            influences,
            attendable,
        )

    async def stream(
        self, prompt: str, params: Generation, plan: InfluencePlan
    ) -> AsyncIterator[Piece]:
        sampling = pb.Sampling(do_sample=params.temperature > 0)
        if params.temperature > 0:
            sampling.temperature = params.temperature
            sampling.top_k = params.top_k
            sampling.top_p = params.top_p
            if params.seed:
                sampling.seed = params.seed
        request = pb.GenerateRequest(
            prompt=prompt,
            max_new_tokens=params.max_new_tokens,
            stop_sequences=list(params.stop),
            sampling=sampling,
            influences=[
                pb.Influence(vector=v, layer=layer, strength=s, positions=pb.POSITIONS_ALL)
                for v, layer, s in plan.influences
            ],
            attendable=pb.Attendable.FromString(plan.attendable) if plan.attendable else None,
        )
        async with calling("injection"):
            async for item in self._stub.Generate(request, timeout=self._timeout):
                text = "" if item.token.special else item.token.text
                if item.HasField("finish"):
                    reason = _FINISH.get(item.finish.reason, "length")
                    yield Piece(text, reason, int(item.finish.generated_tokens))
                else:
                    yield Piece(text)

    async def write(
        self, tenant: str, user: str, query: str, reply: str
    ) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        request = pb.WriteMemtoksRequest(tenant=tenant, user_id=user, query=query, reply=reply)
        async with calling("injection"):
            result = await self._stub.WriteMemtoks(request, timeout=self._timeout)
        body: dict[str, Any] = json.loads(result.audit_json)
        private: dict[str, Any] = json.loads(result.private_json or "{}")
        return body, private

    async def forget_user(self, tenant: str, user: str) -> int:
        request = pb.ForgetUserRequest(tenant=tenant, user_id=user)
        try:
            async with calling("injection"):
                result = await self._stub.ForgetUser(request, timeout=self._timeout)
        except FailedPrecondition:
            return 0  # this deployment keeps no memtoks: nothing to erase
        return int(result.memtoks_deleted)
