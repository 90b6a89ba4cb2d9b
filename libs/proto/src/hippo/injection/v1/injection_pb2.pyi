from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InfluenceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INFLUENCE_MODE_UNSPECIFIED: _ClassVar[InfluenceMode]
    INFLUENCE_MODE_OFF: _ClassVar[InfluenceMode]
    INFLUENCE_MODE_DISCLOSE_ONLY: _ClassVar[InfluenceMode]
    INFLUENCE_MODE_ON: _ClassVar[InfluenceMode]

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]

class Positions(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POSITIONS_UNSPECIFIED: _ClassVar[Positions]
    POSITIONS_PROMPT: _ClassVar[Positions]
    POSITIONS_GENERATED: _ClassVar[Positions]
    POSITIONS_ALL: _ClassVar[Positions]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_EOS_TOKEN: _ClassVar[FinishReason]
    FINISH_REASON_STOP_SEQUENCE: _ClassVar[FinishReason]
INFLUENCE_MODE_UNSPECIFIED: InfluenceMode
INFLUENCE_MODE_OFF: InfluenceMode
INFLUENCE_MODE_DISCLOSE_ONLY: InfluenceMode
INFLUENCE_MODE_ON: InfluenceMode
ROLE_UNSPECIFIED: Role
ROLE_SYSTEM: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
POSITIONS_UNSPECIFIED: Positions
POSITIONS_PROMPT: Positions
POSITIONS_GENERATED: Positions
POSITIONS_ALL: Positions
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_EOS_TOKEN: FinishReason
FINISH_REASON_STOP_SEQUENCE: FinishReason

class PlanInfluenceRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "query", "mode", "time_us")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    query: str
    mode: InfluenceMode
    time_us: int
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., query: _Optional[str] = ..., mode: _Optional[_Union[InfluenceMode, str]] = ..., time_us: _Optional[int] = ...) -> None: ...

class PlanInfluenceResponse(_message.Message):
    __slots__ = ("mode", "influences", "audit_json", "private_json", "attendable")
    MODE_FIELD_NUMBER: _ClassVar[int]
    INFLUENCES_FIELD_NUMBER: _ClassVar[int]
    AUDIT_JSON_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_JSON_FIELD_NUMBER: _ClassVar[int]
    ATTENDABLE_FIELD_NUMBER: _ClassVar[int]
    mode: InfluenceMode
    influences: _containers.RepeatedCompositeFieldContainer[Influence]
    audit_json: str
    private_json: str
    attendable: Attendable
    def __init__(self, mode: _Optional[_Union[InfluenceMode, str]] = ..., influences: _Optional[_Iterable[_Union[Influence, _Mapping]]] = ..., audit_json: _Optional[str] = ..., private_json: _Optional[str] = ..., attendable: _Optional[_Union[Attendable, _Mapping]] = ...) -> None: ...

class WriteMemtoksRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "query", "reply", "time_us")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    query: str
    reply: str
    time_us: int
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., query: _Optional[str] = ..., reply: _Optional[str] = ..., time_us: _Optional[int] = ...) -> None: ...

class WriteMemtoksResponse(_message.Message):
    __slots__ = ("audit_json", "created", "merged", "evicted", "private_json")
    AUDIT_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    MERGED_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_JSON_FIELD_NUMBER: _ClassVar[int]
    audit_json: str
    created: int
    merged: int
    evicted: int
    private_json: str
    def __init__(self, audit_json: _Optional[str] = ..., created: _Optional[int] = ..., merged: _Optional[int] = ..., evicted: _Optional[int] = ..., private_json: _Optional[str] = ...) -> None: ...

class SetUserInfluenceRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "mode")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    mode: InfluenceMode
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., mode: _Optional[_Union[InfluenceMode, str]] = ...) -> None: ...

class SetUserInfluenceResponse(_message.Message):
    __slots__ = ("mode",)
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: InfluenceMode
    def __init__(self, mode: _Optional[_Union[InfluenceMode, str]] = ...) -> None: ...

class ForgetUserRequest(_message.Message):
    __slots__ = ("tenant", "user_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ...) -> None: ...

class ForgetUserResponse(_message.Message):
    __slots__ = ("memtoks_deleted",)
    MEMTOKS_DELETED_FIELD_NUMBER: _ClassVar[int]
    memtoks_deleted: int
    def __init__(self, memtoks_deleted: _Optional[int] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: Role
    content: str
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ...) -> None: ...

class Influence(_message.Message):
    __slots__ = ("vector", "layer", "strength", "positions")
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    STRENGTH_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    vector: bytes
    layer: int
    strength: float
    positions: Positions
    def __init__(self, vector: _Optional[bytes] = ..., layer: _Optional[int] = ..., strength: _Optional[float] = ..., positions: _Optional[_Union[Positions, str]] = ...) -> None: ...

class Attendable(_message.Message):
    __slots__ = ("texts", "from_layer", "value_scale", "states")
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    FROM_LAYER_FIELD_NUMBER: _ClassVar[int]
    VALUE_SCALE_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    from_layer: int
    value_scale: float
    states: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, texts: _Optional[_Iterable[str]] = ..., from_layer: _Optional[int] = ..., value_scale: _Optional[float] = ..., states: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Sampling(_message.Message):
    __slots__ = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "seed")
    DO_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    seed: int
    def __init__(self, do_sample: _Optional[bool] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "messages", "max_new_tokens", "stop_sequences", "sampling", "influences", "attendable")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    INFLUENCES_FIELD_NUMBER: _ClassVar[int]
    ATTENDABLE_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    max_new_tokens: int
    stop_sequences: _containers.RepeatedScalarFieldContainer[str]
    sampling: Sampling
    influences: _containers.RepeatedCompositeFieldContainer[Influence]
    attendable: Attendable
    def __init__(self, prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., max_new_tokens: _Optional[int] = ..., stop_sequences: _Optional[_Iterable[str]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., influences: _Optional[_Iterable[_Union[Influence, _Mapping]]] = ..., attendable: _Optional[_Union[Attendable, _Mapping]] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("id", "text", "logprob", "special")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_FIELD_NUMBER: _ClassVar[int]
    id: int
    text: str
    logprob: float
    special: bool
    def __init__(self, id: _Optional[int] = ..., text: _Optional[str] = ..., logprob: _Optional[float] = ..., special: _Optional[bool] = ...) -> None: ...

class Finish(_message.Message):
    __slots__ = ("reason", "generated_text", "prompt_tokens", "generated_tokens", "seed")
    REASON_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    reason: FinishReason
    generated_text: str
    prompt_tokens: int
    generated_tokens: int
    seed: int
    def __init__(self, reason: _Optional[_Union[FinishReason, str]] = ..., generated_text: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token", "finish")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    token: Token
    finish: Finish
    def __init__(self, token: _Optional[_Union[Token, _Mapping]] = ..., finish: _Optional[_Union[Finish, _Mapping]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("prompt", "messages", "continuation", "influences", "attendable")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_FIELD_NUMBER: _ClassVar[int]
    INFLUENCES_FIELD_NUMBER: _ClassVar[int]
    ATTENDABLE_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    continuation: str
    influences: _containers.RepeatedCompositeFieldContainer[Influence]
    attendable: Attendable
    def __init__(self, prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., continuation: _Optional[str] = ..., influences: _Optional[_Iterable[_Union[Influence, _Mapping]]] = ..., attendable: _Optional[_Union[Attendable, _Mapping]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("token_ids", "logprobs", "total_logprob", "greedy_match", "prompt_tokens")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    GREEDY_MATCH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    total_logprob: float
    greedy_match: bool
    prompt_tokens: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., total_logprob: _Optional[float] = ..., greedy_match: _Optional[bool] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class CountTokensRequest(_message.Message):
    __slots__ = ("text", "messages")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    text: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class CountTokensResponse(_message.Message):
    __slots__ = ("tokens", "formatted", "context_length")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORMATTED_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    formatted: str
    context_length: int
    def __init__(self, tokens: _Optional[int] = ..., formatted: _Optional[str] = ..., context_length: _Optional[int] = ...) -> None: ...

class MakeValueVectorRequest(_message.Message):
    __slots__ = ("text", "layer", "subtract_baseline", "baseline_texts", "scale_to_layer_norm")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    SUBTRACT_BASELINE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_TEXTS_FIELD_NUMBER: _ClassVar[int]
    SCALE_TO_LAYER_NORM_FIELD_NUMBER: _ClassVar[int]
    text: str
    layer: int
    subtract_baseline: bool
    baseline_texts: _containers.RepeatedScalarFieldContainer[str]
    scale_to_layer_norm: bool
    def __init__(self, text: _Optional[str] = ..., layer: _Optional[int] = ..., subtract_baseline: _Optional[bool] = ..., baseline_texts: _Optional[_Iterable[str]] = ..., scale_to_layer_norm: _Optional[bool] = ...) -> None: ...

class MakeValueVectorResponse(_message.Message):
    __slots__ = ("vector", "dimension", "layer", "norm", "layer_mean_norm", "tokens")
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    NORM_FIELD_NUMBER: _ClassVar[int]
    LAYER_MEAN_NORM_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    vector: bytes
    dimension: int
    layer: int
    norm: float
    layer_mean_norm: float
    tokens: int
    def __init__(self, vector: _Optional[bytes] = ..., dimension: _Optional[int] = ..., layer: _Optional[int] = ..., norm: _Optional[float] = ..., layer_mean_norm: _Optional[float] = ..., tokens: _Optional[int] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model", "layers", "hidden_size", "dtype", "device", "context_length", "vocab_size", "layer_mean_norms", "max_new_tokens", "max_stop_sequences", "max_influences", "max_strength", "max_memories", "max_waiting", "vector_encoding", "prompt_format", "special_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAYER_MEAN_NORMS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_STOP_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    MAX_INFLUENCES_FIELD_NUMBER: _ClassVar[int]
    MAX_STRENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_MEMORIES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITING_FIELD_NUMBER: _ClassVar[int]
    VECTOR_ENCODING_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    layers: int
    hidden_size: int
    dtype: str
    device: str
    context_length: int
    vocab_size: int
    layer_mean_norms: _containers.RepeatedScalarFieldContainer[float]
    max_new_tokens: int
    max_stop_sequences: int
    max_influences: int
    max_strength: float
    max_memories: int
    max_waiting: int
    vector_encoding: str
    prompt_format: str
    special_tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., layers: _Optional[int] = ..., hidden_size: _Optional[int] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., context_length: _Optional[int] = ..., vocab_size: _Optional[int] = ..., layer_mean_norms: _Optional[_Iterable[float]] = ..., max_new_tokens: _Optional[int] = ..., max_stop_sequences: _Optional[int] = ..., max_influences: _Optional[int] = ..., max_strength: _Optional[float] = ..., max_memories: _Optional[int] = ..., max_waiting: _Optional[int] = ..., vector_encoding: _Optional[str] = ..., prompt_format: _Optional[str] = ..., special_tokens: _Optional[_Iterable[str]] = ...) -> None: ...
