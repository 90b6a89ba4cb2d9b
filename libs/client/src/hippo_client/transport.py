"""What both clients share about the wire: TLS credentials, channel options, the key.

The API key goes in `x-api-key` metadata (the gateway also reads `authorization: Bearer`;
one credential per call, two are refused). gRPC's own retry policy is switched off: the
clients retry themselves (`retry.py`), and two layers would multiply the attempts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from hippo_client._version import __version__

API_KEY_HEADER = "x-api-key"


@dataclass(frozen=True)
class TlsConfig:
    """TLS to the gateway. `ca_file=None` trusts the system's roots; `cert_file` and
    `key_file` (both or neither) present a client certificate, for a gateway that
    requires one (mTLS); `server_name` overrides the name checked in the gateway's
    certificate (e.g. when dialling an IP address)."""

    ca_file: str | Path | None = None
    cert_file: str | Path | None = None
    key_file: str | Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TlsConfig: give cert_file and key_file together, or neither")

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | Path | None) -> bytes | None:
            return Path(path).read_bytes() if path is not None else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


def options(tls: TlsConfig | None) -> list[tuple[str, Any]]:
    opts: list[tuple[str, Any]] = [
        ("grpc.primary_user_agent", f"hippo-client/{__version__}"),
        ("grpc.enable_retries", 0),
        # A dropped connection is noticed within a minute, not at the next call's deadline.
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
    ]
    if tls is not None and tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return opts


def metadata(api_key: str) -> tuple[tuple[str, str], ...]:
    if not api_key or api_key != api_key.strip():
        raise ValueError("api_key: give the key itself, without spaces around it")
    return ((API_KEY_HEADER, api_key),)


def timeout(value: float | None, default: float) -> float:
    chosen = default if value is None else value
    if chosen <= 0:
        raise ValueError(f"timeout must be positive seconds, got {chosen}")
    return chosen
