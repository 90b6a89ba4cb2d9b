"""Values of the summariser's domain: sessions, turns, merge statistics, results."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Role(enum.Enum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    TOOL = "tool"


@dataclass(frozen=True, order=True)
class SessionKey:
    tenant: str
    user: str
    session: str


@dataclass(frozen=True)
class TurnIn:
    """A turn as Append receives it; `tokens` is filled in by the service (None = the
    counter was unreachable: counted later by the merge worker)."""

    memory_id: str
    role: Role
    text: str
    time_us: int
    speaker: str = ""
    tokens: int | None = None


@dataclass(frozen=True)
class WindowTurn:
    """A turn of the working window. `seq` orders turns within a session (append order)."""

    seq: int
    memory_id: str
    role: Role
    text: str
    time_us: int
    speaker: str
    tokens: int | None  # None: not counted yet


@dataclass(frozen=True)
class MergeStats:
    """How a session's merges went, summed since the session began. Retention = facts of
    the merged turns (names, numbers, dates, identifiers) found in the summary."""

    merges: int = 0
    turns_merged: int = 0
    facts: int = 0
    facts_kept_llm: int = 0  # in the LLM's first answer (before retry and repair)
    facts_kept: int = 0  # in the committed summary
    last_retention_llm: float = 1.0
    last_retention: float = 1.0
    llm_failures: int = 0


@dataclass(frozen=True)
class Session:
    key: SessionKey
    window: tuple[WindowTurn, ...] = ()
    summary: str = ""
    summary_tokens: int = 0
    version: int = 0
    turns_total: int = 0
    updated_us: int = 0
    # Increases whenever the summary or the set of turns merged into it changes: a merge
    # commits only if it is unchanged since the merge read the session (compare-and-set).
    summary_rev: int = 0
    stats: MergeStats = field(default_factory=MergeStats)

    @property
    def window_tokens(self) -> int:
        return sum(t.tokens or 0 for t in self.window)

    @property
    def uncounted(self) -> list[WindowTurn]:
        return [t for t in self.window if t.tokens is None]


class Claim(enum.Enum):
    """A replica's answer to "may I merge this session?" (see SessionStore.claim).

    One replica at a time merges a session: it holds the session's claim, a lease it
    renews while it works. A lease that runs out (its replica died, stalled or lost the
    database) may be taken over by any replica."""

    TAKEN = "taken"  # nobody held it
    RENEWED = "renewed"  # this replica held it already: the lease is extended
    TAKEN_OVER = "taken_over"  # another replica's lease had run out
    BUSY = "busy"  # another replica holds a live lease, or is writing the session now

    @property
    def held(self) -> bool:
        return self is not Claim.BUSY

    @staticmethod
    def judge(holder: tuple[str, int] | None, owner: str, now_us: int) -> Claim:
        """What `owner` gets, given the claim's current (holder, lease end) or None."""
        if holder is None:
            return Claim.TAKEN
        who, until_us = holder
        if who == owner:
            return Claim.RENEWED
        if until_us <= now_us:
            return Claim.TAKEN_OVER
        return Claim.BUSY


@dataclass(frozen=True)
class Appended:
    version: int
    appended: int
    merge_pending: bool


@dataclass(frozen=True)
class SessionView:
    """A session as GetSession and Flush answer it."""

    session: Session
    merge_pending: bool
    window_budget: int
    summary_budget: int


@dataclass(frozen=True)
class Forgotten:
    sessions_deleted: int = 0
    turns_removed: int = 0
    summaries_erased: int = 0
    # Sessions that changed but still exist (their pending merge must be re-planned).
    touched: tuple[SessionKey, ...] = ()


@dataclass(frozen=True)
class MergeOutcome:
    """What a merge produced, before it is committed."""

    summary: str
    summary_tokens: int
    facts: int
    kept_llm: int
    kept: int
    llm_calls: int
    repaired: bool  # the missing-facts sentence was appended
    invented_dropped: int  # LLM sentences removed for stating facts no source holds

    @property
    def retention_llm(self) -> float:
        return self.kept_llm / self.facts if self.facts else 1.0

    @property
    def retention(self) -> float:
        return self.kept / self.facts if self.facts else 1.0


@dataclass(frozen=True)
class MergeEvent:
    """One committed merge, as the audit log records it (ids and figures, never text).
    Queued in the store's outbox in the merge's own transaction (see domain/audit.py) and
    handed to the `on_merge` hook after the commit. `event_id` is the idempotency key of
    its delivery; `version` is the session version the merge committed."""

    key: SessionKey
    version: int
    merged_memory_ids: tuple[str, ...]
    summary_tokens: int
    facts: int
    kept_llm: int
    kept: int
    retention_llm: float
    retention: float
    llm_calls: int
    repaired: bool
    seconds: float
    event_id: str
    time_us: int
