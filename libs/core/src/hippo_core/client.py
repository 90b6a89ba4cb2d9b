"""The one way a Hippo process opens a channel to a peer.

Every outbound call gets a deadline: the caller's own `timeout=`, else the settings'
default, and never more than what is left of the inbound call being served (so servers
pass on their remaining time). Retries happen only on UNAVAILABLE (connection refused,
peer draining), by grpc's own retry policy; keepalive notices dead peers; message sizes
are bounded. The request id and trace context travel in metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from hippo_core import context as request_context
from hippo_core import errors, metrics, tls, tracing
from hippo_core.errors import DeadlineExceeded
from hippo_core.settings import MIB, ClientSettings, TlsSettings

T = TypeVar("T")


def _service_config(max_attempts: int) -> str:
    policy = {
        "maxAttempts": max_attempts,
        "initialBackoff": "0.05s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        # Only UNAVAILABLE: the request never reached a handler or the peer is
        # draining. Retrying anything else could apply a write twice.
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    return json.dumps({"methodConfig": [{"name": [{}], "retryPolicy": policy}]})


# The longest a channel waits between attempts to reconnect to a peer that went away.
RECONNECT_BACKOFF_MAX_MS = 1_000

# The share of an inbound call's remaining time that a bulk outbound call may take: the
# rest is kept for the steps after it (storing what it computed, answering).
BULK_SHARE = 0.8


def bulk_timeout() -> float | None:
    """The deadline for an outbound call whose work grows with its input (embedding a
    batch of turns): most of what is left of the inbound call, not the per-hop default.

    A slow peer (a large embedder on a CPU) can need longer than the default for a full
    batch even when it is idle; with the default the call would miss its deadline on
    every try, however long the caller was willing to wait. None (no inbound deadline)
    leaves the default in force."""
    remaining = request_context.time_remaining()
    if remaining is None:
        return None
    return max(remaining * BULK_SHARE, 0.001)


def _details(
    details: grpc.aio.ClientCallDetails, default_timeout: float
) -> grpc.aio.ClientCallDetails:
    timeout = details.timeout if details.timeout is not None else default_timeout
    remaining = request_context.time_remaining()
    if remaining is not None:
        if remaining <= 0:
            raise DeadlineExceeded("the inbound call's deadline has already passed")
        timeout = min(timeout, remaining)
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    rid = request_context.request_id.get()
    if rid and "x-request-id" not in metadata:
        metadata.add("x-request-id", rid)
    return grpc.aio.ClientCallDetails(
        details.method, timeout, metadata, details.credentials, details.wait_for_ready
    )


def _labels(details: grpc.aio.ClientCallDetails, grpc_type: str) -> tuple[str, str, str]:
    method = details.method.decode() if isinstance(details.method, bytes) else details.method
    return (grpc_type, *metrics.split_method(method))


async def _record(call: Any, labels: tuple[str, str, str], started: float) -> None:
    code = await call.code()
    metrics.CLIENT_HANDLED.labels(*labels, code.name).inc()
    metrics.CLIENT_HANDLING_SECONDS.labels(*labels).observe(time.perf_counter() - started)


def _record_when_done(call: Any, labels: tuple[str, str, str], started: float) -> None:
    # The status of an aio call is read with `await`; done callbacks are synchronous.
    call.add_done_callback(lambda done: asyncio.ensure_future(_record(done, labels, started)))


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, default_timeout: float) -> None:
        self._timeout = default_timeout

    async def intercept_unary_unary(
        self,
        continuation: Callable[..., Awaitable[Any]],
        details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        labels = _labels(details, "unary")
        metrics.CLIENT_STARTED.labels(*labels).inc()
        started = time.perf_counter()
        call = await continuation(_details(details, self._timeout), request)

        _record_when_done(call, labels, started)
        return call


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, default_timeout: float) -> None:
        self._timeout = default_timeout

    async def intercept_unary_stream(
        self,
        continuation: Callable[..., Awaitable[Any]],
        details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        labels = _labels(details, "server_stream")
        metrics.CLIENT_STARTED.labels(*labels).inc()
        started = time.perf_counter()
        call = await continuation(_details(details, self._timeout), request)

        _record_when_done(call, labels, started)
        return call


class _BlockingUnaryUnary(grpc.UnaryUnaryClientInterceptor):
    """grpc_client_* metrics for a blocking channel's unary calls."""

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        labels = ("unary", *metrics.split_method(details.method))
        metrics.CLIENT_STARTED.labels(*labels).inc()
        started = time.perf_counter()
        outcome = continuation(details, request)
        code = outcome.code()  # the call has completed: a blocking channel waits for it
        metrics.CLIENT_HANDLED.labels(*labels, code.name).inc()
        metrics.CLIENT_HANDLING_SECONDS.labels(*labels).observe(time.perf_counter() - started)
        return outcome


def blocking_channel(
    target: str,
    settings: ClientSettings | None = None,
    *,
    max_message_bytes: int = MIB,
    tls_settings: TlsSettings | None = None,
) -> grpc.Channel:
    """A blocking channel with the same policy as `channel`, for code that runs on a
    worker thread (the injection service's model thread), unary calls only. Callers pass
    `timeout=` on every call: there is no inbound call's deadline on that thread."""
    settings = settings or ClientSettings()
    options = _options(settings, max_message_bytes, target, tls_settings)
    if tls_settings is not None and tls_settings.enabled:
        credentials = tls.channel_credentials(tls_settings)
        plain = grpc.secure_channel(target, credentials, options=options)
    else:
        plain = grpc.insecure_channel(target, options=options)
    counted = grpc.intercept_channel(plain, _BlockingUnaryUnary())
    traced: grpc.Channel = tracing.traced_blocking_channel(counted)
    return traced


def _options(
    settings: ClientSettings,
    max_message_bytes: int,
    target: str,
    tls_settings: TlsSettings | None,
) -> list[tuple[str, Any]]:
    name = tls.target_name(target, tls_settings) if tls_settings and tls_settings.enabled else None
    return [
        # The name the peer's certificate must carry, where the target has no host of its
        # own (ipv4: lists) or the operator named one.
        *([("grpc.ssl_target_name_override", name)] if name else []),
        # Spread calls over every address the target resolves to: a headless Service's
        # pod IPs (dns:///name:port) or a loopback list (ipv4:127.0.0.1:a,127.0.0.1:b).
        # pick_first, gRPC's default, would send everything to one replica. Servers cap
        # connection age (ServiceSettings.max_connection_age_seconds), so channels
        # reconnect, re-resolve and reach pods that started after them.
        ("grpc.lb_policy_name", "round_robin"),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", _service_config(settings.max_attempts)),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # Ping only while calls are open (the server accepts one every 20 s), so a
        # peer that vanished mid-call is noticed in seconds, not at the TCP timeout.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 0),
        # gRPC's default reconnect backoff grows to 120 s: after a peer restarts, calls
        # would keep failing for minutes. Cap it at RECONNECT_BACKOFF_MAX_MS: a peer that
        # answers its health check is reached by its callers within about a second (a
        # 5 s cap left the gateway failing Recall for seconds after a restarted
        # retrieval service was SERVING). A refused connect costs next to nothing.
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
    ]


def channel(
    target: str,
    settings: ClientSettings | None = None,
    *,
    max_message_bytes: int = MIB,
    tls_settings: TlsSettings | None = None,
) -> grpc.aio.Channel:
    """An aio channel to `target` with Hippo's call policy: TLS with this process's
    certificate when `tls_settings` has a CA, else plaintext. `target` is 'host:port',
    or any gRPC name that resolves to several replicas (dns:///svc:port, ipv4:a:p,b:q):
    calls are balanced round robin over all of them."""
    settings = settings or ClientSettings()
    options = _options(settings, max_message_bytes, target, tls_settings)
    interceptors = [
        _UnaryUnary(settings.timeout_seconds),
        _UnaryStream(settings.timeout_seconds),
        *tracing.client_interceptors(),
    ]
    if tls_settings is not None and tls_settings.enabled:
        credentials = tls.channel_credentials(tls_settings)
        return grpc.aio.secure_channel(
            target, credentials, options=options, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)


# A peer's status, as the caller should see it. UNAVAILABLE, DEADLINE_EXCEEDED and
# RESOURCE_EXHAUSTED pass through (the caller's retry policy applies to them);
# INVALID_ARGUMENT, NOT_FOUND and FAILED_PRECONDITION pass through with the peer's message
# (it names the field); anything else means we broke the contract: INTERNAL.
_PASS_THROUGH: dict[grpc.StatusCode, type[errors.HippoError]] = {
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
}


def peer_error(exc: grpc.aio.AioRpcError, peer: str) -> errors.HippoError:
    """The HippoError to raise for a failed call to `peer` (e.g. "retrieval")."""
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field, _, problem = details.partition(": ")
        return errors.InvalidArgument(field, problem or details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # The peer's own RetryInfo travels on: the caller learns how long the busy
        # service wants it to wait, not a guess made here.
        retry_after, reason = _overload_details(exc)
        return errors.ResourceExhausted(
            f"{peer}: {details}" if details else f"{peer} is overloaded",
            reason=reason,
            retry_after=retry_after,
        )
    kind = _PASS_THROUGH.get(code)
    if kind is not None:
        return kind(f"{peer}: {details}" if details else f"{peer} is {code.name.lower()}")
    return errors.Internal(f"{peer} failed ({code.name})")


def _overload_details(exc: grpc.aio.AioRpcError) -> tuple[float, str | None]:
    """(RetryInfo's delay in seconds, ErrorInfo's reason) of a RESOURCE_EXHAUSTED reply;
    0.1 s and no reason when the peer sent none (or sent something unreadable)."""
    retry_after, reason = 0.1, None
    raw = dict(exc.trailing_metadata() or ()).get("grpc-status-details-bin")
    if not isinstance(raw, bytes):
        return retry_after, reason
    status = status_pb2.Status()
    try:
        status.ParseFromString(raw)
    except DecodeError:
        return retry_after, reason
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            retry_after = max(0.001, info.retry_delay.ToNanoseconds() / 1e9)
        elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            error_info = error_details_pb2.ErrorInfo()
            detail.Unpack(error_info)
            reason = error_info.reason or None
    return retry_after, reason


@contextlib.asynccontextmanager
async def calling(peer: str) -> AsyncIterator[None]:
    """`async with calling("retrieval"): await stub.X(...)` turns a failed call into the
    HippoError its status means, so the caller's error interceptor maps it correctly."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise peer_error(exc, peer) from exc


def _split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not host:port: {address!r}")
    return host.strip("[]"), int(port)


async def replicas(target: str) -> list[tuple[str, str | None]]:
    """Every replica behind `target`, one (address, certificate name) each, for a call
    that must reach all of them (an erasure of each replica's in-memory cache) rather
    than one picked round robin. `ipv4:`/`ipv6:` lists are split; a name (`host:port` or
    `dns:///host:port`, e.g. a headless Service) is resolved to all its addresses, each
    dialled as an IP and checked against the name's certificate."""
    for scheme in ("ipv4:", "ipv6:"):
        if target.startswith(scheme):
            listed = [a.strip() for a in target[len(scheme) :].split(",") if a.strip()]
            return [(f"{scheme}{a}", _split_host_port(a)[0]) for a in listed]
    name = target.removeprefix("dns:///").removeprefix("dns:")
    host, port = _split_host_port(name)
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[tuple[str, str | None]] = []
    for family, *_, sockaddr in infos:
        ip = str(sockaddr[0])
        address = f"ipv6:[{ip}]:{port}" if family == socket.AF_INET6 else f"ipv4:{ip}:{port}"
        if (address, host) not in found:
            found.append((address, host))
    return found


async def each_replica(
    target: str,
    call: Callable[[grpc.aio.Channel], Awaitable[T]],
    settings: ClientSettings | None = None,
    *,
    tls_settings: TlsSettings | None = None,
) -> list[T]:
    """Run `call` once against every replica behind `target` (see `replicas`), all at
    once, each on a channel of its own that is closed afterwards; the results in replica
    order. The first failure is raised once every call has ended."""
    found = await replicas(target)

    async def one(address: str, name: str | None) -> T:
        own_tls = tls_settings
        if own_tls is not None and own_tls.enabled and not own_tls.server_name and name:
            own_tls = own_tls.model_copy(update={"server_name": name})
        peer = channel(address, settings, tls_settings=own_tls)
        try:
            return await call(peer)
        finally:
            await peer.close()

    results = await asyncio.gather(*(one(a, n) for a, n in found), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [r for r in results if not isinstance(r, BaseException)]
