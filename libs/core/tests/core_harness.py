"""In-process aio servers built on the real runtime, with a scripted test servicer.

The servicer implements the generated EmbeddingService interface, but every behaviour is
scripted by the test: these tests are about the runtime (interceptors, health, clients),
not about embedding. The real embedding servicer is tested in services/embedding/tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core.server.app import Runner, Service
from hippo_core.server.authz import Callers
from hippo_core.settings import ServiceSettings

FULL_NAME = "hippo.embedding.v1.EmbeddingService"
Behaviour = Callable[
    [embedding_pb2.EmbedRequest, grpc.aio.ServicerContext], Awaitable[embedding_pb2.EmbedResponse]
]


class Scripted(embedding_pb2_grpc.EmbeddingServiceServicer):
    def __init__(self) -> None:
        self.calls = 0
        self.behaviour: Behaviour | None = None

    async def Embed(self, request, context):  # type: ignore[no-untyped-def]
        self.calls += 1
        assert self.behaviour is not None
        return await self.behaviour(request, context)

    async def Info(self, request, context):  # type: ignore[no-untyped-def]
        return embedding_pb2.InfoResponse(model="scripted")


class Harness:
    def __init__(self, runner: Runner, servicer: Scripted, warm: asyncio.Event) -> None:
        self.runner = runner
        self.servicer = servicer
        self.warm = warm

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.runner.port}"


async def start(
    settings: ServiceSettings, warm_now: bool = True, callers: Callers | None = None
) -> Harness:
    servicer = Scripted()
    warm = asyncio.Event()
    if warm_now:
        warm.set()

    async def warmup() -> None:
        await warm.wait()

    service = Service(
        "test",
        [FULL_NAME],
        lambda server: embedding_pb2_grpc.add_EmbeddingServiceServicer_to_server(servicer, server),
        warmup,
        callers=callers,
    )
    runner = Runner(service, settings)
    await runner.start()
    return Harness(runner, servicer, warm)
