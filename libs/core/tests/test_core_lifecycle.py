"""Health follows the lifecycle: NOT_SERVING until warm-up ends, NOT_SERVING on stop."""

from __future__ import annotations

import asyncio

import grpc
from core_harness import FULL_NAME, start
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core.settings import ServiceSettings

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(addr: str, service: str) -> int:
    async with grpc.aio.insecure_channel(addr) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2
        )
    return int(reply.status)


async def test_serving_only_after_warmup_then_not_serving_on_stop() -> None:
    h = await start(ServiceSettings(grace_seconds=2.0), warm_now=False)
    try:
        assert await _status(h.addr, "") == NOT_SERVING
        assert await _status(h.addr, FULL_NAME) == NOT_SERVING
        h.warm.set()
        await asyncio.wait_for(h.runner.ready.wait(), 5)
        assert await _status(h.addr, "") == SERVING
        assert await _status(h.addr, FULL_NAME) == SERVING
    finally:
        await h.runner.stop()


async def test_stop_lets_inflight_finish_and_refuses_new_calls() -> None:
    h = await start(ServiceSettings(grace_seconds=5.0))
    await h.runner.ready.wait()
    release = asyncio.Event()

    async def slow(request, context):  # type: ignore[no-untyped-def]
        await release.wait()
        return embedding_pb2.EmbedResponse(count=3)

    h.servicer.behaviour = slow
    async with grpc.aio.insecure_channel(h.addr) as channel:
        stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        inflight = asyncio.ensure_future(
            stub.Embed(embedding_pb2.EmbedRequest(texts=["a"]), timeout=10)
        )
        while h.servicer.calls == 0:
            await asyncio.sleep(0.01)
        stopping = asyncio.ensure_future(h.runner.stop())
        await asyncio.sleep(0.2)
        async with grpc.aio.insecure_channel(h.addr) as fresh:
            try:
                await embedding_pb2_grpc.EmbeddingServiceStub(fresh).Embed(
                    embedding_pb2.EmbedRequest(texts=["b"]), timeout=2
                )
                refused = False
            except grpc.aio.AioRpcError as exc:
                refused = exc.code() == grpc.StatusCode.UNAVAILABLE
        release.set()
        reply = await inflight
        await asyncio.wait_for(stopping, 6)
    assert refused
    assert reply.count == 3
    assert h.servicer.calls == 1
