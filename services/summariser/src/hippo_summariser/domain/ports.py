"""What the summariser needs from the outside: a session store, a token counter, an LLM,
and (optionally) someone to tell about merges. Adapters implement them; tests use real
ones or small doubles."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from hippo_summariser.domain.models import (
    Forgotten,
    MergeEvent,
    MergeOutcome,
    Session,
    SessionKey,
    TurnIn,
)


class SessionStore(Protocol):
    """Durable session state. Synchronous (SQLite): the domain calls it from a worker
    thread. Every method applies tenant and user in its own query."""

    def load(self, key: SessionKey) -> Session | None: ...

    def append(self, key: SessionKey, turns: Sequence[TurnIn], now_us: int) -> tuple[Session, int]:
        """Add the turns whose memory id the session does not hold yet, in one
        transaction, durable before it returns: (the session after, turns added)."""
        ...

    def set_tokens(self, key: SessionKey, tokens: Mapping[int, int], now_us: int) -> None:
        """Record token counts of window turns (by seq) that were stored uncounted."""
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
        """Compare-and-set: if the summary is still at `expected_rev` and every merged turn
        is still in the window, replace the summary and move those turns out of the window
        in one transaction; returns the new version. Otherwise changes nothing: None.
        `event` (its version set to the new one) joins the audit outbox in the same
        transaction: a committed merge is never left unrecorded."""
        ...

    def outbox_peek(self, limit: int) -> list[tuple[int, MergeEvent]]:
        """Up to `limit` oldest undelivered merge events with their outbox ids."""
        ...

    def outbox_remove(self, ids: Sequence[int]) -> None:
        """Delivered: drop them from the outbox."""
        ...

    def outbox_bury(self, outbox_id: int, reason: str) -> None:
        """Refused for good by the audit service (a bug): keep it aside, out of the queue."""
        ...

    def outbox_depth(self) -> tuple[int, int]:
        """(events waiting, events buried)."""
        ...

    def record_llm_failure(self, key: SessionKey) -> None: ...

    def forget(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> Forgotten:
        """Erase memories (from any of the user's sessions, or only `session`), a session,
        or every session of the user; a summary built from an erased turn goes too. The
        text must not stay readable in the file."""
        ...

    def pending(self, budget: int) -> list[SessionKey]:
        """Sessions whose window is over `budget` tokens or holds uncounted turns."""
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
