"""Values of the audit log. Times are UTC epoch microseconds; hashes are raw 32-byte digests
(hex only at the edge)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

Json = Mapping[str, Any]


@dataclass(frozen=True)
class NewEntry:
    """An entry as a caller hands it in; seq, time and hashes are the log's to assign."""

    tenant: str
    actor: str
    event_type: str
    user: str = ""
    session: str = ""
    memory_ids: tuple[str, ...] = ()
    body: Json = field(default_factory=dict)  # public: never user text
    private: Json | None = None  # sealed under the user's key
    idempotency_key: str = ""


@dataclass(frozen=True)
class Entry:
    """An entry as stored and hashed. `body` is the canonical JSON text exactly as hashed;
    `sealed` is nonce || AES-GCM ciphertext of the private body's canonical JSON."""

    seq: int
    time_us: int
    tenant: str
    actor: str
    event_type: str
    user: str
    session: str
    memory_ids: tuple[str, ...]
    body: str
    sealed: bytes
    key_id: int  # which of the user's keys sealed it; 0 = nothing sealed
    idempotency_key: str
    prev_hash: bytes
    hash: bytes


class PrivateState(StrEnum):
    NONE = "none"  # the entry has no private body
    SEALED = "sealed"  # it has one; not asked for (or it failed authentication)
    READABLE = "readable"
    ERASED = "erased"  # the user's key was destroyed


@dataclass(frozen=True)
class ReadEntry:
    entry: Entry
    private_state: PrivateState
    private: Json | None = None


@dataclass(frozen=True)
class Page:
    entries: list[ReadEntry]
    next_after_seq: int  # 0 = no more


@dataclass(frozen=True)
class Appended:
    seq: int
    hash: bytes
    duplicate: bool = False


@dataclass(frozen=True)
class Filter:
    """Which entries of one tenant a read selects (empty = any)."""

    tenant: str
    user: str = ""
    session: str = ""
    event_types: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Checkpoint:
    """A signed statement that the log had `size` entries, the last one hashing to `hash`."""

    size: int
    hash: bytes
    time_us: int
    key_id: str
    signature: bytes


@dataclass(frozen=True)
class WitnessLine:
    """One line of the witness file: a checkpoint, or why it could not be parsed."""

    number: int  # 1-based line number
    checkpoint: Checkpoint | None
    error: str = ""


@dataclass(frozen=True)
class Head:
    seq: int
    hash: bytes
    checkpoint: Checkpoint | None
    public_key: bytes
    key_id: str
    writable: bool
    problem: str


@dataclass(frozen=True)
class Verdict:
    ok: bool
    entries_checked: int
    first_bad_seq: int
    reason: str
    head_seq: int
    head_hash: bytes
    checkpoints_checked: int
    latest_checkpoint: Checkpoint | None
    # When a tenant was asked about: its entries in the range, and its last one there.
    tenant_entries: int = 0
    tenant_head_seq: int = 0
    tenant_head_hash: bytes = b""


@dataclass(frozen=True)
class Erased:
    keys_destroyed: int
    seq: int


@dataclass(frozen=True)
class Tip:
    """The log's head as a store hands it to the domain under its append lock: nobody
    else can append until the batch built on it commits or fails.

    `checkpoint_size` and `checkpoint_us` describe the latest checkpoint when the store
    keeps checkpoints in the same transactions as entries (PostgreSQL: one replica
    signs each); None when they live apart, in a witness file the one writer keeps."""

    seq: int
    hash: bytes
    checkpoint_size: int | None = None
    checkpoint_us: int = 0


@dataclass(frozen=True)
class Batch:
    """What one group commit stores: entries (in seq order, linked from the tip) and,
    when the batch was chosen to sign one, the checkpoint of the head after it."""

    entries: Sequence[Entry] = ()
    checkpoint: Checkpoint | None = None


# The key ring's items are tuples: a page of reads makes one per sealed entry.
class ToSeal(NamedTuple):
    tenant: str
    user: str
    plaintext: bytes
    aad: bytes


class ToOpen(NamedTuple):
    tenant: str
    user: str
    key_id: int
    sealed: bytes
    aad: bytes


class Opened(NamedTuple):
    """A private body opened: its plaintext, or None when the key was destroyed;
    `authentic` False when the ciphertext (or its associated data) was altered."""

    plaintext: bytes | None
    authentic: bool = True
