"""One trace per request: the trace context crosses services in gRPC metadata."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from core_harness import FULL_NAME, Harness, start
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import REGISTRY

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core import client, tracing
from hippo_core.errors import InvalidArgument
from hippo_core.settings import ServiceSettings


async def test_downstream_server_span_joins_the_callers_trace(harness: Harness) -> None:
    exporter = InMemorySpanExporter()
    tracing.configure("test").add_span_processor(SimpleSpanProcessor(exporter))
    leaf = await start(ServiceSettings(grace_seconds=1.0))
    await leaf.runner.ready.wait()

    async def answer(request, context):  # type: ignore[no-untyped-def]
        return embedding_pb2.EmbedResponse(count=1)

    async def forward(request, context):  # type: ignore[no-untyped-def]
        async with client.channel(leaf.addr) as channel:
            return await embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(request, timeout=5)

    leaf.servicer.behaviour = answer
    harness.servicer.behaviour = forward
    try:
        async with grpc.aio.insecure_channel(harness.addr) as channel:
            await embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
                embedding_pb2.EmbedRequest(texts=["a"]), timeout=5
            )
    finally:
        await leaf.runner.stop()
    spans = [s for s in exporter.get_finished_spans() if "Embed" in s.name]
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    clients = [s for s in spans if s.kind == SpanKind.CLIENT]
    assert len(servers) == 2 and len(clients) == 1
    assert len({s.context.trace_id for s in spans}) == 1  # one trace end to end
    outer = next(s for s in servers if s.parent is None or s.parent.is_remote is False)
    inner = next(s for s in servers if s is not outer)
    assert clients[0].parent is not None and clients[0].parent.span_id == outer.context.span_id
    assert inner.parent is not None and inner.parent.span_id == clients[0].context.span_id


def test_deferred_work_rejoins_the_first_callers_trace_and_links_the_rest() -> None:
    """A batch delivered later (the gateway's audit spool) is a child of the first
    request that contributed to it and links the others, so each trace shows it."""
    exporter = InMemorySpanExporter()
    tracing.configure("test").add_span_processor(SimpleSpanProcessor(exporter))
    tracer = trace.get_tracer("test")
    origins = []
    for name in ("first", "second", "second-again"):
        with tracer.start_as_current_span(name if name != "second-again" else "second"):
            origins.append(tracing.traceparent())
    assert all(o.startswith("00-") for o in origins)
    with tracing.resumed("deliver", [origins[0], "", origins[1], origins[1]]):
        pass
    with tracing.resumed("nothing", ["", "garbage"]):  # no origin: no span at all
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert "nothing" not in spans
    deliver, first = spans["deliver"], spans["first"]
    assert deliver.context.trace_id == first.context.trace_id
    assert deliver.parent is not None and deliver.parent.span_id == first.context.span_id
    linked = [link.context.span_id for link in deliver.links]
    assert len(linked) == 1  # the second origin, once, though given twice
    assert tracing.traceparent() == ""  # outside any span


def test_http_calls_carry_the_trace_in_headers() -> None:
    """The gateway's Chat reaches the LLM host over TGI's HTTP API: the client span's
    headers make the host's server span its child, in the caller's trace."""
    exporter = InMemorySpanExporter()
    tracing.configure("test").add_span_processor(SimpleSpanProcessor(exporter))
    with (
        trace.get_tracer("test").start_as_current_span("chat"),
        tracing.http_client_span("POST /generate_stream") as headers,
    ):
        assert headers["traceparent"].startswith("00-")
        with tracing.http_server_span("POST /generate_stream", headers):
            pass
    spans = exporter.get_finished_spans()
    chat = next(s for s in spans if s.name == "chat")
    client = next(s for s in spans if s.kind == trace.SpanKind.CLIENT)
    server = next(s for s in spans if s.kind == trace.SpanKind.SERVER)
    assert {s.context.trace_id for s in (chat, client, server)} == {chat.context.trace_id}
    assert client.parent is not None and client.parent.span_id == chat.context.span_id
    assert server.parent is not None and server.parent.span_id == client.context.span_id


async def test_blocking_channel_counts_calls_and_carries_the_trace(harness: Harness) -> None:
    """Code on a worker thread (the injection service's model thread) calls peers through
    a blocking channel: its calls are in grpc_client_* and in the caller's trace."""
    exporter = InMemorySpanExporter()
    tracing.configure("test").add_span_processor(SimpleSpanProcessor(exporter))

    async def answer(request, context):  # type: ignore[no-untyped-def]
        if request.texts == ["bad"]:
            raise InvalidArgument("texts", "scripted refusal")
        return embedding_pb2.EmbedResponse(count=1)

    harness.servicer.behaviour = answer
    labels = {"grpc_type": "unary", "grpc_service": FULL_NAME, "grpc_method": "Embed"}

    def handled(code: str) -> float:
        value = REGISTRY.get_sample_value(
            "grpc_client_handled_total", {**labels, "grpc_code": code}
        )
        return value or 0.0

    def call(texts: list[str]) -> None:
        with client.blocking_channel(harness.addr) as channel:
            stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            with trace.get_tracer("test").start_as_current_span("model-thread"):
                stub.Embed(embedding_pb2.EmbedRequest(texts=texts), timeout=5)

    ok, bad = handled("OK"), handled("INVALID_ARGUMENT")
    await asyncio.to_thread(call, ["a"])
    with pytest.raises(grpc.RpcError):
        await asyncio.to_thread(call, ["bad"])
    assert handled("OK") == ok + 1 and handled("INVALID_ARGUMENT") == bad + 1
    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.name == "model-thread")
    mine = [s for s in spans if s.context.trace_id == root.context.trace_id]
    kinds = {s.kind for s in mine if "Embed" in s.name}
    assert kinds == {SpanKind.CLIENT, SpanKind.SERVER}


async def test_health_checks_get_no_spans_and_calls_do(harness: Harness) -> None:
    """Probes every few seconds per pod would drown request traces: a health check makes
    no span, on the server or through a Hippo channel, while an RPC makes both."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    exporter = InMemorySpanExporter()
    tracing.configure("test").add_span_processor(SimpleSpanProcessor(exporter))

    async def answer(request, context):  # type: ignore[no-untyped-def]
        return embedding_pb2.EmbedResponse(count=1)

    harness.servicer.behaviour = answer
    async with client.channel(harness.addr) as channel:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        await embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
            embedding_pb2.EmbedRequest(texts=["a"]), timeout=5
        )
    names = [s.name for s in exporter.get_finished_spans()]
    assert not [n for n in names if "grpc.health" in n], names
    kinds = {s.kind for s in exporter.get_finished_spans() if "Embed" in s.name}
    assert kinds == {SpanKind.SERVER, SpanKind.CLIENT}


async def test_a_refused_call_is_a_span_status_not_an_exception(harness: Harness) -> None:
    """Statuses go on the server span as its status code, with no exception event: the
    instrumentation this replaces formatted two tracebacks per refused call. A status
    the server owes (INTERNAL) marks the span an error; one the caller owes does not."""
    exporter = InMemorySpanExporter()
    tracing.configure("test").add_span_processor(SimpleSpanProcessor(exporter))

    async def answer(request, context):  # type: ignore[no-untyped-def]
        if request.texts == ["bad"]:
            raise InvalidArgument("texts", "scripted refusal")
        if request.texts == ["boom"]:
            raise RuntimeError("scripted bug")
        return embedding_pb2.EmbedResponse(count=1)

    harness.servicer.behaviour = answer
    async with grpc.aio.insecure_channel(harness.addr) as channel:
        stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        await stub.Embed(embedding_pb2.EmbedRequest(texts=["a"]), timeout=5)
        for texts in (["bad"], ["boom"]):
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Embed(embedding_pb2.EmbedRequest(texts=texts), timeout=5)
    spans = [
        s for s in exporter.get_finished_spans()
        if s.kind == SpanKind.SERVER and s.name == f"/{FULL_NAME}/Embed"
    ]  # fmt: skip
    codes = [s.attributes["rpc.grpc.status_code"] for s in spans]  # type: ignore[index]
    refused, failed = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL
    assert codes == [0, refused.value[0], failed.value[0]]
    statuses = [s.status.status_code for s in spans]
    assert statuses == [StatusCode.UNSET, StatusCode.UNSET, StatusCode.ERROR]
    assert all(not s.events for s in spans), [e.name for s in spans for e in s.events]
    assert spans[0].attributes["rpc.method"] == "Embed"  # type: ignore[index]
    assert spans[0].attributes["rpc.service"] == FULL_NAME  # type: ignore[index]
