"""Certificates from `TlsSettings`: server and channel credentials, and peer identities.

A Hippo process has one certificate, served by its gRPC server and presented as its
client identity to its peers; the identity is the certificate's URI SAN
`spiffe://hippo/<service>` (see `identity`). The server re-reads its files when their
modification time changes: gRPC asks the fetcher before each new TLS handshake, so a
rotated certificate is served on the next connection without a restart. Channels read
the files when they are made (gRPC has no reloading channel credentials in Python): a
process presents a rotated client certificate after its restart, so rotate before the
old one expires (docs/security.md).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable
from pathlib import Path

import grpc
import structlog

from hippo_core.settings import TlsSettings

log = structlog.stdlib.get_logger("hippo.tls")

TRUST_DOMAIN = "spiffe://hippo/"


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def _signature(paths: Iterable[str]) -> tuple[tuple[int, int, int], ...]:
    # Kubernetes swaps a Secret's files with a symlink rename: stat follows the link,
    # so the inode and mtime change together.
    out = []
    for path in paths:
        st = os.stat(path)
        out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class _ServerFiles:
    """The server's key, certificate and CA, re-read whenever one of them changes."""

    def __init__(self, tls: TlsSettings) -> None:
        if not (tls.cert_file and tls.key_file):
            raise ValueError("tls.ca_file is set: tls.cert_file and tls.key_file must be too")
        self._paths = (tls.key_file, tls.cert_file, tls.ca_file)
        self._seen = _signature(self._paths)

    def config(self) -> grpc.ServerCertificateConfiguration:
        key, cert, ca = (_read(p) for p in self._paths)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """None: keep serving what is loaded (gRPC's contract for an unchanged config)."""
        try:
            seen = _signature(self._paths)
            if seen == self._seen:
                return None
            config = self.config()
        except OSError as exc:  # mid-rotation: keep the old files until the new ones land
            log.warning("tls_reload_failed", error=str(exc))
            return None
        self._seen = seen
        log.info("tls_reloaded", cert_file=self._paths[1])
        return config


def server_credentials(tls: TlsSettings, *, require_client_cert: bool) -> grpc.ServerCredentials:
    files = _ServerFiles(tls)
    return grpc.dynamic_ssl_server_credentials(
        files.config(), files.fetch, require_client_authentication=require_client_cert
    )


def channel_credentials(tls: TlsSettings) -> grpc.ChannelCredentials:
    """Trust `ca_file`; present `cert_file` when one is configured (the gateway takes
    callers without one)."""
    key = _read(tls.key_file) if tls.key_file else None
    cert = _read(tls.cert_file) if tls.cert_file else None
    return grpc.ssl_channel_credentials(_read(tls.ca_file), key, cert)


def target_name(target: str, tls: TlsSettings) -> str | None:
    """The name the peer's certificate is checked for, when the target's own authority
    is not a host: an `ipv4:a:p,b:q` list's authority is the whole list."""
    if tls.server_name:
        return tls.server_name
    for scheme in ("ipv4:", "ipv6:"):
        if target.startswith(scheme):
            first = target[len(scheme) :].split(",")[0]
            return first.rsplit(":", 1)[0].strip("[]")
    return None


def identity(auth_context: dict[str, list[bytes]]) -> str | None:
    """The Hippo service name of a verified peer (its URI SAN spiffe://hippo/<name>), or
    None. gRPC fills `auth_context` only from a certificate that chains to our CA."""
    for uri in auth_context.get("peer_uri", []) or auth_context.get(
        "x509_subject_alternative_name", []
    ):
        text = uri.decode(errors="replace")
        if text.startswith(TRUST_DOMAIN) and "/" not in text[len(TRUST_DOMAIN) :]:
            return text[len(TRUST_DOMAIN) :] or None
    return None


class HttpServerTls:
    """The HTTPS side of a service (the injection host's TGI API): requires a client
    certificate from `ca_file`. `reload_if_changed()` (called per request) loads rotated
    files into the same context, which the connections after it handshake with."""

    def __init__(self, tls: TlsSettings) -> None:
        self._paths = (tls.key_file, tls.cert_file, tls.ca_file)
        self._seen = _signature(self._paths)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.verify_mode = ssl.CERT_REQUIRED
        self._load()

    def _load(self) -> None:
        key, cert, ca = self._paths
        self.context.load_verify_locations(ca)  # adds: a CA being rotated in stays trusted
        self.context.load_cert_chain(cert, key)

    def reload_if_changed(self) -> None:
        try:
            seen = _signature(self._paths)
            if seen != self._seen:
                self._load()
                self._seen = seen
                log.info("tls_reloaded", cert_file=self._paths[1])
        except (OSError, ssl.SSLError) as exc:  # mid-rotation: keep the loaded files
            log.warning("tls_reload_failed", error=str(exc))


def http_client_context(tls: TlsSettings) -> ssl.SSLContext:
    """An HTTPS client context that trusts `ca_file` (and the system's CAs, for a TGI
    server elsewhere) and presents `cert_file`."""
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(tls.ca_file)
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def peer_identity(peercert: dict[str, object] | None) -> str | None:
    """The Hippo service name in a verified peer certificate as `ssl` reports it."""
    sans = (peercert or {}).get("subjectAltName", ())
    uris = [value.encode() for kind, value in sans if kind == "URI"]  # type: ignore[attr-defined]
    return identity({"peer_uri": uris})
