"""Server interceptors, outermost first: metrics, tracing, errors, concurrency limit.

`ErrorInterceptor` is the one place where errors become statuses: a `HippoError` becomes
its code with its message (which names the field and the limit) plus rich details
(google.rpc ErrorInfo and BadRequest); anything else becomes INTERNAL with a generic
message and a trace id, the traceback going only to the log. It also opens the request's
context: request id, deadline and log fields that downstream calls and logs inherit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import grpc
import structlog
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status
from opentelemetry.trace import StatusCode as SpanStatus

from hippo_core import context as request_context
from hippo_core import metrics, tracing
from hippo_core.errors import HippoError, InvalidArgument, ResourceExhausted
from hippo_core.server.decode import Undecodable, tolerant
from hippo_core.server.handlers import Streaming, Unary, rewrap

log = structlog.stdlib.get_logger("hippo.rpc")

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]
S = TypeVar("S")
# Infrastructure RPCs: never refused by the concurrency limit, so probes keep answering.
EXEMPT = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _grpc_type(handler: grpc.RpcMethodHandler) -> str:
    if handler.request_streaming:
        return "bidi_stream" if handler.response_streaming else "client_stream"
    return "server_stream" if handler.response_streaming else "unary"


def _final_code(context: grpc.aio.ServicerContext, error: BaseException | None) -> str:
    if isinstance(error, asyncio.CancelledError):
        remaining = context.time_remaining()
        expired = remaining is not None and remaining <= 0
        return "DEADLINE_EXCEEDED" if expired else "CANCELLED"
    code = context.code()  # set by abort() or set_code(); None when the handler returned
    if code is None:
        return "OK" if error is None else "UNKNOWN"
    return str(code.name) if isinstance(code, grpc.StatusCode) else "UNKNOWN"


def _observed(
    handler: grpc.RpcMethodHandler,
    begin: Callable[[], AbstractContextManager[S]],
    finish: Callable[[S, grpc.aio.ServicerContext, BaseException | None], None],
) -> grpc.RpcMethodHandler:
    """`handler` with every call run inside `begin()`, and `finish(state, context, error)`
    called as it ends, however it ends (`error`: what it raised, else None): the shape
    the metrics and tracing interceptors share."""

    def unary(behavior: Unary) -> Unary:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            with begin() as state:
                error = None
                try:
                    return await behavior(request, context)
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    finish(state, context, error)

        return call

    def streaming(behavior: Streaming) -> Streaming:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with begin() as state:
                error = None
                try:
                    async for item in behavior(request, context):
                        yield item
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    finish(state, context, error)

        return call

    return rewrap(handler, unary, streaming)


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """grpc_server_started/handled_total and grpc_server_handling_seconds per method."""

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        service, method = metrics.split_method(details.method)
        labels = (_grpc_type(handler), service, method)

        def begin() -> AbstractContextManager[float]:
            metrics.SERVER_STARTED.labels(*labels).inc()
            return nullcontext(time.perf_counter())

        def finish(
            started: float, context: grpc.aio.ServicerContext, error: BaseException | None
        ) -> None:
            metrics.SERVER_HANDLED.labels(*labels, _final_code(context, error)).inc()
            metrics.SERVER_HANDLING_SECONDS.labels(*labels).observe(time.perf_counter() - started)

        return _observed(handler, begin, finish)


# The statuses that make a server span an error (OpenTelemetry's gRPC conventions): the
# others are the caller's problem (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED...).
_SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)


class TracingInterceptor(grpc.aio.ServerInterceptor):
    """A SERVER span per call, in the caller's trace (W3C context from the metadata); its
    status is the call's. In place of opentelemetry-instrumentation-grpc's aio server
    interceptor, which records every abort (every status but OK, refusals included) as an
    exception, twice, formatting the traceback each time (opentelemetry-python-contrib
    #5068): under overload, where most calls are refused, that was 13% of the gateway's
    CPU. Statuses come from ErrorInterceptor inside, so no exception reaches this one but
    the abort that carries a status, or a cancellation."""

    def __init__(self) -> None:
        self._tracer = trace.get_tracer("hippo.grpc")

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or not tracing.traced(details):
            return handler
        name = details.method
        service, _, method = name.lstrip("/").partition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        carrier = {k: v for k, v in details.invocation_metadata or () if isinstance(v, str)}
        parent = propagate.extract(carrier)

        def span() -> AbstractContextManager[trace.Span]:
            return self._tracer.start_as_current_span(
                name,
                context=parent,
                kind=SpanKind.SERVER,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            )

        def finish(
            current: trace.Span, context: grpc.aio.ServicerContext, error: BaseException | None
        ) -> None:
            code = _final_code(context, error)
            known = grpc.StatusCode.__members__.get(code, grpc.StatusCode.UNKNOWN)
            current.set_attribute("rpc.grpc.status_code", known.value[0])
            if code in _SERVER_ERRORS:
                current.set_status(Status(SpanStatus.ERROR, code))

        return _observed(handler, span, finish)


def _status_details(error: HippoError, code: grpc.StatusCode) -> bytes:
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=error.reason, domain="hippo"))
    details = [info]
    if isinstance(error, InvalidArgument):
        bad = any_pb2.Any()
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=error.field, description=error.problem
        )
        bad.Pack(error_details_pb2.BadRequest(field_violations=[violation]))
        details.append(bad)
    if isinstance(error, ResourceExhausted):
        if error.retry_after is not None:
            retry = any_pb2.Any()
            delay = duration_pb2.Duration()
            delay.FromNanoseconds(max(1, round(error.retry_after * 1e9)))
            retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
            details.append(retry)
        if error.quota is not None:
            subject, description = error.quota
            failure = any_pb2.Any()
            violation_q = error_details_pb2.QuotaFailure.Violation(
                subject=subject, description=description
            )
            failure.Pack(error_details_pb2.QuotaFailure(violations=[violation_q]))
            details.append(failure)
    status = status_pb2.Status(code=code.value[0], message=error.message, details=details)
    return bytes(status.SerializeToString())


def _trace_id() -> str:
    span = trace.get_current_span().get_span_context()
    return format(span.trace_id, "032x") if span.is_valid else uuid.uuid4().hex


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Request context in, statuses out: the one place errors are mapped."""

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        incoming = dict(details.invocation_metadata or ())
        rid = str(incoming.get("x-request-id") or uuid.uuid4().hex)

        def enter(context: grpc.aio.ServicerContext) -> None:
            request_context.request_id.set(rid)
            remaining = context.time_remaining()
            due = None if remaining is None else time.monotonic() + remaining
            request_context.deadline.set(due)
            structlog.contextvars.bind_contextvars(request_id=rid, method=method)

        async def fail(context: grpc.aio.ServicerContext, exc: Exception) -> None:
            if isinstance(exc, HippoError):
                code = grpc.StatusCode[exc.code.value]
                # A refusal that asks the caller to wait (overload) is logged at debug:
                # under overload there are hundreds a second, each already counted by
                # grpc_server_handled_total and the rejected counters; at info the log
                # line was a tenth of a refusal's CPU and drowned everything else.
                busy = isinstance(exc, ResourceExhausted) and exc.retry_after is not None
                emit = log.debug if busy else log.info
                emit("rpc_error", code=code.name, reason=exc.reason, error=exc.message)
                trailer = (("grpc-status-details-bin", _status_details(exc, code)),)
                await context.abort(code, exc.message, trailing_metadata=trailer)
            trace_id = _trace_id()
            log.exception("rpc_internal_error", trace_id=trace_id)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error (trace id {trace_id})")

        def check(request: Any) -> Any:
            """The request, or for a client stream the stream, whose undecodable
            messages raise INVALID_ARGUMENT where the servicer reads them."""
            if isinstance(request, Undecodable):
                raise request.error
            if hasattr(request, "__aiter__"):
                return _checked_stream(request)
            return request

        def unary(behavior: Unary) -> Unary:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                enter(context)
                try:
                    return await behavior(check(request), context)
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    raise
                except Exception as exc:
                    await fail(context, exc)

            return call

        def streaming(behavior: Streaming) -> Streaming:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                enter(context)
                try:
                    async for item in behavior(check(request), context):
                        yield item
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    raise
                except Exception as exc:
                    await fail(context, exc)

            return call

        return rewrap(handler, unary, streaming, decode=tolerant)


async def _checked_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Undecodable):
            raise request.error
        yield request


class ConcurrencyLimitInterceptor(grpc.aio.ServerInterceptor):
    """Admission: at most `limit` calls in flight, at most `per_method` of one method, and
    no call that would not finish in time. The per-method bound is what keeps latency
    flat under overload: throughput saturates at a few calls in flight (2 cores: ~8
    Recalls), and every call beyond that only waits, so by Little's law its latency grows
    with the number admitted until deadlines pass and the work is wasted; bounded, the
    rest is refused in microseconds and goodput stays at capacity. The next call over a
    limit, or one whose remaining deadline is shorter than
    the method's recent latency (an EWMA of calls that completed) while other calls are
    in flight, gets RESOURCE_EXHAUSTED with a RetryInfo of about that latency at once,
    instead of a queue. Work that would run into its deadline is refused before it costs
    anything, so under overload the CPU goes to calls that can still succeed (goodput)
    and callers back off for as long as the server says. A call with nothing else in
    flight is always admitted: an idle server never refuses.

    Sits inside ErrorInterceptor so the refusal is mapped like any domain error.
    """

    EWMA_ALPHA = 0.1
    RETRY_MIN_S, RETRY_MAX_S = 0.05, 5.0

    def __init__(self, limit: int, per_method: int | None = None) -> None:
        self._limit = limit
        self._per_method = per_method or limit
        self._inflight = 0
        self._by_method: dict[str, int] = {}  # method -> calls in flight
        self._latency: dict[str, float] = {}  # method -> EWMA seconds of completed calls

    def _retry_after(self, method: str) -> float:
        return min(self.RETRY_MAX_S, max(self.RETRY_MIN_S, self._latency.get(method, 0.0)))

    def _completed(self, method: str, seconds: float) -> None:
        old = self._latency.get(method)
        self._latency[method] = seconds if old is None else old + self.EWMA_ALPHA * (seconds - old)

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or details.method.startswith(EXEMPT):
            return handler
        service, method = metrics.split_method(details.method)
        gauge = metrics.SERVER_INFLIGHT.labels(service)
        full = details.method

        def admit(context: grpc.aio.ServicerContext) -> float:
            mine = self._by_method.get(full, 0)
            if self._inflight >= self._limit or mine >= self._per_method:
                metrics.SERVER_REJECTED.labels(service, method).inc()
                raise ResourceExhausted(
                    f"server busy: {self._inflight} calls in flight, {mine} of {method} "
                    f"(max_concurrent_rpcs={self._limit}, "
                    f"max_concurrent_per_method={self._per_method}); retry after the hint",
                    reason="SERVER_BUSY",
                    retry_after=self._retry_after(full),
                )
            expected = self._latency.get(full)
            remaining = context.time_remaining()
            late = expected is not None and remaining is not None and remaining < expected
            if self._inflight and late:
                metrics.SERVER_REJECTED.labels(service, method).inc()
                raise ResourceExhausted(
                    f"server busy: calls take ~{expected:.3f}s now and this one has "
                    f"{max(0.0, remaining or 0.0):.3f}s left; retry after the hint",
                    reason="DEADLINE_TOO_SHORT",
                    retry_after=self._retry_after(full),
                )
            self._inflight += 1
            self._by_method[full] = mine + 1
            gauge.inc()
            return time.perf_counter()

        def release(started: float, ok: bool) -> None:
            self._inflight -= 1
            self._by_method[full] -= 1
            gauge.dec()
            if ok:
                self._completed(full, time.perf_counter() - started)

        def unary(behavior: Unary) -> Unary:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                started = admit(context)
                ok = False
                try:
                    result = await behavior(request, context)
                    ok = True
                    return result
                finally:
                    release(started, ok)

            return call

        def streaming(behavior: Streaming) -> Streaming:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                started = admit(context)
                ok = False
                try:
                    async for item in behavior(request, context):
                        yield item
                    ok = True
                finally:
                    release(started, ok)

            return call

        return rewrap(handler, unary, streaming)
