"""What the summariser needs from the outside: a session store, a token counter, an LLM,
and (optionally) someone to tell about merges. Adapters implement them; tests use real
ones or small doubles."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from hippo_summariser.domain.models import (
    Claim,
    Forgotten,
    MergeEvent,
    MergeOutcome,
    Session,
    SessionKey,
    TurnIn,
)


class SessionStore(Protocol):
    """Durable session state: one SQLite file (the embedded default) or PostgreSQL (cluster
    mode, shared by every replica). Synchronous: the domain calls it from worker threads.
    Every method applies tenant and user in its own statements.

    A store acts for one replica, `owner` (new at every start): the merge claims it takes
    and the audit outbox rows it writes are that replica's."""

    owner: str

    def load(self, key: SessionKey) -> Session | None:
        """The session as of one moment (never half of a concurrent commit)."""
        ...

    def versions(self, tenant: str, user: str, sessions: Sequence[str]) -> dict[str, int]:
        """The state version of each of the user's sessions that has state."""
        ...

    def append(self, key: SessionKey, turns: Sequence[TurnIn], now_us: int) -> tuple[Session, int]:
        """Add the turns whose memory id the session does not hold yet, in one
        transaction, durable before it returns: (the session after, turns added). Appends
        to one session are serialised, so its turns keep one order on every replica."""
        ...

    def set_tokens(self, key: SessionKey, tokens: Mapping[int, int], now_us: int) -> None:
        """Record token counts of window turns (by seq) that were stored uncounted."""
        ...

    def claim(self, key: SessionKey, lease_seconds: float) -> Claim:
        """Claim the session's merges for this replica for `lease_seconds` (the store's
        clock): held when the claim was free, already ours, or its lease had run out.
        Never waits: a session another transaction is writing at this moment answers BUSY
        (that writer schedules the merge its write calls for)."""
        ...

    def renew(self, key: SessionKey, lease_seconds: float) -> bool:
        """Extend this replica's claim; False when the claim is not ours any more (our
        lease ran out and another replica took it over, or the session is gone)."""
        ...

    def release(self, key: SessionKey) -> None:
        """Let go of this replica's claim (nothing when it holds none)."""
        ...

    def release_all(self) -> int:
        """Let go of every claim of this replica (at stop); how many."""
        ...

    def orphaned(self) -> list[SessionKey]:
        """Sessions claimed by another replica whose lease ran out (it died, or lost the
        database): any replica may take them over."""
        ...

    def commit_merge(
        self,
        key: SessionKey,
        expected_rev: int,
        merged_seqs: Sequence[int],
        outcome: MergeOutcome,
        now_us: int,
        event: MergeEvent | None = None,
    ) -> int | None:
        """Compare-and-set: if this replica holds the session's claim with a live lease,
        the summary is still at `expected_rev` and every merged turn is still in the
        window, replace the summary and move those turns out of the window in one
        transaction; returns the new version. Otherwise changes nothing: None. `event`
        (its version set to the new one) joins the audit outbox in the same transaction:
        a committed merge is never left unrecorded."""
        ...

    def record_llm_failure(self, key: SessionKey) -> None: ...

    def forget(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> Forgotten:
        """Erase memories (from any of the user's sessions, or only `session`), a session,
        or every session of the user; a summary built from an erased turn goes too, and
        so do the claims of erased sessions. The text must not stay readable in the
        store."""
        ...

    def pending(self, budget: int) -> list[SessionKey]:
        """Sessions whose window is over `budget` tokens or holds uncounted turns, and
        that no other replica holds a live claim on."""
        ...

    def session_count(self) -> int:
        """Sessions held (all tenants), for the store-size gauge; 0 once closed."""
        ...

    def close(self) -> None: ...


class TokenCounter(Protocol):
    async def count(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text as the serving model reads it, without <bos>. Raises a
        HippoError (UNAVAILABLE, DEADLINE_EXCEEDED...) when the counter cannot answer."""
        ...


@dataclass(frozen=True)
class Completion:
    text: str
    cut_by_length: bool  # generation stopped at max_new_tokens, not at a stop sequence
    tokens: int


class LlmUnavailable(Exception):
    """The LLM could not answer now (down, overloaded, timed out): retry later."""


class LlmRejected(Exception):
    """The LLM refused the request itself (e.g. the prompt is too long for it): retrying
    the same request cannot succeed."""


class Llm(Protocol):
    async def complete(
        self, prompt: str, *, max_new_tokens: int, stop: Sequence[str]
    ) -> Completion:
        """Continue `prompt`. Raises LlmUnavailable or LlmRejected; has its own deadline."""
        ...


class MergeObserver(Protocol):
    async def on_merge(self, event: MergeEvent) -> None:
        """Called after each committed merge (the audit log's hook). Must not raise for
        the merge's sake: a failure is logged and the merge stays committed."""
        ...


class NoObserver:
    """The default: nobody is told."""

    async def on_merge(self, event: MergeEvent) -> None:
        return None
