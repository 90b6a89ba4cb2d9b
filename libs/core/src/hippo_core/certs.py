"""A throwaway CA and per-service certificates, for `hippo up --tls` and the tests.

Not for production: the chart takes certificates from cert-manager or existing Secrets.
Each certificate carries the identity `spiffe://hippo/<name>` as its URI SAN (what the
servers' caller checks read), and `localhost`, `<name>` and 127.0.0.1 as names a
client may check the server for. `cryptography` is imported here only (a dependency of
hippo-cli, which runs the launcher): the services never need it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hippo_core.tls import TRUST_DOMAIN

VALID = dt.timedelta(days=30)


@dataclass(frozen=True)
class Issued:
    ca_file: Path
    cert_file: Path
    key_file: Path


def _write(path: Path, data: bytes, private: bool = False) -> None:
    # Written beside and renamed over the old file: a server reloading mid-write reads
    # either the old or the new file, never half of one.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


class Authority:
    """A CA in `directory` (ca.pem, ca.key), made on first use, that issues leaf
    certificates into the same directory."""

    def __init__(self, directory: Path, name: str = "Hippo local CA") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        self.directory = directory
        self.ca_file = directory / "ca.pem"
        key_file = directory / "ca.key"
        self._key: Any
        if self.ca_file.exists() and key_file.exists():
            self._key = serialization.load_pem_private_key(key_file.read_bytes(), None)
            self._cert = x509.load_pem_x509_certificate(self.ca_file.read_bytes())
            return
        self._key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        _write(key_file, _pem_key(self._key), private=True)
        _write(self.ca_file, self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        dns: Iterable[str] = (),
        *,
        uri: str | None = None,
        file_stem: str | None = None,
    ) -> Issued:
        """A certificate for service `name` (identity spiffe://hippo/<name>, or `uri`),
        valid for client and server use, written as <stem>.pem and <stem>.key."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = _key()
        names: list[x509.GeneralName] = [
            x509.UniformResourceIdentifier(uri or f"{TRUST_DOMAIN}{name}"),
            *(x509.DNSName(d) for d in ("localhost", name, *dns)),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALID)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        stem = file_stem or name
        cert_file, key_file = self.directory / f"{stem}.pem", self.directory / f"{stem}.key"
        _write(key_file, _pem_key(key), private=True)
        _write(cert_file, cert.public_bytes(serialization.Encoding.PEM))
        return Issued(self.ca_file, cert_file, key_file)
