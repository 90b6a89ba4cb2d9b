"""Prometheus metrics with the standard gRPC names, and the /metrics HTTP endpoint.

Names and labels follow go-grpc-prometheus, so stock dashboards and alerts work:
`grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}` and
`grpc_server_handling_seconds`. Service domain metrics are named `hippo_<svc>_*` and
live in each service's own `metrics.py`. All are registered in the default registry
once per process (several servers in one test process share them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# No `<name>_created` sample beside every counter and histogram: Prometheus 2 stores each
# as one more series that no query or alert reads, doubling what every scrape carries.
disable_created_metrics()  # type: ignore[no-untyped-call]

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


class _DataDirs(Collector):
    """`hippo_data_dir_bytes{service}`: what a stateful service holds on disk.

    Measured at scrape time (a directory walk: a few dozen files per service), so it needs
    no bookkeeping in the stores themselves and counts everything they keep (SQLite and
    its WAL, index segments, spools), which is what fills a PVC.
    """

    def __init__(self) -> None:
        self.dirs: dict[str, Path] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "hippo_data_dir_bytes",
            "Bytes of the files under the service's data directory.",
            labels=["service"],
        )
        for service, path in self.dirs.items():
            family.add_metric([service], float(_bytes_under(path)))
        yield family


def _bytes_under(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # removed between the listing and the stat
                continue
    return total


_DATA_DIRS = _DataDirs()
REGISTRY.register(_DATA_DIRS)


def watch_data_dir(service: str, path: Path) -> None:
    """Export the size of `path` as `hippo_data_dir_bytes{service=...}`."""
    _DATA_DIRS.dirs[service] = path


def split_method(full_method: str) -> tuple[str, str]:
    """'/pkg.v1.Service/Method' -> ('pkg.v1.Service', 'Method')."""
    _, _, rest = full_method.partition("/")
    service, _, method = rest.partition("/")
    return service, method


def serve_http(host: str, port: int) -> tuple[WSGIServer, Thread, int]:
    """Start /metrics on a daemon thread; returns the server, its thread and the bound port."""
    server, thread = start_http_server(port, addr=host)
    return server, thread, int(server.server_port)
