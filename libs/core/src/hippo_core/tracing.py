"""OpenTelemetry tracing: spans for every call, context carried in gRPC metadata.

Spans are always made (their ids reach the logs); they leave the process only when an
OTLP endpoint is configured. The grpc instrumentation's interceptors create server and
client spans and propagate W3C trace context across services.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor
from opentelemetry.instrumentation.grpc.filters import any_of, negate, service_prefix
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
_INFRA = negate(any_of(service_prefix("grpc.health."), service_prefix("grpc.reflection.")))


def server_interceptor() -> Any:
    return aio_server_interceptor(filter_=_INFRA)  # type: ignore[no-untyped-call]


def client_interceptors() -> list[Any]:
    return list(aio_client_interceptors(filter_=_INFRA))  # type: ignore[no-untyped-call]
