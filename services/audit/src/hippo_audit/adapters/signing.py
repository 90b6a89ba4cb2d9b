"""The Ed25519 key that signs checkpoints: from settings, or a file made on first start."""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from hippo_core.files import write_atomic


class Ed25519Signer:
    """`Signer`."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private = private_key
        self._public: Ed25519PublicKey = private_key.public_key()
        self._public_raw = self._public.public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @classmethod
    def load(cls, secret_b64: str, path: Path) -> Ed25519Signer:
        """The key given in settings (base64 of the 32-byte private key), else the PEM file
        at `path`, created (mode 0600) when it does not exist yet."""
        if secret_b64:
            try:
                raw = base64.b64decode(secret_b64, validate=True)
            except binascii.Error as exc:
                raise ValueError("signing_key: not valid base64") from exc
            if len(raw) != 32:
                raise ValueError(f"signing_key: must decode to 32 bytes, got {len(raw)}")
            return cls(Ed25519PrivateKey.from_private_bytes(raw))
        if path.exists():
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError(f"{path}: not an Ed25519 private key")
            return cls(key)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, pem, mode=0o600)
        return cls(key)

    @property
    def public_key(self) -> bytes:
        return self._public_raw

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)

    def verify(self, message: bytes, signature: bytes) -> bool:
        try:
            self._public.verify(signature, message)
        except InvalidSignature:
            return False
        return True


def verify_with(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Check a signature with a bare public key (independent verifiers, tests)."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
