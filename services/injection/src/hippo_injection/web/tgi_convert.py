"""Pure conversions between text-generation-inference's JSON and domain values.

Shapes follow TGI's router (`router/src/lib.rs`): GenerateParameters in, GenerateResponse
/ StreamResponse / ErrorResponse / Info out, so `text_generation.Client` and
`AsyncClient` parse them unchanged. Parameters this host cannot honour are refused as
validation errors rather than silently ignored.
"""

from __future__ import annotations

from typing import Any

from hippo_core.errors import InvalidArgument
from hippo_injection.domain.types import (
    Finish,
    GenerateRequest,
    ModelInfo,
    Prompt,
    Sampling,
    Token,
)
from hippo_injection.domain.validation import Limits

TGI_DEFAULT_NEW_TOKENS = 100  # TGI's default_max_new_tokens
_UNSUPPORTED = ("typical_p", "truncate", "top_n_tokens", "grammar", "frequency_penalty")


def _number(params: dict[str, Any], name: str, kind: type) -> Any:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"parameters.{name}", f"must be a number, got {value!r}")
    if kind is int and (not float(value).is_integer()):
        raise InvalidArgument(f"parameters.{name}", f"must be an integer, got {value!r}")
    return kind(value)


def generate_request(body: Any) -> tuple[GenerateRequest, dict[str, Any]]:
    """The domain request and the parameters the reply's shape depends on."""
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object with `inputs`")
    inputs = body.get("inputs")
    if not isinstance(inputs, str) or not inputs:
        raise InvalidArgument("inputs", "must be a non-empty string")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidArgument("parameters", "must be a JSON object")
    for name in _UNSUPPORTED:
        if params.get(name) is not None:
            raise InvalidArgument(f"parameters.{name}", "is not supported by this host")
    if (_number(params, "best_of", int) or 1) > 1:
        raise InvalidArgument("parameters.best_of", "only 1 is supported by this host")
    if params.get("watermark"):
        raise InvalidArgument("parameters.watermark", "is not supported by this host")
    stop = params.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise InvalidArgument("parameters.stop", "must be a list of strings")
    temperature = _number(params, "temperature", float)
    top_k = _number(params, "top_k", int)
    top_p = _number(params, "top_p", float)
    # TGI samples when asked to, or when any warper differs from its neutral value.
    do_sample = bool(params.get("do_sample")) or (
        (temperature is not None and temperature != 1.0)
        or (top_k is not None and top_k > 0)
        or (top_p is not None and top_p < 1.0)
    )
    seed = _number(params, "seed", int)
    if seed is not None and seed < 0:
        raise InvalidArgument("parameters.seed", f"must be >= 0, got {seed}")
    sampling = Sampling(
        do_sample=do_sample,
        temperature=1.0 if temperature is None else temperature,
        top_k=top_k or 0,
        top_p=1.0 if top_p is None else top_p,
        repetition_penalty=_number(params, "repetition_penalty", float) or 1.0,
        seed=seed,
    )
    new_tokens = _number(params, "max_new_tokens", int)
    request = GenerateRequest(
        prompt=Prompt(text=inputs),
        max_new_tokens=TGI_DEFAULT_NEW_TOKENS if new_tokens is None else new_tokens,
        stop_sequences=tuple(stop),
        sampling=sampling,
    )
    shape = {
        "details": bool(params.get("details")),
        "decoder_input_details": bool(params.get("decoder_input_details")),
        "full_text": inputs if params.get("return_full_text") else "",
    }
    return request, shape


def token(item: Token) -> dict[str, Any]:
    return {"id": item.id, "text": item.text, "logprob": item.logprob, "special": item.special}


def _seed(finish: Finish) -> int | None:
    return finish.seed or None  # TGI reports a seed only when it sampled


def generate_response(
    tokens: list[Token], finish: Finish, prefill: list[dict[str, Any]], shape: dict[str, Any]
) -> dict[str, Any]:
    reply: dict[str, Any] = {"generated_text": shape["full_text"] + finish.generated_text}
    if shape["details"]:
        reply["details"] = {
            "finish_reason": finish.reason.value,
            "generated_tokens": finish.generated_tokens,
            "seed": _seed(finish),
            "prefill": prefill if shape["decoder_input_details"] else [],
            "tokens": [token(t) for t in tokens],
        }
    return reply


def stream_event(
    index: int, item: Token, finish: Finish | None, shape: dict[str, Any]
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "index": index,
        "token": token(item),
        "top_tokens": None,
        "generated_text": None,
        "details": None,
    }
    if finish is not None:
        event["generated_text"] = shape["full_text"] + finish.generated_text
        if shape["details"]:
            event["details"] = {
                "finish_reason": finish.reason.value,
                "generated_tokens": finish.generated_tokens,
                "seed": _seed(finish),
                "input_length": finish.prompt_tokens,
            }
    return event


def prefill(ids: list[int], texts: list[str]) -> list[dict[str, Any]]:
    """Decoder input details: ids and texts; this host does not score the prompt."""
    return [{"id": i, "text": t, "logprob": None} for i, t in zip(ids, texts, strict=True)]


def error(message: str, kind: str) -> dict[str, str]:
    return {"error": message, "error_type": kind}


def info(model: ModelInfo, limits: Limits, max_waiting: int, version: str) -> dict[str, Any]:
    return {
        "model_id": model.model,
        "model_sha": None,
        "model_dtype": f"torch.{model.dtype}",
        "model_device_type": model.device,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": max_waiting + 1,
        "max_best_of": 1,
        "max_stop_sequences": limits.max_stop_sequences,
        "max_input_tokens": limits.context_length - 1,
        "max_input_length": limits.context_length - 1,
        "max_total_tokens": limits.context_length,
        "waiting_served_ratio": 0.0,
        "max_batch_total_tokens": limits.context_length,
        "max_waiting_tokens": 0,
        "max_batch_size": 1,
        "validation_workers": 1,
        "max_client_batch_size": 1,
        "router": "hippo-injection",
        "version": version,
        "sha": None,
        "docker_label": None,
    }
