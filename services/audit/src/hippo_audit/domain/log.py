"""The audit log's use cases: append (group commit), forget a user, read, follow, verify.

One writer. Every mutation (appends, key erasures, checkpoints) goes through one queue
served by one task, which hands a batch to one dedicated thread: the batch gets its
sequence numbers and hashes in queue order and is committed in one transaction with one
fsync. While a commit is on disk, new requests gather in the queue and form the next
batch, so concurrent appends share fsyncs (group commit) and the order of the log is the
order of the queue. A request is answered only after its commit is durable; a request
whose caller gave up may still be committed (its idempotency key makes a retry safe).

Checkpoints are signed by the same writer after a commit, every `checkpoint_every`
entries, on a timer, and at close, so a checkpoint always describes a committed head.

At open the log is checked against the witness file. If it disagrees (it is shorter than
a signed size, or an entry no longer hashes as signed), the service still serves reads
and Verify but refuses every write: appending to a rolled-back or rewritten log would
bury the evidence under new, valid-looking entries.
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
from hippo_audit.domain.chain import GENESIS, Problem, canonical_json, link, verify_rows
from hippo_audit.domain.models import (
    Appended,
    Checkpoint,
    Entry,
    Erased,
    Filter,
    Head,
    NewEntry,
    Page,
    PrivateState,
    ReadEntry,
    Verdict,
    WitnessLine,
)
from hippo_audit.domain.ports import KeyRing, LogStore, Signer, Witness
from hippo_audit.domain.validation import Limits, Prepared
from hippo_core.errors import (
    Aborted,
    FailedPrecondition,
    HippoError,
    InvalidArgument,
    Unavailable,
)

log = logging.getLogger(__name__)

ERASE_EVENT = "erase"  # the entry ForgetUser appends
_END = 2**63 - 1
WAL_CHECKPOINT_SECONDS = 1.0


def now_us() -> int:
    return time.time_ns() // 1000


def private_aad(tenant: str, user: str, seq: int) -> bytes:
    """Bound into each private body's authentication tag: a ciphertext moved to another
    entry, user or tenant does not decrypt there."""
    return f"hippo.audit.v1 private\n{tenant}\n{user}\n{seq}".encode()


@dataclass(frozen=True)
class LogConfig:
    checkpoint_every: int = 1000
    checkpoint_interval_seconds: float = 60.0
    max_batch_entries: int = 4096
    limits: Limits = field(default_factory=Limits)


@dataclass
class _Request:
    kind: Literal["append", "forget", "checkpoint"]
    future: asyncio.Future[object]
    entries: Sequence[Prepared] = ()
    expected: bytes | None = None
    erase: NewEntry | None = None  # forget: the erasure entry (tenant, user, actor, key)
    enqueued: float = field(default_factory=time.perf_counter)


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
        self._seq, self._hash = 0, GENESIS  # the committed head
        self._checkpoint: Checkpoint | None = None
        self._writable, self._problem = True, ""
        self._queue: list[_Request] = []
        self._wake = asyncio.Event()
        self._committed = asyncio.Event()  # replaced after every commit (see _notify)
        self._closing = asyncio.Event()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-writer")
        self._tasks: list[asyncio.Task[None]] = []
        self._dirty = False  # commits since the last WAL checkpoint

    # -- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        """Load the head and check the log against the witness (blocking)."""
        self._seq, self._hash = self._store.head()
        problems, _, latest = self._check_witness(self._witness.read(), self._seq, 1, self._seq)
        self._checkpoint = latest
        if problems:
            first = min(problems, key=_order)
            self._writable = False
            self._problem = f"entry {first.seq}: {first.reason}" if first.seq else first.reason
            log.error(
                "audit log disagrees with its signed checkpoints; writes refused: %s", self._problem
            )
        elif self._seq > (latest.size if latest else 0):
            # Entries committed after the last checkpoint (an unclean stop): sign them now.
            self._sign_checkpoint()
        metrics.CHAIN_LENGTH.set(self._seq)
        metrics.WRITABLE.set(1 if self._writable else 0)
        if self._checkpoint is not None:
            metrics.checkpoint_signed(self._checkpoint.size, self._checkpoint.time_us)

    async def start(self) -> None:
        """Start the writer and the checkpoint timer (inside the serving event loop)."""
        self._tasks = [
            asyncio.create_task(self._write_loop(), name="audit-writer"),
            asyncio.create_task(self._checkpoint_timer(), name="audit-checkpoints"),
            asyncio.create_task(self._wal_timer(), name="audit-wal"),
        ]

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
            await loop.run_in_executor(self._writer, self._sign_checkpoint)
        self._writer.shutdown(wait=True)
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
        return await request.future

    def _refusal(self) -> FailedPrecondition:
        return FailedPrecondition(
            f"the audit log disagrees with its signed checkpoints ({self._problem}); writes "
            "are refused until an operator has investigated (hippo audit verify)",
            reason="LOG_DISAGREES_WITH_CHECKPOINT",
        )

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = self._take()
                outcomes = await loop.run_in_executor(self._writer, self._commit, batch)
                done = time.perf_counter()
                self._dirty = True
                for request, outcome in zip(batch, outcomes, strict=True):
                    metrics.APPEND_SECONDS.observe(done - request.enqueued)
                    if request.future.done():  # the caller was cancelled meanwhile
                        continue
                    if isinstance(outcome, BaseException):
                        request.future.set_exception(outcome)
                    else:
                        request.future.set_result(outcome)
                self._notify()
                # After the batch's callers are answered: signing and fsyncing the witness
                # is not on any append's latency.
                if self._checkpoint_due():
                    await loop.run_in_executor(self._writer, self._sign_checkpoint)
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

    def _commit(self, batch: list[_Request]) -> list[object]:
        """Build the batch's entries on the committed head and commit them (writer thread)."""
        if not self._writable:
            return [self._refusal() for _ in batch]
        seq, head = self._seq, self._hash
        pending: list[Entry] = []
        outcomes: list[object] = []
        keys: dict[tuple[str, str], tuple[int, bytes]] = {}
        try:
            for request in batch:
                if request.kind == "checkpoint":
                    self._sign_checkpoint()
                    outcomes.append(None)
                    continue
                if request.kind == "forget":
                    assert request.erase is not None
                    erase = request.erase
                    # The key goes first and durably: a crash before the entry commits
                    # leaves the user erased and the caller unanswered; its retry (same
                    # idempotency key) records the erasure once.
                    destroyed = self._keys.destroy(erase.tenant, erase.user)
                    metrics.KEYS_DESTROYED.inc(destroyed)
                    body = canonical_json({"keys_destroyed": destroyed})
                    appended, seq, head = self._add(
                        Prepared(erase, body, None), seq, head, pending, keys
                    )
                    outcomes.append(Erased(destroyed, appended.seq))
                    continue
                if request.expected is not None and request.expected != head:
                    outcomes.append(
                        Aborted(
                            f"expected_prev_hash: the head is entry {seq} with hash "
                            f"{head.hex()}; another writer appended first",
                            reason="HEAD_MOVED",
                        )
                    )
                    continue
                results = []
                for new in request.entries:
                    appended, seq, head = self._add(new, seq, head, pending, keys)
                    results.append(appended)
                outcomes.append(results)
            if pending:
                self._store.append(pending)
        except HippoError as exc:
            return [exc for _ in batch]
        except Exception:
            log.exception("audit: a group commit failed; nothing of it was written")
            error = Unavailable("the audit log could not commit; retry shortly")
            return [error for _ in batch]
        if pending:
            self._seq, self._hash = seq, head
            metrics.CHAIN_LENGTH.set(seq)
            metrics.BATCH_ENTRIES.observe(len(pending))
            for event_type, count in Counter(e.event_type for e in pending).items():
                metrics.ENTRIES.labels(event_type).inc(count)
        return outcomes

    def _checkpoint_due(self) -> bool:
        last = self._checkpoint.size if self._checkpoint else 0
        return self._writable and self._seq - last >= self._config.checkpoint_every

    def _add(
        self,
        prepared: Prepared,
        seq: int,
        head: bytes,
        pending: list[Entry],
        keys: dict[tuple[str, str], tuple[int, bytes]],
    ) -> tuple[Appended, int, bytes]:
        """Add an entry after (seq, head) unless its idempotency key is already in the log."""
        new = prepared.new
        if new.idempotency_key:
            ident = (new.tenant, new.idempotency_key)
            known = keys.get(ident) or self._store.find_key(*ident)
            if known is not None:
                metrics.DUPLICATES.inc()
                return Appended(known[0], known[1], duplicate=True), seq, head
        seq += 1
        sealed, key_id = b"", 0
        if prepared.private is not None:
            key_id, sealed = self._keys.seal(
                new.tenant, new.user, prepared.private, private_aad(new.tenant, new.user, seq)
            )
        when = self._clock()
        body, memory_ids = prepared.body, tuple(new.memory_ids)
        digest = link(head, seq, when, key_id, new, memory_ids, body, sealed)
        entry = Entry(
            seq=seq,
            time_us=when,
            tenant=new.tenant,
            actor=new.actor,
            event_type=new.event_type,
            user=new.user,
            session=new.session,
            memory_ids=memory_ids,
            body=body,
            sealed=sealed,
            key_id=key_id,
            idempotency_key=new.idempotency_key,
            prev_hash=head,
            hash=digest,
        )
        pending.append(entry)
        if new.idempotency_key:
            keys[(new.tenant, new.idempotency_key)] = (seq, entry.hash)
        return Appended(seq, entry.hash), seq, entry.hash

    def _sign_checkpoint(self) -> None:
        """Sign the committed head into the witness (writer thread, or before start)."""
        if self._seq == 0 or (self._checkpoint and self._checkpoint.size == self._seq):
            return
        when = self._clock()
        signature = self._signer.sign(checkpoints.message(self._seq, self._hash, when))
        checkpoint = Checkpoint(self._seq, self._hash, when, self._key_id, signature)
        self._witness.append(checkpoint)
        self._checkpoint = checkpoint
        metrics.checkpoint_signed(checkpoint.size, when)

    async def _checkpoint_timer(self) -> None:
        interval = self._config.checkpoint_interval_seconds
        while True:
            await asyncio.sleep(interval)
            covered = self._checkpoint.size if self._checkpoint else 0
            if self._writable and self._seq > covered and not self._closing.is_set():
                with contextlib.suppress(HippoError):
                    await self._submit(_Request("checkpoint", self._future()))

    async def _wal_timer(self) -> None:
        while True:
            await asyncio.sleep(WAL_CHECKPOINT_SECONDS)
            if self._dirty:
                self._dirty = False
                await asyncio.to_thread(self._store.checkpoint)

    def _notify(self) -> None:
        # Followers wait on the event they saw before reading; setting it and putting a
        # fresh one in its place wakes exactly those who might have missed this commit.
        committed, self._committed = self._committed, asyncio.Event()
        committed.set()

    # -- reads ---------------------------------------------------------------------------

    def head(self) -> Head:
        return Head(
            self._seq,
            self._hash,
            self._checkpoint,
            self._signer.public_key,
            self._key_id,
            self._writable,
            self._problem,
        )

    async def read(
        self, where: Filter, after_seq: int, to_seq: int, limit: int, include_private: bool
    ) -> Page:
        return await asyncio.to_thread(self._read, where, after_seq, to_seq, limit, include_private)

    def _read(
        self, where: Filter, after_seq: int, to_seq: int, limit: int, include_private: bool
    ) -> Page:
        rows = self._store.read(where, after_seq, to_seq or _END, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        entries = [self._reveal(e, include_private) for e in rows]
        return Page(entries, rows[-1].seq if more else 0)

    def _reveal(self, entry: Entry, include_private: bool) -> ReadEntry:
        if not entry.sealed:
            return ReadEntry(entry, PrivateState.NONE)
        if not include_private:
            return ReadEntry(entry, PrivateState.SEALED)
        aad = private_aad(entry.tenant, entry.user, entry.seq)
        try:
            plain = self._keys.open(entry.tenant, entry.user, entry.key_id, entry.sealed, aad)
        except ValueError:
            log.warning("audit: the private body of entry %d does not authenticate", entry.seq)
            return ReadEntry(entry, PrivateState.SEALED)
        if plain is None:
            return ReadEntry(entry, PrivateState.ERASED)
        return ReadEntry(entry, PrivateState.READABLE, json.loads(plain))

    async def follow(
        self, where: Filter, after_seq: int, include_private: bool
    ) -> AsyncIterator[list[ReadEntry]]:
        """The matching entries after `after_seq`, then each new one as it is committed,
        until the caller goes away or the log closes."""
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

    async def verify(self, from_seq: int, to_seq: int, chain_only: bool) -> Verdict:
        if from_seq and to_seq and from_seq > to_seq:
            raise InvalidArgument("from_seq", f"{from_seq} exceeds to_seq {to_seq}")
        verdict = await asyncio.to_thread(self.verify_now, from_seq, to_seq, chain_only)
        metrics.VERIFIED.inc(verdict.entries_checked)
        if not verdict.ok:
            metrics.VERIFY_FAILURES.inc()
        return verdict

    def verify_now(self, from_seq: int = 0, to_seq: int = 0, chain_only: bool = False) -> Verdict:
        """Check the stored log (as it is on disk now) over [from_seq, to_seq] (blocking)."""
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
            found, cps_checked, latest = self._check_witness(self._witness.read(), head_seq, lo, hi)
            problems.extend(found)
        first = min(problems, key=_order) if problems else None
        return Verdict(
            ok=first is None,
            entries_checked=checked,
            first_bad_seq=first.seq if first else 0,
            reason=first.reason if first else "",
            head_seq=head_seq,
            head_hash=head_hash,
            checkpoints_checked=cps_checked,
            latest_checkpoint=latest,
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
