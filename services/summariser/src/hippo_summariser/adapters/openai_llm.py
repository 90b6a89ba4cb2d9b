"""The merge LLM through any OpenAI-compatible API (the `Llm` port), with the `openai`
client.

Two request styles (`llm_api_style`): "completions" posts the merge prompt as it is to
/v1/completions (base models; vLLM, llama.cpp, TGI, Ollama, the injection host's /v1);
"chat" sends it as one user message to /v1/chat/completions, for servers that only take
messages (hosted APIs). OpenAI's replies stop before a matched stop sequence, where TGI's
include it; the merge's clean-up cuts at the same markers either way.

Every call is marked `X-Hippo-Priority: background` (the client's default headers), as
the TGI adapter's are: the injection host serves Chat first; other servers ignore it.
Every call has a deadline twice over: the client's timeout and an asyncio timeout around
the whole call (its connection and its wait for a concurrency slot included). The client
does not retry (max_retries=0): the merger retries with its own backoff and pacing.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import openai
from pydantic import SecretStr

from hippo_core import openai_compat
from hippo_summariser.adapters.tgi_llm import BACKGROUND, Generation
from hippo_summariser.domain.ports import Completion, LlmRejected, LlmUnavailable

ApiStyle = Literal["completions", "chat"]
# The request itself is at fault: sending it again cannot succeed. A 404 (a wrong
# llm_model or llm_url) is not: merges wait, and alert, until the setting is fixed.
_REJECTED = (400, 413, 422)


class OpenAiLlm:
    def __init__(
        self,
        url: str,
        api_key: SecretStr,
        model: str,
        style: ApiStyle,
        timeout: float,
        generation: Generation,
        max_concurrency: int,
        tls: ssl.SSLContext | None = None,
        headers: Mapping[str, str] = BACKGROUND,
    ) -> None:
        # Under TLS to the injection host the client presents the summariser's certificate.
        self._client = openai_compat.async_client(
            url, api_key.get_secret_value(), timeout, tls=tls, headers=headers
        )
        self._model = model
        self._style = style
        self._timeout = timeout
        self._generation = generation
        self._slots = asyncio.Semaphore(max_concurrency)

    def __repr__(self) -> str:  # never the key
        return f"OpenAiLlm({self._client.base_url!s}, model={self._model!r}, {self._style})"

    def _body(self, max_new_tokens: int, stop: Sequence[str]) -> dict[str, Any]:
        g = self._generation
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": max_new_tokens,
            "temperature": 0.0 if g.greedy else g.temperature,
            "seed": g.seed,
        }
        if not g.greedy:
            body["top_p"] = g.top_p
        if stop:
            body["stop"] = list(stop)
        if g.repetition_penalty != 1.0:  # vLLM's and llama.cpp's extension
            body["extra_body"] = {"repetition_penalty": g.repetition_penalty}
        return body

    async def complete(
        self, prompt: str, *, max_new_tokens: int, stop: Sequence[str]
    ) -> Completion:
        body = self._body(max_new_tokens, stop)
        try:
            async with asyncio.timeout(self._timeout), self._slots:
                if self._style == "chat":
                    messages: Any = [{"role": "user", "content": prompt}]
                    chat = await self._client.chat.completions.create(messages=messages, **body)
                    choice: Any = chat.choices[0]
                    text, usage = choice.message.content or "", chat.usage
                else:
                    reply = await self._client.completions.create(prompt=prompt, **body)
                    choice = reply.choices[0]
                    text, usage = choice.text, reply.usage
        except openai.APIStatusError as exc:
            if exc.status_code in _REJECTED:
                raise LlmRejected(exc.message) from exc
            raise LlmUnavailable(f"{exc.status_code}: {exc.message}") from exc
        except (TimeoutError, openai.APIError, ValueError, KeyError, IndexError) as exc:
            # Down, timed out, or a reply that is not OpenAI's JSON: retry later.
            raise LlmUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return Completion(
            text=text,
            cut_by_length=choice.finish_reason == "length",
            tokens=usage.completion_tokens if usage is not None else 0,
        )

    async def close(self) -> None:
        await self._client.close()
