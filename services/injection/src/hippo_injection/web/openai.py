"""The OpenAI-compatible HTTP API, on the TGI API's aiohttp app (same port, same process).

Routes: POST /v1/completions (a raw prompt, the caller's own markup), POST
/v1/chat/completions (messages, rendered in the host's prompt format, gemma-turns-v1:
exactly what Generate and CountTokens use), GET /v1/models. `stream: true` answers with
server-sent events in OpenAI's chunk format, ending with `data: [DONE]`; a plain reply
carries `usage`. Errors are OpenAI's JSON error object: 400 bad input, 403 a caller the
TLS rules refuse, 429 with Retry-After when the model queue is full, 503 before the model
is loaded, 504 past the deadline.

The TGI app's middlewares run first (web/tgi.py): under TLS the same callers as
/generate may generate and /v1/models is open to any verified caller, as /info is; the
X-Hippo-Priority header and the request deadline (HTTP_TIMEOUT_SECONDS) apply as there.
This module only converts (openai_convert.py) and streams.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import structlog
from aiohttp import web

from hippo_core import openai_compat
from hippo_core.errors import Code, HippoError, InvalidArgument, ResourceExhausted
from hippo_injection.domain.service import InjectionService
from hippo_injection.domain.types import Finish, Generated, GenerateRequest
from hippo_injection.web import openai_convert as convert

log = structlog.stdlib.get_logger("hippo.injection.openai")

_STATUS = {
    Code.INVALID_ARGUMENT: (400, "invalid_request_error"),
    Code.FAILED_PRECONDITION: (400, "invalid_request_error"),
    Code.PERMISSION_DENIED: (403, "permission_error"),
    Code.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    Code.UNAVAILABLE: (503, "service_unavailable"),
    Code.DEADLINE_EXCEEDED: (504, "timeout"),
}
_SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def error_payload(exc: Exception) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, OpenAI error body and headers of an exception."""
    if not isinstance(exc, HippoError) or exc.code not in _STATUS:
        log.exception("openai_http_internal_error", exc_info=exc)
        return 500, convert.error("Request failed during generation", "server_error"), {}
    status, kind = _STATUS[exc.code]
    param = exc.field if isinstance(exc, InvalidArgument) else None
    headers, code = {}, None
    if isinstance(exc, ResourceExhausted):
        code = "rate_limit_exceeded"
        if exc.retry_after is not None:
            headers["Retry-After"] = openai_compat.retry_after_header(exc.retry_after)
    return status, convert.error(exc.message, kind, param, code), headers


class OpenAiHttpApi:
    prefix = "/v1"
    open: tuple[str, ...] = ("/v1/models",)  # to any verified caller, as /info is

    def __init__(self, service: Any) -> None:
        self._service = service  # () -> InjectionService; UNAVAILABLE until warm-up is done

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)

    def error_reply(self, exc: Exception) -> web.Response:
        status, body, headers = error_payload(exc)
        return web.json_response(body, status=status, headers=headers)

    @staticmethod
    async def _body(request: web.Request) -> Any:
        try:
            return await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidArgument("body", f"is not valid JSON: {exc}") from None

    async def completions(self, request: web.Request) -> web.StreamResponse:
        domain: InjectionService = self._service()
        generate, body = convert.completion_request(await self._body(request))
        return await self._answer(request, domain, generate, body, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        domain: InjectionService = self._service()
        generate, body = convert.chat_request(await self._body(request))
        if not generate.max_new_tokens:
            # No max_tokens: what the context leaves after the prompt, as vLLM does, up
            # to the host's own cap.
            left = domain.limits.context_length - len(domain.prompt_ids(generate.prompt))
            new = max(1, min(domain.limits.max_new_tokens, left))
            generate = dataclasses.replace(generate, max_new_tokens=new)
        return await self._answer(request, domain, generate, body, chat=True)

    async def models(self, request: web.Request) -> web.StreamResponse:
        domain: InjectionService = self._service()
        return web.json_response(convert.models(convert.served_name(domain.info.model)))

    async def _answer(
        self,
        request: web.Request,
        domain: InjectionService,
        generate: GenerateRequest,
        body: dict[str, Any],
        chat: bool,
    ) -> web.StreamResponse:
        stream, with_usage = convert.streaming(body)
        model = body.get("model") or convert.served_name(domain.info.model)
        id_ = convert.new_id("chatcmpl" if chat else "cmpl")
        async with aclosing(domain.generate(generate)) as items:
            if not stream:
                finish = await _last(items)
                text, stop = convert.cut_at_stop(finish.generated_text, generate.stop_sequences)
                make = convert.chat_completion if chat else convert.completion
                return web.json_response(make(id_, model, text, stop, finish))
            first = await anext(items)  # errors before the first token get a status code
            response = web.StreamResponse(headers=_SSE)
            await response.prepare(request)
            request["stream"] = response  # the deadline just ends a started stream
            send = _sender(response)
            try:
                finish, stop = await _events(send, chat, id_, model, first, items, generate)
                if with_usage:
                    await send(convert.usage_chunk(chat, id_, model, finish))
                await response.write(b"data: [DONE]\n\n")
            except Exception as exc:  # after the headers: in-band, as OpenAI's servers do
                await send(error_payload(exc)[1])
            await response.write_eof()
            return response


async def _last(items: AsyncIterator[Generated]) -> Finish:
    async for item in items:
        if item.finish is not None:
            return item.finish
    raise RuntimeError("generation ended without a finish")


def _sender(response: web.StreamResponse) -> Any:
    async def send(event: dict[str, Any]) -> None:
        await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")

    return send


async def _events(
    send: Any,
    chat: bool,
    id_: str,
    model: str,
    first: Generated,
    rest: AsyncIterator[Generated],
    generate: GenerateRequest,
) -> tuple[Finish, str | None]:
    holdback = convert.StopHoldback(generate.stop_sequences)
    if chat:
        await send(convert.chunk(chat, id_, model, None))  # the role comes first
    item = first
    while True:
        # Special tokens (<eos>, <end_of_turn>) are never text, as in the TGI reply.
        piece = "" if item.token.special else item.token.text
        if item.finish is None:
            out = holdback.push(piece)
            if out:
                await send(convert.chunk(chat, id_, model, out))
            item = await anext(rest)
            continue
        out, stop = holdback.finish(piece)
        if out:
            await send(convert.chunk(chat, id_, model, out))
        await send(convert.chunk(chat, id_, model, "", item.finish, stop))
        return item.finish, stop
