"""The merge worker: off the request path, in order per session, bounded overall, one
replica at a time.

One asyncio task per session with work to do (never two in a process), so a session's
merges happen in order; a semaphore bounds how many call the LLM at once. A task loops
until the session needs nothing: count turns stored uncounted, plan the next merge
(trimming.py), summarise (summarise.py; or extractive.py, no LLM, by merge_mode), commit
with compare-and-set. A commit that finds the session changed (a Forget, another
replica's merge) is dropped and planned again from the new state. When the LLM or the
counter is unavailable the task sleeps with capped, jittered exponential backoff and
tries again: Append never waits for any of this.

Claims: before it merges, a task claims the session for its replica (`SessionStore.claim`,
a lease renewed every third of its length while the task works), so replicas sharing one
database never merge a session at the same time; a session another replica holds is
left to it (it looks again after letting go, so work that arrived meanwhile is not
missed). A commit is accepted only from the claim's holder, so a replica that stalled past
its lease and was taken over changes nothing when it wakes; a task that finds its claim
taken stops its merge. A replica that dies holding claims leaves them to run out: every
replica sweeps for such orphans every half lease and takes them over.

Crash safety comes from the commit, not from the worker: the dropped turns stay in the
window until the transaction that stores the merged summary also moves them out. A
process killed mid-merge leaves the window as it was; `resume` at start-up schedules
every session still over budget that nobody holds, and the sweep the ones it held.

Pacing: the LLM is the model host's (by default the injection service's one CPU model,
which Chat shares). Merges mark their calls background, so Chat goes first there; here
each replica leaves at least `pause_seconds` between the end of one merge LLM call and
the start of the next (and between two starts), on top of `max_concurrent`. With a
backlog of hundreds of sessions the host then gets a moment between merges instead of
back-to-back requests, and failing calls cannot hammer it; the share of the host a slot
can take is about call / (call + pause), so a pause near the mean call time halves it.
Idle, a replica only wakes for the claim sweep (every half lease) and its audit outbox's
poll (every 5 s): one query each, no busy loop.

Tasks start in a fresh contextvars context: the inbound call that scheduled them has a
deadline, and outbound calls made on its behalf would otherwise inherit it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog

from hippo_core import backoff
from hippo_core.errors import HippoError
from hippo_core.neutralise import Neutraliser
from hippo_summariser import metrics
from hippo_summariser.domain import extractive, prompt, trimming
from hippo_summariser.domain.audit import AuditQueue
from hippo_summariser.domain.models import Claim, MergeEvent, Session, SessionKey
from hippo_summariser.domain.ports import (
    Completion,
    Llm,
    LlmUnavailable,
    MergeObserver,
    NoObserver,
    SessionStore,
    TokenCounter,
)
from hippo_summariser.domain.summarise import SummaryConfig, summarise
from hippo_summariser.domain.tokens import render_line

log = structlog.stdlib.get_logger("hippo.summariser.merge")


@dataclass(frozen=True)
class MergeConfig:
    window_tokens: int
    low_water_tokens: int
    max_input_tokens: int
    summary: SummaryConfig
    max_concurrent: int = 2
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 60.0
    drain_seconds: float = 3.0
    claim_lease_seconds: float = 30.0
    pause_seconds: float = 0.0  # settings.merge_pause_seconds (0.5 s by default) sets it


class PacedLlm:
    """The merge LLM with `pause` seconds between calls of this replica (module doc)."""

    def __init__(self, llm: Llm, pause: float) -> None:
        self._llm = llm
        self._pause = pause
        self._gate = asyncio.Lock()  # one caller at a time waits for its turn to start
        self._next = 0.0  # time.monotonic() before which no call starts

    async def complete(
        self, prompt: str, *, max_new_tokens: int, stop: Sequence[str]
    ) -> Completion:
        async with self._gate:
            # Again after each sleep: a call that ended meanwhile moved the time on. (A
            # deadline, not an event: ASYNC110's Event would need a timer anyway.)
            while (wait := self._next - time.monotonic()) > 0:  # noqa: ASYNC110
                await asyncio.sleep(wait)
            self._next = time.monotonic() + self._pause
        try:
            return await self._llm.complete(prompt, max_new_tokens=max_new_tokens, stop=stop)
        finally:
            self._next = max(self._next, time.monotonic() + self._pause)


def now_us() -> int:
    return time.time_ns() // 1000


class ClaimLost(Exception):
    """Another replica took the session's claim over: this task's merges stop."""


class Merger:
    """Create inside the running event loop (its semaphore and tasks belong to it)."""

    def __init__(
        self,
        store: SessionStore,
        counter: TokenCounter,
        llm: Llm,
        config: MergeConfig,
        observer: MergeObserver | None = None,
        *,
        outbox: AuditQueue | None = None,
        jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2),
        special_tokens: Callable[[], Awaitable[Sequence[str]]] | None = None,
        llm_model_id: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        # merge_mode=auto is settled on first use by the id of the model at the LLM
        # (extractive.auto_mode); None: the model is unknown, auto means llm.
        self._llm_model_id = llm_model_id
        self._mode: str | None = None if config.summary.mode == "auto" else config.summary.mode
        # The serving model's added tokens (injection Info), asked once: merge prompts
        # are neutralised against all of them. None: Gemma's control tokens only.
        self._special_tokens = special_tokens
        self._neutraliser: Neutraliser | None = None if special_tokens else prompt.GEMMA
        self._store = store
        self._counter = counter
        self._llm: Llm = PacedLlm(llm, config.pause_seconds) if config.pause_seconds else llm
        self._config = config
        self._observer = observer or NoObserver()
        self._outbox = outbox  # None: merges are not recorded (no audit service)
        self._jitter = jitter
        self._slots = asyncio.Semaphore(config.max_concurrent)
        self._tasks: dict[SessionKey, asyncio.Task[None]] = {}
        self._again: set[SessionKey] = set()  # state changed while its task was running
        self._busy: set[SessionKey] = set()  # inside an LLM call: worth draining at close
        self._since: dict[SessionKey, float] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False

    # -- scheduling ---------------------------------------------------------------------

    def start(self) -> None:
        """Begin sweeping for sessions whose claim a stopped replica left behind."""
        if self._sweeper is None and not self._closing:
            self._sweeper = asyncio.create_task(
                self._sweep(), name="merge-sweep", context=contextvars.Context()
            )

    def schedule(self, key: SessionKey) -> None:
        """Make sure the session's state gets looked at (idempotent, never waits)."""
        if self._closing:
            return
        task = self._tasks.get(key)
        if task is not None and not task.done():
            self._again.add(key)
            return
        self._since.setdefault(key, time.monotonic())
        task = asyncio.create_task(
            self._run(key), name=f"merge:{key.tenant}", context=contextvars.Context()
        )
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._finished(key, task))
        metrics.PENDING.set(len(self._tasks))

    def _finished(self, key: SessionKey, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        metrics.PENDING.set(len(self._tasks))
        if not task.cancelled() and task.exception() is not None:
            log.error("merge_worker_crashed", error=repr(task.exception()))

    def active(self, key: SessionKey) -> bool:
        task = self._tasks.get(key)
        return task is not None and not task.done()

    async def idle(self, key: SessionKey, timeout: float) -> bool:
        """Wait until the session has no merge task (True) or `timeout` passes (False)."""
        end = time.monotonic() + timeout
        while True:
            task = self._tasks.get(key)
            if task is None or task.done():
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False
            await asyncio.wait({task}, timeout=left)

    async def close(self) -> None:
        """Stop: tasks waiting (backoff, queue) are cancelled at once; merges inside an LLM
        call get `drain_seconds` to commit. Cancelling loses nothing: uncommitted merges
        leave the window as it was. The claims go last, so the next start (or another
        replica) resumes at once instead of waiting for the leases to run out."""
        if self._closed:
            return
        self._closed = self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        tasks = dict(self._tasks)
        for key, task in tasks.items():
            if key not in self._busy:
                task.cancel()
        busy = [t for k, t in tasks.items() if k in self._busy and not t.done()]
        if busy:
            await asyncio.wait(busy, timeout=self._config.drain_seconds)
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        try:
            await asyncio.to_thread(self._store.release_all)
        except Exception as exc:  # the leases run out by themselves
            log.warning("claims_not_released", error=repr(exc))

    # -- claims -------------------------------------------------------------------------

    async def _run(self, key: SessionKey) -> None:
        failures = 0
        lease = self._config.claim_lease_seconds
        while True:
            try:
                claim = await asyncio.to_thread(self._store.claim, key, lease)
            except HippoError as exc:
                failures += 1
                await self._backoff(key, failures, exc)
                continue
            metrics.CLAIMS.labels("taken" if claim is Claim.RENEWED else claim.value).inc()
            if not claim.held:
                if key in self._again:
                    # Scheduled again while we asked: the write that made the row busy
                    # may be this process's own, whose schedule() found this task
                    # still running. It has committed by now: ask again.
                    self._again.discard(key)
                    continue
                break  # another replica merges it, and looks again once it lets go
            if claim is Claim.TAKEN_OVER:
                log.info("merge_taken_over", reason="the replica holding it stopped renewing")
            try:
                await self._while_claimed(key)
            finally:
                await self._release(key)
            # Work that arrived while we held the claim found it taken and was left to
            # us: look once more after letting go.
            if not await self._still_needed(key):
                break
        started = self._since.pop(key, None)
        if started is not None:
            metrics.MERGE_LAG.observe(time.monotonic() - started)

    async def _while_claimed(self, key: SessionKey) -> None:
        """The session's merges, with the claim's lease renewed as they go; stopped if
        another replica took the claim over (our lease ran out while we stalled)."""
        work = asyncio.create_task(self._work(key), name=f"merging:{key.tenant}")
        try:
            while not work.done():
                await asyncio.wait({work}, timeout=self._config.claim_lease_seconds / 3)
                if not work.done() and not await self._renew(key):
                    metrics.CLAIMS.labels("lost").inc()
                    log.warning("merge_claim_lost", reason="taken over by another replica")
                    return
        finally:
            if not work.done():
                work.cancel()
            await asyncio.gather(work, return_exceptions=True)

    async def _renew(self, key: SessionKey) -> bool:
        try:
            return await asyncio.to_thread(self._store.renew, key, self._config.claim_lease_seconds)
        except HippoError as exc:
            # Unknown: keep working; the commit checks the claim anyway.
            log.warning("claim_renewal_failed", error=exc.message)
            return True

    async def _release(self, key: SessionKey) -> None:
        try:
            await asyncio.to_thread(self._store.release, key)
        except HippoError as exc:  # the lease runs out by itself
            log.warning("claim_release_failed", error=exc.message)

    async def _still_needed(self, key: SessionKey) -> bool:
        if self._closing:
            return False
        try:
            session = await asyncio.to_thread(self._store.load, key)
        except HippoError:
            return True  # unknown: claim again (with backoff while the store is down)
        return session is not None and trimming.needs_merge(
            session.window, self._config.window_tokens
        )

    async def _sweep(self) -> None:
        """Take over what stopped replicas held: every half lease, so an orphan waits at
        most one and a half leases."""
        while True:
            await asyncio.sleep(self._config.claim_lease_seconds / 2)
            try:
                keys = await asyncio.to_thread(self._store.orphaned)
            except HippoError as exc:
                log.warning("claim_sweep_failed", error=exc.message)
                continue
            except Exception as exc:  # a bug must not end the sweep
                log.exception("claim_sweep_failed", error=repr(exc))
                continue
            for key in keys:
                self.schedule(key)

    # -- the loop -----------------------------------------------------------------------

    async def _work(self, key: SessionKey) -> None:
        failures = 0
        while True:
            self._again.discard(key)
            try:
                session = await asyncio.to_thread(self._store.load, key)
                if session is None:
                    return
                if session.uncounted:
                    await self._count(session)
                    continue
                if not await self._merge_next(session):
                    if key in self._again:
                        continue
                    return
                failures = 0
            except asyncio.CancelledError:
                raise
            except ClaimLost:
                metrics.CLAIMS.labels("lost").inc()
                log.warning("merge_claim_lost", reason="a commit found the claim taken over")
                return
            except (LlmUnavailable, HippoError) as exc:
                failures += 1
                if isinstance(exc, LlmUnavailable):
                    metrics.LLM_ERRORS.labels("unavailable").inc()
                    with contextlib.suppress(HippoError):  # a statistic: never worth a retry
                        await asyncio.to_thread(self._store.record_llm_failure, key)
                await self._backoff(key, failures, exc)
            except Exception as exc:
                # A bug must not spin or kill the worker silently: log, back off, retry.
                failures += 1
                log.exception("merge_failed", error=repr(exc))
                await self._backoff(key, failures, exc)

    async def _backoff(self, key: SessionKey, failures: int, exc: BaseException) -> None:
        cfg = self._config
        wait = backoff.delay(
            failures, cfg.backoff_initial_seconds, cfg.backoff_max_seconds, self._jitter()
        )
        log.warning("merge_retry_later", error=str(exc) or repr(exc), seconds=round(wait, 2))
        await asyncio.sleep(wait)

    async def _count(self, session: Session) -> None:
        turns = session.uncounted
        try:
            counts = await self._counter.count([render_line(t.role, t.text) for t in turns])
        except HippoError:
            metrics.COUNT_ERRORS.inc()
            raise
        tokens = {t.seq: n for t, n in zip(turns, counts, strict=True)}
        await asyncio.to_thread(self._store.set_tokens, session.key, tokens, now_us())

    async def _prompt_guard(self) -> Neutraliser:
        """The neutraliser for the serving model's token list; fetched on first use (a
        HippoError while the injection service is down fails the merge, retried later,
        as the LLM call would)."""
        if self._neutraliser is None:
            assert self._special_tokens is not None
            self._neutraliser = Neutraliser(await self._special_tokens())
        return self._neutraliser

    async def _merge_mode(self) -> str:
        """llm or extractive. An LlmUnavailable while the LLM's host is down fails the
        merge, retried later (as its LLM call would)."""
        if self._mode is None:
            model = await self._llm_model_id() if self._llm_model_id is not None else ""
            self._mode = extractive.auto_mode(model)
            log.info("merge_mode", mode=self._mode, setting="auto", model=model)
        return self._mode

    async def _merge_next(self, session: Session) -> bool:
        """Merge the next batch of dropped exchanges; False when there is nothing to do."""
        cfg = self._config
        turns = trimming.next_merge(
            session.window, cfg.window_tokens, cfg.low_water_tokens, cfg.max_input_tokens
        )
        if not turns:
            return False
        started = time.monotonic()
        async with self._slots:
            self._busy.add(session.key)
            try:
                mode = await self._merge_mode()
                if mode == "extractive":
                    outcome = await extractive.merge(
                        session.summary, turns, self._counter, cfg.summary.summary_tokens
                    )
                else:
                    neutraliser = await self._prompt_guard()
                    outcome = await summarise(
                        session.summary,
                        turns,
                        self._llm,
                        self._counter,
                        cfg.summary,
                        neutraliser.neutralise,
                    )
            finally:
                self._busy.discard(session.key)
        seconds = time.monotonic() - started
        now = now_us()
        event = MergeEvent(
            key=session.key,
            version=0,  # the store sets the version the commit makes
            merged_memory_ids=tuple(t.memory_id for t in turns),
            summary_tokens=outcome.summary_tokens,
            facts=outcome.facts,
            kept_llm=outcome.kept_llm,
            kept=outcome.kept,
            retention_llm=outcome.retention_llm,
            retention=outcome.retention,
            llm_calls=outcome.llm_calls,
            repaired=outcome.repaired,
            seconds=seconds,
            event_id=uuid.uuid4().hex,
            time_us=now,
        )
        version = await asyncio.to_thread(
            self._store.commit_merge,
            session.key,
            session.summary_rev,
            [t.seq for t in turns],
            outcome,
            now,
            event if self._outbox is not None else None,
        )
        if version is None:
            metrics.MERGES.labels("conflict").inc()
            if not await self._renew(session.key):
                raise ClaimLost()
            return True  # plan again from the state that won
        if self._outbox is not None:
            self._outbox.notify()
        metrics.MERGES.labels("committed").inc()
        metrics.MERGE_SECONDS.observe(seconds)
        metrics.RETENTION.labels("llm").observe(outcome.retention_llm)
        metrics.RETENTION.labels("final").observe(outcome.retention)
        metrics.FACTS.labels("checked").inc(outcome.facts)
        metrics.FACTS.labels("kept_llm").inc(outcome.kept_llm)
        metrics.FACTS.labels("kept").inc(outcome.kept)
        log.info(
            "merged",
            turns=len(turns),
            summary_tokens=outcome.summary_tokens,
            facts=outcome.facts,
            retention_llm=round(outcome.retention_llm, 3),
            retention=round(outcome.retention, 3),
            llm_calls=outcome.llm_calls,
            mode=mode,
            seconds=round(seconds, 3),
        )
        event = dataclasses.replace(event, version=version)
        try:
            await self._observer.on_merge(event)
        except Exception as exc:
            log.error("on_merge_failed", error=repr(exc))
        return True
