"""Service.drain: a process's other listener (an HTTP API beside gRPC) drains at the same
time as gRPC, so a stop takes one grace period, not one per listener, and the service's
resources close only after both."""

from __future__ import annotations

import asyncio
import time

import grpc

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core.server.app import Runner, Service
from hippo_core.settings import ServiceSettings

FULL_NAME = "hippo.embedding.v1.EmbeddingService"
GRACE = 1.0


class Slow(embedding_pb2_grpc.EmbeddingServiceServicer):
    """An Embed still running when the stop begins: gRPC waits out the grace for it."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def Embed(self, request, context):  # type: ignore[no-untyped-def]
        self.started.set()
        await asyncio.sleep(30)
        return embedding_pb2.EmbedResponse()


async def test_drain_runs_alongside_grpcs_grace_and_before_close() -> None:
    servicer = Slow()
    order: list[str] = []

    async def drain() -> None:
        order.append("drain")
        await asyncio.sleep(GRACE)  # an HTTP request in flight, using its grace too
        order.append("drained")

    async def close() -> None:
        order.append("close")

    service = Service(
        "test",
        [FULL_NAME],
        lambda server: embedding_pb2_grpc.add_EmbeddingServiceServicer_to_server(servicer, server),
        close=close,
        drain=drain,
    )
    runner = Runner(service, ServiceSettings(grace_seconds=GRACE))
    await runner.start()
    await runner.ready.wait()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{runner.port}") as channel:
        call = embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
            embedding_pb2.EmbedRequest(texts=["x"]), timeout=30
        )
        await servicer.started.wait()
        began = time.monotonic()
        await runner.stop()
        took = time.monotonic() - began
        call.cancel()
    assert order == ["drain", "drained", "close"]
    assert GRACE * 0.9 <= took < GRACE * 1.8  # one grace, not two
