"""The merge LLM through text-generation-inference's HTTP API (the `Llm` port).

The request and reply are the `text_generation` client's types, posted here rather
than by `text_generation.AsyncClient`, which cannot present a client certificate: under
TLS the injection host's API requires the summariser's. By default it talks to the
injection host's TGI-compatible endpoint, and any TGI server works the same way. Every
call has a deadline twice over: aiohttp's timeout and an asyncio timeout around it
(aiohttp's covers the HTTP exchange, ours also covers its session set-up).

Every call is marked `X-Hippo-Priority: background`: nobody waits for a merge, so the
injection host serves Chat first (docs/injection.md#priorities). Other TGI servers ignore
the header.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from text_generation import errors as tgi_errors
from text_generation.types import FinishReason, Parameters, Request, Response

from hippo_summariser.domain.ports import Completion, LlmRejected, LlmUnavailable

# The request itself is at fault: sending it again cannot succeed.
_REJECTED = (tgi_errors.ValidationError, tgi_errors.BadRequestError, tgi_errors.NotFoundError)


# Down, busy, or failing on the server's side: worth retrying later.
_TRANSIENT = (
    tgi_errors.OverloadedError,
    tgi_errors.RateLimitExceededError,
    tgi_errors.GenerationError,
    tgi_errors.IncompleteGenerationError,
    tgi_errors.ShardNotReadyError,
    tgi_errors.ShardTimeoutError,
    tgi_errors.UnknownError,
    # A reply that is not TGI's JSON (a proxy's error page, a server starting up).
    KeyError,
    TypeError,
    ValueError,
)


BACKGROUND = {"X-Hippo-Priority": "background"}


@dataclass(frozen=True)
class Generation:
    """Generation parameters (greedy by default: a summary should be reproducible)."""

    greedy: bool = True
    temperature: float = 0.7
    top_p: float = 0.9
    seed: int = 0
    repetition_penalty: float = 1.0


class TgiLlm:
    def __init__(
        self,
        url: str,
        timeout: float,
        generation: Generation,
        tls: ssl.SSLContext | None = None,
        headers: Mapping[str, str] = BACKGROUND,
    ) -> None:
        self._url = url
        self._headers = dict(headers)
        self._timeout = timeout
        self._generation = generation
        self._tls = tls  # None: the system's CAs, no client certificate

    async def _generate(self, parameters: Parameters, prompt: str) -> Response:
        """What `AsyncClient.generate` does: POST to TGI's compat route, one Response."""
        request = Request(inputs=prompt, stream=False, parameters=parameters)
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(self._timeout)) as session,
            session.post(
                self._url,
                json=request.model_dump(),
                headers=self._headers,
                ssl=self._tls or True,
            ) as resp,
        ):
            payload = await resp.json()
            if resp.status != 200:
                raise tgi_errors.parse_error(resp.status, payload)
            return Response(**payload[0])

    async def complete(
        self, prompt: str, *, max_new_tokens: int, stop: Sequence[str]
    ) -> Completion:
        g = self._generation
        sampling = {} if g.greedy else {"temperature": g.temperature, "top_p": g.top_p}
        try:
            async with asyncio.timeout(self._timeout):
                parameters = Parameters(
                    details=True,
                    do_sample=not g.greedy,
                    max_new_tokens=max_new_tokens,
                    stop=list(stop),
                    seed=g.seed,
                    repetition_penalty=(
                        g.repetition_penalty if g.repetition_penalty != 1.0 else None
                    ),
                    **sampling,
                )
                reply = await self._generate(parameters, prompt)
        except _REJECTED as exc:
            raise LlmRejected(str(exc)) from exc
        except (TimeoutError, aiohttp.ClientError, *_TRANSIENT) as exc:
            raise LlmUnavailable(f"{type(exc).__name__}: {exc}") from exc
        details = reply.details
        cut = details is not None and details.finish_reason == FinishReason.Length
        return Completion(
            text=reply.generated_text,
            cut_by_length=cut,
            tokens=details.generated_tokens if details is not None else 0,
        )
