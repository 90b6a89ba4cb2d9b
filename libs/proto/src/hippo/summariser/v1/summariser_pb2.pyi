from hippo.memory.v1 import memory_pb2 as _memory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionTurn(_message.Message):
    __slots__ = ("memory_id", "role", "text", "time_us", "speaker", "tokens")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    role: _memory_pb2.Role
    text: str
    time_us: int
    speaker: str
    tokens: int
    def __init__(self, memory_id: _Optional[str] = ..., role: _Optional[_Union[_memory_pb2.Role, str]] = ..., text: _Optional[str] = ..., time_us: _Optional[int] = ..., speaker: _Optional[str] = ..., tokens: _Optional[int] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "session_id", "turns")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    session_id: str
    turns: _containers.RepeatedCompositeFieldContainer[SessionTurn]
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ..., turns: _Optional[_Iterable[_Union[SessionTurn, _Mapping]]] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("version", "appended", "merge_pending")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    MERGE_PENDING_FIELD_NUMBER: _ClassVar[int]
    version: int
    appended: int
    merge_pending: bool
    def __init__(self, version: _Optional[int] = ..., appended: _Optional[int] = ..., merge_pending: _Optional[bool] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "session_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    session_id: str
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class SessionVersionsRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "session_ids")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SessionVersionsResponse(_message.Message):
    __slots__ = ("versions",)
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.ScalarMap[str, int]
    def __init__(self, versions: _Optional[_Mapping[str, int]] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("window", "summary", "version", "window_tokens", "summary_tokens", "turns_total", "updated_us", "merge_pending", "window_budget", "merge_stats", "summary_budget")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WINDOW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TURNS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UPDATED_US_FIELD_NUMBER: _ClassVar[int]
    MERGE_PENDING_FIELD_NUMBER: _ClassVar[int]
    WINDOW_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MERGE_STATS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    window: _containers.RepeatedCompositeFieldContainer[SessionTurn]
    summary: str
    version: int
    window_tokens: int
    summary_tokens: int
    turns_total: int
    updated_us: int
    merge_pending: bool
    window_budget: int
    merge_stats: MergeStats
    summary_budget: int
    def __init__(self, window: _Optional[_Iterable[_Union[SessionTurn, _Mapping]]] = ..., summary: _Optional[str] = ..., version: _Optional[int] = ..., window_tokens: _Optional[int] = ..., summary_tokens: _Optional[int] = ..., turns_total: _Optional[int] = ..., updated_us: _Optional[int] = ..., merge_pending: _Optional[bool] = ..., window_budget: _Optional[int] = ..., merge_stats: _Optional[_Union[MergeStats, _Mapping]] = ..., summary_budget: _Optional[int] = ...) -> None: ...

class MergeStats(_message.Message):
    __slots__ = ("merges", "turns_merged", "facts", "facts_kept_llm", "facts_kept", "last_retention_llm", "last_retention", "llm_failures")
    MERGES_FIELD_NUMBER: _ClassVar[int]
    TURNS_MERGED_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    FACTS_KEPT_LLM_FIELD_NUMBER: _ClassVar[int]
    FACTS_KEPT_FIELD_NUMBER: _ClassVar[int]
    LAST_RETENTION_LLM_FIELD_NUMBER: _ClassVar[int]
    LAST_RETENTION_FIELD_NUMBER: _ClassVar[int]
    LLM_FAILURES_FIELD_NUMBER: _ClassVar[int]
    merges: int
    turns_merged: int
    facts: int
    facts_kept_llm: int
    facts_kept: int
    last_retention_llm: float
    last_retention: float
    llm_failures: int
    def __init__(self, merges: _Optional[int] = ..., turns_merged: _Optional[int] = ..., facts: _Optional[int] = ..., facts_kept_llm: _Optional[int] = ..., facts_kept: _Optional[int] = ..., last_retention_llm: _Optional[float] = ..., last_retention: _Optional[float] = ..., llm_failures: _Optional[int] = ...) -> None: ...

class ForgetRequest(_message.Message):
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

class ForgetResponse(_message.Message):
    __slots__ = ("sessions_deleted", "turns_removed", "summaries_erased")
    SESSIONS_DELETED_FIELD_NUMBER: _ClassVar[int]
    TURNS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_ERASED_FIELD_NUMBER: _ClassVar[int]
    sessions_deleted: int
    turns_removed: int
    summaries_erased: int
    def __init__(self, sessions_deleted: _Optional[int] = ..., turns_removed: _Optional[int] = ..., summaries_erased: _Optional[int] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "session_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    session_id: str
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class FlushResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: GetSessionResponse
    def __init__(self, session: _Optional[_Union[GetSessionResponse, _Mapping]] = ...) -> None: ...
