"""AES-256-GCM for private bodies, shared by both key rings: a random 96-bit nonce per
encryption, stored in front of the ciphertext; the caller's associated data binds the
body to its entry (see `batch.private_aad`)."""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hippo_audit.domain.models import Opened

NONCE = 12  # bytes: AES-GCM's standard nonce


def new_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def seal(cipher: AESGCM, plaintext: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(NONCE)
    return nonce + cipher.encrypt(nonce, plaintext, aad)


def unseal(cipher: AESGCM | None, sealed: bytes, aad: bytes) -> Opened:
    """The plaintext; None when there is no key (destroyed); not authentic when the
    ciphertext, its nonce or the associated data was altered."""
    if cipher is None:
        return Opened(None)
    try:
        return Opened(cipher.decrypt(sealed[:NONCE], sealed[NONCE:], aad))
    except InvalidTag:
        return Opened(None, authentic=False)
