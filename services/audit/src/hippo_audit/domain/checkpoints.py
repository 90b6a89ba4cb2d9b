"""Signed checkpoints: what is signed, and how a checkpoint is checked against the log.

A checkpoint says "the log had `size` entries and entry `size` hashed to `hash`", signed
with the service's Ed25519 key and appended to a witness file kept apart from the log.
The chain alone cannot show that entries were cut off the end (or that the whole file
was replaced by an older copy): the remaining prefix is a perfectly valid chain. A
checkpoint signed before the cut can: the log is then shorter than a size it once
signed, or its entry at that size no longer hashes as signed.

The signed message is plain text, so anyone can check a checkpoint with the public key
and a few lines of code, independently of this service.
"""

from __future__ import annotations

import hashlib

PREFIX = "hippo.audit.v1 checkpoint"


def message(size: int, head_hash: bytes, time_us: int) -> bytes:
    return f"{PREFIX}\n{size}\n{head_hash.hex()}\n{time_us}\n".encode()


def key_id(public_key: bytes) -> str:
    """Short, stable name of a signing key: 16 hex digits of SHA-256 of the raw key."""
    return hashlib.sha256(public_key).hexdigest()[:16]
