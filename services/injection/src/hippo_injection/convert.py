"""Pure conversions between protobuf messages and domain values."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np

from hippo.injection.v1 import injection_pb2 as pb
from hippo_core.errors import InvalidArgument
from hippo_injection.adapters.states_codec import pack_states, unpack_states
from hippo_injection.domain import prompt as prompt_format
from hippo_injection.domain.memtok.models import WriteReport
from hippo_injection.domain.memtok.pipeline import Mode, Plan
from hippo_injection.domain.types import (
    Attendable,
    Counted,
    FinishReason,
    Generated,
    GenerateRequest,
    Influence,
    Message,
    ModelInfo,
    Positions,
    Prompt,
    Role,
    Sampling,
    Scored,
    ScoreRequest,
    ValueVector,
    ValueVectorRequest,
)
from hippo_injection.domain.validation import Limits

VECTOR_ENCODING = "float32-le"
DEFAULT_NEW_TOKENS = 64
_ROLES = {pb.ROLE_SYSTEM: Role.SYSTEM, pb.ROLE_USER: Role.USER, pb.ROLE_ASSISTANT: Role.ASSISTANT}
_POSITIONS = {
    pb.POSITIONS_UNSPECIFIED: Positions.ALL,
    pb.POSITIONS_ALL: Positions.ALL,
    pb.POSITIONS_PROMPT: Positions.PROMPT,
    pb.POSITIONS_GENERATED: Positions.GENERATED,
}
_FINISH = {
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.EOS_TOKEN: pb.FINISH_REASON_EOS_TOKEN,
    FinishReason.STOP_SEQUENCE: pb.FINISH_REASON_STOP_SEQUENCE,
}


def vector(raw: bytes, field: str) -> np.ndarray:
    """Packed '<f4' bytes as a float32 array; a length that is not whole floats is the
    caller's error, named like any other."""
    if len(raw) % 4:
        raise InvalidArgument(
            field, f"must be whole float32 values (4 bytes each), got {len(raw)} bytes"
        )
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def _messages(items: Iterable[pb.ChatMessage]) -> tuple[Message, ...]:
    out = []
    for i, item in enumerate(items):
        if item.role not in _ROLES:
            raise InvalidArgument(f"messages[{i}].role", "must be SYSTEM, USER or ASSISTANT")
        out.append(Message(_ROLES[item.role], item.content))
    return tuple(out)


def prompt(text: str, messages: Iterable[pb.ChatMessage]) -> Prompt:
    converted = _messages(messages)
    if converted and text:
        raise InvalidArgument("prompt", "set prompt or messages, not both")
    return Prompt(messages=converted) if converted else Prompt(text=text)


def _influences(items: Iterable[pb.Influence]) -> tuple[Influence, ...]:
    return tuple(
        Influence(
            vector(item.vector, f"influences[{i}].vector"),
            item.layer,
            item.strength,
            _POSITIONS.get(item.positions, Positions.ALL),
        )
        for i, item in enumerate(items)
    )


def _attendable(item: pb.Attendable) -> Attendable:
    states = []
    for i, record in enumerate(item.states):
        try:
            states.append(unpack_states(record))
        except ValueError as e:
            raise InvalidArgument(f"attendable.states[{i}]", str(e)) from None
    return Attendable(tuple(item.texts), item.from_layer, item.value_scale or 1.0, tuple(states))


def attendable_message(item: Attendable) -> pb.Attendable:
    """A plan's attendable memories for PlanInfluenceResponse (float16 records)."""
    return pb.Attendable(
        from_layer=item.from_layer,
        value_scale=item.value_scale,
        states=[pack_states(s) for s in item.states],
    )


def _sampling(item: pb.Sampling) -> Sampling:
    return Sampling(
        do_sample=item.do_sample,
        temperature=item.temperature or 1.0,
        top_k=item.top_k,
        top_p=item.top_p or 1.0,
        repetition_penalty=item.repetition_penalty or 1.0,
        seed=item.seed if item.HasField("seed") else None,
    )


def generate_request(request: pb.GenerateRequest) -> GenerateRequest:
    return GenerateRequest(
        prompt=prompt(request.prompt, request.messages),
        max_new_tokens=request.max_new_tokens or DEFAULT_NEW_TOKENS,
        stop_sequences=tuple(request.stop_sequences),
        sampling=_sampling(request.sampling),
        influences=_influences(request.influences),
        attendable=_attendable(request.attendable),
    )


def generate_response(item: Generated) -> pb.GenerateResponse:
    token = item.token
    reply = pb.GenerateResponse(
        token=pb.Token(id=token.id, text=token.text, logprob=token.logprob, special=token.special)
    )
    if item.finish is not None:
        finish = item.finish
        reply.finish.CopyFrom(
            pb.Finish(
                reason=_FINISH[finish.reason],
                generated_text=finish.generated_text,
                prompt_tokens=finish.prompt_tokens,
                generated_tokens=finish.generated_tokens,
                seed=finish.seed,
            )
        )
    return reply


def score_request(request: pb.ScoreRequest) -> ScoreRequest:
    return ScoreRequest(
        prompt=prompt(request.prompt, request.messages),
        continuation=request.continuation,
        influences=_influences(request.influences),
        attendable=_attendable(request.attendable),
    )


def score_response(result: Scored) -> pb.ScoreResponse:
    return pb.ScoreResponse(
        token_ids=result.token_ids,
        logprobs=result.logprobs,
        total_logprob=result.total,
        greedy_match=result.greedy_match,
        prompt_tokens=result.prompt_tokens,
    )


def count_request(request: pb.CountTokensRequest) -> Prompt:
    return prompt(request.text, request.messages)


def count_response(result: Counted, limits: Limits) -> pb.CountTokensResponse:
    return pb.CountTokensResponse(
        tokens=result.tokens, formatted=result.formatted, context_length=limits.context_length
    )


def value_vector_request(request: pb.MakeValueVectorRequest) -> ValueVectorRequest:
    return ValueVectorRequest(
        text=request.text,
        layer=request.layer,
        subtract_baseline=request.subtract_baseline,
        baseline_texts=tuple(request.baseline_texts),
        scale_to_layer_norm=request.scale_to_layer_norm,
    )


def value_vector_response(result: ValueVector) -> pb.MakeValueVectorResponse:
    return pb.MakeValueVectorResponse(
        vector=np.ascontiguousarray(result.vector, dtype="<f4").tobytes(),
        dimension=result.vector.size,
        layer=result.layer,
        norm=result.norm,
        layer_mean_norm=result.layer_mean_norm,
        tokens=result.tokens,
    )


def info_response(info: ModelInfo, limits: Limits, max_waiting: int) -> pb.InfoResponse:
    return pb.InfoResponse(
        model=info.model,
        layers=info.layers,
        hidden_size=info.hidden_size,
        dtype=info.dtype,
        device=info.device,
        context_length=limits.context_length,
        vocab_size=info.vocab_size,
        layer_mean_norms=info.layer_mean_norms,
        max_new_tokens=limits.max_new_tokens,
        max_stop_sequences=limits.max_stop_sequences,
        max_influences=limits.max_influences,
        max_strength=limits.max_strength,
        max_memories=limits.max_memories,
        max_waiting=max_waiting,
        vector_encoding=VECTOR_ENCODING,
        prompt_format=prompt_format.NAME,
        special_tokens=info.special_tokens,
    )


def values(raw: bytes) -> np.ndarray:
    """The client side: a vector field as a float32 array."""
    return np.frombuffer(raw, dtype="<f4")


# -- memtok influence ---------------------------------------------------------------

_MODES = {
    pb.INFLUENCE_MODE_OFF: Mode.OFF,
    pb.INFLUENCE_MODE_DISCLOSE_ONLY: Mode.DISCLOSE_ONLY,
    pb.INFLUENCE_MODE_ON: Mode.ON,
}
_MODE_VALUES = {m: v for v, m in _MODES.items()}


def mode(value: int) -> Mode | None:
    """None for UNSPECIFIED (the user's recorded mode applies)."""
    if value == pb.INFLUENCE_MODE_UNSPECIFIED:
        return None
    if value not in _MODES:
        raise InvalidArgument("mode", f"unknown influence mode {value}")
    return _MODES[value]  # type: ignore[index]


def mode_value(item: Mode) -> Any:  # the generated enum's value type
    return _MODE_VALUES[item]


def plan_response(plan: Plan) -> pb.PlanInfluenceResponse:
    return pb.PlanInfluenceResponse(
        mode=mode_value(plan.mode),
        influences=[
            pb.Influence(
                vector=np.asarray(i.vector, dtype="<f4").tobytes(),
                layer=i.layer,
                strength=i.strength,
                positions=pb.POSITIONS_ALL,
            )
            for i in plan.influences
        ],
        audit_json=json.dumps(plan.audit_body(), sort_keys=True),
        private_json=json.dumps(plan.private_body(), sort_keys=True),
        attendable=attendable_message(plan.attendable) if plan.attendable else None,
    )


def write_response(report: WriteReport) -> pb.WriteMemtoksResponse:
    counts = report.counts()
    return pb.WriteMemtoksResponse(
        audit_json=json.dumps(report.audit_body(), sort_keys=True),
        private_json=json.dumps(report.private_body(), sort_keys=True),
        created=counts.get("new", 0),
        merged=counts.get("merged", 0),
        evicted=counts.get("evicted", 0),
    )
