"""Chat's LLM through any OpenAI-compatible API (the `Llm` port), with the `openai` client.

Two request styles (`llm_api_style`): "completions" posts the prompt Hippo built, as it
is, to /v1/completions: base models and servers that take raw prompts (vLLM, llama.cpp,
TGI, Ollama, the injection host's /v1) generate exactly what the TGI backend would.
"chat" posts /v1/chat/completions for servers that only take messages (hosted APIs): the
built prompt is in the serving model's turn format (gemma-turns-v1, from the injection
host's CountTokens), so it is split back into its turns; a prompt without turn markers
goes as one user message.

OpenAI's semantics differ from TGI's in one visible way: the reply stops *before* a
matched stop sequence. finish_reason is "length", "stop_sequence" when the server names
the stop that matched (vLLM's and the injection host's `stop_reason`), else "eos_token".
Every call has a deadline (the caller's remaining time, capped by llm_timeout_seconds),
enforced on every chunk; llm_max_concurrency calls run at once per replica, the rest
wait for a slot within their deadline. The client does not retry (max_retries=0): the
caller's deadline is the budget and Chat is not idempotent for the user.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import openai
from pydantic import SecretStr

from hippo_core import context as request_context
from hippo_core import openai_compat, tracing
from hippo_core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    HippoError,
    Internal,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from hippo_gateway.domain.models import Generation, Piece

ApiStyle = Literal["completions", "chat"]
START, END = "<start_of_turn>", "<end_of_turn>"
_ROLE = {"user": "user", "model": "assistant", "system": "system"}


def messages_of(prompt: str) -> list[dict[str, str]]:
    """The turns of a prompt in the turn format, without the opened reply turn."""
    pieces = prompt.split(START)
    messages = []
    for piece in pieces[1:]:
        role, _, rest = piece.partition("\n")
        content, closed, _ = rest.partition(END)
        if not closed and not content.strip():
            continue  # the opened model turn the reply goes in
        messages.append({"role": _ROLE.get(role.strip(), "user"), "content": content})
    return messages or [{"role": "user", "content": prompt}]


def retry_after(exc: openai.APIStatusError) -> float | None:
    try:
        return max(0.1, float(exc.response.headers.get("retry-after", "")))
    except ValueError:
        return None


def hippo_error(exc: Exception) -> HippoError:
    """What an `openai` client error means for Chat's caller."""
    if isinstance(exc, openai.APITimeoutError | TimeoutError):
        return DeadlineExceeded("llm: the generation did not finish in time")
    if isinstance(exc, openai.APIConnectionError):
        return Unavailable(f"llm: {exc}")
    if isinstance(exc, openai.RateLimitError):
        return ResourceExhausted(f"llm: {exc.message}", retry_after=retry_after(exc))
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status in (400, 413, 422):
            return InvalidArgument("params", f"the LLM refused the request: {exc.message}")
        if status in (401, 403, 404):  # our key, or llm_model / llm_url, is wrong
            return FailedPrecondition(f"llm: {exc.message} (check the gateway's llm_* settings)")
        return Unavailable(f"llm: {exc.message}")
    if isinstance(exc, openai.APIError):  # an error event inside a stream
        return Unavailable(f"llm: {exc.message}")
    return Internal(f"llm failed ({type(exc).__name__})")


class OpenAiLlm:
    def __init__(
        self,
        url: str,
        api_key: SecretStr,
        model: str,
        style: ApiStyle,
        timeout_s: float,
        max_concurrency: int,
        tls: ssl.SSLContext | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # Under TLS to the injection host the client presents the gateway's certificate.
        self._client = openai_compat.async_client(
            url, api_key.get_secret_value(), timeout_s, tls=tls, headers=headers
        )
        self._model = model
        self._style = style
        self._timeout = timeout_s
        self._slots = asyncio.Semaphore(max_concurrency)

    def __repr__(self) -> str:  # never the key
        return f"OpenAiLlm({self._client.base_url!s}, model={self._model!r}, {self._style})"

    def _params(self, params: Generation) -> dict[str, Any]:
        sampling = params.temperature > 0
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature if sampling else 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if sampling and 0 < params.top_p < 1:
            body["top_p"] = params.top_p
        if sampling and params.top_k > 0:
            body["extra_body"] = {"top_k": params.top_k}  # vLLM's, llama.cpp's extension
        if params.seed:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        return body

    async def _open(
        self, prompt: str, params: Generation, timeout: float, headers: Mapping[str, str]
    ) -> Any:
        chat = self._style == "chat"
        # The typed overloads cannot follow a built body: one call site, untyped.
        create: Any = (self._client.chat.completions if chat else self._client.completions).create
        given: dict[str, Any] = {"messages": messages_of(prompt)} if chat else {"prompt": prompt}
        # The trace context (traceparent), so the LLM host's span joins Chat's trace.
        return await create(
            **given, **self._params(params), extra_headers=dict(headers), timeout=timeout
        )

    async def stream(self, prompt: str, params: Generation) -> AsyncIterator[Piece]:
        remaining = request_context.time_remaining()
        timeout = self._timeout if remaining is None else min(self._timeout, remaining)
        if timeout <= 0:
            raise DeadlineExceeded("the call's deadline has already passed")
        deadline = time.monotonic() + timeout
        path = "/chat/completions" if self._style == "chat" else "/completions"
        # The deadline is enforced around each await rather than around the generator's
        # body: a timeout scope must not span the `yield`s to our caller.
        try:
            async with asyncio.timeout_at(_loop_time(deadline)):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise hippo_error(exc) from exc
        try:
            with tracing.http_client_span(f"POST {path}") as headers:
                try:
                    async with asyncio.timeout_at(_loop_time(deadline)):
                        left = deadline - time.monotonic()
                        chunks = await self._open(prompt, params, left, headers)
                    async for piece in self._pieces(chunks, deadline):
                        yield piece
                except HippoError:
                    raise
                except Exception as exc:  # the client's and httpx's exceptions
                    raise hippo_error(exc) from exc
        finally:
            self._slots.release()

    async def _pieces(self, chunks: Any, deadline: float) -> AsyncIterator[Piece]:
        iterator = aiter(chunks)
        finish, stop, pieces, generated = "", None, 0, 0
        try:
            while True:
                async with asyncio.timeout_at(_loop_time(deadline)):
                    try:
                        chunk = await anext(iterator)
                    except StopAsyncIteration:
                        break
                if chunk.usage is not None:
                    generated = chunk.usage.completion_tokens
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                text = (choice.delta.content if self._style == "chat" else choice.text) or ""
                if text:
                    pieces += 1
                    yield Piece(text)
                if choice.finish_reason:
                    finish = choice.finish_reason
                    stop = (choice.model_extra or {}).get("stop_reason")
        finally:
            await chunks.close()
        if not finish:
            # OpenAI's last chunk always names a finish reason: without one the server
            # cut the stream. llama.cpp's server does that, with status 200 and no token,
            # for a prompt longer than its --n_ctx: an empty reply must not pass as one.
            if not pieces:
                raise FailedPrecondition(
                    "llm: the server ended the stream without a token or a finish reason "
                    "(a prompt longer than its context? llama.cpp: raise --n_ctx)"
                )
            raise Unavailable("llm: the server cut the stream off before it finished")
        if finish == "length":
            reason = "length"
        else:
            reason = "stop_sequence" if isinstance(stop, str) else "eos_token"
        # Servers without usage in streams: the pieces are about the tokens.
        yield Piece("", reason, generated or pieces)

    async def close(self) -> None:
        await self._client.close()


def _loop_time(deadline: float) -> float:
    """A time.monotonic() deadline on the running loop's clock."""
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())
