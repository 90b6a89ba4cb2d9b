"""Request limits, checked before a request waits for the model, so a bad one costs
nothing and never half-runs. Messages name the field and the limit."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hippo_core.errors import InvalidArgument
from hippo_injection.domain.types import Attendable, Influence, ModelInfo, Sampling


@dataclass(frozen=True)
class Limits:
    context_length: int
    max_new_tokens: int
    max_stop_sequences: int
    max_stop_chars: int
    max_influences: int
    max_strength: float
    max_memories: int
    max_memory_tokens: int
    max_value_scale: float
    max_baseline_texts: int


def _finite(field: str, value: float) -> None:
    if not math.isfinite(value):
        raise InvalidArgument(field, f"must be a finite number, got {value}")


def layer(field: str, value: int, info: ModelInfo) -> None:
    if not 0 <= value < info.layers:
        raise InvalidArgument(field, f"must be 0 to {info.layers - 1}, got {value}")


def nonempty(field: str, text: str) -> None:
    if not text:
        raise InvalidArgument(field, "must not be empty")


def influences(items: Sequence[Influence], info: ModelInfo, limits: Limits) -> None:
    if len(items) > limits.max_influences:
        raise InvalidArgument(
            "influences", f"at most {limits.max_influences} per request, got {len(items)}"
        )
    for i, item in enumerate(items):
        field = f"influences[{i}]"
        if item.vector.shape != (info.hidden_size,):
            raise InvalidArgument(
                f"{field}.vector",
                f"must hold {info.hidden_size} float32 values "
                f"({info.hidden_size * 4} bytes), got {item.vector.size}",
            )
        if not np.isfinite(item.vector).all():
            bad = int(np.flatnonzero(~np.isfinite(item.vector))[0])
            raise InvalidArgument(f"{field}.vector", f"holds NaN or inf at index {bad}")
        layer(f"{field}.layer", item.layer, info)
        _finite(f"{field}.strength", item.strength)
        if abs(item.strength) > limits.max_strength:
            raise InvalidArgument(
                f"{field}.strength",
                f"must be within ±{limits.max_strength:g}, got {item.strength:g}",
            )


def attendable(item: Attendable, memory_tokens: int, info: ModelInfo, limits: Limits) -> None:
    """`memory_tokens`: of the texts and the states together (each text's <bos> too)."""
    count = len(item.texts) + len(item.states)
    if count > limits.max_memories:
        field = "attendable.texts" if item.texts else "attendable.states"
        raise InvalidArgument(field, f"at most {limits.max_memories} memories, got {count}")
    for i, text in enumerate(item.texts):
        nonempty(f"attendable.texts[{i}]", text)
    for i, states in enumerate(item.states):
        field = f"attendable.states[{i}]"
        if states.model_id != info.model:
            raise InvalidArgument(
                field, f"states of model {states.model_id!r}; this service runs {info.model!r}"
            )
        if states.keys.shape[0] != info.layers:
            raise InvalidArgument(
                field, f"states of {states.keys.shape[0]} layers; the model has {info.layers}"
            )
    if memory_tokens > limits.max_memory_tokens:
        raise InvalidArgument(
            "attendable.texts" if item.texts else "attendable.states",
            f"at most {limits.max_memory_tokens} tokens in all, got {memory_tokens}",
        )
    layer("attendable.from_layer", item.from_layer, info)
    _finite("attendable.value_scale", item.value_scale)
    if not 0 <= item.value_scale <= limits.max_value_scale:
        raise InvalidArgument(
            "attendable.value_scale",
            f"must be 0 to {limits.max_value_scale:g}, got {item.value_scale:g}",
        )


def sampling(item: Sampling, vocab_size: int) -> None:
    for name in ("temperature", "top_p", "repetition_penalty"):
        _finite(f"sampling.{name}", getattr(item, name))
    if not 0 < item.temperature <= 100:
        raise InvalidArgument(
            "sampling.temperature", f"must be in (0, 100], got {item.temperature:g}"
        )
    if not 0 <= item.top_k <= vocab_size:
        raise InvalidArgument("sampling.top_k", f"must be 0 to {vocab_size}, got {item.top_k}")
    if not 0 < item.top_p <= 1:
        raise InvalidArgument("sampling.top_p", f"must be in (0, 1], got {item.top_p:g}")
    if not 0 < item.repetition_penalty <= 10:
        raise InvalidArgument(
            "sampling.repetition_penalty", f"must be in (0, 10], got {item.repetition_penalty:g}"
        )


def generation(
    max_new_tokens: int, stop_sequences: Sequence[str], prompt_tokens: int, limits: Limits
) -> None:
    if not 1 <= max_new_tokens <= limits.max_new_tokens:
        raise InvalidArgument(
            "max_new_tokens", f"must be 1 to {limits.max_new_tokens}, got {max_new_tokens}"
        )
    if len(stop_sequences) > limits.max_stop_sequences:
        raise InvalidArgument(
            "stop_sequences",
            f"at most {limits.max_stop_sequences} sequences, got {len(stop_sequences)}",
        )
    for i, stop in enumerate(stop_sequences):
        nonempty(f"stop_sequences[{i}]", stop)
        if len(stop) > limits.max_stop_chars:
            raise InvalidArgument(
                f"stop_sequences[{i}]",
                f"at most {limits.max_stop_chars} characters, got {len(stop)}",
            )
    context(prompt_tokens, max_new_tokens, limits)


def context(prompt_tokens: int, new_tokens: int, limits: Limits, field: str = "prompt") -> None:
    if prompt_tokens + new_tokens > limits.context_length:
        raise InvalidArgument(
            field,
            f"{prompt_tokens} prompt tokens + {new_tokens} new tokens exceed the context "
            f"length of {limits.context_length}",
        )
