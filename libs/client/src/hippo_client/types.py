"""What the SDK takes and returns: plain frozen dataclasses, never protobuf messages.

Enums travel as short lower-case strings (`"user"`, `"hybrid"`, …); times as aware
`datetime`s in UTC (`None` where the API leaves a time unset). Field meanings, units and
limits are the proto's (protos/hippo/memory/v1/memory.proto); docs/api.md tours them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

Role = Literal["user", "assistant", "system", "tool"]
RecallMode = Literal["hybrid", "lexical", "semantic"]
ContextLayout = Literal["boundary_weighted", "chronological", "summary_in_system"]
InfluenceMode = Literal["off", "disclose_only", "on"]
OutcomeKind = Literal["accepted", "rejected", "corrected", "note"]
ListOrder = Literal["newest", "oldest"]
ZoneKind = Literal["system", "memories", "summary", "window", "query"]

T = TypeVar("T")


@dataclass(frozen=True)
class Turn:
    """One turn to store. `time=None`: the server's receive time. A `client_id` makes the
    write idempotent per turn: the same id in the same scope is stored once."""

    role: Role
    text: str
    time: datetime | None = None
    client_id: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Memory:
    """A stored turn. `sequence` is its 1-based position in its session."""

    id: str
    user: str
    session: str
    role: Role
    text: str
    time: datetime | None
    client_id: str
    metadata: Mapping[str, str]
    sequence: int


@dataclass(frozen=True)
class RememberResult:
    """The memory id of each turn, in order; created + deduplicated = len(turns)."""

    memory_ids: tuple[str, ...]
    created: int
    deduplicated: int


@dataclass(frozen=True)
class Hit:
    """A recalled memory with its fused score and each retriever's rank (1-based; 0 = that
    retriever did not find it) and raw score."""

    memory: Memory
    fused_score: float
    lexical_rank: int
    semantic_rank: int
    lexical_score: float
    semantic_score: float


@dataclass(frozen=True)
class RecallResult:
    """Hits best first; iterating the result iterates its hits."""

    hits: tuple[Hit, ...]
    lexical_candidates: int
    semantic_candidates: int
    # Typing slips the service repaired in the query: typed word -> repair.
    query_repairs: Mapping[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Hit]:
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)


@dataclass(frozen=True)
class TokenCounts:
    """How a prompt's tokens are spent (the serving model's tokenizer)."""

    budget: int
    total: int
    system: int
    memories: int
    summary: int
    window: int
    query: int


@dataclass(frozen=True)
class ContextZone:
    kind: ZoneKind
    text: str
    tokens: int
    memory_ids: tuple[str, ...]


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    text: str


@dataclass(frozen=True)
class Context:
    """A prompt built under a token budget (BuildContext). Pass `audit_seq` to
    `report_outcome`."""

    messages: tuple[ChatMessage, ...]
    zones: tuple[ContextZone, ...]
    tokens: TokenCounts
    memory_ids_used: tuple[str, ...]
    summary: str
    disclosure_note: str
    prompt: str
    audit_seq: int


@dataclass(frozen=True)
class ChatStart:
    """What the reply's prompt was built from: the first event of a chat stream."""

    memory_ids_used: tuple[str, ...]
    disclosure_note: str
    tokens: TokenCounts


@dataclass(frozen=True)
class AppliedInfluence:
    memtok_id: str
    source_words: str
    layer: int
    strength: float


@dataclass(frozen=True)
class ChatEnd:
    """How generation ended and what was stored: the last event of a chat stream.
    `finish_reason` is "eos_token", "stop_sequence" or "length"."""

    finish_reason: str
    generated_tokens: int
    user_memory_id: str
    assistant_memory_id: str
    influences: tuple[AppliedInfluence, ...]
    audit_seq: int


@dataclass(frozen=True)
class ForgetResult:
    """What each store erased. `audit_key_destroyed` only for a whole-user forget."""

    memories_deleted: int
    sessions_deleted: int
    memtoks_deleted: int
    cache_entries_dropped: int
    audit_key_destroyed: bool


@dataclass(frozen=True)
class Session:
    """A session's bounded state; `version == 0` means it has none (not an error)."""

    user: str
    session: str
    window: tuple[Memory, ...]
    summary: str
    version: int
    window_tokens: int
    summary_tokens: int
    turns_total: int
    updated: datetime | None


@dataclass(frozen=True)
class AuditVerification:
    """VerifyAudit's answer: sequence numbers and hashes only."""

    ok: bool
    entries_checked: int
    first_bad_seq: int
    reason: str
    head_seq: int
    head_hash: str


@dataclass(frozen=True)
class AuditEntry:
    """One audit record. `body` is the entry's JSON details; it never holds memory text."""

    seq: int
    time: datetime | None
    actor: str
    event_type: str
    user: str
    session: str
    memory_ids: tuple[str, ...]
    body: Mapping[str, Any]
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; an empty `next_page_token` means it was the last."""

    items: tuple[T, ...]
    next_page_token: str

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class SessionInfo:
    """A session of a user that holds stored turns (ListSessions)."""

    session: str
    turn_count: int
    first_time: datetime | None
    last_time: datetime | None
    # The session state's version (GetSession's): it goes up whenever the window or
    # the summary changes; 0 without state.
    summary_version: int = 0


@dataclass(frozen=True)
class UserInfo:
    """A user of the tenant that holds stored turns (ListUsers)."""

    user: str
    turn_count: int
    session_count: int
    first_time: datetime | None
    last_time: datetime | None


@dataclass(frozen=True)
class MetadataUpdate:
    """A memory after UpdateMemoryMetadata, and the audit entry recording the change."""

    memory: Memory
    audit_seq: int


@dataclass(frozen=True)
class ExportHeader:
    """The first item of an export: the audit entry it is consistent with."""

    format_version: int
    user: str
    audit_seq: int
    time: datetime | None


@dataclass(frozen=True)
class ExportedSession:
    """A session in an export, with its rolling summary (rebuilt on import)."""

    session: SessionInfo
    summary: str
    version: int


@dataclass(frozen=True)
class ExportFooter:
    """The last item of an export; an export without one is incomplete."""

    memories: int
    sessions: int


ExportItem = ExportHeader | Memory | ExportedSession | ExportFooter


@dataclass(frozen=True)
class ImportResult:
    """What ImportTurns stored and skipped (ids already stored in the tenant)."""

    created: int
    deduplicated: int
