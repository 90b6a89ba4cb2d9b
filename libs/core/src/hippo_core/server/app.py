"""The serve loop every service runs: bind, warm up, serve, drain, stop.

Lifecycle (grpc examples and TGI do the same):
1. bind the port with health NOT_SERVING for every name, so probes get an answer but no
   traffic arrives during warm-up;
2. warm up (load the model, open the index), then SERVING for "" (liveness) and each
   service name (readiness);
3. on SIGTERM/SIGINT: NOT_SERVING at once, `server.stop(grace)` so calls in flight may
   finish while new ones are refused (and, at the same time, the service's `drain` for
   any other listener it runs), then close the service's resources.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from hippo_core import logging as hippo_logging
from hippo_core import metrics, tls, tracing
from hippo_core.server.authz import CallerInterceptor, Callers
from hippo_core.server.interceptors import (
    ConcurrencyLimitInterceptor,
    ErrorInterceptor,
    MetricsInterceptor,
    TracingInterceptor,
)
from hippo_core.settings import ServiceSettings

log = structlog.stdlib.get_logger("hippo.server")


async def _nothing() -> None:
    return None


def _connection_age(s: ServiceSettings) -> list[tuple[str, int]]:
    """Clients reconnect (and re-resolve) after this long: with round-robin channels, a
    new replica gets its share of traffic within one connection age."""
    if not s.max_connection_age_seconds:
        return []
    return [
        ("grpc.max_connection_age_ms", int(s.max_connection_age_seconds * 1000)),
        ("grpc.max_connection_age_grace_ms", int(s.max_connection_age_grace_seconds * 1000)),
    ]


@dataclass
class Service:
    """What a service plugs into the runtime."""

    name: str  # short name, e.g. "embedding": logs, metrics, span resource
    full_names: Sequence[str]  # proto service names: readiness and reflection
    register: Callable[[grpc.aio.Server], None]
    warmup: Callable[[], Awaitable[None]] = _nothing
    close: Callable[[], Awaitable[None]] = _nothing
    version: str = "0.1.0"
    # Who may call each RPC (hippo_core.server.authz), checked when TLS is on. None: an
    # edge service (the gateway), open to any caller the transport admits.
    callers: Callers | None = None
    # Other listeners of the process (an HTTP API beside gRPC): stop accepting and let
    # requests in flight finish within `grace_seconds`. Runs alongside gRPC's drain, not
    # after it, so a stop takes one grace period, not two (it must stay shorter than the
    # pod's termination period).
    drain: Callable[[], Awaitable[None]] = _nothing


@dataclass
class Runner:
    """Runs one service; `serve()` for processes, `start()`/`stop()` for tests."""

    service: Service
    settings: ServiceSettings
    port: int = 0
    metrics_port: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _server: grpc.aio.Server | None = None
    _health: health.aio.HealthServicer | None = None
    _warmup: asyncio.Task[None] | None = None
    _metrics_http: object | None = None

    async def start(self) -> None:
        s, svc = self.settings, self.service
        tracing.configure(svc.name, s.otlp_endpoint)
        metrics.BUILD.info({"service": svc.name, "version": svc.version})
        data_dir = getattr(s, "data_dir", None)  # only stateful services have one
        if data_dir:
            metrics.watch_data_dir(svc.name, Path(data_dir))
        http, _, self.metrics_port = metrics.serve_http(s.host, s.metrics_port)
        self._metrics_http = http
        checked = s.tls.enabled and svc.callers is not None
        server = grpc.aio.server(
            interceptors=[
                MetricsInterceptor(),
                TracingInterceptor(),
                ErrorInterceptor(),
                *([CallerInterceptor(svc.callers or {})] if checked else []),
                ConcurrencyLimitInterceptor(s.max_concurrent_rpcs, s.max_concurrent_per_method),
            ],
            options=[
                ("grpc.max_send_message_length", s.max_message_bytes),
                ("grpc.max_receive_message_length", s.max_message_bytes),
                # Accept the keepalive pings our client channels send while calls are open.
                ("grpc.http2.min_ping_interval_without_data_ms", 20_000),
                *_connection_age(s),
            ],
        )
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        for name in ("", *svc.full_names):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        svc.register(server)
        reflection.enable_server_reflection(
            [*svc.full_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        address = f"{s.host}:{s.port}"
        if s.tls.enabled:
            required = checked or s.tls.require_client_cert
            credentials = tls.server_credentials(s.tls, require_client_cert=required)
            self.port = server.add_secure_port(address, credentials)
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        self._server = server
        log.info(
            "listening",
            port=self.port,
            metrics_port=self.metrics_port,
            host=s.host,
            tls=s.tls.enabled,
        )
        self._warmup = asyncio.create_task(self._warm())

    async def _warm(self) -> None:
        assert self._health is not None
        started = asyncio.get_running_loop().time()
        await self.service.warmup()
        for name in ("", *self.service.full_names):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.ready.set()
        log.info("serving", warmup_seconds=round(asyncio.get_running_loop().time() - started, 3))

    async def stop(self) -> None:
        """NOT_SERVING now, let calls in flight finish within the grace, then close."""
        grace = self.settings.grace_seconds
        log.info("draining", grace_seconds=grace)
        if self._warmup is not None and not self._warmup.done():
            self._warmup.cancel()
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        stopping = [self.service.drain()]
        if self._server is not None:
            stopping.append(self._server.stop(grace))
        await asyncio.gather(*stopping)
        await self.service.close()
        shutdown = getattr(self._metrics_http, "shutdown", None)
        if shutdown is not None:
            shutdown()
        log.info("stopped")
        tracing.shutdown()

    async def serve(self) -> None:
        """Run until SIGTERM or SIGINT, then stop gracefully. A warm-up failure exits."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        assert self._warmup is not None
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({self._warmup, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if self._warmup.done() and not self._warmup.cancelled() and self._warmup.exception():
            log.error("warmup_failed", error=repr(self._warmup.exception()))
            stopping.cancel()
            await self.stop()
            raise SystemExit(1)
        await stopping
        await self.stop()
        # Stopped cleanly. A second stop signal must not kill the exiting interpreter
        # (exit -15): a terminal's Ctrl-C reaches the whole process group, and `hippo up`
        # then sends SIGTERM too. Closing the loop would restore the default actions.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)


def run(service: Service, settings: ServiceSettings) -> None:
    """Entry point for a service's `__main__`: JSON logs, then serve until signalled."""
    hippo_logging.configure(service.name, settings.log_level)
    asyncio.run(Runner(service, settings).serve())
