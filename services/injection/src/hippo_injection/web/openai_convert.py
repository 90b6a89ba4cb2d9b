"""Pure conversions between OpenAI's completions / chat completions JSON and domain values.

Shapes follow OpenAI's API reference (and what vLLM and llama.cpp serve), so the `openai`
client parses them unchanged. OpenAI's semantics where they differ from TGI's: the
temperature defaults to 1 (sampling; 0 is greedy), the returned text stops *before* a
matched stop sequence, and `finish_reason` is "stop" or "length". Like vLLM, a choice
also names the stop sequence that matched in `stop_reason` (None otherwise), so a caller
can tell a stop sequence from the model's own end. Parameters this host cannot honour are
refused (400) rather than silently ignored.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from hippo_core import openai_compat
from hippo_core.errors import InvalidArgument
from hippo_injection.domain.types import (
    Finish,
    FinishReason,
    GenerateRequest,
    Message,
    Prompt,
    Role,
    Sampling,
)

COMPLETIONS_DEFAULT_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
# "developer" is OpenAI's newer name for the system role.
_ROLES = {
    "system": Role.SYSTEM,
    "developer": Role.SYSTEM,
    "user": Role.USER,
    "assistant": Role.ASSISTANT,
}
# Must be absent, null or the neutral value: anything else asks for what this host lacks.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "echo": (False,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "suffix": ("",),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logit_bias": ({},),
    "tools": ([],),
    "functions": ([],),
}


def _number(body: dict[str, Any], name: str, kind: type, low: float, high: float) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(name, f"must be a number, got {value!r}")
    if kind is int and not float(value).is_integer():
        raise InvalidArgument(name, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidArgument(name, f"must be {low:g} to {high:g}, got {value!r}")
    return kind(value)


def _common(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object")
    for name, neutral in _NEUTRAL.items():
        if body.get(name) is not None and body[name] not in neutral:
            raise InvalidArgument(name, "is not supported by this host")
    format_ = body.get("response_format")
    if format_ is not None and format_ != {"type": "text"}:
        raise InvalidArgument("response_format", 'only {"type": "text"} is supported')
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise InvalidArgument("model", "must be a string")
    return body


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise InvalidArgument("stop", "must be a non-empty string or a list of them")
    return tuple(stops)


def _sampling(body: dict[str, Any]) -> Sampling:
    temperature = _number(body, "temperature", float, 0, 2)
    top_p = _number(body, "top_p", float, 0, 1)
    seed = _number(body, "seed", int, 0, 2**63 - 1)
    temperature = 1.0 if temperature is None else temperature
    if temperature == 0:  # OpenAI's greedy
        return Sampling(seed=seed)
    if top_p == 0:
        raise InvalidArgument("top_p", "must be above 0 when sampling")
    return Sampling(
        do_sample=True, temperature=temperature, top_p=1.0 if top_p is None else top_p, seed=seed
    )


def _max_tokens(body: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = _number(body, name, int, 1, 2**31 - 1)
        if value is not None:
            return int(value)
    return None


def streaming(body: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage): whether to answer with SSE, and with a usage chunk."""
    options = body.get("stream_options") or {}
    return bool(body.get("stream")), bool(
        isinstance(options, dict) and options.get("include_usage")
    )


def completion_request(body: Any) -> tuple[GenerateRequest, dict[str, Any]]:
    """POST /v1/completions: the raw prompt (the caller's own markup), as TGI's `inputs`."""
    body = _common(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # one prompt as a list; several would be a batch
    if not isinstance(prompt, str) or not prompt:
        raise InvalidArgument("prompt", "must be one non-empty string")
    new_tokens = _max_tokens(body, "max_tokens") or COMPLETIONS_DEFAULT_TOKENS
    request = GenerateRequest(Prompt(text=prompt), new_tokens, _stop(body), _sampling(body))
    return request, body


def chat_request(body: Any) -> tuple[GenerateRequest, dict[str, Any]]:
    """POST /v1/chat/completions: the messages, rendered by the host's prompt format.
    The request's max_new_tokens is 0 when the caller gave none (the host fills in what
    the context leaves)."""
    body = _common(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidArgument("messages", "must be a non-empty list")
    messages = [_message(i, m) for i, m in enumerate(raw)]
    new_tokens = _max_tokens(body, "max_completion_tokens", "max_tokens") or 0
    prompt = Prompt(messages=tuple(messages))
    return GenerateRequest(prompt, new_tokens, _stop(body), _sampling(body)), body


def _message(i: int, message: Any) -> Message:
    if not isinstance(message, dict):
        raise InvalidArgument(f"messages[{i}]", "must be an object with role and content")
    given = message.get("role")
    role = _ROLES.get(given) if isinstance(given, str) else None
    if role is None:
        raise InvalidArgument(
            f"messages[{i}].role",
            f"must be system, developer, user or assistant, got {message.get('role')!r}",
        )
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text ones
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise InvalidArgument(f"messages[{i}].content", "only text parts are supported")
        content = "".join(str(p.get("text", "")) for p in content)
    if not isinstance(content, str):
        raise InvalidArgument(f"messages[{i}].content", "must be a string or text parts")
    return Message(role, content)


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """The text before the first stop sequence in it, and that stop (None: none in it)."""
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    at, stop = min(hits)
    return text[:at], stop


class StopHoldback:
    """What a stream may send so far: text that may still turn out to begin a stop
    sequence is held back until the next token settles it, so a matched stop sequence
    is never sent (OpenAI's rule), even when it arrives over several tokens."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = stops
        self._text = ""
        self._sent = 0

    def _held(self) -> int:
        longest = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self._text)), longest, -1):
                if self._text.endswith(stop[:k]):
                    longest = k
                    break
        return longest

    def push(self, piece: str) -> str:
        self._text += piece
        safe = max(self._sent, len(self._text) - self._held())
        out, self._sent = self._text[self._sent : safe], safe
        return out

    def finish(self, piece: str) -> tuple[str, str | None]:
        """The rest to send after the last piece, and the stop sequence that matched."""
        text, stop = cut_at_stop(self._text + piece, self._stops)
        return text[self._sent :], stop


def finish_reason(finish: Finish) -> str:
    return "length" if finish.reason is FinishReason.LENGTH else "stop"


def usage(finish: Finish) -> dict[str, int]:
    return {
        "prompt_tokens": finish.prompt_tokens,
        "completion_tokens": finish.generated_tokens,
        "total_tokens": finish.prompt_tokens + finish.generated_tokens,
    }


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex}"


def _envelope(id_: str, object_: str, model: str) -> dict[str, Any]:
    return {"id": id_, "object": object_, "created": int(time.time()), "model": model}


def completion(id_: str, model: str, text: str, stop: str | None, finish: Finish) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason(finish),
        "stop_reason": stop,
    }
    return {**_envelope(id_, "text_completion", model), "choices": [choice], "usage": usage(finish)}


def chat_completion(
    id_: str, model: str, text: str, stop: str | None, finish: Finish
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": finish_reason(finish),
        "stop_reason": stop,
    }
    envelope = _envelope(id_, "chat.completion", model)
    return {**envelope, "choices": [choice], "usage": usage(finish)}


def chunk(
    chat: bool,
    id_: str,
    model: str,
    text: str | None,
    finish: Finish | None = None,
    stop: str | None = None,
) -> dict[str, Any]:
    """One SSE chunk; `text` None on a chat stream's first chunk (the role)."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None}
    if chat:
        choice["delta"] = (
            {"role": "assistant", "content": ""}
            if text is None
            else ({"content": text} if text else {})
        )
    else:
        choice["text"] = text or ""
    choice["finish_reason"] = finish_reason(finish) if finish is not None else None
    if finish is not None:
        choice["stop_reason"] = stop
    object_ = "chat.completion.chunk" if chat else "text_completion"
    return {**_envelope(id_, object_, model), "choices": [choice]}


def usage_chunk(chat: bool, id_: str, model: str, finish: Finish) -> dict[str, Any]:
    object_ = "chat.completion.chunk" if chat else "text_completion"
    return {**_envelope(id_, object_, model), "choices": [], "usage": usage(finish)}


def served_name(model: str) -> str:
    """The id /v1/models lists: the model id without the host's notes ("(GGUF ...)")."""
    return model.split(" ", 1)[0]


def models(name: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": "hippo"}],
    }


error = openai_compat.error_body  # OpenAI's error body (shared with the gateway's /v1)
