"""The TGI-compatible HTTP API, served by aiohttp in the service's own process.

Routes: POST / (TGI's compat route: a list for plain calls, SSE when `stream` is true,
which is what `text_generation.Client.generate` posts to), POST /generate,
POST /generate_stream (server-sent events), GET /info, GET /health. Errors are TGI's
ErrorResponse with its status codes: 422 validation, 429 overloaded, 503 not ready,
504 deadline, 424 anything else. The same app serves the OpenAI-compatible routes under
/v1 (web/openai.py, passed in as `extra`), with their own error shape. A client that
disconnects cancels its handler (`handler_cancellation`), which stops generation and
removes the request's hooks.

Under TLS the API is HTTPS and requires a client certificate from the CA; the routes
that generate answer only the services allowed to (their certificate's identity, as
for gRPC: hippo_core.server.authz), anyone else gets 403. /health and /info stay open
to any verified caller.

Priority: a request with `X-Hippo-Priority: background` (the summariser's merges) waits
behind every other one for the model (domain/queue.py); any other value, or none, is
interactive. The header can only lower a caller's own priority, so it is honoured as sent,
under TLS too. A 429 carries Retry-After (whole seconds, from the queue's estimate).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, Protocol

import structlog
from aiohttp import web

from hippo_core import context as request_context
from hippo_core import openai_compat, tls, tracing
from hippo_core.errors import (
    Code,
    DeadlineExceeded,
    HippoError,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
)
from hippo_core.settings import TlsSettings
from hippo_injection.domain import queue
from hippo_injection.domain.service import InjectionService
from hippo_injection.domain.types import Generated, Token
from hippo_injection.web import tgi_convert

log = structlog.stdlib.get_logger("hippo.injection.http")

_STATUS = {
    Code.INVALID_ARGUMENT: (422, "validation"),
    Code.PERMISSION_DENIED: (403, "permission"),
    Code.RESOURCE_EXHAUSTED: (429, "overloaded"),
    Code.UNAVAILABLE: (503, "unhealthy"),
    Code.DEADLINE_EXCEEDED: (504, "generation"),
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN = ("/health", "/info")  # to any verified caller, as gRPC health and reflection are
PRIORITY_HEADER = "X-Hippo-Priority"


class Routes(Protocol):
    """More routes on this app (the OpenAI-compatible API, web/openai.py): the same
    callers, priority and deadline, their own error shape for paths under `prefix`."""

    prefix: str
    open: tuple[str, ...]  # paths any verified caller may read

    def add_routes(self, app: web.Application) -> None: ...

    def error_reply(self, exc: Exception) -> web.Response: ...


def _error_reply(exc: Exception) -> web.Response:
    if isinstance(exc, HippoError):
        status, kind = _STATUS.get(exc.code, (424, "generation"))
        headers = {}
        if isinstance(exc, ResourceExhausted) and exc.retry_after is not None:
            headers["Retry-After"] = openai_compat.retry_after_header(exc.retry_after)
        return web.json_response(
            tgi_convert.error(exc.message, kind), status=status, headers=headers
        )
    log.exception("http_internal_error")
    return web.json_response(
        tgi_convert.error("Request failed during generation", "generation"), status=424
    )


class TgiHttpApi:
    def __init__(
        self,
        service: Callable[[], InjectionService],
        timeout: float,
        grace: float,
        max_waiting: int,
        version: str,
        extra: Sequence[Routes] = (),
    ) -> None:
        self._service = service  # raises UNAVAILABLE until warm-up has loaded the model
        self._timeout = timeout
        self._grace = grace
        self._max_waiting = max_waiting
        self._version = version
        self._extra = tuple(extra)
        self._open = OPEN + tuple(path for routes in self._extra for path in routes.open)
        self._runner: web.AppRunner | None = None
        self._tls: tls.HttpServerTls | None = None
        self._callers: frozenset[str] = frozenset()
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._caller, self._traced, self._errors])
        app.router.add_post("/", self.compat)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/generate_stream", self.generate_stream)
        app.router.add_get("/info", self.info)
        app.router.add_get("/health", self.health)
        for routes in self._extra:
            routes.add_routes(app)
        return app

    def _reply(self, request: web.Request, exc: Exception) -> web.Response:
        for routes in self._extra:
            if request.path.startswith(routes.prefix + "/"):
                return routes.error_reply(exc)
        return _error_reply(exc)

    async def start(
        self,
        host: str,
        port: int,
        tls_settings: TlsSettings | None = None,
        callers: frozenset[str] = frozenset(),
    ) -> None:
        """Plaintext, or (TLS settings with a CA) HTTPS where only `callers` generate."""
        self._runner = web.AppRunner(
            self.app(), handler_cancellation=True, shutdown_timeout=self._grace, access_log=None
        )
        await self._runner.setup()
        if tls_settings is not None and tls_settings.enabled:
            self._tls, self._callers = tls.HttpServerTls(tls_settings), callers
        context = self._tls.context if self._tls is not None else None
        await web.TCPSite(self._runner, host, port, ssl_context=context).start()
        self.port = int(self._runner.addresses[0][1])
        log.info("http_listening", port=self.port, tls=context is not None)

    async def stop(self) -> None:
        """Stop accepting, give requests in flight the grace period, then close."""
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _caller(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._tls is None:
            return await handler(request)
        self._tls.reload_if_changed()  # for the connections after this one
        transport = request.transport
        who = tls.peer_identity(transport.get_extra_info("peercert") if transport else None)
        if request.path not in self._open and who not in self._callers:
            caller = who or "a caller without a Hippo identity"
            return self._reply(request, PermissionDenied(f"{caller} may not call {request.path}"))
        return await handler(request)

    @web.middleware
    async def _traced(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # The gateway's Chat sends its trace context in the headers (traceparent).
        with tracing.http_server_span(f"{request.method} {request.path}", request.headers):
            return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        request_context.deadline.set(time.monotonic() + self._timeout)
        # Set on every request, never left from the last: keep-alive requests of one
        # connection may share a task (and so its context).
        queue.priority.set(queue.parse_priority(request.headers.get(PRIORITY_HEADER)))
        try:
            async with asyncio.timeout(self._timeout):
                return await handler(request)
        except web.HTTPException:
            raise
        except TimeoutError:
            started = request.get("stream")
            if started is not None:  # headers already sent: the stream just ends
                return started  # type: ignore[no-any-return]
            return self._reply(
                request, DeadlineExceeded("the request's deadline passed; generation stopped")
            )
        except Exception as exc:  # the one place HTTP errors are mapped
            return self._reply(request, exc)

    async def _body(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidArgument("body", f"is not valid JSON: {exc}") from None

    async def compat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, dict) and body.get("stream"):
            return await self._stream(request, body)
        return web.json_response([await self._generate(body)])

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(await self._generate(await self._body(request)))

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, await self._body(request))

    async def _generate(self, body: Any) -> dict[str, Any]:
        domain = self._service()
        generate, shape = tgi_convert.generate_request(body)
        tokens: list[Token] = []
        async with aclosing(domain.generate(generate)) as items:
            async for item in items:
                tokens.append(item.token)
                if item.finish is not None:
                    prefill = (
                        self._prefill(domain, generate) if shape["decoder_input_details"] else []
                    )
                    return tgi_convert.generate_response(tokens, item.finish, prefill, shape)
        raise RuntimeError("generation ended without a finish")

    @staticmethod
    def _prefill(domain: InjectionService, generate: Any) -> list[dict[str, Any]]:
        ids = domain.prompt_ids(generate.prompt)
        return tgi_convert.prefill(ids, [domain.engine.token_text(i) for i in ids])

    async def _stream(self, request: web.Request, body: Any) -> web.StreamResponse:
        domain = self._service()
        generate, shape = tgi_convert.generate_request(body)
        async with aclosing(domain.generate(generate)) as items:
            first = await anext(items)  # errors before the first token get a status code
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            request["stream"] = response
            try:
                await self._events(response, first, items, shape)
            except Exception as exc:  # after the headers: report in-band, as TGI does
                reply = _error_reply(exc)
                await response.write(b"data:" + reply.body + b"\n\n")  # type: ignore[operator]
            await response.write_eof()
            return response

    async def _events(
        self,
        response: web.StreamResponse,
        first: Generated,
        rest: AsyncIterator[Generated],
        shape: dict[str, Any],
    ) -> None:
        index, item = 0, first
        while True:
            event = tgi_convert.stream_event(index, item.token, item.finish, shape)
            await response.write(b"data:" + json.dumps(event).encode() + b"\n\n")
            if item.finish is not None:
                return
            index, item = index + 1, await anext(rest)

    async def info(self, request: web.Request) -> web.StreamResponse:
        domain = self._service()
        return web.json_response(
            tgi_convert.info(domain.info, domain.limits, self._max_waiting, self._version)
        )

    async def health(self, request: web.Request) -> web.StreamResponse:
        self._service()  # UNAVAILABLE (503) until the model is loaded
        return web.Response(status=200)
