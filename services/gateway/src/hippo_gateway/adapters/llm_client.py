"""The LLM through a TGI-compatible HTTP endpoint, with the `text-generation` client.

The local default is the injection service's TGI API; any TGI server can replace it by
configuration. The client's own exceptions become the statuses they mean for our caller.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import aiohttp
from text_generation import AsyncClient
from text_generation import errors as tgi

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


class TgiLlm:
    def __init__(self, base_url: str, timeout_s: float) -> None:
        self._url = base_url
        self._timeout = timeout_s

    async def stream(self, prompt: str, params: Generation) -> AsyncIterator[Piece]:
        # The client takes whole seconds, for the whole call: the caller's remaining
        # time when it has one, our own cap otherwise.
        remaining = request_context.time_remaining()
        timeout = self._timeout if remaining is None else min(self._timeout, remaining)
        if timeout <= 0:
            raise DeadlineExceeded("the call's deadline has already passed")
        # `generate_stream` posts to TGI's compat route, "/", with stream=true.
        with tracing.http_client_span("POST /") as headers:
            client = AsyncClient(self._url, headers=headers, timeout=max(1, math.ceil(timeout)))
            sampling = params.temperature > 0
            stream = client.generate_stream(
                prompt,
                do_sample=sampling,
                max_new_tokens=params.max_new_tokens,
                temperature=params.temperature if sampling else None,
                top_p=params.top_p if sampling and 0 < params.top_p < 1 else None,
                top_k=params.top_k if sampling and params.top_k > 0 else None,
                seed=params.seed or None,
                stop_sequences=list(params.stop) or None,
            )
            try:
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
