"""Token counts from the injection service's CountTokens (the `TokenCounter` port).

The serving model's own tokenizer, over gRPC: the gateway counts its prompts the same
way, so the summariser's window and the gateway's budget agree to the token. (Loading the
same tokenizer.json here would save ~1 ms of transport per turn but cost ~370 MB and 2 s
to load, and tie this service to the injection host's model cache on disk.)

The merge worker's counter marks its calls `x-hippo-priority: background`, like its LLM
calls; Append's counts stay interactive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc

from hippo.injection.v1 import injection_pb2, injection_pb2_grpc
from hippo_core.client import calling
from hippo_core.tokenizer import ModelTokenizer

BACKGROUND = (("x-hippo-priority", "background"),)


class GrpcTokenCounter:
    def __init__(
        self,
        channel: grpc.aio.Channel,
        timeout: float,
        concurrency: int = 8,
        *,
        background: bool = False,
    ) -> None:
        self._stub = injection_pb2_grpc.InjectionServiceStub(channel)
        self._timeout = timeout
        self._concurrency = concurrency
        self._metadata = BACKGROUND if background else ()

    async def count(self, texts: Sequence[str]) -> list[int]:
        # One call per text (CountTokens counts one text), a few in flight at once.
        gate = asyncio.Semaphore(self._concurrency)

        async def one(text: str) -> int:
            async with gate, calling("injection"):
                reply = await self._stub.CountTokens(
                    injection_pb2.CountTokensRequest(text=text),
                    timeout=self._timeout,
                    metadata=self._metadata,
                )
            # CountTokens includes the <bos> every prompt starts with; a turn's line
            # inside a prompt does not carry one.
            return int(reply.tokens) - 1

        return list(await asyncio.gather(*(one(t) for t in texts)))

    async def special_tokens(self) -> list[str]:
        """The serving model's added tokens (injection Info): merge prompts are
        neutralised against every one of them."""
        async with calling("injection"):
            reply = await self._stub.Info(
                injection_pb2.InfoRequest(), timeout=self._timeout, metadata=self._metadata
            )
        return list(reply.special_tokens)


class LocalTokenCounter:
    """The reading model's tokenizer from its files (`tokenizer_path`): for a model
    served elsewhere, the window is counted by that model's own tokenizer, as the gateway
    counts its prompts (hippo_core.tokenizer)."""

    def __init__(self, model: ModelTokenizer) -> None:
        self._model = model

    async def count(self, texts: Sequence[str]) -> list[int]:
        return [self._model.count_text(t) for t in texts]

    async def special_tokens(self) -> list[str]:
        return list(self._model.special_tokens)
