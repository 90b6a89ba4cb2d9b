from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrivateState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIVATE_STATE_UNSPECIFIED: _ClassVar[PrivateState]
    PRIVATE_STATE_NONE: _ClassVar[PrivateState]
    PRIVATE_STATE_SEALED: _ClassVar[PrivateState]
    PRIVATE_STATE_READABLE: _ClassVar[PrivateState]
    PRIVATE_STATE_ERASED: _ClassVar[PrivateState]
PRIVATE_STATE_UNSPECIFIED: PrivateState
PRIVATE_STATE_NONE: PrivateState
PRIVATE_STATE_SEALED: PrivateState
PRIVATE_STATE_READABLE: PrivateState
PRIVATE_STATE_ERASED: PrivateState

class NewEntry(_message.Message):
    __slots__ = ("tenant", "actor", "event_type", "user_id", "session_id", "memory_ids", "body", "private_body", "idempotency_key")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_BODY_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    actor: str
    event_type: str
    user_id: str
    session_id: str
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    body: _struct_pb2.Struct
    private_body: _struct_pb2.Struct
    idempotency_key: str
    def __init__(self, tenant: _Optional[str] = ..., actor: _Optional[str] = ..., event_type: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ..., memory_ids: _Optional[_Iterable[str]] = ..., body: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., private_body: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("entries", "expected_prev_hash")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[NewEntry]
    expected_prev_hash: str
    def __init__(self, entries: _Optional[_Iterable[_Union[NewEntry, _Mapping]]] = ..., expected_prev_hash: _Optional[str] = ...) -> None: ...

class Appended(_message.Message):
    __slots__ = ("seq", "hash", "duplicate")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    hash: str
    duplicate: bool
    def __init__(self, seq: _Optional[int] = ..., hash: _Optional[str] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("entries", "head_seq")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    HEAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Appended]
    head_seq: int
    def __init__(self, entries: _Optional[_Iterable[_Union[Appended, _Mapping]]] = ..., head_seq: _Optional[int] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("seq", "time_us", "tenant", "actor", "event_type", "user_id", "session_id", "memory_ids", "body", "private_body", "private_state", "idempotency_key", "prev_hash", "hash")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IDS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_BODY_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_STATE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time_us: int
    tenant: str
    actor: str
    event_type: str
    user_id: str
    session_id: str
    memory_ids: _containers.RepeatedScalarFieldContainer[str]
    body: _struct_pb2.Struct
    private_body: _struct_pb2.Struct
    private_state: PrivateState
    idempotency_key: str
    prev_hash: str
    hash: str
    def __init__(self, seq: _Optional[int] = ..., time_us: _Optional[int] = ..., tenant: _Optional[str] = ..., actor: _Optional[str] = ..., event_type: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ..., memory_ids: _Optional[_Iterable[str]] = ..., body: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., private_body: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., private_state: _Optional[_Union[PrivateState, str]] = ..., idempotency_key: _Optional[str] = ..., prev_hash: _Optional[str] = ..., hash: _Optional[str] = ...) -> None: ...

class HeadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("size", "hash", "time_us", "key_id", "signature")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    size: int
    hash: str
    time_us: int
    key_id: str
    signature: bytes
    def __init__(self, size: _Optional[int] = ..., hash: _Optional[str] = ..., time_us: _Optional[int] = ..., key_id: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class HeadResponse(_message.Message):
    __slots__ = ("seq", "hash", "latest_checkpoint", "public_key", "key_id", "writable", "problem")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    LATEST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    seq: int
    hash: str
    latest_checkpoint: Checkpoint
    public_key: bytes
    key_id: str
    writable: bool
    problem: str
    def __init__(self, seq: _Optional[int] = ..., hash: _Optional[str] = ..., latest_checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., public_key: _Optional[bytes] = ..., key_id: _Optional[str] = ..., writable: _Optional[bool] = ..., problem: _Optional[str] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "session_id", "event_types", "after_seq", "to_seq", "limit", "include_private")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPES_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    TO_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PRIVATE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    session_id: str
    event_types: _containers.RepeatedScalarFieldContainer[str]
    after_seq: int
    to_seq: int
    limit: int
    include_private: bool
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ..., event_types: _Optional[_Iterable[str]] = ..., after_seq: _Optional[int] = ..., to_seq: _Optional[int] = ..., limit: _Optional[int] = ..., include_private: _Optional[bool] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("entries", "next_after_seq")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    next_after_seq: int
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., next_after_seq: _Optional[int] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "session_id", "event_types", "after_seq", "include_private")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPES_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PRIVATE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    session_id: str
    event_types: _containers.RepeatedScalarFieldContainer[str]
    after_seq: int
    include_private: bool
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., session_id: _Optional[str] = ..., event_types: _Optional[_Iterable[str]] = ..., after_seq: _Optional[int] = ..., include_private: _Optional[bool] = ...) -> None: ...

class StreamResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("from_seq", "to_seq", "chain_only", "tenant")
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    TO_SEQ_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ONLY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    from_seq: int
    to_seq: int
    chain_only: bool
    tenant: str
    def __init__(self, from_seq: _Optional[int] = ..., to_seq: _Optional[int] = ..., chain_only: _Optional[bool] = ..., tenant: _Optional[str] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("ok", "entries_checked", "first_bad_seq", "reason", "head_seq", "head_hash", "checkpoints_checked", "latest_checkpoint", "tenant_entries", "tenant_head_seq", "tenant_head_hash")
    OK_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_CHECKED_FIELD_NUMBER: _ClassVar[int]
    FIRST_BAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HEAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    LATEST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    TENANT_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TENANT_HEAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    TENANT_HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    entries_checked: int
    first_bad_seq: int
    reason: str
    head_seq: int
    head_hash: str
    checkpoints_checked: int
    latest_checkpoint: Checkpoint
    tenant_entries: int
    tenant_head_seq: int
    tenant_head_hash: str
    def __init__(self, ok: _Optional[bool] = ..., entries_checked: _Optional[int] = ..., first_bad_seq: _Optional[int] = ..., reason: _Optional[str] = ..., head_seq: _Optional[int] = ..., head_hash: _Optional[str] = ..., checkpoints_checked: _Optional[int] = ..., latest_checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., tenant_entries: _Optional[int] = ..., tenant_head_seq: _Optional[int] = ..., tenant_head_hash: _Optional[str] = ...) -> None: ...

class ForgetUserRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "actor", "idempotency_key")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    actor: str
    idempotency_key: str
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., actor: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class ForgetUserResponse(_message.Message):
    __slots__ = ("keys_destroyed", "audit_seq")
    KEYS_DESTROYED_FIELD_NUMBER: _ClassVar[int]
    AUDIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    keys_destroyed: int
    audit_seq: int
    def __init__(self, keys_destroyed: _Optional[int] = ..., audit_seq: _Optional[int] = ...) -> None: ...
