"""The serving model's tokenizer and prompt format, through the LLM host's gRPC
`CountTokens` (the `Tokenizer` port): budgets are counted exactly as the model reads."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from hippo.injection.v1 import injection_pb2, injection_pb2_grpc
from hippo_core.client import calling
from hippo_core.errors import Unimplemented
from hippo_gateway.domain.models import ChatMessage, ChatRole, Counted

_ROLES = {
    ChatRole.SYSTEM: injection_pb2.ROLE_SYSTEM,
    ChatRole.USER: injection_pb2.ROLE_USER,
    ChatRole.ASSISTANT: injection_pb2.ROLE_ASSISTANT,
}


class GrpcTokenizer:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = injection_pb2_grpc.InjectionServiceStub(channel)

    async def count(self, messages: Sequence[ChatMessage]) -> Counted:
        request = injection_pb2.CountTokensRequest(
            messages=[
                injection_pb2.ChatMessage(role=_ROLES[m.role], content=m.text) for m in messages
            ]
        )
        async with calling("injection"):
            reply = await self._stub.CountTokens(request)
        return Counted(int(reply.tokens), reply.formatted, int(reply.context_length))

    async def special_tokens(self) -> list[str]:
        async with calling("injection"):
            reply = await self._stub.Info(injection_pb2.InfoRequest())
        return list(reply.special_tokens)

    async def count_text(self, text: str) -> int:
        async with calling("injection"):
            reply = await self._stub.CountTokens(injection_pb2.CountTokensRequest(text=text))
        return max(0, int(reply.tokens) - 1)  # the count includes <bos>


class NoTokenizer:
    """A deployment without an LLM host (injection_addr empty): there is no model to
    count for, so BuildContext and Chat are not served (a channel to an empty address
    failed UNKNOWN, which reached callers as INTERNAL)."""

    @staticmethod
    def _refuse() -> Unimplemented:
        return Unimplemented(
            "this deployment has no LLM host (injection_addr is empty): BuildContext and "
            "Chat need the serving model's tokenizer"
        )

    async def count(self, messages: Sequence[ChatMessage]) -> Counted:
        raise self._refuse()

    async def special_tokens(self) -> list[str]:
        raise self._refuse()

    async def count_text(self, text: str) -> int:
        raise self._refuse()
