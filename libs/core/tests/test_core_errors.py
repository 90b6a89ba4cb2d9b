"""The error interceptor: domain errors keep their code, everything else is INTERNAL."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from core_harness import Harness, start
from google.rpc import error_details_pb2, status_pb2
from prometheus_client import REGISTRY

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core.errors import InvalidArgument, NotFound
from hippo_core.settings import ServiceSettings


def _stub(h: Harness) -> tuple[grpc.aio.Channel, embedding_pb2_grpc.EmbeddingServiceStub]:
    channel = grpc.aio.insecure_channel(h.addr)
    return channel, embedding_pb2_grpc.EmbeddingServiceStub(channel)


async def test_domain_error_keeps_code_message_and_rich_details(harness: Harness) -> None:
    async def behaviour(request, context):  # type: ignore[no-untyped-def]
        raise InvalidArgument("texts[2]", "at most 10 characters, got 11")

    harness.servicer.behaviour = behaviour
    channel, stub = _stub(harness)
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Embed(embedding_pb2.EmbedRequest(texts=["x"]), timeout=5)
    err = caught.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "texts[2]: at most 10 characters, got 11"
    raw = dict(err.trailing_metadata() or ())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(raw)
    bad = error_details_pb2.BadRequest()
    assert any(d.Unpack(bad) for d in status.details if d.Is(bad.DESCRIPTOR))
    assert bad.field_violations[0].field == "texts[2]"


async def test_other_domain_codes_pass_through(harness: Harness) -> None:
    async def behaviour(request, context):  # type: ignore[no-untyped-def]
        raise NotFound("session s1 does not exist")

    harness.servicer.behaviour = behaviour
    channel, stub = _stub(harness)
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Embed(embedding_pb2.EmbedRequest(texts=["x"]), timeout=5)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_unexpected_error_is_internal_with_trace_id_and_no_internals(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    async def behaviour(request, context):  # type: ignore[no-untyped-def]
        raise KeyError("secret-internal-detail")

    harness.servicer.behaviour = behaviour
    channel, stub = _stub(harness)
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Embed(embedding_pb2.EmbedRequest(texts=["x"]), timeout=5)
    err = caught.value
    assert err.code() == grpc.StatusCode.INTERNAL
    assert "secret-internal-detail" not in (err.details() or "")
    assert "trace id" in (err.details() or "")
    trace_id = (err.details() or "").rsplit(" ", 1)[-1].rstrip(")")
    assert len(trace_id) == 32
    # The traceback goes to the JSON log only, under the same trace id.
    records = [
        r for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("trace_id") == trace_id
    ]
    assert records, "no log entry carries the trace id given to the caller"
    assert records[0].msg["event"] == "rpc_internal_error"
    exc_info = records[0].exc_info
    assert exc_info is not None and "secret-internal-detail" in repr(exc_info[1])


async def test_handled_counter_records_final_codes(harness: Harness) -> None:
    async def ok(request, context):  # type: ignore[no-untyped-def]
        return embedding_pb2.EmbedResponse(count=0)

    def handled(code: str) -> float:
        labels = {"grpc_type": "unary", "grpc_service": "hippo.embedding.v1.EmbeddingService"}
        value = REGISTRY.get_sample_value(
            "grpc_server_handled_total", {**labels, "grpc_method": "Embed", "grpc_code": code}
        )
        return value or 0.0

    before_ok, before_bad = handled("OK"), handled("INVALID_ARGUMENT")
    harness.servicer.behaviour = ok
    channel, stub = _stub(harness)
    async with channel:
        await stub.Embed(embedding_pb2.EmbedRequest(texts=["x"]), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError):
            # Not UTF-8: rejected by the tolerant decoder before the servicer runs.
            await channel.unary_unary("/hippo.embedding.v1.EmbeddingService/Embed")(
                b"\x0a\x02\xc3\x28", timeout=5
            )
    assert handled("OK") == before_ok + 1
    assert handled("INVALID_ARGUMENT") == before_bad + 1


async def test_concurrency_limit_answers_resource_exhausted(harness: Harness) -> None:
    """max_concurrent_rpcs=2: a third call in flight is refused at once, not queued."""
    release = asyncio.Event()

    async def slow(request, context):  # type: ignore[no-untyped-def]
        await release.wait()
        return embedding_pb2.EmbedResponse(count=1)

    harness.servicer.behaviour = slow
    channel, stub = _stub(harness)
    async with channel:
        held = [
            asyncio.ensure_future(stub.Embed(embedding_pb2.EmbedRequest(texts=["x"]), timeout=10))
            for _ in range(2)
        ]
        while harness.servicer.calls < 2:
            await asyncio.sleep(0.01)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Embed(embedding_pb2.EmbedRequest(texts=["x"]), timeout=5)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_concurrent_rpcs=2" in (caught.value.details() or "")
        release.set()
        replies = await asyncio.gather(*held)
    assert [r.count for r in replies] == [1, 1]


async def test_a_call_that_cannot_finish_in_time_is_refused_at_once(harness: Harness) -> None:
    """The method's calls take ~0.4 s now: while one is in flight, a call with 0.1 s left
    is refused at once (RESOURCE_EXHAUSTED, RetryInfo ~ that latency), one with time
    enough is admitted, and with nothing in flight even a short deadline is served."""

    async def slow(request, context):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.4)
        return embedding_pb2.EmbedResponse(count=1)

    harness.servicer.behaviour = slow
    channel, stub = _stub(harness)
    request = embedding_pb2.EmbedRequest(texts=["x"])
    async with channel:
        await stub.Embed(request, timeout=10)  # measures the method's latency
        held = asyncio.ensure_future(stub.Embed(request, timeout=10))
        while harness.servicer.calls < 2:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Embed(request, timeout=0.1)
        assert time.monotonic() - started < 0.09  # refused, not run into its deadline
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "DEADLINE_TOO_SHORT" in str(caught.value.trailing_metadata())
        assert (await stub.Embed(request, timeout=5)).count == 1  # time enough: admitted
        await held

        async def quick(request, context):  # type: ignore[no-untyped-def]
            return embedding_pb2.EmbedResponse(count=2)

        harness.servicer.behaviour = quick
        alone = await stub.Embed(request, timeout=0.1)  # nothing in flight: never refused
        assert alone.count == 2


async def test_one_method_over_its_own_bound_is_refused_while_others_are_served() -> None:
    """max_concurrent_per_method=2: a third Embed in flight is refused at once with a
    RetryInfo (reason SERVER_BUSY), while another method (Info) is still served."""
    h = await start(ServiceSettings(grace_seconds=1.0, max_concurrent_per_method=2))
    release = asyncio.Event()

    async def slow(request, context):  # type: ignore[no-untyped-def]
        await release.wait()
        return embedding_pb2.EmbedResponse(count=1)

    h.servicer.behaviour = slow
    channel, stub = _stub(h)
    try:
        async with channel:
            request = embedding_pb2.EmbedRequest(texts=["x"])
            held = [asyncio.ensure_future(stub.Embed(request, timeout=10)) for _ in range(2)]
            while h.servicer.calls < 2:
                await asyncio.sleep(0.01)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Embed(request, timeout=5)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_concurrent_per_method=2" in (caught.value.details() or "")
            raw = dict(caught.value.trailing_metadata() or ())["grpc-status-details-bin"]
            details = status_pb2.Status.FromString(raw).details
            assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in details)
            info = await stub.Info(embedding_pb2.InfoRequest(), timeout=5)
            assert info.model == "scripted"
            release.set()
            assert [r.count for r in await asyncio.gather(*held)] == [1, 1]
    finally:
        await h.runner.stop()
