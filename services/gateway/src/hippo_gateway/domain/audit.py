"""Recording the gateway's decisions in the audit log, and its audit reads.

Every Remember, Recall, BuildContext, Chat, Forget and reported outcome becomes an entry,
written by this code (never by a model). The entry's `body` is public for the life of the
log, so it holds ids, counts, scores, ranks and reasons, never user text; what is derived
from user content (a query's fingerprint, an operator's note) goes in `private`, which the
audit service seals under the user's key and which becomes unreadable when the user is
forgotten. A query is never logged, only its keyed fingerprint (HMAC-SHA256 under a
gateway secret): equal queries match, but nobody without the secret can test a guess.

Delivery. Appends are off the caller's critical path but never silently dropped: an event
is first written to a durable local spool (one fsync, shared by concurrent callers), then
a single drainer delivers the spool in order, batched, with an idempotency key per event
(a delivery whose reply was lost is not appended twice). If the audit service is down the
spool grows and drains, in order, when it returns; an event the service refuses for good
(INVALID_ARGUMENT: a bug) is moved to a dead-letter table, logged and counted, not lost.

`fail_closed` inverts the trade-off: the event must be in the log before the caller is
answered, else the call fails UNAVAILABLE. Remember then records before it writes (so a
refused record means nothing was stored); reads record before they return results (so
nothing is disclosed unrecorded). Forget is never refused because the log is down:
refusing an erasure is worse than recording it late; its entry and the erasure of the
user's key are spooled in every mode.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from hippo_core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    HippoError,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from hippo_gateway import metrics
from hippo_gateway.domain import validation
from hippo_gateway.domain.models import Hit, Recalled, RecallQuery

log = logging.getLogger(__name__)
T = TypeVar("T")

Json = Mapping[str, Any]
ACTOR = "gateway"
MAX_NOTE_BYTES = 4 * 1024
MAX_PAGE = 1000
DEFAULT_PAGE = 100
OUTCOMES = ("accepted", "rejected", "corrected", "note")
# Worth retrying later: the service is down, slow, busy, or (FAILED_PRECONDITION) refusing
# writes until an operator has looked at a log that disagrees with its checkpoints.
RETRYABLE = (Unavailable, DeadlineExceeded, ResourceExhausted, FailedPrecondition)


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class AuditEvent:
    """One decision to record. `event_id` is the idempotency key of its delivery."""

    tenant: str
    event_type: str
    user: str = ""
    session: str = ""
    memory_ids: tuple[str, ...] = ()
    body: Json = field(default_factory=dict)  # public: never user text
    private: Json | None = None  # derived from user content: sealed under the user's key
    actor: str = ACTOR
    event_id: str = field(default_factory=new_id)
    # The W3C traceparent of the call that decided it, set by the spool: the delivery,
    # later and batched, then shows up in that call's trace. Opaque here, never sent.
    trace_parent: str = ""


@dataclass(frozen=True)
class EraseUser:
    """Destroy the user's key in the audit service (after every event spooled before it)."""

    tenant: str
    user: str
    actor: str = ACTOR
    event_id: str = field(default_factory=new_id)
    trace_parent: str = ""  # as AuditEvent.trace_parent


Item = AuditEvent | EraseUser


@dataclass(frozen=True)
class AuditRecord:
    """An entry as the audit service returns it."""

    seq: int
    time_us: int
    actor: str
    event_type: str
    user: str
    session: str
    memory_ids: tuple[str, ...]
    body: Json
    private: Json | None
    private_state: str  # "none" | "sealed" | "readable" | "erased"
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class Verification:
    ok: bool
    entries_checked: int
    first_bad_seq: int
    reason: str
    head_seq: int
    head_hash: str


class AuditLog(Protocol):
    """The audit service, as the gateway uses it."""

    async def append(self, events: Sequence[AuditEvent]) -> list[int]:
        """Append in order, all or none; the seq of each (the earlier one for an event_id
        already appended)."""
        ...

    async def erase_user(self, erase: EraseUser) -> int:
        """Destroy the user's keys; the seq of the entry recording it."""
        ...

    async def read(
        self, tenant: str, user: str, session: str, after_seq: int, to_seq: int, limit: int
    ) -> tuple[list[AuditRecord], int]:
        """The user's (or session's) entries after `after_seq`, private bodies decrypted
        where the key exists; and the next after_seq (0 = no more)."""
        ...

    async def verify(self, from_seq: int, to_seq: int) -> Verification: ...


class Spool(Protocol):
    """The durable local queue of items not yet delivered, oldest first."""

    async def put(self, items: Sequence[Item]) -> None:
        """Durable (fsynced) before returning; `items` keep their order, together."""
        ...

    async def peek(self, limit: int) -> list[tuple[int, Item]]:
        """Up to `limit` oldest items with their spool ids."""
        ...

    async def remove(self, ids: Sequence[int]) -> None: ...

    async def bury(self, spool_id: int, reason: str) -> None:
        """Move an item the service refuses for good to the dead-letter table."""
        ...

    def depth(self) -> int: ...


@dataclass(frozen=True)
class RecorderConfig:
    fail_closed: bool = False
    seq_wait_seconds: float = 0.5  # how long record(wait=True) waits for delivery
    batch: int = 100  # spooled items per Append
    retry_min_seconds: float = 0.25
    retry_max_seconds: float = 5.0


class AuditRecorder:
    """Records events; see the module docstring for the delivery guarantees."""

    def __init__(
        self,
        log: AuditLog,
        spool: Spool,
        fingerprint_key: bytes,
        config: RecorderConfig | None = None,
    ) -> None:
        self._log, self._spool, self._key = log, spool, fingerprint_key
        self._config = config or RecorderConfig()
        self._waiters: dict[str, asyncio.Future[int]] = {}
        self._wake = asyncio.Event()
        self._delivering = asyncio.Lock()  # one delivery at a time keeps the spool's order
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        # False while deliveries fail: callers that would wait for a seq do not wait
        # (an outage must not add seq_wait_seconds to every BuildContext).
        self._reachable = True

    @property
    def fail_closed(self) -> bool:
        return self._config.fail_closed

    def fingerprint(self, tenant: str, user: str, text: str) -> str:
        """Keyed hash of user text: equal texts of one user match, guesses cannot be tested
        without the gateway's secret, and it says nothing about the words."""
        message = "\x1f".join((tenant, user, " ".join(text.split()))).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:32]

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        metrics.AUDIT_SPOOL_DEPTH.set(self._spool.depth())
        self._task = asyncio.create_task(self._drain_loop(), name="audit-drainer")
        self._wake.set()  # whatever a previous run left in the spool

    async def close(self) -> None:
        """Stop delivering; what is spooled stays spooled for the next start."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- recording -----------------------------------------------------------------------

    async def record(self, event: AuditEvent, *, wait: bool = False) -> int:
        """Record `event`; returns its seq, or 0 when it is spooled but not yet delivered.

        Default (spool): durable in the local spool when this returns; with `wait`, also
        waits up to seq_wait_seconds for delivery (BuildContext and Chat report the seq).
        fail_closed: in the log when this returns, else Unavailable (nothing recorded: the
        caller must not act or answer).
        """
        if self._config.fail_closed:
            return await self.record_now(event)
        waiter = self._waiter(event.event_id) if wait and self._reachable else None
        with metrics.AUDIT_RECORD_SECONDS.labels("spool").time():
            await self._put([event])
        metrics.AUDIT_SPOOLED.inc()
        metrics.AUDIT_SPOOL_DEPTH.set(self._spool.depth())
        self._wake.set()
        return await self._await(event.event_id, waiter)

    async def record_now(self, event: AuditEvent) -> int:
        """In the log before returning, in any mode, else Unavailable and nothing recorded
        (ReportOutcome, whose reply is the new entry's seq; every call in fail_closed)."""
        with metrics.AUDIT_RECORD_SECONDS.labels("direct").time():
            if self._spool.depth():
                # Items spooled earlier (a Forget, a failed write's note) go first, so the
                # log keeps the order in which the gateway decided.
                async with self._delivering:
                    await self._refuse_unless(self._drain_all)
            seqs: list[int] = await self._refuse_unless(lambda: self._log.append([event]))
        metrics.AUDIT_DELIVERED.inc()
        return seqs[0]

    async def record_spooled(
        self, event: AuditEvent, *, erase: EraseUser | None = None, wait: bool = False
    ) -> int:
        """Spooled in every mode, never refused: Forget's entry and (for a whole user) the
        destruction of the user's key, spooled together; notes about writes that failed.
        Returns the seq when `wait` and delivered within seq_wait_seconds, else 0."""
        wait = wait and self._reachable
        waiter = self._waiter(event.event_id) if wait else None
        erased = self._waiter(erase.event_id) if wait and erase is not None else None
        await self._put([event, erase] if erase is not None else [event])
        metrics.AUDIT_SPOOLED.inc(2 if erase is not None else 1)
        metrics.AUDIT_SPOOL_DEPTH.set(self._spool.depth())
        self._wake.set()
        seq = await self._await(event.event_id, waiter)
        if erase is not None:
            await self._await(erase.event_id, erased)
        return seq

    # -- the memory use cases' records (MemoryService calls these) ------------------------

    async def remembering(self, event: AuditEvent, write: Callable[[], Awaitable[T]]) -> T:
        """Remember's write with its record. fail_closed: recorded before the write (a log
        that is down means nothing is stored); if the write then fails, a
        `remember_failed` entry follows. Default: recorded after the write succeeded."""
        if self._config.fail_closed:
            await self.record_now(event)
            try:
                return await write()
            except HippoError as exc:
                await self.record_spooled(write_failed_event(event, exc))
                raise
        result = await write()
        await self.record(event)
        return result

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
    ) -> None:
        """Forget's record, and for a whole user the destruction of their audit key."""
        event = forget_event(tenant, kind, user, session, requested, erased, sessions)
        erase = EraseUser(tenant, user) if kind == "user" else None
        await self.record_spooled(event, erase=erase, wait=True)

    async def _put(self, items: Sequence[Item]) -> None:
        try:
            await self._spool.put(items)
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

    async def _refuse_unless(self, call: Any) -> Any:
        try:
            return await call()
        except InvalidArgument as exc:
            log.error("audit: the service refused an event: %s", exc.message)
            raise Internal("the audit log refused the record") from exc
        except HippoError as exc:
            metrics.AUDIT_FAILURES.labels(exc.code.value).inc()
            raise Unavailable(
                f"the audit log is unavailable and this gateway must record before it acts "
                f"(audit_fail_closed): {exc.message}",
                reason="AUDIT_UNAVAILABLE",
            ) from exc

    # -- delivery ------------------------------------------------------------------------

    async def _drain_loop(self) -> None:
        pause = self._config.retry_min_seconds
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=pause)
            self._wake.clear()
            if not self._spool.depth():
                continue
            try:
                async with self._delivering:
                    await self._drain_all()
                pause = self._config.retry_min_seconds
            except RETRYABLE as exc:
                self._reachable = False
                metrics.AUDIT_FAILURES.labels(exc.code.value).inc()
                log.warning(
                    "audit: delivery failed (%s); %d items spooled",
                    exc.message,
                    self._spool.depth(),
                )
                pause = min(
                    max(pause * 2, self._config.retry_min_seconds), self._config.retry_max_seconds
                )
            except Exception:
                log.exception("audit: delivery failed; retrying")
                pause = self._config.retry_max_seconds

    async def _drain_all(self) -> None:
        """Deliver the spool in order until it is empty (caller holds `_delivering`)."""
        batch = self._config.batch
        while items := await self._spool.peek(batch):
            first_id, first = items[0]
            if isinstance(first, EraseUser):
                seq = await self._log.erase_user(first)
                await self._delivered([(first_id, first)], [seq])
                continue
            run: list[tuple[int, AuditEvent]] = []
            for spool_id, item in items:
                if isinstance(item, EraseUser):
                    break
                run.append((spool_id, item))
            try:
                seqs = await self._log.append([e for _, e in run])
            except InvalidArgument as exc:
                if len(run) > 1:
                    batch = 1  # find the one the service refuses; the rest go through
                    continue
                log.error("audit: event %s refused for good: %s", run[0][1].event_id, exc.message)
                await self._spool.bury(run[0][0], exc.message)
                metrics.AUDIT_DEAD.inc()
                self._resolve(run[0][1].event_id, 0)
                continue
            await self._delivered(run, seqs)
            batch = self._config.batch

    async def _delivered(self, items: Sequence[tuple[int, Item]], seqs: Sequence[int]) -> None:
        await self._spool.remove([spool_id for spool_id, _ in items])
        self._reachable = True
        metrics.AUDIT_DELIVERED.inc(len(items))
        metrics.AUDIT_SPOOL_DEPTH.set(self._spool.depth())
        for (_, item), seq in zip(items, seqs, strict=True):
            self._resolve(item.event_id, seq)

    def _resolve(self, event_id: str, seq: int) -> None:
        waiter = self._waiters.get(event_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(seq)


# -- the events the gateway records ---------------------------------------------------------


def hit_json(hit: Hit, rank: int) -> dict[str, Any]:
    """A recalled memory as the log keeps it: ids, date, scores, ranks; never its text."""
    return {
        "memory_id": hit.memory.memory_id,
        "session_id": hit.memory.session,
        "time_us": hit.memory.time_us,
        "rank": rank,
        "fused_score": round(hit.fused_score, 6),
        "lexical_rank": hit.lexical_rank,
        "semantic_rank": hit.semantic_rank,
    }


def remember_event(
    tenant: str, user: str, session: str, memory_ids: Sequence[str], turns: int
) -> AuditEvent:
    return AuditEvent(tenant, "remember", user, session, tuple(memory_ids), body={"turns": turns})


def write_failed_event(remembered: AuditEvent, error: HippoError) -> AuditEvent:
    """Follows a `remember` recorded before a write that then failed."""
    body = {"ref_event": remembered.event_id, "code": error.code.value, "turns": 0}
    return AuditEvent(
        remembered.tenant,
        "remember_failed",
        remembered.user,
        remembered.session,
        remembered.memory_ids,
        body=body,
    )


def recall_event(tenant: str, query: RecallQuery, result: Recalled, fingerprint: str) -> AuditEvent:
    body: dict[str, Any] = {
        "mode": query.mode.value,
        "top_k": query.top_k,
        "candidates": {
            "lexical": result.lexical_candidates,
            "semantic": result.semantic_candidates,
        },
        "hits": [hit_json(h, i) for i, h in enumerate(result.hits, start=1)],
    }
    if query.start_us is not None or query.end_us is not None:
        body["time_range_us"] = [query.start_us, query.end_us]
    if query.roles:
        body["roles"] = sorted(r.value for r in query.roles)
    return AuditEvent(
        tenant,
        "recall",
        query.user,
        query.session or "",
        tuple(h.memory.memory_id for h in result.hits),
        body=body,
        private={"query_fingerprint": fingerprint},
    )


class SkipLike(Protocol):
    """A memory recalled but not used (the context builder's `Skipped` fits)."""

    @property
    def memory_id(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def fused_score(self) -> float: ...


def context_event(
    tenant: str,
    user: str,
    session: str,
    fingerprint: str,
    *,
    used: Sequence[Hit],
    skipped: Sequence[SkipLike],
    candidates: int,
    lexical_candidates: int | None = None,
    semantic_candidates: int | None = None,
    mode: str = "hybrid",
    event_type: str = "context",
    extra: Json | None = None,
) -> AuditEvent:
    """BuildContext's (or Chat's start) decision: what was used, in prompt order, with
    dates, fused scores and ranks; what was skipped and why; how many candidates there
    were. `extra` adds public fields (token counts, layout, influences...)."""
    counts: dict[str, int] = {"total": candidates}
    if lexical_candidates is not None:
        counts["lexical"] = lexical_candidates
    if semantic_candidates is not None:
        counts["semantic"] = semantic_candidates
    body: dict[str, Any] = {
        "mode": mode,
        "candidates": counts,
        "used": [hit_json(h, i) for i, h in enumerate(used, start=1)],
        "skipped": [
            {"memory_id": s.memory_id, "reason": s.reason, "fused_score": round(s.fused_score, 6)}
            for s in skipped
        ],
        **(extra or {}),
    }
    return AuditEvent(
        tenant,
        event_type,
        user,
        session,
        tuple(h.memory.memory_id for h in used),
        body=body,
        private={"query_fingerprint": fingerprint},
    )


def forget_event(
    tenant: str,
    kind: str,
    user: str,
    session: str | None,
    requested: Sequence[str],
    erased: Sequence[str],
    sessions: int,
) -> AuditEvent:
    body = {
        "target": kind,
        "requested": len(requested),
        "memories_deleted": len(erased),
        "sessions_deleted": sessions,
        "user_key_erased": kind == "user",
    }
    return AuditEvent(tenant, "forget", user, session or "", tuple(erased), body=body)


# -- the audit reads of the public API ------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    scope_user: str
    scope_session: str
    audit_seq: int
    kind: str  # one of OUTCOMES
    note: str = ""


class AuditTrail:
    """VerifyAudit, ListAuditEntries and ReportOutcome, inside the caller's tenant."""

    def __init__(self, log: AuditLog, recorder: AuditRecorder) -> None:
        self._log, self._recorder = log, recorder

    async def verify(self, from_seq: int, to_seq: int) -> Verification:
        if from_seq and to_seq and from_seq > to_seq:
            raise InvalidArgument("from_seq", f"{from_seq} exceeds to_seq {to_seq}")
        return await self._log.verify(from_seq, to_seq)

    async def entries(
        self, tenant: str, user: str, session: str, page_size: int, page_token: str
    ) -> tuple[list[AuditRecord], str]:
        validation.check_id("scope.user_id", user)
        if session:
            validation.check_id("scope.session_id", session)
        size = page_size or DEFAULT_PAGE
        if not 1 <= size <= MAX_PAGE:
            raise InvalidArgument(
                "page_size", f"must be 0 (default {DEFAULT_PAGE}) or 1..{MAX_PAGE}, got {size}"
            )
        scope = _scope_digest(tenant, user, session)
        after = _read_token(page_token, scope) if page_token else 0
        records, next_after = await self._log.read(tenant, user, session, after, 0, size)
        return records, _token(next_after, scope) if next_after else ""

    async def report(self, tenant: str, outcome: Outcome) -> int:
        validation.check_id("scope.user_id", outcome.scope_user)
        if outcome.scope_session:
            validation.check_id("scope.session_id", outcome.scope_session)
        if outcome.audit_seq <= 0:
            raise InvalidArgument("audit_seq", "is required (> 0)")
        if outcome.kind not in OUTCOMES:
            raise InvalidArgument("kind", "must be one of OUTCOME_KIND_ACCEPTED..NOTE")
        size = len(outcome.note.encode("utf-8", "surrogatepass"))
        if size > MAX_NOTE_BYTES:
            raise InvalidArgument("note", f"{size} bytes exceeds the limit of {MAX_NOTE_BYTES}")
        if outcome.kind in ("corrected", "note") and not outcome.note.strip():
            raise InvalidArgument("note", f"is required for OUTCOME_KIND_{outcome.kind.upper()}")
        found, _ = await self._log.read(
            tenant,
            outcome.scope_user,
            outcome.scope_session,
            outcome.audit_seq - 1,
            outcome.audit_seq,
            1,
        )
        if not found:
            raise NotFound(
                f"audit_seq: no audit entry {outcome.audit_seq} for this user"
                + (" and session" if outcome.scope_session else ""),
                reason="AUDIT_ENTRY_NOT_FOUND",
            )
        earlier = found[0]
        event = AuditEvent(
            tenant,
            "outcome",
            earlier.user,
            earlier.session,
            earlier.memory_ids,
            body={
                "ref_seq": earlier.seq,
                "ref_event_type": earlier.event_type,
                "kind": outcome.kind,
            },
            private={"note": outcome.note} if outcome.note else None,
        )
        return await self._recorder.record_now(event)


def _scope_digest(tenant: str, user: str, session: str) -> str:
    return hashlib.sha256("\x1f".join((tenant, user, session)).encode()).hexdigest()[:16]


def _token(after_seq: int, scope: str) -> str:
    raw = json.dumps({"a": after_seq, "s": scope}, separators=(",", ":")).encode()
    return "v1." + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _read_token(token: str, scope: str) -> int:
    """The after_seq a page token carries; it must have been issued for this scope."""
    try:
        version, _, data = token.partition(".")
        raw = json.loads(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
        after, issued_for = int(raw["a"]), str(raw["s"])
        if version != "v1" or after < 0:
            raise ValueError(version)
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise InvalidArgument("page_token", "is not a token this service issued") from exc
    if not hmac.compare_digest(issued_for, scope):
        raise InvalidArgument(
            "page_token", "was issued for another scope (use it with the same scope)"
        )
    return after
