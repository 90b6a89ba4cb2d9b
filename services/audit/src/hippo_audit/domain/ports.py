"""Ports: what the audit domain needs from storage and crypto. Adapters implement them;
tests may use them directly over real files."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from hippo_audit.domain.chain import Row
from hippo_audit.domain.models import Checkpoint, Entry, Filter, WitnessLine


class LogStore(Protocol):
    """The entries, append-only. Every read that returns content is confined to one
    tenant inside the store's own query."""

    def head(self) -> tuple[int, bytes]:
        """(seq, hash) of the last stored entry; (0, GENESIS) when empty."""
        ...

    def append(self, entries: Sequence[Entry]) -> None:
        """Store the entries in one durable transaction (all or none); returns once synced."""
        ...

    def find_key(self, tenant: str, idempotency_key: str) -> tuple[int, bytes] | None:
        """(seq, hash) of the tenant's entry with this idempotency key, if any."""
        ...

    def hash_at(self, seq: int) -> bytes | None:
        """The stored hash of entry `seq`, or None when absent."""
        ...

    def read(self, where: Filter, after_seq: int, to_seq: int, limit: int) -> list[Entry]:
        """Up to `limit` entries of where.tenant with after_seq < seq <= to_seq, seq order."""
        ...

    def checkpoint(self, truncate: bool = False) -> None:
        """Move committed data from the write-ahead log into the main file, off the
        writer's path (a storage chore; entries are durable either way)."""
        ...

    def rows(self, from_seq: int, to_seq: int) -> Iterator[Row]:
        """Raw rows from_seq <= seq <= to_seq in seq order, fields as stored bytes (for
        verification: never decoded, so any stored byte is hashed as it is)."""
        ...

    def close(self) -> None: ...


class KeyRing(Protocol):
    """Per-user encryption keys (AES-GCM) for private bodies."""

    def seal(self, tenant: str, user: str, plaintext: bytes, aad: bytes) -> tuple[int, bytes]:
        """Encrypt under the user's current key, creating one (durably, before returning)
        if the user has none. Returns (key id, nonce || ciphertext)."""
        ...

    def open(self, tenant: str, user: str, key_id: int, sealed: bytes, aad: bytes) -> bytes | None:
        """The plaintext; None when the key was destroyed. Raises ValueError when the
        ciphertext does not authenticate."""
        ...

    def destroy(self, tenant: str, user: str) -> int:
        """Destroy every key of the user, durably and without leaving the key bytes in the
        file; returns how many were destroyed."""
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
    """The append-only file of signed checkpoints, kept apart from the log."""

    def append(self, checkpoint: Checkpoint) -> None:
        """Add one checkpoint, durably (fsynced) before returning."""
        ...

    def read(self) -> list[WitnessLine]:
        """Every line, in file order, parsed or with the reason it could not be."""
        ...
