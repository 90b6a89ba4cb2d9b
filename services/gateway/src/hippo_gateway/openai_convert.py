"""Pure conversions between OpenAI's chat-completions JSON and the gateway's Chat.

One request is one Chat: its `user` is the scope's user, the X-Hippo-Session header its
session, and its last message (a user message) the message. Earlier messages are not
read: Hippo's own session window and memories supply the history, so an application
that resends its whole conversation stores each message once, when it is new. Fields
whose meaning Hippo cannot honour (tools, n > 1, logprobs, JSON mode) are refused rather
than silently ignored; sampling penalties and logit_bias are ignored (docs/api.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hippo_core import openai_compat
from hippo_core.errors import InvalidArgument
from hippo_gateway.domain import validation
from hippo_gateway.domain.chat import Finished, Started
from hippo_gateway.domain.models import Generation

MODEL_ID = "hippo"  # what GET /v1/models lists; any `model` a request names is served
SESSION_HEADER = "X-Hippo-Session"
MAX_SEED = 2**64 - 1  # GenerationParameters.seed is a uint64
# TGI's finish reasons -> OpenAI's.
_FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}
# Domain field paths (as the gRPC API names them) -> the OpenAI request's.
_PARAMS = {
    "params.temperature": "temperature",
    "params.top_p": "top_p",
    "params.stop": "stop",
    "message": "messages",
    "scope.user_id": "user",
    "scope.session_id": SESSION_HEADER,
}


@dataclass(frozen=True)
class ChatCall:
    """One /v1/chat/completions request, read."""

    user: str
    session: str
    message: str
    params: Generation
    model: str
    stream: bool
    include_usage: bool
    # Which of max_tokens / max_completion_tokens the caller sent: errors name that one.
    max_tokens_field: str = "max_tokens"


def _typed(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    # bool is an int to Python, never to JSON Schema: `"max_tokens": true` is refused.
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise InvalidArgument(name, f"must be {what}, got {type(value).__name__}")
    return value


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidArgument(name, f"must be a boolean, got {type(value).__name__}")
    return bool(value)


def _content(message: Any, i: int) -> str:
    """A message's text: a string, or text parts (other parts are refused)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidArgument(
                    f"messages[{i}].content[{j}]", "only text parts are supported"
                )
            if not isinstance(part.get("text"), str):
                raise InvalidArgument(f"messages[{i}].content[{j}].text", "must be a string")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidArgument(f"messages[{i}].content", "must be a string or a list of text parts")


def _message(body: Mapping[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("messages", "must be a non-empty array of messages")
    i = len(messages) - 1
    last = messages[i]
    if not isinstance(last, dict) or last.get("role") != "user":
        # Answering an older user message while tool results or a prefill follow it would
        # answer a question the caller no longer asks.
        raise InvalidArgument(
            f"messages[{i}].role", "the last message must be the user's (the one answered)"
        )
    return _content(last, i)


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for name in ("tools", "functions"):
        if body.get(name):
            raise InvalidArgument(name, "tool calling is not supported")
    if body.get("tool_choice") not in (None, "none"):
        raise InvalidArgument("tool_choice", "tool calling is not supported")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise InvalidArgument("logprobs", "log probabilities are not returned")
    n = _typed(body, "n", int, "an integer")
    if n not in (None, 1):
        raise InvalidArgument("n", f"only 1 choice per request is supported, got {n}")
    response_format = body.get("response_format")
    if response_format is not None and (
        not isinstance(response_format, dict) or response_format.get("type") != "text"
    ):
        raise InvalidArgument("response_format", 'only {"type": "text"} is supported')


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise InvalidArgument("stop", "must be a string or an array of strings")


def _generation(body: Mapping[str, Any]) -> tuple[Generation, str]:
    field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = _typed(body, field, int, "an integer")
    if max_tokens is not None and max_tokens < 1:
        raise InvalidArgument(field, f"must be at least 1, got {max_tokens}")
    temperature = _typed(body, "temperature", (int, float), "a number")
    top_p = _typed(body, "top_p", (int, float), "a number")
    seed = _typed(body, "seed", int, "an integer")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise InvalidArgument("seed", f"must be 0..{MAX_SEED}, got {seed}")
    params = Generation(
        max_new_tokens=max_tokens or 0,  # 0: the API's default (check_generation)
        temperature=float(temperature or 0.0),
        top_p=float(top_p or 0.0),
        seed=seed or 0,
        stop=_stop(body),
    )
    return params, field


def chat_call(body: Any, session: str | None, default_session: str) -> ChatCall:
    """The request's Chat, or InvalidArgument naming the OpenAI field."""
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object")
    model = _typed(body, "model", str, "a string") or MODEL_ID
    user = _typed(body, "user", str, "a string") or ""
    # The user is the scope: without it every caller of a key would share one memory.
    validation.check_id("user", user)
    session = default_session if session is None else session
    validation.check_id(SESSION_HEADER, session)
    _refuse_unsupported(body)
    message = _message(body)
    params, field = _generation(body)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidArgument("stream_options", "must be an object")
    include_usage = bool(stream and options and options.get("include_usage") is True)
    return ChatCall(user, session, message, params, model, stream, include_usage, field)


def param(field: str, call: ChatCall | None) -> str:
    """The OpenAI request field a domain error's field path stands for."""
    if field in ("params.max_new_tokens", "token_budget"):
        return call.max_tokens_field if call is not None else "max_tokens"
    if field.startswith("params.stop["):
        return field.removeprefix("params.")
    return _PARAMS.get(field, field)


def finish_reason(reason: str) -> str:
    return _FINISH.get(reason, "stop")


def usage(started: Started, finished: Finished) -> dict[str, int]:
    """Prompt tokens as the context builder counted them; completion as the model made."""
    prompt = started.context.total_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": finished.generated_tokens,
        "total_tokens": prompt + finished.generated_tokens,
    }


def hippo(started: Started, finished: Finished | None = None) -> dict[str, Any]:
    """The vendor extension: what Hippo did for this reply (docs/api.md)."""
    out: dict[str, Any] = {
        "disclosure_note": started.note,
        "memory_ids_used": [h.memory.memory_id for h in started.context.memories_used],
    }
    if finished is not None:
        out |= {
            "audit_seq": finished.audit_seq,
            "user_memory_id": finished.user_memory_id,
            "assistant_memory_id": finished.assistant_memory_id,
        }
    return out


def completion(
    call: ChatCall, cid: str, created: int, text: str, started: Started, finished: Finished
) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": call.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason(finished.finish_reason),
                "logprobs": None,
            }
        ],
        "usage": usage(started, finished),
        "hippo": hippo(started, finished),
    }


def chunk(
    call: ChatCall,
    cid: str,
    created: int,
    delta: dict[str, str],
    finish: str | None = None,
    extension: dict[str, Any] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": call.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    if extension is not None:
        out["hippo"] = extension
    return out


def usage_chunk(
    call: ChatCall, cid: str, created: int, started: Started, finished: Finished
) -> dict[str, Any]:
    """stream_options.include_usage: the last chunk, no choices, the usage."""
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": call.model,
        "choices": [],
        "usage": usage(started, finished),
    }


def models(created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": MODEL_ID, "object": "model", "created": created, "owned_by": "hippo"}],
    }


error = openai_compat.error_body  # OpenAI's error body (shared with the injection host)
