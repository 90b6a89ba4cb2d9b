"""The OpenAI-compatible HTTP edge: POST /v1/chat/completions and GET /v1/models.

An edge like servicer.py: authenticate (the same API keys and roles as gRPC Chat, sent as
`Authorization: Bearer <key>`), admit the tenant's rate, read the request
(openai_convert), one ChatService.chat, write the reply as a `chat.completion` or as SSE
`chat.completion.chunk`s ending `data: [DONE]`. Every error is OpenAI's
`{"error": {...}}` body with the status OpenAI's clients read (401, 403, 400, 429 with
Retry-After, 503, 504); a fault of ours is a 500 with a trace id, its traceback only in
the log. Once a stream has begun an error is sent in-band as a `data: {"error": ...}`
event, as OpenAI does. A client that disconnects cancels the handler
(`handler_cancellation`), which stops generation and stores nothing.

Under TLS it is HTTPS with the gateway's certificate; a client certificate is required
only when the gateway's gRPC port requires one (`tls.require_client_cert`).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing, suppress
from typing import Any, cast

import structlog
from aiohttp import web
from opentelemetry import trace

from hippo_core import context as request_context
from hippo_core import openai_compat, tls, tracing
from hippo_core.errors import (
    Code,
    DeadlineExceeded,
    HippoError,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from hippo_core.settings import TlsSettings
from hippo_gateway import metrics
from hippo_gateway import openai_convert as convert
from hippo_gateway.domain.auth import Authenticator
from hippo_gateway.domain.chat import ChatEvent, ChatService, Finished, Started, Token
from hippo_gateway.domain.quota import Quotas

log = structlog.stdlib.get_logger("hippo.gateway.openai")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Status and OpenAI error type per code. OpenAI's clients retry 409, 429 and 5xx.
_STATUS = {
    Code.INVALID_ARGUMENT: (400, "invalid_request_error"),
    Code.FAILED_PRECONDITION: (400, "invalid_request_error"),
    Code.UNAUTHENTICATED: (401, "authentication_error"),
    Code.PERMISSION_DENIED: (403, "permission_error"),
    Code.NOT_FOUND: (404, "not_found_error"),
    Code.ALREADY_EXISTS: (409, "conflict_error"),
    Code.ABORTED: (409, "conflict_error"),
    Code.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    Code.UNIMPLEMENTED: (501, "not_implemented_error"),
    Code.UNAVAILABLE: (503, "service_unavailable_error"),
    Code.DEADLINE_EXCEEDED: (504, "timeout_error"),
}
_CREDENTIALS = ("authorization", "x-api-key")
CALL = web.RequestKey("call", convert.ChatCall)  # the request as read: errors name its fields
STREAM = web.RequestKey("stream", web.StreamResponse)  # set once the SSE headers are sent


def _trace_id() -> str:
    span = trace.get_current_span().get_span_context()
    return format(span.trace_id, "032x") if span.is_valid else uuid.uuid4().hex


def _reply(
    exc: Exception, call: convert.ChatCall | None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, OpenAI error body and headers of an error."""
    if isinstance(exc, web.HTTPException):  # no route, wrong method, body too large
        body = convert.error(exc.reason, "invalid_request_error", code=str(exc.status))
        return exc.status, body, {}
    if not isinstance(exc, HippoError):
        trace_id = _trace_id()
        log.exception("http_internal_error", trace_id=trace_id)
        body = convert.error(f"internal error (trace id {trace_id})", "server_error")
        return 500, body, {}
    status, kind = _STATUS.get(exc.code, (500, "server_error"))
    message, param = exc.message, None
    if isinstance(exc, InvalidArgument):
        param = convert.param(exc.field, call)
        message = f"{param}: {exc.problem}"
    headers = {}
    if isinstance(exc, ResourceExhausted):
        if exc.retry_after is not None:
            headers["Retry-After"] = openai_compat.retry_after_header(exc.retry_after)
        else:  # over the stored-turn quota: waiting frees nothing (OpenAI clients read this)
            headers["x-should-retry"] = "false"
    log.info("http_error", status=status, reason=exc.reason, error=exc.message)
    return status, convert.error(message, kind, param, exc.reason.lower()), headers


def _event(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def server_context(settings: TlsSettings) -> tls.HttpServerTls:
    """The gateway's certificate; a client certificate only when gRPC requires one (the
    public edge serves applications that have none)."""
    server = tls.HttpServerTls(settings)
    if not settings.require_client_cert:
        server.context.verify_mode = ssl.CERT_NONE
    return server


class OpenAiApi:
    """Given its ChatService once warm-up reached the peers; until then 503."""

    def __init__(
        self,
        auth: Authenticator,
        quotas: Quotas,
        default_session: str,
        timeout: float,
        grace: float,
        max_body_bytes: int,
    ) -> None:
        self._auth = auth
        self._quotas = quotas
        self._default_session = default_session
        self._timeout = timeout
        self._grace = grace
        self._max_body = max_body_bytes
        self.chat: ChatService | None = None
        self._runner: web.AppRunner | None = None
        self._tls: tls.HttpServerTls | None = None
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=self._max_body)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        return app

    async def start(self, host: str, port: int, tls_settings: TlsSettings) -> None:
        self._runner = web.AppRunner(
            self.app(), handler_cancellation=True, shutdown_timeout=self._grace, access_log=None
        )
        await self._runner.setup()
        if tls_settings.enabled:
            self._tls = server_context(tls_settings)
        context = self._tls.context if self._tls is not None else None
        await web.TCPSite(self._runner, host, port, ssl_context=context).start()
        self.port = int(self._runner.addresses[0][1])
        log.info("openai_api_listening", port=self.port, tls=context is not None)

    async def stop(self) -> None:
        """Stop accepting; requests in flight get the grace period, then are cancelled."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def _chat(self) -> ChatService:
        if self.chat is None:
            raise Unavailable("the gateway is still connecting to its peers; retry shortly")
        return self.chat

    def _tenant(self, request: web.Request) -> str:
        """Authenticated, allowed Chat by the key's roles, within the tenant's rate."""
        metadata = [(k.lower(), v) for k, v in request.headers.items() if k.lower() in _CREDENTIALS]
        tenant = self._auth.caller(metadata, "Chat").tenant
        self._quotas.admit(tenant)
        return tenant

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._tls is not None:
            self._tls.reload_if_changed()  # for the connections after this one
        # Set on every request, never left from the last: keep-alive requests of one
        # connection share a task (and so its context).
        rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        request_context.request_id.set(rid)
        request_context.deadline.set(time.monotonic() + self._timeout)
        structlog.contextvars.bind_contextvars(request_id=rid, method=request.path)
        route = request.path if request.path in metrics.HTTP_ROUTES else "other"
        started = time.perf_counter()
        status = 500
        with tracing.http_server_span(f"{request.method} {request.path}", request.headers):
            try:
                async with asyncio.timeout(self._timeout):
                    response = await handler(request)
                status = response.status
                return response
            except Exception as exc:  # the one place errors of this API are mapped
                if isinstance(exc, TimeoutError):
                    exc = DeadlineExceeded("the request's deadline passed; generation stopped")
                status, body, headers = _reply(exc, request.get(CALL))
                stream: web.StreamResponse | None = request.get(STREAM)
                if stream is None:
                    return web.json_response(body, status=status, headers=headers)
                with suppress(ConnectionError):  # headers sent: report in-band
                    await stream.write(_event(body))
                    await stream.write_eof()
                return stream
            finally:
                metrics.HTTP_REQUESTS.labels(route, str(status)).inc()
                metrics.HTTP_SECONDS.labels(route).observe(time.perf_counter() - started)

    async def _body(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidArgument("body", f"is not valid JSON: {exc}") from None

    async def models(self, request: web.Request) -> web.StreamResponse:
        self._tenant(request)
        return web.json_response(convert.models(int(time.time())))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        tenant = self._tenant(request)
        session = request.headers.get(convert.SESSION_HEADER)
        call = convert.chat_call(await self._body(request), session, self._default_session)
        request[CALL] = call
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        # An async generator: closed on the way out, so generation stops with the request.
        events = cast(
            "AsyncGenerator[ChatEvent, None]",
            self._chat().chat(tenant, call.user, call.session, call.message, params=call.params),
        )
        async with aclosing(events) as items:
            started = await anext(items)  # errors before the reply get their status
            if not isinstance(started, Started):
                raise RuntimeError("chat did not start with a Started event")
            if call.stream:
                return await self._stream(request, call, cid, created, started, items)
            pieces: list[str] = []
            async for item in items:
                if isinstance(item, Token):
                    pieces.append(item.text)
                elif isinstance(item, Finished):
                    reply = convert.completion(call, cid, created, "".join(pieces), started, item)
                    return web.json_response(reply)
        raise RuntimeError("chat ended without a Finished event")

    async def _stream(
        self,
        request: web.Request,
        call: convert.ChatCall,
        cid: str,
        created: int,
        started: Started,
        items: Any,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        request[STREAM] = response
        first = {"role": "assistant", "content": ""}
        await response.write(
            _event(convert.chunk(call, cid, created, first, None, convert.hippo(started)))
        )
        async for item in items:
            if isinstance(item, Token):
                await response.write(
                    _event(convert.chunk(call, cid, created, {"content": item.text}))
                )
            elif isinstance(item, Finished):
                finish = convert.finish_reason(item.finish_reason)
                extension = convert.hippo(started, item)
                await response.write(
                    _event(convert.chunk(call, cid, created, {}, finish, extension))
                )
                if call.include_usage:
                    await response.write(
                        _event(convert.usage_chunk(call, cid, created, started, item))
                    )
        await response.write(_event("[DONE]"))
        await response.write_eof()
        return response
