"""Recording the gateway's decisions in the audit log (the events: audit_events.py).

A query is never logged, only its keyed fingerprint (HMAC-SHA256 under a gateway secret
that every replica shares): equal queries match, but nobody without the secret can test a
guess.

Delivery. Appends are off the caller's critical path but never silently dropped: an event
is first written to the durable spool (one commit, shared by concurrent callers: a local
fsync embedded, a PostgreSQL commit in cluster mode), then the spool's one drainer
(`hippo_core.outbox`) delivers it in order, batched, with an idempotency key per event (a
delivery whose reply was lost is not appended twice). If the audit service is down the
spool grows and drains, in order, when it returns; an event the service refuses for good
(INVALID_ARGUMENT: a bug) is set aside in the spool with the reason, logged and counted,
not lost. In cluster mode each replica delivers its own events, and the events of a
replica that stopped are adopted and delivered by another.

`fail_closed` inverts the trade-off: the event must be in the log before the caller is
answered, else the call fails UNAVAILABLE. Remember then records before it writes (so a
refused record means nothing was stored); reads record before they return results (so
nothing is disclosed unrecorded). Forget is never refused because the log is down:
refusing an erasure is worse than recording it late; its entry and the erasure of the
user's key are spooled in every mode.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hippo_core.errors import HippoError, Internal, InvalidArgument, Unavailable
from hippo_gateway import metrics
from hippo_gateway.domain.audit_events import (
    AuditEvent,
    AuditItem,
    EraseUser,
    forget_event,
    recall_event,
    write_failed_event,
)
from hippo_gateway.domain.models import Recalled, RecallQuery
from hippo_gateway.domain.ports import AuditLog, OpenOutbox

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RecorderConfig:
    fail_closed: bool = False
    seq_wait_seconds: float = 0.5  # how long record(wait=True) waits for delivery


class AuditRecorder:
    """Records events; see the module docstring for the delivery guarantees. `outbox`
    opens the spool with this recorder's delivery (`deliver`, and the callbacks that
    answer callers waiting for their event's seq)."""

    def __init__(
        self,
        log: AuditLog,
        outbox: OpenOutbox,
        fingerprint_key: bytes,
        config: RecorderConfig | None = None,
    ) -> None:
        self._log, self._key = log, fingerprint_key
        self._config = config or RecorderConfig()
        self._waiters: dict[str, asyncio.Future[int]] = {}
        self._outbox = outbox(self._deliver, self._delivered, self._buried)

    @property
    def fail_closed(self) -> bool:
        return self._config.fail_closed

    @property
    def reachable(self) -> bool:
        """False while deliveries fail: callers that would wait for a seq do not wait (an
        outage must not add seq_wait_seconds to every BuildContext)."""
        return self._outbox.reachable

    def fingerprint(self, tenant: str, user: str, text: str) -> str:
        """Keyed hash of user text: equal texts of one user match, guesses cannot be tested
        without the gateway's secret, and it says nothing about the words."""
        message = "\x1f".join((tenant, user, " ".join(text.split()))).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:32]

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Deliver whatever a previous run (or a stopped replica) left, and what comes."""
        await self._outbox.start()

    async def close(self) -> None:
        """Stop delivering; what is spooled stays spooled for the next start."""
        await self._outbox.close()

    # -- recording -----------------------------------------------------------------------

    async def record(self, event: AuditEvent, *, wait: bool = False) -> int:
        """Record `event`; returns its seq, or 0 when it is spooled but not yet delivered.

        Default (spool): durable in the spool when this returns; with `wait`, also waits
        up to seq_wait_seconds for delivery (BuildContext and Chat report the seq).
        fail_closed: in the log when this returns, else Unavailable (nothing recorded: the
        caller must not act or answer).
        """
        if self._config.fail_closed:
            return await self.record_now(event)
        waiter = self._waiter(event.event_id) if wait and self.reachable else None
        with metrics.AUDIT_RECORD_SECONDS.labels("spool").time():
            await self._put([event])
        return await self._await(event.event_id, waiter)

    async def record_now(self, event: AuditEvent) -> int:
        """In the log before returning, in any mode, else Unavailable and nothing recorded
        (ReportOutcome, whose reply is the new entry's seq; every call in fail_closed)."""
        with metrics.AUDIT_RECORD_SECONDS.labels("direct").time():
            if self._outbox.depth():
                # Items spooled earlier (a Forget, a failed write's note) go first, so the
                # log keeps the order in which the gateway decided.
                await self._refuse_unless(self._outbox.drain_now)
            seqs: list[int] = await self._refuse_unless(lambda: self._log.append([event]))
        return seqs[0]

    async def record_spooled(
        self, event: AuditEvent, *, erase: EraseUser | None = None, wait: bool = False
    ) -> int:
        """Spooled in every mode, never refused: Forget's entry and (for a whole user) the
        destruction of the user's key, spooled together; notes about writes that failed.
        Returns the seq when `wait` and delivered within seq_wait_seconds, else 0."""
        return (await self._spooled(event, erase, wait))[0]

    async def _spooled(
        self, event: AuditEvent, erase: EraseUser | None, wait: bool
    ) -> tuple[int, int]:
        """The seqs of the event and of the erasure (0: not delivered within the wait)."""
        wait = wait and self.reachable
        waiter = self._waiter(event.event_id) if wait else None
        erased = self._waiter(erase.event_id) if wait and erase is not None else None
        await self._put([event, erase] if erase is not None else [event])
        seq = await self._await(event.event_id, waiter)
        erase_seq = await self._await(erase.event_id, erased) if erase is not None else 0
        return seq, erase_seq

    # -- the memory use cases' records (MemoryService calls these) ------------------------

    async def remembering(self, event: AuditEvent, write: Callable[[], Awaitable[T]]) -> T:
        """Remember's write with its record (as `writing`)."""
        return (await self.writing(event, write))[0]

    async def writing(
        self, event: AuditEvent, write: Callable[[], Awaitable[T]], *, wait: bool = False
    ) -> tuple[T, int]:
        """A write with its record, and the record's seq (0: spooled, not yet delivered).
        fail_closed: recorded before the write (a log that is down means nothing is
        stored); if the write then fails, a `remember_failed` entry follows. Default:
        recorded after the write succeeded (`wait`: as `record`)."""
        if self._config.fail_closed:
            seq = await self.record_now(event)
            try:
                return await write(), seq
            except HippoError as exc:
                await self.record_spooled(write_failed_event(event, exc))
                raise
        result = await write()
        return result, await self.record(event, wait=wait)

    async def recalled(self, tenant: str, query: RecallQuery, result: Recalled) -> None:
        """Recall's record, before its results are returned."""
        fingerprint = self.fingerprint(tenant, query.user, query.query)
        await self.record(recall_event(tenant, query, result, fingerprint))

    async def forgotten(
        self,
        tenant: str,
        kind: str,
        user: str,
        session: str | None,
        requested: Sequence[str],
        erased: Sequence[str],
        sessions: int,
        memtoks: int = 0,
    ) -> bool:
        """Forget's record, and for a whole user the destruction of their audit key; True
        when the audit service confirmed the key destroyed within seq_wait_seconds."""
        event = forget_event(tenant, kind, user, session, requested, erased, sessions, memtoks)
        erase = EraseUser(tenant, user) if kind == "user" else None
        _, erase_seq = await self._spooled(event, erase, wait=True)
        return erase_seq > 0

    async def _put(self, items: Sequence[AuditItem]) -> None:
        try:
            await self._outbox.put(items)
        except BaseException:
            for item in items:
                self._waiters.pop(item.event_id, None)
            raise

    def _waiter(self, event_id: str) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters[event_id] = future
        return future

    async def _await(self, event_id: str, waiter: asyncio.Future[int] | None) -> int:
        if waiter is None:
            return 0
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), self._config.seq_wait_seconds)
        except TimeoutError:
            return 0  # still spooled: delivered later, in order
        finally:
            self._waiters.pop(event_id, None)

    async def _refuse_unless(self, call: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await call()
        except InvalidArgument as exc:
            log.error("audit: the service refused an event: %s", exc.message)
            raise Internal("the audit log refused the record") from exc
        except HippoError as exc:
            raise Unavailable(
                f"the audit log is unavailable and this gateway must record before it acts "
                f"(audit_fail_closed): {exc.message}",
                reason="AUDIT_UNAVAILABLE",
            ) from exc

    # -- delivery (the spool's drainer calls these) --------------------------------------

    async def _deliver(self, items: Sequence[AuditItem]) -> list[int]:
        """Deliver the oldest items: a key erasure alone (its own RPC), else the events up
        to the next erasure in one Append; the seq of each item delivered."""
        first = items[0]
        if isinstance(first, EraseUser):
            return [await self._log.erase_user(first)]
        run: list[AuditEvent] = []
        for item in items:
            if isinstance(item, EraseUser):
                break
            run.append(item)
        return await self._log.append(run)

    def _delivered(self, item: AuditItem, seq: int) -> None:
        self._resolve(item.event_id, seq)

    def _buried(self, item: AuditItem) -> None:
        self._resolve(item.event_id, 0)

    def _resolve(self, event_id: str, seq: int) -> None:
        waiter = self._waiters.get(event_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(seq)
