"""OpenTelemetry tracing: spans for every call, context carried in gRPC metadata.

Spans are always made (their ids reach the logs); they leave the process only when an
OTLP endpoint is configured. The grpc instrumentation's client interceptors make client
spans and carry W3C trace context in the metadata; server spans are made by
`hippo_core.server.interceptors.TracingInterceptor`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.instrumentation.grpc import (
    aio_client_interceptors,
    client_interceptor,
    grpcext,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

_provider: TracerProvider | None = None


def configure(service: str, otlp_endpoint: str = "") -> TracerProvider:
    """Install the process's tracer provider once; later calls return the same one."""
    global _provider
    if _provider is None:
        _provider = TracerProvider(resource=Resource.create({"service.name": f"hippo-{service}"}))
        if otlp_endpoint:
            # Imported only when used: the exporter pulls in its own grpc channel setup.
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(otlp_endpoint)))
        trace.set_tracer_provider(_provider)
    return _provider


def shutdown() -> None:
    """Flush spans still buffered (called last in a graceful stop)."""
    if _provider is not None:
        _provider.shutdown()


# Probes and reflection get no spans: a kubelet checking every few seconds would otherwise
# start a trace per probe per pod, drowning the request traces in the collector.
_INFRA_PREFIXES = ("/grpc.health.", "/grpc.reflection.")


def traced(details: Any) -> bool:
    """True for calls that get spans. One prefix test per call: the instrumentation's
    composable filters (negate/any_of/service_prefix) split and normalise the method path
    twice per call, several percent of the gateway's CPU per Recall under load."""
    method = getattr(details, "method", None) or getattr(details, "full_method", "")
    if isinstance(method, bytes):  # grpc.aio client details carry bytes (grpc#31092)
        method = method.decode()
    return not str(method).startswith(_INFRA_PREFIXES)


def client_interceptors() -> list[Any]:
    return list(aio_client_interceptors(filter_=traced))  # type: ignore[no-untyped-call]


def traced_blocking_channel(channel: Any) -> Any:
    """`channel` (blocking) with client spans; the context comes from the calling thread."""
    interceptor = client_interceptor(filter_=traced)  # type: ignore[no-untyped-call]
    return grpcext.intercept_channel(channel, interceptor)  # type: ignore[no-untyped-call]


def traceparent() -> str:
    """The current span as a W3C `traceparent` ('' outside any span): stored beside work
    that is done later (a spooled audit event) so that work can rejoin this trace."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


@contextlib.contextmanager
def resumed(name: str, origins: Sequence[str]) -> Iterator[None]:
    """A span for deferred work, in the trace of the first of `origins` (traceparents)
    and linked to the others: a batch serves several requests, and each request's trace
    should show where its part went. Without origins, nothing is added."""
    spans = [trace.get_current_span(propagate.extract({"traceparent": o})) for o in origins]
    valid = [s.get_span_context() for s in spans if s.get_span_context().is_valid]
    if not valid:
        yield
        return
    parent = trace.set_span_in_context(trace.NonRecordingSpan(valid[0]))
    distinct = {(c.trace_id, c.span_id): c for c in valid[1:]}
    distinct.pop((valid[0].trace_id, valid[0].span_id), None)
    links = [trace.Link(c) for c in distinct.values()]
    tracer = trace.get_tracer("hippo")
    with tracer.start_as_current_span(name, context=parent, links=links) as span:
        span.set_attribute("hippo.batch.size", len(origins))
        yield


# HTTP has no interceptors here (the TGI-compatible API between the gateway and the LLM
# host): these two carry the trace across it the way gRPC metadata does.


@contextlib.contextmanager
def http_client_span(name: str) -> Iterator[dict[str, str]]:
    """A client span for an outbound HTTP call; yields the headers that carry it. The span
    is never made current, so it is safe inside an async generator that may be closed
    from another task (an attached context would fail to detach there)."""
    span = trace.get_tracer("hippo").start_span(name, kind=trace.SpanKind.CLIENT)
    headers: dict[str, str] = {}
    propagate.inject(headers, context=trace.set_span_in_context(span))
    try:
        yield headers
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        span.end()


@contextlib.contextmanager
def http_server_span(name: str, headers: Mapping[str, str]) -> Iterator[None]:
    """The server span of an inbound HTTP request, in the caller's trace if it sent one."""
    parent = propagate.extract(dict(headers))
    tracer = trace.get_tracer("hippo")
    with tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER):
        yield
