"""What Hippo's OpenAI-compatible pieces share: the client every LLM adapter opens (the
gateway's Chat, the summariser's merges), OpenAI's error body and the Retry-After value
every HTTP edge sends (the injection host's TGI and /v1 routes, the gateway's /v1).

`openai` is imported only by `async_client`: the services that call an OpenAI-compatible
LLM declare it; the others never load it.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import openai


def base_url(url: str) -> str:
    """OpenAI clients want the API's root, /v1 included: a URL without a path gets it
    (http://vllm:8000 -> http://vllm:8000/v1); one with a path is kept as given."""
    return url.rstrip("/") + "/v1" if urlsplit(url).path in ("", "/") else url


def async_client(
    url: str,
    api_key: str,
    timeout: float,
    *,
    tls: ssl.SSLContext | None = None,
    headers: Mapping[str, str] | None = None,
) -> openai.AsyncOpenAI:
    """An `openai` client for an LLM adapter: no retries of its own (the caller's policy
    and deadlines decide), a placeholder key for local servers that want none (the client
    insists on one), and under TLS this process's certificate presented."""
    import openai

    http = openai.DefaultAsyncHttpxClient(verify=tls) if tls is not None else None
    return openai.AsyncOpenAI(
        base_url=base_url(url),
        api_key=api_key or "none",
        timeout=timeout,
        max_retries=0,
        default_headers=dict(headers or {}),
        http_client=http,
    )


def error_body(
    message: str, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def retry_after_header(seconds: float) -> str:
    """A RetryInfo delay as an HTTP Retry-After value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
