from hippo.memory.v1 import memory_pb2 as _memory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NewTurn(_message.Message):
    __slots__ = ("memory_id", "user_id", "session_id", "role", "text", "time_us", "client_id", "metadata", "vector", "vector_model")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    VECTOR_MODEL_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    user_id: str
    session_id: str
    role: _memory_pb2.Role
    text: str
    time_us: int
    client_id: str
    metadata: _containers.ScalarMap[str, str]
    vector: bytes
    vector_model: str
    def __init__(self, memory_id: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ..., role: _Optional[_Union[_memory_pb2.Role, str]] = ..., text: _Optional[str] = ..., time_us: _Optional[int] = ..., client_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., vector: _Optional[bytes] = ..., vector_model: _Optional[str] = ...) -> None: ...

class WriteRequest(_message.Message):
    __slots__ = ("tenant", "turns", "wait_searchable")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SEARCHABLE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    turns: _containers.RepeatedCompositeFieldContainer[NewTurn]
    wait_searchable: bool
    def __init__(self, tenant: _Optional[str] = ..., turns: _Optional[_Iterable[_Union[NewTurn, _Mapping]]] = ..., wait_searchable: _Optional[bool] = ...) -> None: ...

class WriteResponse(_message.Message):
    __slots__ = ("created", "records", "searchable", "embedding_model")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    SEARCHABLE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    created: _containers.RepeatedScalarFieldContainer[bool]
    records: _containers.RepeatedCompositeFieldContainer[_memory_pb2.MemoryRecord]
    searchable: bool
    embedding_model: str
    def __init__(self, created: _Optional[_Iterable[bool]] = ..., records: _Optional[_Iterable[_Union[_memory_pb2.MemoryRecord, _Mapping]]] = ..., searchable: _Optional[bool] = ..., embedding_model: _Optional[str] = ...) -> None: ...

class SearchRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "session_id", "start_us", "end_us", "roles", "query", "vector", "mode", "top_k", "vector_model", "metadata", "query_repairs")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class QueryRepairsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    START_US_FIELD_NUMBER: _ClassVar[int]
    END_US_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    VECTOR_MODEL_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    QUERY_REPAIRS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    session_id: str
    start_us: int
    end_us: int
    roles: _containers.RepeatedScalarFieldContainer[_memory_pb2.Role]
    query: str
    vector: bytes
    mode: _memory_pb2.RecallMode
    top_k: int
    vector_model: str
    metadata: _containers.ScalarMap[str, str]
    query_repairs: _containers.ScalarMap[str, str]
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ..., start_us: _Optional[int] = ..., end_us: _Optional[int] = ..., roles: _Optional[_Iterable[_Union[_memory_pb2.Role, str]]] = ..., query: _Optional[str] = ..., vector: _Optional[bytes] = ..., mode: _Optional[_Union[_memory_pb2.RecallMode, str]] = ..., top_k: _Optional[int] = ..., vector_model: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., query_repairs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("hits", "lexical_candidates", "semantic_candidates", "embedding_model")
    HITS_FIELD_NUMBER: _ClassVar[int]
    LEXICAL_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[_memory_pb2.Hit]
    lexical_candidates: int
    semantic_candidates: int
    embedding_model: str
    def __init__(self, hits: _Optional[_Iterable[_Union[_memory_pb2.Hit, _Mapping]]] = ..., lexical_candidates: _Optional[int] = ..., semantic_candidates: _Optional[int] = ..., embedding_model: _Optional[str] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "memory_ids")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., memory_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[_memory_pb2.MemoryRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[_memory_pb2.MemoryRecord, _Mapping]]] = ...) -> None: ...

class ListCursor(_message.Message):
    __slots__ = ("time_us", "seq")
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    time_us: int
    seq: int
    def __init__(self, time_us: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "session_id", "start_us", "end_us", "roles", "newest_first", "limit", "after", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    START_US_FIELD_NUMBER: _ClassVar[int]
    END_US_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    session_id: str
    start_us: int
    end_us: int
    roles: _containers.RepeatedScalarFieldContainer[_memory_pb2.Role]
    newest_first: bool
    limit: int
    after: ListCursor
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ..., start_us: _Optional[int] = ..., end_us: _Optional[int] = ..., roles: _Optional[_Iterable[_Union[_memory_pb2.Role, str]]] = ..., newest_first: _Optional[bool] = ..., limit: _Optional[int] = ..., after: _Optional[_Union[ListCursor, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("records", "next")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[_memory_pb2.MemoryRecord]
    next: ListCursor
    def __init__(self, records: _Optional[_Iterable[_Union[_memory_pb2.MemoryRecord, _Mapping]]] = ..., next: _Optional[_Union[ListCursor, _Mapping]] = ...) -> None: ...

class SessionStats(_message.Message):
    __slots__ = ("session_id", "turns", "first_time_us", "last_time_us")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_US_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_US_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    turns: int
    first_time_us: int
    last_time_us: int
    def __init__(self, session_id: _Optional[str] = ..., turns: _Optional[int] = ..., first_time_us: _Optional[int] = ..., last_time_us: _Optional[int] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "limit", "after")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    limit: int
    after: str
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., limit: _Optional[int] = ..., after: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionStats]
    next: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionStats, _Mapping]]] = ..., next: _Optional[str] = ...) -> None: ...

class UserStats(_message.Message):
    __slots__ = ("user_id", "turns", "sessions", "first_time_us", "last_time_us")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_US_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_US_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    turns: int
    sessions: int
    first_time_us: int
    last_time_us: int
    def __init__(self, user_id: _Optional[str] = ..., turns: _Optional[int] = ..., sessions: _Optional[int] = ..., first_time_us: _Optional[int] = ..., last_time_us: _Optional[int] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ("tenant", "limit", "after")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    limit: int
    after: str
    def __init__(self, tenant: _Optional[str] = ..., limit: _Optional[int] = ..., after: _Optional[str] = ...) -> None: ...

class ListUsersResponse(_message.Message):
    __slots__ = ("users", "next")
    USERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[UserStats]
    next: str
    def __init__(self, users: _Optional[_Iterable[_Union[UserStats, _Mapping]]] = ..., next: _Optional[str] = ...) -> None: ...

class UpdateMetadataRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "memory_id", "set", "remove", "vector", "vector_model")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    VECTOR_MODEL_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    memory_id: str
    set: _containers.ScalarMap[str, str]
    remove: _containers.RepeatedScalarFieldContainer[str]
    vector: bytes
    vector_model: str
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., memory_id: _Optional[str] = ..., set: _Optional[_Mapping[str, str]] = ..., remove: _Optional[_Iterable[str]] = ..., vector: _Optional[bytes] = ..., vector_model: _Optional[str] = ...) -> None: ...

class UpdateMetadataResponse(_message.Message):
    __slots__ = ("record", "changed")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    record: _memory_pb2.MemoryRecord
    changed: bool
    def __init__(self, record: _Optional[_Union[_memory_pb2.MemoryRecord, _Mapping]] = ..., changed: _Optional[bool] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "session_id", "memory_ids")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    session_id: str
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ..., memory_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("memory_ids",)
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, memory_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("last_seq", "lexical_seq", "vector_seq", "vector_backend", "dimension", "turns", "tenant_turns", "embedding_model", "generation", "vectors_outside_graph", "rebuilding", "lexical_backend")
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LEXICAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    VECTOR_SEQ_FIELD_NUMBER: _ClassVar[int]
    VECTOR_BACKEND_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TENANT_TURNS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    VECTORS_OUTSIDE_GRAPH_FIELD_NUMBER: _ClassVar[int]
    REBUILDING_FIELD_NUMBER: _ClassVar[int]
    LEXICAL_BACKEND_FIELD_NUMBER: _ClassVar[int]
    last_seq: int
    lexical_seq: int
    vector_seq: int
    vector_backend: str
    dimension: int
    turns: int
    tenant_turns: int
    embedding_model: str
    generation: int
    vectors_outside_graph: int
    rebuilding: bool
    lexical_backend: str
    def __init__(self, last_seq: _Optional[int] = ..., lexical_seq: _Optional[int] = ..., vector_seq: _Optional[int] = ..., vector_backend: _Optional[str] = ..., dimension: _Optional[int] = ..., turns: _Optional[int] = ..., tenant_turns: _Optional[int] = ..., embedding_model: _Optional[str] = ..., generation: _Optional[int] = ..., vectors_outside_graph: _Optional[int] = ..., rebuilding: _Optional[bool] = ..., lexical_backend: _Optional[str] = ...) -> None: ...

class ReindexRequest(_message.Message):
    __slots__ = ("embedding_model",)
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    embedding_model: str
    def __init__(self, embedding_model: _Optional[str] = ...) -> None: ...

class ReindexResponse(_message.Message):
    __slots__ = ("applied", "last_seq", "done", "embedded", "embedding_model")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDED_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    applied: int
    last_seq: int
    done: bool
    embedded: int
    embedding_model: str
    def __init__(self, applied: _Optional[int] = ..., last_seq: _Optional[int] = ..., done: _Optional[bool] = ..., embedded: _Optional[int] = ..., embedding_model: _Optional[str] = ...) -> None: ...
