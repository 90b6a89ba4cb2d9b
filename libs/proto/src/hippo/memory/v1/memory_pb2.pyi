import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_TOOL: _ClassVar[Role]

class RecallMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECALL_MODE_UNSPECIFIED: _ClassVar[RecallMode]
    RECALL_MODE_HYBRID: _ClassVar[RecallMode]
    RECALL_MODE_LEXICAL: _ClassVar[RecallMode]
    RECALL_MODE_SEMANTIC: _ClassVar[RecallMode]

class ContextLayout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTEXT_LAYOUT_UNSPECIFIED: _ClassVar[ContextLayout]
    CONTEXT_LAYOUT_BOUNDARY_WEIGHTED: _ClassVar[ContextLayout]
    CONTEXT_LAYOUT_CHRONOLOGICAL: _ClassVar[ContextLayout]
    CONTEXT_LAYOUT_SUMMARY_IN_SYSTEM: _ClassVar[ContextLayout]

class ZoneKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ZONE_KIND_UNSPECIFIED: _ClassVar[ZoneKind]
    ZONE_KIND_SYSTEM: _ClassVar[ZoneKind]
    ZONE_KIND_MEMORIES: _ClassVar[ZoneKind]
    ZONE_KIND_SUMMARY: _ClassVar[ZoneKind]
    ZONE_KIND_WINDOW: _ClassVar[ZoneKind]
    ZONE_KIND_QUERY: _ClassVar[ZoneKind]

class InfluenceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INFLUENCE_MODE_UNSPECIFIED: _ClassVar[InfluenceMode]
    INFLUENCE_MODE_OFF: _ClassVar[InfluenceMode]
    INFLUENCE_MODE_DISCLOSE_ONLY: _ClassVar[InfluenceMode]
    INFLUENCE_MODE_ON: _ClassVar[InfluenceMode]

class ListOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIST_ORDER_UNSPECIFIED: _ClassVar[ListOrder]
    LIST_ORDER_NEWEST_FIRST: _ClassVar[ListOrder]
    LIST_ORDER_OLDEST_FIRST: _ClassVar[ListOrder]

class OutcomeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_KIND_UNSPECIFIED: _ClassVar[OutcomeKind]
    OUTCOME_KIND_ACCEPTED: _ClassVar[OutcomeKind]
    OUTCOME_KIND_REJECTED: _ClassVar[OutcomeKind]
    OUTCOME_KIND_CORRECTED: _ClassVar[OutcomeKind]
    OUTCOME_KIND_NOTE: _ClassVar[OutcomeKind]
ROLE_UNSPECIFIED: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
ROLE_SYSTEM: Role
ROLE_TOOL: Role
RECALL_MODE_UNSPECIFIED: RecallMode
RECALL_MODE_HYBRID: RecallMode
RECALL_MODE_LEXICAL: RecallMode
RECALL_MODE_SEMANTIC: RecallMode
CONTEXT_LAYOUT_UNSPECIFIED: ContextLayout
CONTEXT_LAYOUT_BOUNDARY_WEIGHTED: ContextLayout
CONTEXT_LAYOUT_CHRONOLOGICAL: ContextLayout
CONTEXT_LAYOUT_SUMMARY_IN_SYSTEM: ContextLayout
ZONE_KIND_UNSPECIFIED: ZoneKind
ZONE_KIND_SYSTEM: ZoneKind
ZONE_KIND_MEMORIES: ZoneKind
ZONE_KIND_SUMMARY: ZoneKind
ZONE_KIND_WINDOW: ZoneKind
ZONE_KIND_QUERY: ZoneKind
INFLUENCE_MODE_UNSPECIFIED: InfluenceMode
INFLUENCE_MODE_OFF: InfluenceMode
INFLUENCE_MODE_DISCLOSE_ONLY: InfluenceMode
INFLUENCE_MODE_ON: InfluenceMode
LIST_ORDER_UNSPECIFIED: ListOrder
LIST_ORDER_NEWEST_FIRST: ListOrder
LIST_ORDER_OLDEST_FIRST: ListOrder
OUTCOME_KIND_UNSPECIFIED: OutcomeKind
OUTCOME_KIND_ACCEPTED: OutcomeKind
OUTCOME_KIND_REJECTED: OutcomeKind
OUTCOME_KIND_CORRECTED: OutcomeKind
OUTCOME_KIND_NOTE: OutcomeKind

class Scope(_message.Message):
    __slots__ = ("user_id", "session_id")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    session_id: str
    def __init__(self, user_id: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("role", "text", "time", "client_id", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    role: Role
    text: str
    time: _timestamp_pb2.Timestamp
    client_id: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., text: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., client_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class MemoryRecord(_message.Message):
    __slots__ = ("memory_id", "scope", "role", "text", "time", "client_id", "metadata", "sequence")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    scope: Scope
    role: Role
    text: str
    time: _timestamp_pb2.Timestamp
    client_id: str
    metadata: _containers.ScalarMap[str, str]
    sequence: int
    def __init__(self, memory_id: _Optional[str] = ..., scope: _Optional[_Union[Scope, _Mapping]] = ..., role: _Optional[_Union[Role, str]] = ..., text: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., client_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., sequence: _Optional[int] = ...) -> None: ...

class TimeRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    def __init__(self, start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TokenCounts(_message.Message):
    __slots__ = ("budget", "total", "system", "memories", "summary", "window", "query")
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    budget: int
    total: int
    system: int
    memories: int
    summary: int
    window: int
    query: int
    def __init__(self, budget: _Optional[int] = ..., total: _Optional[int] = ..., system: _Optional[int] = ..., memories: _Optional[int] = ..., summary: _Optional[int] = ..., window: _Optional[int] = ..., query: _Optional[int] = ...) -> None: ...

class RememberRequest(_message.Message):
    __slots__ = ("scope", "turns", "idempotency_key", "wait_searchable")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    WAIT_SEARCHABLE_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    idempotency_key: str
    wait_searchable: bool
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., idempotency_key: _Optional[str] = ..., wait_searchable: _Optional[bool] = ...) -> None: ...

class RememberResponse(_message.Message):
    __slots__ = ("memory_ids", "created", "deduplicated")
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    created: int
    deduplicated: int
    def __init__(self, memory_ids: _Optional[_Iterable[str]] = ..., created: _Optional[int] = ..., deduplicated: _Optional[int] = ...) -> None: ...

class RecallRequest(_message.Message):
    __slots__ = ("scope", "query", "mode", "top_k", "time_range", "roles", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TIME_RANGE_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    query: str
    mode: RecallMode
    top_k: int
    time_range: TimeRange
    roles: _containers.RepeatedScalarFieldContainer[Role]
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., query: _Optional[str] = ..., mode: _Optional[_Union[RecallMode, str]] = ..., top_k: _Optional[int] = ..., time_range: _Optional[_Union[TimeRange, _Mapping]] = ..., roles: _Optional[_Iterable[_Union[Role, str]]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Hit(_message.Message):
    __slots__ = ("memory", "fused_score", "lexical_rank", "semantic_rank", "lexical_score", "semantic_score")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    FUSED_SCORE_FIELD_NUMBER: _ClassVar[int]
    LEXICAL_RANK_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_RANK_FIELD_NUMBER: _ClassVar[int]
    LEXICAL_SCORE_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_SCORE_FIELD_NUMBER: _ClassVar[int]
    memory: MemoryRecord
    fused_score: float
    lexical_rank: int
    semantic_rank: int
    lexical_score: float
    semantic_score: float
    def __init__(self, memory: _Optional[_Union[MemoryRecord, _Mapping]] = ..., fused_score: _Optional[float] = ..., lexical_rank: _Optional[int] = ..., semantic_rank: _Optional[int] = ..., lexical_score: _Optional[float] = ..., semantic_score: _Optional[float] = ...) -> None: ...

class RecallResponse(_message.Message):
    __slots__ = ("hits", "lexical_candidates", "semantic_candidates", "query_repairs")
    class QueryRepairsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HITS_FIELD_NUMBER: _ClassVar[int]
    LEXICAL_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    QUERY_REPAIRS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[Hit]
    lexical_candidates: int
    semantic_candidates: int
    query_repairs: _containers.ScalarMap[str, str]
    def __init__(self, hits: _Optional[_Iterable[_Union[Hit, _Mapping]]] = ..., lexical_candidates: _Optional[int] = ..., semantic_candidates: _Optional[int] = ..., query_repairs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ContextZone(_message.Message):
    __slots__ = ("kind", "text", "tokens", "memory_ids")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    kind: ZoneKind
    text: str
    tokens: int
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[_Union[ZoneKind, str]] = ..., text: _Optional[str] = ..., tokens: _Optional[int] = ..., memory_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "text")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    role: Role
    text: str
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., text: _Optional[str] = ...) -> None: ...

class BuildContextRequest(_message.Message):
    __slots__ = ("scope", "query", "token_budget", "layout", "mode", "top_k")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    query: str
    token_budget: int
    layout: ContextLayout
    mode: RecallMode
    top_k: int
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., query: _Optional[str] = ..., token_budget: _Optional[int] = ..., layout: _Optional[_Union[ContextLayout, str]] = ..., mode: _Optional[_Union[RecallMode, str]] = ..., top_k: _Optional[int] = ...) -> None: ...

class BuildContextResponse(_message.Message):
    __slots__ = ("messages", "zones", "tokens", "memory_ids_used", "summary", "disclosure_note", "prompt", "audit_seq")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ZONES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_USED_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    DISCLOSURE_NOTE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    AUDIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    zones: _containers.RepeatedCompositeFieldContainer[ContextZone]
    tokens: TokenCounts
    memory_ids_used: _containers.RepeatedScalarFieldContainer[str]
    summary: str
    disclosure_note: str
    prompt: str
    audit_seq: int
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., zones: _Optional[_Iterable[_Union[ContextZone, _Mapping]]] = ..., tokens: _Optional[_Union[TokenCounts, _Mapping]] = ..., memory_ids_used: _Optional[_Iterable[str]] = ..., summary: _Optional[str] = ..., disclosure_note: _Optional[str] = ..., prompt: _Optional[str] = ..., audit_seq: _Optional[int] = ...) -> None: ...

class GenerationParameters(_message.Message):
    __slots__ = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class ChatRequest(_message.Message):
    __slots__ = ("scope", "message", "token_budget", "params", "influence")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    INFLUENCE_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    message: str
    token_budget: int
    params: GenerationParameters
    influence: InfluenceMode
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., message: _Optional[str] = ..., token_budget: _Optional[int] = ..., params: _Optional[_Union[GenerationParameters, _Mapping]] = ..., influence: _Optional[_Union[InfluenceMode, str]] = ...) -> None: ...

class ChatResponse(_message.Message):
    __slots__ = ("start", "token", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: ChatStart
    token: ChatToken
    end: ChatEnd
    def __init__(self, start: _Optional[_Union[ChatStart, _Mapping]] = ..., token: _Optional[_Union[ChatToken, _Mapping]] = ..., end: _Optional[_Union[ChatEnd, _Mapping]] = ...) -> None: ...

class ChatStart(_message.Message):
    __slots__ = ("memory_ids_used", "disclosure_note", "tokens")
    MEMORY_IDS_USED_FIELD_NUMBER: _ClassVar[int]
    DISCLOSURE_NOTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    memory_ids_used: _containers.RepeatedScalarFieldContainer[str]
    disclosure_note: str
    tokens: TokenCounts
    def __init__(self, memory_ids_used: _Optional[_Iterable[str]] = ..., disclosure_note: _Optional[str] = ..., tokens: _Optional[_Union[TokenCounts, _Mapping]] = ...) -> None: ...

class ChatToken(_message.Message):
    __slots__ = ("text", "index")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    text: str
    index: int
    def __init__(self, text: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class AppliedInfluence(_message.Message):
    __slots__ = ("memtok_id", "source_words", "layer", "strength")
    MEMTOK_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_WORDS_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    STRENGTH_FIELD_NUMBER: _ClassVar[int]
    memtok_id: str
    source_words: str
    layer: int
    strength: float
    def __init__(self, memtok_id: _Optional[str] = ..., source_words: _Optional[str] = ..., layer: _Optional[int] = ..., strength: _Optional[float] = ...) -> None: ...

class ChatEnd(_message.Message):
    __slots__ = ("finish_reason", "generated_tokens", "user_memory_id", "assistant_memory_id", "influences", "audit_seq")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    USER_MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    INFLUENCES_FIELD_NUMBER: _ClassVar[int]
    AUDIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    finish_reason: str
    generated_tokens: int
    user_memory_id: str
    assistant_memory_id: str
    influences: _containers.RepeatedCompositeFieldContainer[AppliedInfluence]
    audit_seq: int
    def __init__(self, finish_reason: _Optional[str] = ..., generated_tokens: _Optional[int] = ..., user_memory_id: _Optional[str] = ..., assistant_memory_id: _Optional[str] = ..., influences: _Optional[_Iterable[_Union[AppliedInfluence, _Mapping]]] = ..., audit_seq: _Optional[int] = ...) -> None: ...

class MemoryIds(_message.Message):
    __slots__ = ("scope", "memory_ids")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., memory_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ForgetRequest(_message.Message):
    __slots__ = ("memory_ids", "session", "user_id")
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    memory_ids: MemoryIds
    session: Scope
    user_id: str
    def __init__(self, memory_ids: _Optional[_Union[MemoryIds, _Mapping]] = ..., session: _Optional[_Union[Scope, _Mapping]] = ..., user_id: _Optional[str] = ...) -> None: ...

class ForgetResponse(_message.Message):
    __slots__ = ("memories_deleted", "sessions_deleted", "memtoks_deleted", "cache_entries_dropped", "audit_key_destroyed")
    MEMORIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_DELETED_FIELD_NUMBER: _ClassVar[int]
    MEMTOKS_DELETED_FIELD_NUMBER: _ClassVar[int]
    CACHE_ENTRIES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    AUDIT_KEY_DESTROYED_FIELD_NUMBER: _ClassVar[int]
    memories_deleted: int
    sessions_deleted: int
    memtoks_deleted: int
    cache_entries_dropped: int
    audit_key_destroyed: bool
    def __init__(self, memories_deleted: _Optional[int] = ..., sessions_deleted: _Optional[int] = ..., memtoks_deleted: _Optional[int] = ..., cache_entries_dropped: _Optional[int] = ..., audit_key_destroyed: _Optional[bool] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("scope",)
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("window", "summary", "version", "window_tokens", "summary_tokens", "turns_total", "updated")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WINDOW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TURNS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    window: _containers.RepeatedCompositeFieldContainer[MemoryRecord]
    summary: str
    version: int
    window_tokens: int
    summary_tokens: int
    turns_total: int
    updated: _timestamp_pb2.Timestamp
    def __init__(self, window: _Optional[_Iterable[_Union[MemoryRecord, _Mapping]]] = ..., summary: _Optional[str] = ..., version: _Optional[int] = ..., window_tokens: _Optional[int] = ..., summary_tokens: _Optional[int] = ..., turns_total: _Optional[int] = ..., updated: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListMemoriesRequest(_message.Message):
    __slots__ = ("scope", "time_range", "roles", "order", "page_size", "page_token", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TIME_RANGE_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    time_range: TimeRange
    roles: _containers.RepeatedScalarFieldContainer[Role]
    order: ListOrder
    page_size: int
    page_token: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., time_range: _Optional[_Union[TimeRange, _Mapping]] = ..., roles: _Optional[_Iterable[_Union[Role, str]]] = ..., order: _Optional[_Union[ListOrder, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListMemoriesResponse(_message.Message):
    __slots__ = ("memories", "next_page_token")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[MemoryRecord]
    next_page_token: str
    def __init__(self, memories: _Optional[_Iterable[_Union[MemoryRecord, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetMemoryRequest(_message.Message):
    __slots__ = ("user_id", "memory_id")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    memory_id: str
    def __init__(self, user_id: _Optional[str] = ..., memory_id: _Optional[str] = ...) -> None: ...

class GetMemoryResponse(_message.Message):
    __slots__ = ("memory",)
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    memory: MemoryRecord
    def __init__(self, memory: _Optional[_Union[MemoryRecord, _Mapping]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("user_id", "page_size", "page_token")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    page_size: int
    page_token: str
    def __init__(self, user_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "turn_count", "first_time", "last_time", "summary_version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    turn_count: int
    first_time: _timestamp_pb2.Timestamp
    last_time: _timestamp_pb2.Timestamp
    summary_version: int
    def __init__(self, session_id: _Optional[str] = ..., turn_count: _Optional[int] = ..., first_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., summary_version: _Optional[int] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class UserInfo(_message.Message):
    __slots__ = ("user_id", "turn_count", "session_count", "first_time", "last_time")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_COUNT_FIELD_NUMBER: _ClassVar[int]
    SESSION_COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    turn_count: int
    session_count: int
    first_time: _timestamp_pb2.Timestamp
    last_time: _timestamp_pb2.Timestamp
    def __init__(self, user_id: _Optional[str] = ..., turn_count: _Optional[int] = ..., session_count: _Optional[int] = ..., first_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListUsersResponse(_message.Message):
    __slots__ = ("users", "next_page_token")
    USERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[UserInfo]
    next_page_token: str
    def __init__(self, users: _Optional[_Iterable[_Union[UserInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateMemoryMetadataRequest(_message.Message):
    __slots__ = ("user_id", "memory_id", "set", "remove")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    memory_id: str
    set: _containers.ScalarMap[str, str]
    remove: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, user_id: _Optional[str] = ..., memory_id: _Optional[str] = ..., set: _Optional[_Mapping[str, str]] = ..., remove: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdateMemoryMetadataResponse(_message.Message):
    __slots__ = ("memory", "audit_seq")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    AUDIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    memory: MemoryRecord
    audit_seq: int
    def __init__(self, memory: _Optional[_Union[MemoryRecord, _Mapping]] = ..., audit_seq: _Optional[int] = ...) -> None: ...

class ExportUserRequest(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class ExportHeader(_message.Message):
    __slots__ = ("format_version", "user_id", "audit_seq", "time")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    AUDIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    user_id: str
    audit_seq: int
    time: _timestamp_pb2.Timestamp
    def __init__(self, format_version: _Optional[int] = ..., user_id: _Optional[str] = ..., audit_seq: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ExportedSession(_message.Message):
    __slots__ = ("session", "summary", "version")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    session: SessionInfo
    summary: str
    version: int
    def __init__(self, session: _Optional[_Union[SessionInfo, _Mapping]] = ..., summary: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ExportFooter(_message.Message):
    __slots__ = ("memories", "sessions")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    memories: int
    sessions: int
    def __init__(self, memories: _Optional[int] = ..., sessions: _Optional[int] = ...) -> None: ...

class ExportUserResponse(_message.Message):
    __slots__ = ("header", "memory", "session", "footer")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    FOOTER_FIELD_NUMBER: _ClassVar[int]
    header: ExportHeader
    memory: MemoryRecord
    session: ExportedSession
    footer: ExportFooter
    def __init__(self, header: _Optional[_Union[ExportHeader, _Mapping]] = ..., memory: _Optional[_Union[MemoryRecord, _Mapping]] = ..., session: _Optional[_Union[ExportedSession, _Mapping]] = ..., footer: _Optional[_Union[ExportFooter, _Mapping]] = ...) -> None: ...

class ImportTurnsRequest(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[MemoryRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[MemoryRecord, _Mapping]]] = ...) -> None: ...

class ImportTurnsResponse(_message.Message):
    __slots__ = ("created", "deduplicated")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    created: int
    deduplicated: int
    def __init__(self, created: _Optional[int] = ..., deduplicated: _Optional[int] = ...) -> None: ...

class VerifyAuditRequest(_message.Message):
    __slots__ = ("from_seq", "to_seq")
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    TO_SEQ_FIELD_NUMBER: _ClassVar[int]
    from_seq: int
    to_seq: int
    def __init__(self, from_seq: _Optional[int] = ..., to_seq: _Optional[int] = ...) -> None: ...

class VerifyAuditResponse(_message.Message):
    __slots__ = ("ok", "entries_checked", "first_bad_seq", "reason", "head_seq", "head_hash")
    OK_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_CHECKED_FIELD_NUMBER: _ClassVar[int]
    FIRST_BAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HEAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    entries_checked: int
    first_bad_seq: int
    reason: str
    head_seq: int
    head_hash: str
    def __init__(self, ok: _Optional[bool] = ..., entries_checked: _Optional[int] = ..., first_bad_seq: _Optional[int] = ..., reason: _Optional[str] = ..., head_seq: _Optional[int] = ..., head_hash: _Optional[str] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("seq", "time", "actor", "event_type", "user_id", "session_id", "memory_ids", "body", "prev_hash", "hash")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time: _timestamp_pb2.Timestamp
    actor: str
    event_type: str
    user_id: str
    session_id: str
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    body: _struct_pb2.Struct
    prev_hash: str
    hash: str
    def __init__(self, seq: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[str] = ..., event_type: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ..., memory_ids: _Optional[_Iterable[str]] = ..., body: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., prev_hash: _Optional[str] = ..., hash: _Optional[str] = ...) -> None: ...

class ListAuditEntriesRequest(_message.Message):
    __slots__ = ("scope", "page_size", "page_token")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    page_size: int
    page_token: str
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAuditEntriesResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReportOutcomeRequest(_message.Message):
    __slots__ = ("scope", "audit_seq", "kind", "note")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    AUDIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    audit_seq: int
    kind: OutcomeKind
    note: str
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., audit_seq: _Optional[int] = ..., kind: _Optional[_Union[OutcomeKind, str]] = ..., note: _Optional[str] = ...) -> None: ...

class ReportOutcomeResponse(_message.Message):
    __slots__ = ("audit_seq",)
    AUDIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    audit_seq: int
    def __init__(self, audit_seq: _Optional[int] = ...) -> None: ...
