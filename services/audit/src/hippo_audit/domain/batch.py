"""One group commit, built on the head the store hands over under its append lock.

The store (SQLite's write lock, PostgreSQL's `head` row locked FOR UPDATE) lets one
writer at a time, of any process, build on the head it reads: seqs, links and hashes
come from THAT head, never from a copy cached in memory, so several replicas appending
to one database still make one chain in one total order. Inside the same lock:
- idempotency keys are looked up (one query for the batch): a key another replica
  stored a moment ago is seen, and a retry is recorded once;
- private bodies are sealed (one key-ring call for the batch; the seq is bound into
  each ciphertext, and it is only known here);
- `expected_prev_hash` is compared with the real head;
- whether this batch signs a checkpoint is decided, so exactly one writer signs each
  (the batch that brings the unsigned tail to `checkpoint_every` entries, or a
  checkpoint request when the latest checkpoint is old enough).

A builder may be called again when the database aborted an attempt: it starts afresh
each time and its results describe the attempt that committed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from hippo_audit.domain import checkpoints
from hippo_audit.domain.chain import canonical_json, link
from hippo_audit.domain.models import (
    Appended,
    Batch,
    Checkpoint,
    Entry,
    Erased,
    NewEntry,
    Tip,
    ToSeal,
)
from hippo_audit.domain.ports import FindKeys, KeyRing, Signer
from hippo_audit.domain.validation import Prepared
from hippo_core.errors import Aborted


def private_aad(tenant: str, user: str, seq: int) -> bytes:
    """Bound into each private body's authentication tag: a ciphertext moved to another
    entry, user or tenant does not decrypt there."""
    return f"hippo.audit.v1 private\n{tenant}\n{user}\n{seq}".encode()


@dataclass(frozen=True)
class AppendJob:
    entries: Sequence[Prepared]
    expected: bytes | None = None  # expected_prev_hash: refuse unless the head hashes so


@dataclass(frozen=True)
class EraseJob:
    """The entry recording a user's erasure; their keys were destroyed just before."""

    entry: NewEntry
    destroyed: int


@dataclass(frozen=True)
class SignJob:
    """Sign the head if entries are unsigned and the latest checkpoint is at least
    `min_age_us` old (0: whenever entries are unsigned: at open and at close)."""

    min_age_us: int = 0


Job = AppendJob | EraseJob | SignJob


@dataclass(frozen=True)
class Signing:
    """A SignJob's result: when the latest checkpoint was signed (after the batch; 0 if
    never) and whether entries are left unsigned (a younger checkpoint made it wait)."""

    latest_us: int
    unsigned: bool


@dataclass
class _Draft:
    prepared: Prepared
    seq: int


class Builder:
    """Callable as the store's `Build`. Results, one per job, in `results` (a list of
    Appended, an Erased, an Aborted or a Signing); `checkpoint` is what it signed."""

    def __init__(
        self,
        jobs: Sequence[Job],
        *,
        keys: KeyRing,
        signer: Signer,
        every: int,
        clock: Callable[[], int],
        own_checkpoint: Checkpoint | None,
    ) -> None:
        self._jobs = jobs
        self._keys, self._signer = keys, signer
        self._key_id = checkpoints.key_id(signer.public_key)
        self._every, self._clock = every, clock
        # The writer's latest checkpoint, for stores that do not keep checkpoints (the
        # witness file has one writer, so this is exact).
        self._own = own_checkpoint
        self._reset(Tip(0, b""))

    def _reset(self, tip: Tip) -> None:
        self.seq, self.head = tip.seq, tip.hash
        # The store keeps the checkpoint (in this batch's transaction) when it reports one.
        self.kept = tip.checkpoint_size is not None
        self.entries: list[Entry] = []
        self.results: list[object] = []
        self.duplicates = 0
        self.checkpoint: Checkpoint | None = None
        self._drafts: list[_Draft] = []
        self._hashes: dict[int, bytes] = {}
        self._keyed: dict[tuple[str, str], int] = {}

    def __call__(self, tip: Tip, find_keys: FindKeys) -> Batch:
        self._reset(tip)
        wanted = {
            (p.new.tenant, p.new.idempotency_key)
            for job in self._jobs
            for p in _prepared(job)
            if p.new.idempotency_key
        }
        if wanted:
            for ident, (seq, digest) in find_keys(wanted).items():
                self._keyed[ident] = seq
                self._hashes[seq] = digest
        placed: list[list[tuple[int, bool]] | tuple[int, bool] | Aborted | None] = []
        for job in self._jobs:
            if isinstance(job, SignJob):
                placed.append(None)
            elif isinstance(job, EraseJob):
                body = canonical_json({"keys_destroyed": job.destroyed})
                placed.append(self._place(Prepared(job.entry, body, None)))
            else:
                if job.expected is not None:
                    self._seal_and_link()  # the head as it will be after what came before
                    if job.expected != self.head:
                        placed.append(
                            Aborted(
                                f"expected_prev_hash: the head is entry {self.seq} with hash "
                                f"{self.head.hex()}; another writer appended first",
                                reason="HEAD_MOVED",
                            )
                        )
                        continue
                placed.append([self._place(p) for p in job.entries])
        self._seal_and_link()
        self.checkpoint, signing = self._decide_checkpoint(tip)
        for job, where in zip(self._jobs, placed, strict=True):
            self.results.append(self._result(job, where, signing))
        return Batch(tuple(self.entries), self.checkpoint)

    def _place(self, prepared: Prepared) -> tuple[int, bool]:
        """(seq, duplicate): the seq the entry gets, or the one its idempotency key
        already has (in the log or earlier in this batch)."""
        new = prepared.new
        ident = (new.tenant, new.idempotency_key)
        if new.idempotency_key and ident in self._keyed:
            self.duplicates += 1
            return self._keyed[ident], True
        self.seq += 1
        self._drafts.append(_Draft(prepared, self.seq))
        if new.idempotency_key:
            self._keyed[ident] = self.seq
        return self.seq, False

    def _seal_and_link(self) -> None:
        """Seal the placed entries' private bodies (one key-ring call) and hash them onto
        the head, in seq order."""
        drafts, self._drafts = self._drafts, []
        private = [d for d in drafts if d.prepared.private is not None]
        by_seq: dict[int, tuple[int, bytes]] = {}
        if private:
            sealed = self._keys.seal(
                [
                    ToSeal(
                        d.prepared.new.tenant,
                        d.prepared.new.user,
                        d.prepared.private or b"",
                        private_aad(d.prepared.new.tenant, d.prepared.new.user, d.seq),
                    )
                    for d in private
                ]
            )
            by_seq = {d.seq: s for d, s in zip(private, sealed, strict=True)}
        for draft in drafts:
            new = draft.prepared.new
            key_id, ciphertext = by_seq.get(draft.seq, (0, b""))
            when = self._clock()
            memory_ids = tuple(new.memory_ids)
            body = draft.prepared.body
            digest = link(self.head, draft.seq, when, key_id, new, memory_ids, body, ciphertext)
            self.entries.append(
                Entry(
                    seq=draft.seq,
                    time_us=when,
                    tenant=new.tenant,
                    actor=new.actor,
                    event_type=new.event_type,
                    user=new.user,
                    session=new.session,
                    memory_ids=memory_ids,
                    body=body,
                    sealed=ciphertext,
                    key_id=key_id,
                    idempotency_key=new.idempotency_key,
                    prev_hash=self.head,
                    hash=digest,
                )
            )
            self._hashes[draft.seq] = digest
            self.head = digest

    def _decide_checkpoint(self, tip: Tip) -> tuple[Checkpoint | None, Signing]:
        if tip.checkpoint_size is None:
            size = self._own.size if self._own else 0
            at = self._own.time_us if self._own else 0
        else:
            size, at = tip.checkpoint_size, tip.checkpoint_us
        if self.seq <= size:
            return None, Signing(at, unsigned=False)
        due = self.seq - size >= self._every
        now = self._clock()
        for job in self._jobs:
            if isinstance(job, SignJob) and now - at >= job.min_age_us:
                due = True
        if not due:
            return None, Signing(at, unsigned=True)
        signature = self._signer.sign(checkpoints.message(self.seq, self.head, now))
        checkpoint = Checkpoint(self.seq, self.head, now, self._key_id, signature)
        return checkpoint, Signing(now, unsigned=False)

    def _result(
        self,
        job: Job,
        where: list[tuple[int, bool]] | tuple[int, bool] | Aborted | None,
        signing: Signing,
    ) -> object:
        if isinstance(where, Aborted):
            return where
        if isinstance(job, SignJob):
            return signing
        if isinstance(job, EraseJob):
            assert isinstance(where, tuple)
            return Erased(job.destroyed, where[0])
        assert isinstance(where, list)
        return [Appended(seq, self._hashes[seq], duplicate=dup) for seq, dup in where]


def _prepared(job: Job) -> Collection[Prepared]:
    if isinstance(job, AppendJob):
        return job.entries
    if isinstance(job, EraseJob):
        return (Prepared(job.entry, "", None),)
    return ()
