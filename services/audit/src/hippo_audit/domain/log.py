"""The audit log's use cases: append (group commit), forget a user, read, follow, verify.

One writer per process. Every mutation (appends, erasures, checkpoint requests) goes
through one queue served by one task, which hands a batch to one dedicated thread. The
batch is built under the store's append lock on the head the store reads there (see
`batch`): seqs and hashes in queue order, from the real head, committed in one
transaction with one fsync. While a commit is on disk, new requests gather in the queue
and form the next batch, so concurrent appends share fsyncs (group commit). With several
processes on one database (cluster mode) their batches serialise on that lock and the
log stays one chain in one total order. A request is answered only after its commit is
durable; a request whose caller gave up may still be committed (its idempotency key
makes a retry safe).

Checkpoints are decided under the same lock, so one writer signs each: the batch that
brings the unsigned tail to `checkpoint_every` entries, a timer when the latest
checkpoint is older than the interval, and open and close when entries are unsigned. A
store that keeps checkpoints (PostgreSQL) writes them in the batch's transaction; else
the writer appends them to the witness file once the batch's callers are answered.

At open the log is checked against the witness, and the hash chain of its most recent
`start_verify_entries` entries (all of them, up to that bound) is recomputed. If either
check fails (the log is shorter than a signed size, an entry no longer hashes as signed,
an entry was edited in place), the service still serves reads and Verify but refuses
every write: appending to a rolled-back or rewritten log would bury the evidence under
new, valid-looking entries. A store whose head stops matching its entries (rows deleted
behind its back) refuses the same way at the next append. Only an operator lifts the
refusal (docs/audit.md: restore the log, or move it aside and start a new chain).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from hippo_audit import metrics
from hippo_audit.domain import checkpoints, validation
from hippo_audit.domain.batch import (
    AppendJob,
    Builder,
    EraseJob,
    Job,
    Signing,
    SignJob,
    private_aad,
)
from hippo_audit.domain.chain import GENESIS, Problem, verify_rows
from hippo_audit.domain.models import (
    Appended,
    Batch,
    Checkpoint,
    Entry,
    Erased,
    Filter,
    Head,
    NewEntry,
    Page,
    PrivateState,
    ReadEntry,
    ToOpen,
    Verdict,
    WitnessLine,
)
from hippo_audit.domain.ports import HeadMismatch, KeyRing, LogStore, Signer, Witness
from hippo_audit.domain.validation import Limits, Prepared
from hippo_core.errors import (
    FailedPrecondition,
    HippoError,
    InvalidArgument,
    Unavailable,
)

log = logging.getLogger(__name__)

ERASE_EVENT = "erase"  # the entry ForgetUser appends
_END = 2**63 - 1
WAL_CHECKPOINT_SECONDS = 1.0
WATCH_SECONDS = 0.5  # cluster mode: longest wait for word of another replica's append


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True)
class LogConfig:
    checkpoint_every: int = 1000
    checkpoint_interval_seconds: float = 60.0
    max_batch_entries: int = 4096
    limits: Limits = field(default_factory=Limits)
    # Entries (the newest) whose chain open() recomputes: ~1 s per 100k entries. 0 = none.
    start_verify_entries: int = 1_000_000


@dataclass
class _Request:
    kind: Literal["append", "forget", "checkpoint"]
    future: asyncio.Future[object] | None
    entries: Sequence[Prepared] = ()
    expected: bytes | None = None
    erase: NewEntry | None = None  # forget: the erasure entry (tenant, user, actor, key)
    min_age_us: int = 0  # checkpoint: see SignJob
    enqueued: float = field(default_factory=time.perf_counter)


@dataclass
class _Outcome:
    """A batch's results (one per request) and what it changed (writer thread -> loop)."""

    results: list[object]
    head: tuple[int, bytes] | None = None  # after the batch, when it wrote entries
    publish: Checkpoint | None = None  # signed, for the witness file (not kept by the store)


def _day(time_us: int) -> str:
    return datetime.fromtimestamp(time_us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class AuditLog:
    def __init__(
        self,
        store: LogStore,
        keys: KeyRing,
        signer: Signer,
        witness: Witness,
        config: LogConfig | None = None,
        clock: Callable[[], int] = now_us,
    ) -> None:
        self._store, self._keys, self._signer, self._witness = store, keys, signer, witness
        self._config = config or LogConfig()
        self._clock = clock
        self._key_id = checkpoints.key_id(signer.public_key)
        self._seq, self._hash = 0, GENESIS  # the latest committed head this process knows
        self._checkpoint: Checkpoint | None = None
        self._writable, self._problem, self._reason = True, "", ""
        self._queue: list[_Request] = []
        self._wake = asyncio.Event()
        self._committed = asyncio.Event()  # replaced after every commit (see _notify)
        self._closing = asyncio.Event()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-writer")
        self._watcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-watch")
        self._tasks: list[asyncio.Task[None]] = []
        self._dirty = False  # commits since the last WAL checkpoint

    # -- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        """Load the head, check the log against the witness, sign what is unsigned
        (blocking)."""
        # The witness first: every checkpoint read then describes entries already
        # committed, so a head read after it can only be shorter if entries were lost
        # (read the other way round, another replica's append could look like a cut).
        lines = self._witness.read()
        self._seq, self._hash = self._store.head()
        problems, _, latest = self._check_witness(lines, self._seq, 1, self._seq)
        self._checkpoint = latest
        if not problems:
            # An entry edited in place, its stored hash left alone, agrees with every
            # checkpoint: only recomputing the chain finds it.
            problems = self._chain_problems(self._seq, self._config.start_verify_entries)
            reason = "LOG_CHAIN_BROKEN"
        else:
            reason = "LOG_DISAGREES_WITH_CHECKPOINT"
        if problems:
            first = min(problems, key=_order)
            self._refuse_writes(
                f"entry {first.seq}: {first.reason}" if first.seq else first.reason, reason
            )
        else:
            # Entries committed after the last checkpoint (an unclean stop, or another
            # replica's appends): sign them now.
            self._finish(self._commit([_Request("checkpoint", None)]))
        metrics.CHAIN_LENGTH.set(self._seq)
        metrics.WRITABLE.set(1 if self._writable else 0)
        if self._checkpoint is not None:
            metrics.checkpoint_signed(self._checkpoint.size, self._checkpoint.time_us)

    async def start(self) -> None:
        """Start the writer and the timers (inside the serving event loop)."""
        self._tasks = [
            asyncio.create_task(self._write_loop(), name="audit-writer"),
            asyncio.create_task(self._checkpoint_timer(), name="audit-checkpoints"),
            asyncio.create_task(self._wal_timer(), name="audit-wal"),
        ]
        if self._store.shared:
            self._tasks.append(asyncio.create_task(self._watch(), name="audit-watch"))

    async def close(self) -> None:
        """Finish what is queued, sign a final checkpoint, close the stores."""
        self._closing.set()
        self._wake.set()
        for task in self._tasks:
            if task.get_name() != "audit-writer":
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        loop = asyncio.get_running_loop()
        if self._writable:
            outcome = await loop.run_in_executor(
                self._writer, self._commit, [_Request("checkpoint", None)]
            )
            await loop.run_in_executor(self._writer, self._finish, outcome)
        self._writer.shutdown(wait=True)
        self._watcher.shutdown(wait=True)  # a wait for appends ends within WATCH_SECONDS
        self._store.close()
        self._keys.close()

    # -- writes --------------------------------------------------------------------------

    async def append(
        self, entries: Sequence[NewEntry], expected_prev: bytes | None
    ) -> list[Appended]:
        prepared = validation.check_entries(entries, self._config.limits)
        result = await self._submit(_Request("append", self._future(), prepared, expected_prev))
        assert isinstance(result, list)
        return result

    async def forget_user(self, tenant: str, user: str, actor: str, key: str = "") -> Erased:
        validation.text("tenant", tenant, required=True)
        validation.text("user_id", user, required=True)
        validation.actor("actor", actor)
        validation.text("idempotency_key", key)
        erase = NewEntry(tenant, actor, ERASE_EVENT, user=user, idempotency_key=key)
        result = await self._submit(_Request("forget", self._future(), erase=erase))
        assert isinstance(result, Erased)
        return result

    def _future(self) -> asyncio.Future[object]:
        return asyncio.get_running_loop().create_future()

    async def _submit(self, request: _Request) -> object:
        if self._closing.is_set():
            raise Unavailable("the audit log is shutting down; retry shortly")
        if not self._writable:
            raise self._refusal()
        self._queue.append(request)
        self._wake.set()
        assert request.future is not None
        return await request.future

    def _refusal(self) -> FailedPrecondition:
        what = (
            "its hash chain is broken"
            if self._reason == "LOG_CHAIN_BROKEN"
            else "it disagrees with its signed checkpoints"
        )
        return FailedPrecondition(
            f"the audit log failed its check at start: {what} ({self._problem}); writes "
            "are refused until an operator restores the log or moves it aside "
            "(hippo audit verify; docs/audit.md, Operations)",
            reason=self._reason,
        )

    def _refuse_writes(self, problem: str, reason: str = "LOG_DISAGREES_WITH_CHECKPOINT") -> None:
        self._writable, self._problem, self._reason = False, problem, reason
        metrics.WRITABLE.set(0)
        log.error("audit log failed its check (%s); writes refused: %s", reason, problem)

    def _chain_problems(self, head_seq: int, entries: int) -> list[Problem]:
        """The first break in the chain of the newest `entries` entries, if any; the
        link into the first of them is taken from the stored hash before it."""
        lo, hi = max(1, head_seq - entries + 1), head_seq
        if entries <= 0 or lo > hi:
            return []
        prev = GENESIS if lo == 1 else self._store.hash_at(lo - 1)
        if prev is None:
            return [Problem(lo - 1, f"entry missing: entry {lo - 1} is absent")]
        scan = verify_rows(self._store.rows(lo, hi), lo, prev)
        if scan.problem is not None:
            return [scan.problem]
        missing = scan.last_seq + 1
        if missing <= hi:
            return [Problem(missing, f"entry missing: entry {missing} is absent")]
        return []

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = self._take()
                outcome = await loop.run_in_executor(self._writer, self._commit, batch)
                done = time.perf_counter()
                if outcome.head is not None:
                    self._advance(*outcome.head)
                    self._dirty = True
                for request, result in zip(batch, outcome.results, strict=True):
                    metrics.APPEND_SECONDS.observe(done - request.enqueued)
                    if request.future is None or request.future.done():  # caller cancelled
                        continue
                    if isinstance(result, BaseException):
                        request.future.set_exception(result)
                    else:
                        request.future.set_result(result)
                if outcome.head is not None:
                    self._notify()
                # After the batch's callers are answered: fsyncing the witness file is
                # not on any append's latency.
                if outcome.publish is not None:
                    await loop.run_in_executor(self._writer, self._finish, outcome)
            if self._closing.is_set():
                return

    def _take(self) -> list[_Request]:
        """The next batch: a run of appends up to max_batch_entries, or one forget or
        checkpoint on its own (so a batch has exactly one commit)."""
        first = self._queue[0]
        if first.kind != "append":
            return [self._queue.pop(0)]
        size, count = 0, 0
        for request in self._queue:
            if request.kind != "append":
                break
            if count and size + len(request.entries) > self._config.max_batch_entries:
                break
            size += len(request.entries)
            count += 1
        batch, self._queue = self._queue[:count], self._queue[count:]
        return batch

    def _commit(self, batch: list[_Request]) -> _Outcome:
        """Build the batch on the store's head, under its lock, and commit it (writer
        thread, or the opening thread before start)."""
        if not self._writable:
            return _Outcome([self._refusal() for _ in batch])
        try:
            jobs = [self._job(request) for request in batch]
            builder = Builder(
                jobs,
                keys=self._keys,
                signer=self._signer,
                every=self._config.checkpoint_every,
                clock=self._clock,
                own_checkpoint=self._checkpoint,
            )
            stored = self._store.append(builder)
        except HeadMismatch as exc:
            self._refuse_writes(str(exc))
            return _Outcome([self._refusal() for _ in batch])
        except HippoError as exc:
            return _Outcome([exc for _ in batch])
        except Exception:
            log.exception("audit: a group commit failed; nothing of it was written")
            error = Unavailable("the audit log could not commit; retry shortly")
            return _Outcome([error for _ in batch])
        return self._committed_batch(builder, stored)

    def _job(self, request: _Request) -> Job:
        if request.kind == "checkpoint":
            return SignJob(request.min_age_us)
        if request.kind == "forget":
            assert request.erase is not None
            erase = request.erase
            # The key goes first and durably, before the entry and outside the append
            # lock: a crash before the entry commits leaves the user erased and the
            # caller unanswered; its retry (same idempotency key) records the erasure once.
            destroyed = self._keys.destroy(erase.tenant, erase.user)
            metrics.KEYS_DESTROYED.inc(destroyed)
            return EraseJob(erase, destroyed)
        return AppendJob(request.entries, request.expected)

    def _committed_batch(self, builder: Builder, stored: Batch) -> _Outcome:
        outcome = _Outcome(builder.results)
        if stored.entries:
            last = stored.entries[-1]
            outcome.head = (last.seq, last.hash)
            metrics.BATCH_ENTRIES.observe(len(stored.entries))
            for event_type, count in Counter(e.event_type for e in stored.entries).items():
                metrics.ENTRIES.labels(event_type).inc(count)
        metrics.DUPLICATES.inc(builder.duplicates)
        if stored.checkpoint is not None:
            if builder.kept:
                self._signed(stored.checkpoint)  # committed with the batch
            else:
                outcome.publish = stored.checkpoint
        return outcome

    def _finish(self, outcome: _Outcome) -> None:
        """Append a checkpoint the batch signed to the witness file (writer thread)."""
        checkpoint = outcome.publish
        if checkpoint is None:
            return
        try:
            self._witness.append(checkpoint)
        except OSError:
            # The entries are committed; the next checkpoint covers them.
            log.exception("audit: witness not written; checkpoint %d lost", checkpoint.size)
            return
        self._signed(checkpoint)

    def _signed(self, checkpoint: Checkpoint) -> None:
        if self._checkpoint is None or checkpoint.size >= self._checkpoint.size:
            self._checkpoint = checkpoint
            metrics.checkpoint_signed(checkpoint.size, checkpoint.time_us)

    def _advance(self, seq: int, digest: bytes) -> None:
        """Move the known head forward (event loop thread; never backwards: a late word
        of an older head is ignored)."""
        if seq > self._seq:
            self._seq, self._hash = seq, digest
            metrics.CHAIN_LENGTH.set(seq)

    async def _checkpoint_timer(self) -> None:
        """Ask for a checkpoint one interval after the latest: under the append lock the
        batch signs only if entries are unsigned and no replica signed meanwhile."""
        interval = self._config.checkpoint_interval_seconds
        delay = interval
        while True:
            await asyncio.sleep(delay)
            delay = interval
            covered = self._checkpoint.size if self._checkpoint else 0
            if not self._writable or self._closing.is_set():
                continue
            if not self._store.shared and self._seq <= covered:
                continue  # nothing new, and nobody else appends
            request = _Request("checkpoint", self._future(), min_age_us=int(interval * 1e6))
            try:
                signing = await self._submit(request)
            except HippoError:
                continue
            if isinstance(signing, Signing) and signing.unsigned:
                # Another replica signed lately: look again one interval after it did.
                due = (signing.latest_us - self._clock()) / 1e6 + interval
                delay = min(interval, max(0.05, due))

    async def _wal_timer(self) -> None:
        while True:
            await asyncio.sleep(WAL_CHECKPOINT_SECONDS)
            if self._dirty:
                self._dirty = False
                await asyncio.to_thread(self._store.checkpoint)

    async def _watch(self) -> None:
        """Cluster mode: learn of other replicas' appends (followers wake, the head
        this process reports moves on)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(
                    self._watcher, self._store.wait_for_append, WATCH_SECONDS
                )
                seq, digest = await loop.run_in_executor(self._watcher, self._store.head)
            except HippoError:  # the database is away: followers wait until it is back
                await asyncio.sleep(WATCH_SECONDS)
                continue
            except Exception:
                log.exception("audit: watching for other replicas' appends failed")
                await asyncio.sleep(WATCH_SECONDS)
                continue
            if seq > self._seq:
                self._advance(seq, digest)
                self._notify()

    def _notify(self) -> None:
        # Followers wait on the event they saw before reading; setting it and putting a
        # fresh one in its place wakes exactly those who might have missed this commit.
        committed, self._committed = self._committed, asyncio.Event()
        committed.set()

    # -- reads ---------------------------------------------------------------------------

    def head(self) -> Head:
        """The head as this process last saw it (exact with one writer; in cluster mode
        at most a moment behind: see `current_head`)."""
        return Head(
            self._seq,
            self._hash,
            self._checkpoint,
            self._signer.public_key,
            self._key_id,
            self._writable,
            self._problem,
        )

    async def current_head(self) -> Head:
        """The head as stored now: other replicas may have appended and signed since
        this process last heard."""
        if self._store.shared:
            seq, digest = await asyncio.to_thread(self._store.head)
            self._advance(seq, digest)
            latest = await asyncio.to_thread(self._witness.latest)
            if latest is not None and self._valid(latest):
                self._signed(latest)
        return self.head()

    def _valid(self, checkpoint: Checkpoint) -> bool:
        message = checkpoints.message(checkpoint.size, checkpoint.hash, checkpoint.time_us)
        return checkpoint.key_id == self._key_id and self._signer.verify(
            message, checkpoint.signature
        )

    async def read(
        self, where: Filter, after_seq: int, to_seq: int, limit: int, include_private: bool
    ) -> Page:
        validation.seq("after_seq", after_seq)
        validation.seq("to_seq", to_seq)
        return await asyncio.to_thread(self._read, where, after_seq, to_seq, limit, include_private)

    def _read(
        self, where: Filter, after_seq: int, to_seq: int, limit: int, include_private: bool
    ) -> Page:
        rows = self._store.read(where, after_seq, to_seq or _END, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        return Page(self._reveal(rows, include_private), rows[-1].seq if more else 0)

    def _reveal(self, rows: list[Entry], include_private: bool) -> list[ReadEntry]:
        """Each entry with its private body's state; the sealed ones of the page opened
        with one key-ring call."""
        sealed = [e for e in rows if e.sealed] if include_private else []
        opened = (
            self._keys.open(
                [
                    ToOpen(
                        e.tenant, e.user, e.key_id, e.sealed, private_aad(e.tenant, e.user, e.seq)
                    )
                    for e in sealed
                ]
            )
            if sealed
            else []
        )
        by_seq = {e.seq: o for e, o in zip(sealed, opened, strict=True)}
        out = []
        for entry in rows:
            found = by_seq.get(entry.seq)
            if not entry.sealed:
                out.append(ReadEntry(entry, PrivateState.NONE))
            elif found is None:
                out.append(ReadEntry(entry, PrivateState.SEALED))
            elif not found.authentic:
                log.warning("audit: the private body of entry %d does not authenticate", entry.seq)
                out.append(ReadEntry(entry, PrivateState.SEALED))
            elif found.plaintext is None:
                out.append(ReadEntry(entry, PrivateState.ERASED))
            else:
                out.append(ReadEntry(entry, PrivateState.READABLE, json.loads(found.plaintext)))
        return out

    async def follow(
        self, where: Filter, after_seq: int, include_private: bool
    ) -> AsyncIterator[list[ReadEntry]]:
        """The matching entries after `after_seq`, then each new one as it is committed,
        until the caller goes away or the log closes."""
        validation.seq("after_seq", after_seq)
        while not self._closing.is_set():
            committed, head = self._committed, self._seq
            page = await self.read(where, after_seq, head, validation.MAX_READ, include_private)
            if page.entries:
                yield page.entries
                after_seq = page.entries[-1].entry.seq
                continue
            after_seq = max(after_seq, head)
            waits = {
                asyncio.ensure_future(committed.wait()),
                asyncio.ensure_future(self._closing.wait()),
            }
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()

    # -- verification --------------------------------------------------------------------

    async def verify(
        self, from_seq: int, to_seq: int, chain_only: bool, tenant: str = ""
    ) -> Verdict:
        validation.seq("from_seq", from_seq)
        validation.seq("to_seq", to_seq)
        if from_seq and to_seq and from_seq > to_seq:
            raise InvalidArgument("from_seq", f"{from_seq} exceeds to_seq {to_seq}")
        verdict = await asyncio.to_thread(self.verify_now, from_seq, to_seq, chain_only, tenant)
        metrics.VERIFIED.inc(verdict.entries_checked)
        if not verdict.ok:
            metrics.VERIFY_FAILURES.inc()
        return verdict

    def verify_now(
        self, from_seq: int = 0, to_seq: int = 0, chain_only: bool = False, tenant: str = ""
    ) -> Verdict:
        """Check the stored log (as it is on disk now) over [from_seq, to_seq] (blocking);
        with `tenant`, also count that tenant's entries in the range."""
        # The witness before the head, as at open: a checkpoint another replica commits
        # meanwhile must not look like a cut.
        lines = [] if chain_only else self._witness.read()
        head_seq, head_hash = self._store.head()
        lo = max(from_seq, 1)
        hi = head_seq if to_seq == 0 else min(to_seq, head_seq)
        problems: list[Problem] = []
        checked = 0
        if lo <= hi:
            prev = GENESIS if lo == 1 else self._store.hash_at(lo - 1)
            if prev is None:
                problems.append(Problem(lo - 1, f"entry missing: entry {lo - 1} is absent"))
            else:
                scan = verify_rows(self._store.rows(lo, hi), lo, prev)
                checked = scan.checked
                if scan.problem is not None:
                    problems.append(scan.problem)
                elif scan.last_seq < hi:
                    missing = scan.last_seq + 1
                    problems.append(Problem(missing, f"entry missing: entry {missing} is absent"))
        cps_checked, latest = 0, None
        if not chain_only:
            found, cps_checked, latest = self._check_witness(lines, head_seq, lo, hi)
            problems.extend(found)
        first = min(problems, key=_order) if problems else None
        mine = self._store.tenant_tip(tenant, lo, hi) if tenant and lo <= hi else (0, 0, b"")
        return Verdict(
            ok=first is None,
            entries_checked=checked,
            first_bad_seq=first.seq if first else 0,
            reason=first.reason if first else "",
            head_seq=head_seq,
            head_hash=head_hash,
            checkpoints_checked=cps_checked,
            latest_checkpoint=latest,
            tenant_entries=mine[0],
            tenant_head_seq=mine[1],
            tenant_head_hash=mine[2],
        )

    def _check_witness(
        self, lines: list[WitnessLine], head_seq: int, lo: int, hi: int
    ) -> tuple[list[Problem], int, Checkpoint | None]:
        """Problems between the witness and the log: bad lines or signatures, a log shorter
        than a signed size (truncation, rollback), a signed entry in [lo, hi] whose stored
        hash differs (rewritten history). Returns (problems, checkpoints checked, latest)."""
        problems: list[Problem] = []
        checked, latest, largest, good = 0, None, 0, 0
        for line in lines:
            cp = line.checkpoint
            if cp is None:
                problems.append(
                    Problem(0, f"witness: line {line.number} is malformed ({line.error})")
                )
                continue
            message = checkpoints.message(cp.size, cp.hash, cp.time_us)
            if cp.key_id != self._key_id or not self._signer.verify(message, cp.signature):
                problems.append(
                    Problem(
                        cp.size,
                        f"witness: the checkpoint on line {line.number} (size {cp.size}) is "
                        "not validly signed by this log's key",
                    )
                )
                continue
            checked += 1
            if cp.size < largest:
                problems.append(
                    Problem(
                        cp.size,
                        f"witness: line {line.number} signs {cp.size} entries "
                        f"after a checkpoint of {largest} (sizes never decrease)",
                    )
                )
            largest = max(largest, cp.size)
            latest = cp
            if cp.size > head_seq:
                problems.append(
                    Problem(
                        head_seq + 1,
                        f"truncated below checkpoint: the log ends at entry {head_seq} but "
                        f"{cp.size} entries were signed on {_day(cp.time_us)}",
                    )
                )
                continue
            if not lo <= cp.size <= hi:
                continue
            stored = self._store.hash_at(cp.size)
            if stored is None:
                problems.append(Problem(cp.size, f"entry missing: entry {cp.size} is absent"))
            elif stored != cp.hash:
                problems.append(
                    Problem(
                        cp.size,
                        f"rewritten: entry {cp.size} does not match the checkpoint signed on "
                        f"{_day(cp.time_us)}; the log was rewritten after entry {good}",
                    )
                )
            else:
                good = cp.size
        return problems, checked, latest


def _order(problem: Problem) -> tuple[bool, int]:
    """Earliest entry first; witness problems that name no entry (seq 0) last."""
    return (problem.seq == 0, problem.seq)
