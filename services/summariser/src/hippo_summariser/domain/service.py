"""The summariser's use cases: Append, GetSession, Forget, Flush, and resuming at start.

Append counts the turns (the injection host's tokenizer), stores them durably, and hands
the session to the merge worker if the window is now over budget; it never waits for a
merge. If the counter cannot answer, the turns are stored uncounted rather than refused:
an acknowledged turn is never lost for want of a token count, and the worker counts them
once the counter is back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import structlog

from hippo_core.errors import HippoError, InvalidArgument
from hippo_summariser import metrics
from hippo_summariser.domain import trimming, validation
from hippo_summariser.domain.merge import Merger, now_us
from hippo_summariser.domain.models import (
    Appended,
    Forgotten,
    Session,
    SessionKey,
    SessionView,
    TurnIn,
)
from hippo_summariser.domain.ports import SessionStore, TokenCounter
from hippo_summariser.domain.tokens import render_line
from hippo_summariser.domain.validation import Limits

log = structlog.stdlib.get_logger("hippo.summariser")

FLUSH_POLL_SECONDS = 0.2
MAX_VERSIONS = 1000  # sessions per SessionVersions call: one listing page


@dataclass(frozen=True)
class Budgets:
    window_tokens: int
    summary_tokens: int
    flush_max_seconds: float = 300.0


class SummariserService:
    def __init__(
        self,
        store: SessionStore,
        counter: TokenCounter,
        merger: Merger,
        budgets: Budgets,
        limits: Limits | None = None,
    ) -> None:
        self._store = store
        self._counter = counter
        self._merger = merger
        self._budgets = budgets
        self._limits = limits or Limits()

    async def append(self, key: SessionKey, turns: Sequence[TurnIn]) -> Appended:
        validation.check_session(key.tenant, key.user, key.session)
        validation.check_turns(turns, self._limits)
        counted = await self._count(turns)
        session, appended = await asyncio.to_thread(self._store.append, key, counted, now_us())
        metrics.TURNS.labels("appended").inc(appended)
        metrics.TURNS.labels("duplicate").inc(len(turns) - appended)
        pending = self._needs_work(session)
        if pending:
            self._merger.schedule(key)
        return Appended(session.version, appended, pending)

    async def get(self, key: SessionKey) -> SessionView:
        validation.check_session(key.tenant, key.user, key.session)
        return await self._view(key)

    async def versions(self, tenant: str, user: str, sessions: Sequence[str]) -> dict[str, int]:
        """Each session's state version (absent: no state), for listings."""
        validation.require("tenant", tenant)
        validation.require("user_id", user)
        if not 1 <= len(sessions) <= MAX_VERSIONS:
            raise InvalidArgument(
                "session_ids", f"must hold 1..{MAX_VERSIONS} ids, got {len(sessions)}"
            )
        for i, session in enumerate(sessions):
            validation.require(f"session_ids[{i}]", session)
        return await asyncio.to_thread(self._store.versions, tenant, user, sessions)

    async def flush(self, key: SessionKey, time_remaining: float | None) -> SessionView:
        """Wait for the session's merges until just before the caller's deadline (a margin
        is kept to read and send the state); a call without one waits flush_max_seconds.
        The merges may run on another replica (it holds the session's claim): then this
        one looks at the stored state every FLUSH_POLL_SECONDS until they are done."""
        validation.check_session(key.tenant, key.user, key.session)
        wait = self._budgets.flush_max_seconds
        if time_remaining is not None:
            wait = time_remaining - min(1.0, 0.1 * time_remaining)
        end = time.monotonic() + wait
        while True:
            session = await asyncio.to_thread(self._store.load, key)
            needed = session is not None and self._needs_work(session)
            if needed:
                self._merger.schedule(key)
            left = end - time.monotonic()
            if left <= 0 or not await self._merger.idle(key, left) or not needed:
                break
            # This replica's worker is done, and the session needed work when we looked:
            # another replica may hold its claim.
            session = await asyncio.to_thread(self._store.load, key)
            if session is None or not self._needs_work(session):
                break
            await asyncio.sleep(max(0.0, min(FLUSH_POLL_SECONDS, end - time.monotonic())))
        return await self._view(key)

    async def forget(
        self, tenant: str, user: str, session: str, memory_ids: Sequence[str]
    ) -> Forgotten:
        validation.check_forget(tenant, user, session, memory_ids, self._limits)
        result = await asyncio.to_thread(
            self._store.forget, tenant, user, session or None, list(memory_ids)
        )
        metrics.SUMMARIES_ERASED.inc(result.summaries_erased)
        # A merge in flight for a touched session will fail its compare-and-set; waking
        # the worker makes it plan again from what is left.
        for key in result.touched:
            self._merger.schedule(key)
        return result

    async def resume(self) -> int:
        """At start-up: schedule every session a previous process left with work (that
        no live replica holds)."""
        keys = await asyncio.to_thread(self._store.pending, self._budgets.window_tokens)
        for key in keys:
            self._merger.schedule(key)
        if keys:
            log.info("merges_resumed", sessions=len(keys))
        self._merger.start()  # and, from now on, what stopped replicas leave claimed
        return len(keys)

    async def close(self) -> None:
        await self._merger.close()
        await asyncio.to_thread(self._store.close)

    # -- internals ----------------------------------------------------------------------

    async def _count(self, turns: Sequence[TurnIn]) -> list[TurnIn]:
        try:
            counts = await self._counter.count([render_line(t.role, t.text) for t in turns])
        except HippoError as exc:
            metrics.COUNT_ERRORS.inc()
            metrics.TURNS_UNCOUNTED.inc(len(turns))
            log.warning("count_deferred", turns=len(turns), error=exc.message)
            return list(turns)
        return [replace(t, tokens=n) for t, n in zip(turns, counts, strict=True)]

    def _needs_work(self, session: Session) -> bool:
        return trimming.needs_merge(session.window, self._budgets.window_tokens)

    async def _view(self, key: SessionKey) -> SessionView:
        session = await asyncio.to_thread(self._store.load, key) or Session(key)
        return SessionView(
            session=session,
            merge_pending=self._needs_work(session) or self._merger.active(key),
            window_budget=self._budgets.window_tokens,
            summary_budget=self._budgets.summary_tokens,
        )
