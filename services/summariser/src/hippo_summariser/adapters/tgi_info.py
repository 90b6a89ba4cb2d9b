"""Which model the merge LLM serves: TGI's GET /info (`model_id`).

merge_mode=auto asks it once, before the first merge: the injection host answers with
its built-in model ("google/gemma-3-270m (GGUF Q4_K_M, dequantised)"), a TGI server with
the model it loaded. A server without TGI's /info answers "" (an unknown model: auto
then means llm); one that cannot be reached raises LlmUnavailable, so the merge is
retried later, as its LLM call would be.
"""

from __future__ import annotations

import asyncio
import ssl

import aiohttp

from hippo_summariser.domain.ports import LlmUnavailable


async def model_id(url: str, timeout: float, tls: ssl.SSLContext | None = None) -> str:
    try:
        async with (
            asyncio.timeout(timeout),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(timeout)) as session,
            session.get(url.rstrip("/") + "/info", ssl=tls or True) as resp,
        ):
            if resp.status != 200:
                return ""
            payload = await resp.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise LlmUnavailable(f"{type(exc).__name__}: {exc}") from exc
    except ValueError:  # not JSON: not TGI's /info
        return ""
    found = payload.get("model_id") if isinstance(payload, dict) else None
    return found if isinstance(found, str) else ""
