"""The channel factory: deadlines always set and propagated, retries on UNAVAILABLE only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from core_harness import Harness, start

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core import client
from hippo_core import context as request_context
from hippo_core.errors import InvalidArgument, ResourceExhausted, Unavailable
from hippo_core.settings import ClientSettings, ServiceSettings


async def test_default_deadline_is_applied(harness: Harness) -> None:
    seen: list[float | None] = []

    async def behaviour(request, context):  # type: ignore[no-untyped-def]
        seen.append(context.time_remaining())
        return embedding_pb2.EmbedResponse()

    harness.servicer.behaviour = behaviour
    async with client.channel(harness.addr, ClientSettings(timeout_seconds=1.5)) as channel:
        await embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
            embedding_pb2.EmbedRequest(texts=["a"])
        )
    # grpc rounds the deadline it sends (a few ms over 1.5 s was seen here).
    assert seen[0] is not None and 1.0 < seen[0] <= 1.55


async def test_remaining_time_and_request_id_propagate_downstream(harness: Harness) -> None:
    """A server calling a peer passes on what is left of its own deadline, never more."""
    downstream = await start(ServiceSettings(grace_seconds=1.0))
    await downstream.runner.ready.wait()
    seen: dict[str, object] = {}

    async def leaf(request, context):  # type: ignore[no-untyped-def]
        seen["remaining"] = context.time_remaining()
        seen["request_id"] = dict(context.invocation_metadata())["x-request-id"]
        return embedding_pb2.EmbedResponse(count=7)

    async def middle(request, context):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.3)
        # Asks for 30 s, but the inbound call only has ~0.7 s left.
        async with client.channel(downstream.addr, ClientSettings(timeout_seconds=30)) as channel:
            stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            return await stub.Embed(request, timeout=30)

    downstream.servicer.behaviour = leaf
    harness.servicer.behaviour = middle
    try:
        async with grpc.aio.insecure_channel(harness.addr) as channel:
            reply = await embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
                embedding_pb2.EmbedRequest(texts=["a"]),
                timeout=1.0,
                metadata=(("x-request-id", "req-42"),),
            )
    finally:
        await downstream.runner.stop()
    assert reply.count == 7
    remaining = seen["remaining"]
    assert isinstance(remaining, float) and remaining < 0.75
    assert seen["request_id"] == "req-42"


async def test_a_bulk_call_gets_most_of_the_inbound_deadline_not_the_hop_default(
    harness: Harness,
) -> None:
    """A batch on a slow peer may take longer than the per-hop default: it gets 80% of
    the caller's remaining time; with no inbound deadline the default stays in force."""
    seen: list[float | None] = []

    async def behaviour(request, context):  # type: ignore[no-untyped-def]
        seen.append(context.time_remaining())
        return embedding_pb2.EmbedResponse()

    harness.servicer.behaviour = behaviour
    async with client.channel(harness.addr, ClientSettings(timeout_seconds=1.0)) as channel:
        stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        token = request_context.deadline.set(time.monotonic() + 10.0)
        try:
            await stub.Embed(embedding_pb2.EmbedRequest(texts=["a"]), timeout=client.bulk_timeout())
        finally:
            request_context.deadline.reset(token)
        assert client.bulk_timeout() is None
        await stub.Embed(embedding_pb2.EmbedRequest(texts=["a"]), timeout=client.bulk_timeout())
    assert seen[0] is not None and 7.5 < seen[0] <= 8.2  # grpc rounds its deadline up a little
    assert seen[1] is not None and seen[1] <= 1.05


async def test_expired_inbound_deadline_fails_before_calling(harness: Harness) -> None:
    token = request_context.deadline.set(0.0)  # long past
    try:
        async with client.channel(harness.addr) as channel:
            with pytest.raises(Exception, match="deadline"):
                await embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
                    embedding_pb2.EmbedRequest(texts=["a"])
                )
    finally:
        request_context.deadline.reset(token)
    assert harness.servicer.calls == 0


@pytest.mark.parametrize(
    ("error", "calls", "code"),
    [
        (Unavailable("peer restarting"), 3, grpc.StatusCode.UNAVAILABLE),
        (InvalidArgument("texts", "bad"), 1, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_retries_only_unavailable(
    harness: Harness, error: Exception, calls: int, code: grpc.StatusCode
) -> None:
    async def behaviour(request, context):  # type: ignore[no-untyped-def]
        raise error

    harness.servicer.behaviour = behaviour
    async with client.channel(harness.addr, ClientSettings(max_attempts=3)) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
                embedding_pb2.EmbedRequest(texts=["a"]), timeout=5
            )
    assert caught.value.code() == code
    assert harness.servicer.calls == calls


async def test_a_peers_retry_info_travels_on_to_the_caller(harness: Harness) -> None:
    """A busy peer's RESOURCE_EXHAUSTED keeps its RetryInfo delay and reason through
    `calling`, so the service in the middle passes on the peer's hint, not a guess."""

    async def busy(request, context):  # type: ignore[no-untyped-def]
        raise ResourceExhausted("queue full", reason="QUEUE_FULL", retry_after=1.5)

    harness.servicer.behaviour = busy
    async with client.channel(harness.addr) as channel:
        with pytest.raises(ResourceExhausted) as caught:
            async with client.calling("embedding"):
                await embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
                    embedding_pb2.EmbedRequest(texts=["a"]), timeout=5
                )
    assert caught.value.retry_after == pytest.approx(1.5)
    assert caught.value.reason == "QUEUE_FULL"
    assert caught.value.message.startswith("embedding: queue full")
    assert harness.servicer.calls == 1  # not retried by the channel


async def test_retry_recovers_after_transient_unavailable(harness: Harness) -> None:
    async def flaky(request, context):  # type: ignore[no-untyped-def]
        if harness.servicer.calls < 3:
            raise Unavailable("warming up")
        return embedding_pb2.EmbedResponse(count=1)

    harness.servicer.behaviour = flaky
    async with client.channel(harness.addr, ClientSettings(max_attempts=3)) as channel:
        reply = await embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
            embedding_pb2.EmbedRequest(texts=["a"]), timeout=5
        )
    assert reply.count == 1 and harness.servicer.calls == 3


@pytest.fixture
async def two_replicas() -> AsyncIterator[list[Harness]]:
    replicas = [await start(ServiceSettings(grace_seconds=1.0)) for _ in range(2)]
    try:
        for replica in replicas:
            await replica.runner.ready.wait()
        yield replicas
    finally:
        # Stopped whatever the test's outcome: an aio server outliving its event loop
        # would be finalised later, in some other test.
        for replica in replicas:
            await replica.runner.stop()


async def test_calls_spread_over_every_replica_of_a_peer(two_replicas: list[Harness]) -> None:
    """A channel to a list of addresses (as a headless Service resolves to its pods)
    balances round robin: both replicas serve, not only the first one picked (pick_first
    would send every call to one)."""

    async def behaviour(request, context):  # type: ignore[no-untyped-def]
        return embedding_pb2.EmbedResponse()

    for replica in two_replicas:
        replica.servicer.behaviour = behaviour
    target = "ipv4:" + ",".join(r.addr for r in two_replicas)
    async with client.channel(target) as channel:
        stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        # A replica's connection may become ready some calls after the other's.
        for _ in range(200):
            await stub.Embed(embedding_pb2.EmbedRequest(texts=["a"]))
            if min(r.servicer.calls for r in two_replicas) >= 5:
                break
    assert min(r.servicer.calls for r in two_replicas) >= 5, [
        r.servicer.calls for r in two_replicas
    ]


async def test_each_replica_reaches_every_address_once(two_replicas: list[Harness]) -> None:
    """A call that must reach all replicas (an erasure of in-memory caches) runs once on
    each address of an `ipv4:` list, where a balanced channel would reach one per call;
    a name is resolved to every address it has; a failing replica's error is raised."""

    async def behaviour(request, context):  # type: ignore[no-untyped-def]
        return embedding_pb2.EmbedResponse(count=1)

    for replica in two_replicas:
        replica.servicer.behaviour = behaviour

    async def embed(channel: grpc.aio.Channel) -> int:
        reply = await embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
            embedding_pb2.EmbedRequest(texts=["a"])
        )
        return int(reply.count)

    target = "ipv4:" + ",".join(r.addr for r in two_replicas)
    assert await client.each_replica(target, embed) == [1, 1]
    assert [r.servicer.calls for r in two_replicas] == [1, 1]
    port = two_replicas[0].runner.port
    resolved = await client.replicas(f"localhost:{port}")
    assert (f"ipv4:127.0.0.1:{port}", "localhost") in resolved
    assert await client.replicas(f"dns:///127.0.0.1:{port}") == [
        (f"ipv4:127.0.0.1:{port}", "127.0.0.1")
    ]

    async def refuse(request, context):  # type: ignore[no-untyped-def]
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no")

    two_replicas[1].servicer.behaviour = refuse
    with pytest.raises(grpc.aio.AioRpcError):
        await client.each_replica(target, embed)
    assert two_replicas[0].servicer.calls == 2  # the healthy one was still called


async def test_servers_ask_clients_to_reconnect_after_the_max_connection_age() -> None:
    """GOAWAY after the age: a long-lived channel reconnects (and so re-resolves its
    peer's replicas) while its calls keep succeeding."""
    server = await start(
        ServiceSettings(grace_seconds=1.0, max_connection_age_seconds=0.5,
                        max_connection_age_grace_seconds=0.5)
    )  # fmt: skip
    try:
        await server.runner.ready.wait()
        peers: set[str] = set()

        async def behaviour(request, context):  # type: ignore[no-untyped-def]
            peers.add(context.peer())
            return embedding_pb2.EmbedResponse()

        server.servicer.behaviour = behaviour
        async with client.channel(server.addr) as channel:
            stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            for _ in range(12):
                await stub.Embed(embedding_pb2.EmbedRequest(texts=["a"]))
                await asyncio.sleep(0.15)
        assert len(peers) >= 2  # a new connection (another client port) after the age
    finally:
        await server.runner.stop()


async def test_a_restarted_peer_is_reached_again_within_the_reconnect_cap() -> None:
    """A peer down for a while, then back on its port: calls through a channel that kept
    failing meanwhile succeed again within about the reconnect cap (1 s), not after
    gRPC's grown backoff (it reaches several seconds after ~7 s of refused connects)."""
    first = await start(ServiceSettings(grace_seconds=0.2))
    await first.runner.ready.wait()
    port = first.runner.port
    first.servicer.behaviour = _empty_reply
    async with client.channel(f"127.0.0.1:{port}") as channel:
        stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        await stub.Embed(embedding_pb2.EmbedRequest(texts=["a"]))
        await first.runner.stop()
        failures = 0
        end = time.monotonic() + 7.0
        while time.monotonic() < end:  # the channel's backoff grows while the peer is gone
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Embed(embedding_pb2.EmbedRequest(texts=["a"]), timeout=0.5)
            failures += 1
            await asyncio.sleep(0.2)
        assert failures > 5
        second = await start(ServiceSettings(grace_seconds=0.2, port=port))
        try:
            await second.runner.ready.wait()
            second.servicer.behaviour = _empty_reply
            back = time.monotonic()
            while True:
                try:
                    await stub.Embed(embedding_pb2.EmbedRequest(texts=["a"]), timeout=0.5)
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE
                    assert time.monotonic() - back < 2.5, "the channel did not reconnect"
                    await asyncio.sleep(0.05)
        finally:
            await second.runner.stop()


async def _empty_reply(request, context):  # type: ignore[no-untyped-def]
    return embedding_pb2.EmbedResponse()
