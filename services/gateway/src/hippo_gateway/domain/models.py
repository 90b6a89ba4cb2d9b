"""Values the gateway works with. Times are UTC epoch microseconds; vectors float32 rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]  # (n, dimension), unit rows


@dataclass(frozen=True)
class Embedding:
    """Vectors and the embedding model that made them: vectors of different models are
    not comparable, so the turn store is told which one each vector comes from."""

    vectors: Vectors
    model: str  # as the embedding service named it ("" only when no text was embedded)


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
    # The model `vector` comes from; "" = the live index's model.
    vector_model: str = ""


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
    # Metadata equality filters, (key, value) sorted; keys declared at the retrieval
    # service, which checks them.
    metadata: tuple[tuple[str, str], ...] = ()
    # The query speller's repairs (typed word -> repair, lower case), sorted: set by the
    # gateway for the retrieval service's BM25 and speaker step, never by a caller.
    repairs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ListQuery:
    """Which of a user's memories ListMemories reads, and in which order."""

    user: str
    session: str | None = None
    start_us: int | None = None
    end_us: int | None = None
    roles: frozenset[Role] = frozenset()
    newest_first: bool = True
    metadata: tuple[tuple[str, str], ...] = ()  # as RecallQuery.metadata


# The key of a memory in a listing, (time_us, store seq): a page starts after it.
ListKey = tuple[int, int]


@dataclass(frozen=True)
class SessionInfo:
    """A session of a user, from its stored turns."""

    session: str
    turns: int
    first_time_us: int
    last_time_us: int
    # The session state's version in the summariser (0: no state, or no summariser).
    summary_version: int = 0


@dataclass(frozen=True)
class UserInfo:
    """A user of a tenant, from their stored turns."""

    user: str
    turns: int
    sessions: int
    first_time_us: int
    last_time_us: int


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
    # The query speller's repairs (typed word -> repair), disclosed to the caller.
    query_repairs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Forgotten:
    memories: int
    sessions: int = 0
    memtoks: int = 0
    # Vectors dropped from the embedding caches (every replica's, whole).
    cache_entries: int = 0
    # The audit service confirmed the user's key destroyed before the reply.
    audit_key_destroyed: bool = False


class Layout(StrEnum):
    BOUNDARY_WEIGHTED = "boundary_weighted"
    CHRONOLOGICAL = "chronological"
    SUMMARY_IN_SYSTEM = "summary_in_system"


class ZoneKind(StrEnum):
    SYSTEM = "system"
    MEMORIES = "memories"
    SUMMARY = "summary"
    WINDOW = "window"
    QUERY = "query"


class ChatRole(StrEnum):
    """Roles of a prompt's messages (tool output is quoted inside them)."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


@dataclass(frozen=True)
class ChatMessage:
    role: ChatRole
    text: str


@dataclass(frozen=True)
class SessionTurn:
    """A turn of a session's working window, as the summariser keeps it."""

    memory_id: str
    role: Role
    text: str
    time_us: int
    speaker: str = ""


@dataclass(frozen=True)
class SessionState:
    window: list[SessionTurn]  # oldest first
    summary: str
    version: int
    window_tokens: int = 0
    summary_tokens: int = 0
    turns_total: int = 0
    updated_us: int = 0


@dataclass(frozen=True)
class Counted:
    """An exact token count of a prompt, with the text the model reads."""

    tokens: int
    formatted: str
    context_length: int


@dataclass(frozen=True)
class Zone:
    kind: ZoneKind
    text: str
    tokens: int
    memory_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Skipped:
    memory_id: str
    reason: str  # "in_window" | "over_budget"
    fused_score: float


@dataclass(frozen=True)
class BuiltContext:
    messages: list[ChatMessage]
    zones: list[Zone]
    budget: int
    total_tokens: int
    memories_used: list[Hit]  # in prompt order
    skipped: list[Skipped]
    candidates: int  # hits recall returned
    summary: str
    prompt: str  # exactly what the model reads (after its prompt format)
    context_length: int
    window_ids: list[str] = field(default_factory=list)
    lexical_candidates: int = 0
    semantic_candidates: int = 0
    layout: str = "boundary_weighted"
    mode: str = "hybrid"

    def zone_tokens(self, kind: ZoneKind) -> int:
        return sum(z.tokens for z in self.zones if z.kind == kind)


@dataclass(frozen=True)
class Generation:
    """Decoding parameters (0 / empty = the defaults, as the API documents)."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    seed: int = 0
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Piece:
    """One streamed piece of a reply; `finish_reason` is set on the last one."""

    text: str
    finish_reason: str = ""
    generated_tokens: int = 0


@dataclass(frozen=True)
class InfluencePlan:
    """What the injection service's memtok pipeline chose for one query: the mode it
    applied, the audit bodies of its steps, and the influences to generate with (packed
    float32 vector, layer, strength), empty unless the mode is "on"."""

    mode: str
    body: Mapping[str, Any]  # ids and numbers: the audit entry's public body
    private: Mapping[str, Any] = field(default_factory=dict)  # the words: sealed per user
    influences: tuple[tuple[bytes, int, float], ...] = ()
    # The memtoks to attend (the attend route): the injection service's own encoding of
    # them, passed back to it untouched with the generation. Empty unless mode "on".
    attendable: bytes = b""

    @property
    def applies(self) -> bool:
        """Whether generating with this plan differs from the plain model."""
        return bool(self.influences or self.attendable)
