"""Prometheus metrics with the standard gRPC names, and the /metrics HTTP endpoint.

Names and labels follow go-grpc-prometheus, so stock dashboards and alerts work:
`grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}` and
`grpc_server_handling_seconds`. Service domain metrics are named `hippo_<svc>_*` and
live in each service's own `metrics.py`. All are registered in the default registry
once per process (several servers in one test process share them).
"""

from __future__ import annotations

from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, Info, start_http_server

# Latency buckets from 0.5 ms to 60 s: embedding calls are ~5 ms, LLM calls minutes.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)
_CALL = ["grpc_type", "grpc_service", "grpc_method"]

SERVER_STARTED = Counter("grpc_server_started", "RPCs started on the server.", _CALL)
SERVER_HANDLED = Counter(
    "grpc_server_handled", "RPCs completed on the server, by status code.", [*_CALL, "grpc_code"]
)
SERVER_HANDLING_SECONDS = Histogram(
    "grpc_server_handling_seconds",
    "Time from the start of an RPC to its status, on the server.",
    _CALL,
    buckets=LATENCY_BUCKETS,
)
SERVER_INFLIGHT = Gauge(
    "hippo_grpc_server_inflight",
    "RPCs being served now (health checks excluded).",
    ["grpc_service"],
)
SERVER_REJECTED = Counter(
    "hippo_grpc_server_rejected",
    "RPCs refused with RESOURCE_EXHAUSTED because max_concurrent_rpcs were in flight.",
    ["grpc_service", "grpc_method"],
)
CLIENT_STARTED = Counter("grpc_client_started", "RPCs started by this process's clients.", _CALL)
CLIENT_HANDLED = Counter(
    "grpc_client_handled",
    "RPCs completed by this process's clients, by status code.",
    [*_CALL, "grpc_code"],
)
CLIENT_HANDLING_SECONDS = Histogram(
    "grpc_client_handling_seconds",
    "Time from the start of an outbound RPC to its status.",
    _CALL,
    buckets=LATENCY_BUCKETS,
)
BUILD = Info("hippo_build", "The service and version this process runs.")


def split_method(full_method: str) -> tuple[str, str]:
    """'/pkg.v1.Service/Method' -> ('pkg.v1.Service', 'Method')."""
    _, _, rest = full_method.partition("/")
    service, _, method = rest.partition("/")
    return service, method


def serve_http(host: str, port: int) -> tuple[WSGIServer, Thread, int]:
    """Start /metrics on a daemon thread; returns the server, its thread and the bound port."""
    server, thread = start_http_server(port, addr=host)
    return server, thread, int(server.server_port)
