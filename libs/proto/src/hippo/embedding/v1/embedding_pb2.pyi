from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EmbedRequest(_message.Message):
    __slots__ = ("texts", "model")
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    model: str
    def __init__(self, texts: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("vectors", "count", "dimension", "model", "cached")
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    vectors: bytes
    count: int
    dimension: int
    model: str
    cached: int
    def __init__(self, vectors: _Optional[bytes] = ..., count: _Optional[int] = ..., dimension: _Optional[int] = ..., model: _Optional[str] = ..., cached: _Optional[int] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model", "dimension", "backend", "normalized", "vector_encoding", "max_texts", "max_chars", "max_batch", "max_tokens", "models")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_FIELD_NUMBER: _ClassVar[int]
    VECTOR_ENCODING_FIELD_NUMBER: _ClassVar[int]
    MAX_TEXTS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    model: str
    dimension: int
    backend: str
    normalized: bool
    vector_encoding: str
    max_texts: int
    max_chars: int
    max_batch: int
    max_tokens: int
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, model: _Optional[str] = ..., dimension: _Optional[int] = ..., backend: _Optional[str] = ..., normalized: _Optional[bool] = ..., vector_encoding: _Optional[str] = ..., max_texts: _Optional[int] = ..., max_chars: _Optional[int] = ..., max_batch: _Optional[int] = ..., max_tokens: _Optional[int] = ..., models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "dimension", "backend", "max_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    dimension: int
    backend: str
    max_tokens: int
    def __init__(self, model: _Optional[str] = ..., dimension: _Optional[int] = ..., backend: _Optional[str] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class DropCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DropCacheResponse(_message.Message):
    __slots__ = ("entries_dropped",)
    ENTRIES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    entries_dropped: int
    def __init__(self, entries_dropped: _Optional[int] = ...) -> None: ...
