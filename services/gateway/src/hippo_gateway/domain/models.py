"""Values the gateway works with. Times are UTC epoch microseconds; vectors float32 rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]  # (n, dimension), unit rows


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    TOOL = "tool"


class Mode(StrEnum):
    HYBRID = "hybrid"
    LEXICAL = "lexical"
    SEMANTIC = "semantic"


@dataclass(frozen=True)
class TurnIn:
    """A turn as the caller gave it (time None = the request's receive time)."""

    role: Role
    text: str
    time_us: int | None = None
    client_id: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TurnToStore:
    """A turn with its id, time and index vector, ready for the turn store."""

    memory_id: str
    user: str
    session: str
    role: Role
    text: str
    time_us: int
    client_id: str
    metadata: Mapping[str, str]
    vector: npt.NDArray[np.float32] | None


@dataclass(frozen=True)
class Memory:
    """A stored turn as the turn store returns it."""

    memory_id: str
    user: str
    session: str
    role: Role
    text: str
    time_us: int
    client_id: str
    metadata: Mapping[str, str]
    sequence: int


@dataclass(frozen=True)
class Remembered:
    memory_ids: list[str]
    created: int
    deduplicated: int


@dataclass(frozen=True)
class RecallQuery:
    user: str
    query: str
    session: str | None = None
    mode: Mode = Mode.HYBRID
    top_k: int = 10
    start_us: int | None = None
    end_us: int | None = None
    roles: frozenset[Role] = frozenset()


@dataclass(frozen=True)
class Hit:
    memory: Memory
    fused_score: float
    lexical_rank: int
    semantic_rank: int
    lexical_score: float
    semantic_score: float


@dataclass(frozen=True)
class Recalled:
    hits: list[Hit]
    lexical_candidates: int
    semantic_candidates: int


@dataclass(frozen=True)
class Forgotten:
    memories: int
    sessions: int = 0
    memtoks: int = 0
