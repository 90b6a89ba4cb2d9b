"""The LLM through a TGI-compatible HTTP endpoint, in the `text-generation` client's types.

The local default is the injection service's TGI API; any TGI server can replace it by
configuration. The request is posted here rather than by `text_generation.AsyncClient`,
which cannot present a client certificate: under TLS the injection host's API requires
the gateway's. The client's own exceptions become the statuses they mean for our caller.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
from collections.abc import AsyncIterator

import aiohttp
from pydantic import ValidationError
from text_generation import errors as tgi
from text_generation.types import Parameters, Request, StreamResponse

from hippo_core import context as request_context
from hippo_core import tracing
from hippo_core.errors import (
    DeadlineExceeded,
    HippoError,
    Internal,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from hippo_gateway.domain.models import Generation, Piece


def _error(exc: Exception) -> HippoError:
    if isinstance(exc, tgi.OverloadedError | tgi.RateLimitExceededError):
        return ResourceExhausted(f"llm: {exc}")
    if isinstance(exc, tgi.ValidationError | tgi.BadRequestError):
        return InvalidArgument("params", f"the LLM refused the request: {exc}")
    if isinstance(exc, asyncio.TimeoutError | tgi.ShardTimeoutError):
        return DeadlineExceeded("llm: the generation did not finish in time")
    if isinstance(exc, aiohttp.ClientError | tgi.ShardNotReadyError | tgi.NotFoundError):
        return Unavailable(f"llm: {exc}")
    return Internal(f"llm failed ({type(exc).__name__})")


async def _generate_stream(
    url: str, request: Request, headers: dict[str, str], timeout: int, tls: ssl.SSLContext | None
) -> AsyncIterator[StreamResponse]:
    """What `AsyncClient.generate_stream` does: POST, then one StreamResponse per SSE
    `data:` line; a TGI error payload raises its `text_generation.errors` exception."""
    async with (
        aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(timeout)) as session,
        session.post(url, json=request.model_dump(), ssl=tls or True) as resp,
    ):
        if resp.status != 200:
            raise tgi.parse_error(resp.status, await resp.json())
        async for line in resp.content:
            payload = line.decode("utf-8")
            if not payload.startswith("data:"):
                continue
            data = json.loads(payload[len("data:") :])
            try:
                yield StreamResponse(**data)
            except ValidationError:
                raise tgi.parse_error(resp.status, data) from None


class TgiLlm:
    def __init__(self, base_url: str, timeout_s: float, tls: ssl.SSLContext | None = None) -> None:
        self._url = base_url
        self._timeout = timeout_s
        self._tls = tls  # None: the system's CAs, no client certificate

    async def stream(self, prompt: str, params: Generation) -> AsyncIterator[Piece]:
        # The client takes whole seconds, for the whole call: the caller's remaining
        # time when it has one, our own cap otherwise.
        remaining = request_context.time_remaining()
        timeout = self._timeout if remaining is None else min(self._timeout, remaining)
        if timeout <= 0:
            raise DeadlineExceeded("the call's deadline has already passed")
        # `generate_stream` posts to TGI's compat route, "/", with stream=true.
        with tracing.http_client_span("POST /") as headers:
            sampling = params.temperature > 0
            try:
                parameters = Parameters(
                    details=True,
                    decoder_input_details=False,
                    do_sample=sampling,
                    max_new_tokens=params.max_new_tokens,
                    temperature=params.temperature if sampling else None,
                    top_p=params.top_p if sampling and 0 < params.top_p < 1 else None,
                    top_k=params.top_k if sampling and params.top_k > 0 else None,
                    seed=params.seed or None,
                    stop=list(params.stop),
                )
                request = Request(inputs=prompt, stream=True, parameters=parameters)
                seconds = max(1, math.ceil(timeout))
                stream = _generate_stream(self._url, request, headers, seconds, self._tls)
                async for response in stream:
                    text = "" if response.token.special else response.token.text
                    details = response.details
                    if details is not None:
                        yield Piece(text, details.finish_reason.value, details.generated_tokens)
                    else:
                        yield Piece(text)
            except HippoError:
                raise
            except Exception as exc:  # the client raises its own and aiohttp's exceptions
                raise _error(exc) from exc
