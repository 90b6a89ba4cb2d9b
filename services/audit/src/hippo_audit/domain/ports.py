"""Ports: what the audit domain needs from storage and crypto. Adapters implement them
(SQLite files for the embedded default, PostgreSQL for cluster mode); the contract tests
run the domain over both."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Protocol

from hippo_audit.domain.chain import Row
from hippo_audit.domain.models import (
    Batch,
    Checkpoint,
    Entry,
    Filter,
    Opened,
    Tip,
    ToOpen,
    ToSeal,
    WitnessLine,
)

# (tenant, idempotency_key) -> (seq, hash) of the entries already holding those keys.
FindKeys = Callable[[Collection[tuple[str, str]]], dict[tuple[str, str], tuple[int, bytes]]]
# Builds a batch on the tip it is handed (under the store's append lock).
Build = Callable[[Tip, FindKeys], Batch]


class HeadMismatch(Exception):
    """Raised by a store whose recorded head no longer matches its last entry (entries
    were deleted or inserted behind its back): appending would bury the evidence."""


class LogStore(Protocol):
    """The entries, append-only. Every read that returns content is confined to one
    tenant inside the store's own query."""

    # True when other processes append to the same store (cluster mode): a head cached in
    # memory goes stale, and new entries may appear that this process did not write.
    shared: bool

    def head(self) -> tuple[int, bytes]:
        """(seq, hash) of the last stored entry; (0, GENESIS) when empty."""
        ...

    def append(self, build: Build) -> Batch:
        """One durable transaction (all or none) under the store's append lock: read the
        head, call `build(tip, find_keys)` (find_keys looks idempotency keys up inside the
        lock, so a key another writer just stored is seen), store what it returns
        (entries; and its checkpoint when the store keeps checkpoints), move the head.
        Returns the batch once it is durable. `build` may be called again if the
        database aborted the first attempt; it must start afresh each time."""
        ...

    def hash_at(self, seq: int) -> bytes | None:
        """The stored hash of entry `seq`, or None when absent."""
        ...

    def tenant_tip(self, tenant: str, from_seq: int, to_seq: int) -> tuple[int, int, bytes]:
        """(count, last seq, its hash) of the tenant's entries in [from_seq, to_seq];
        (0, 0, b"") when it has none there."""
        ...

    def read(self, where: Filter, after_seq: int, to_seq: int, limit: int) -> list[Entry]:
        """Up to `limit` entries of where.tenant with after_seq < seq <= to_seq, seq order."""
        ...

    def checkpoint(self, truncate: bool = False) -> None:
        """A storage chore off the writer's path (SQLite: move committed frames from the
        write-ahead log into the main file); entries are durable either way."""
        ...

    def rows(self, from_seq: int, to_seq: int) -> Iterator[Row]:
        """Raw rows from_seq <= seq <= to_seq in seq order, fields as stored bytes (for
        verification: never decoded, so any stored byte is hashed as it is)."""
        ...

    def wait_for_append(self, timeout: float) -> bool:
        """Block until another process may have appended (True) or `timeout` passed
        (False). Only called when `shared`."""
        ...

    def close(self) -> None: ...


class KeyRing(Protocol):
    """Per-user encryption keys (AES-GCM) for private bodies. Batched: a group commit
    seals all its private bodies with one lookup, a page of reads opens with one."""

    def seal(self, items: Sequence[ToSeal]) -> list[tuple[int, bytes]]:
        """Encrypt each under its user's current key, creating one (durably, before
        returning) for a user who has none. Returns (key id, nonce || ciphertext)."""
        ...

    def open(self, items: Sequence[ToOpen]) -> list[Opened]:
        """Decrypt each; plaintext None where the key was destroyed."""
        ...

    def destroy(self, tenant: str, user: str) -> int:
        """Destroy every key of the user, durably and without leaving the key bytes in
        the store's files; returns how many were destroyed."""
        ...

    def close(self) -> None: ...


class Signer(Protocol):
    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key."""
        ...

    def sign(self, message: bytes) -> bytes: ...

    def verify(self, message: bytes, signature: bytes) -> bool: ...


class Witness(Protocol):
    """The append-only record of signed checkpoints, kept apart from the log's entries (a
    file), or beside them in the same database (cluster mode, written by the log store in
    the batch that signs it)."""

    def append(self, checkpoint: Checkpoint) -> None:
        """Add one checkpoint, durably before returning."""
        ...

    def read(self) -> list[WitnessLine]:
        """Every record, in the order written, parsed or with the reason it could not be."""
        ...

    def latest(self) -> Checkpoint | None:
        """The last record that parses (not checked: the caller verifies)."""
        ...
