"""Typed settings: one object per service, read from `HIPPO_<SVC>_*` environment variables.

Each service subclasses `ServiceSettings`, sets its `env_prefix` and default ports, and
adds its own fields. The object is built once in the service's `__main__` and passed
down; nothing reads the environment at import time. Every field has a description:
`deploy/hippo.env.example` is generated from them (`make env-example`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

MIB = 1024 * 1024


class ClientSettings(BaseModel):
    """How a service calls its peers (nested in each service's settings as `client`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_seconds: float = Field(
        5.0, gt=0, description="Deadline for an outbound call when the caller set none."
    )
    max_attempts: int = Field(
        3, ge=1, le=5, description="Attempts per call, retried on UNAVAILABLE only."
    )


class DatabaseSettings(BaseModel):
    """Where a stateful service keeps its state of record (nested as `database`).

    Empty `url`: SQLite files under the service's data dir (the embedded default of
    `make run`). A PostgreSQL URL: cluster mode, every replica of the service shares the
    database (one schema per service)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: SecretStr = Field(
        SecretStr(""),
        description="PostgreSQL URL (postgresql://user:password@host:5432/db); empty: SQLite "
        "under data_dir. A secret: never logged.",
    )
    schema_name: str = Field(
        "",
        pattern=r"^[a-z_][a-z0-9_]*$|^$",
        description="Schema of this service's tables; empty: hippo_<service>.",
    )
    pool_min_size: int = Field(1, ge=0, description="Connections kept open.")
    pool_max_size: int = Field(
        8,
        ge=1,
        description="Most connections open at once (size the server's max_connections "
        "for every replica of every service).",
    )
    pool_timeout_seconds: float = Field(
        5.0, gt=0, description="Wait for a free pooled connection, then UNAVAILABLE."
    )
    connect_timeout_seconds: float = Field(5.0, gt=0, description="Deadline of a new connection.")
    statement_timeout_seconds: float = Field(
        30.0, gt=0, description="Deadline of every statement (PostgreSQL statement_timeout)."
    )


class TlsSettings(BaseModel):
    """Transport security of a process (nested as `tls`): its certificate, used both as
    its server's and as its client identity, and the CA it trusts. Empty `ca_file`:
    plaintext, the embedded default of `make run` (loopback only). See docs/security.md
    for identities and rotation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: str = Field(
        "",
        description="PEM bundle of the CA that signs Hippo's certificates: peers' server "
        "certificates and (internal services) callers' client certificates are checked "
        "against it. Empty: plaintext, no identities.",
    )
    cert_file: str = Field(
        "",
        description="This process's certificate chain (PEM), served by its gRPC server "
        "and presented to its peers; its URI SAN spiffe://hippo/<service> is its identity. "
        "Re-read by the server when the file changes.",
    )
    key_file: str = Field(
        "",
        description="The private key of cert_file (PEM). Re-read with it.",
    )
    server_name: str = Field(
        "",
        description="Name (a DNS SAN) peers' certificates must carry instead of the "
        "target's host; empty: the target's host (the first address of an ipv4: list).",
    )
    require_client_cert: bool = Field(
        False,
        description="Gateway only: refuse callers without a client certificate from "
        "ca_file. Internal services always require one.",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.ca_file)


class ServiceSettings(BaseSettings):
    """Settings every gRPC service has."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True, env_nested_delimiter="__")

    host: str = Field("127.0.0.1", description="Address the gRPC server binds.")
    port: int = Field(0, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    metrics_port: int = Field(
        0, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 picks a free one)."
    )
    grace_seconds: float = Field(
        10.0,
        gt=0,
        description="On SIGTERM, in-flight calls get this long to finish before they are "
        "cancelled. Keep it below the pod's terminationGracePeriodSeconds.",
    )
    max_concurrent_rpcs: int = Field(
        64,
        ge=1,
        description="Calls served at once; the next one gets RESOURCE_EXHAUSTED (with "
        "RetryInfo) instead of an unbounded queue, as does a call whose deadline is shorter "
        "than its method's recent latency while others are in flight. Health checks are not "
        "counted.",
    )
    max_concurrent_per_method: int = Field(
        0,
        ge=0,
        description="Calls of one method served at once (0: only max_concurrent_rpcs "
        "bounds them); the next gets RESOURCE_EXHAUSTED with RetryInfo. Internal services "
        "leave it off (their queues admit by deadline); the gateway, where overload "
        "enters, bounds it (see its own default).",
    )
    max_message_bytes: int = Field(
        4 * MIB,
        ge=64 * 1024,
        description="Largest request or response message in bytes.",
    )
    max_connection_age_seconds: float = Field(
        300.0,
        ge=0,
        description="Clients are asked to reconnect after this long (GOAWAY), so they "
        "re-resolve their peer's addresses and spread over replicas that started since; "
        "0: never.",
    )
    max_connection_age_grace_seconds: float = Field(
        120.0,
        ge=0,
        description="Calls in flight on a connection past its age get this long to finish "
        "(a Chat reply streams for a while).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Lowest level written to the JSON log on stderr."
    )
    otlp_endpoint: str = Field(
        "",
        description="OTLP/gRPC collector for traces, e.g. http://otel-collector:4317. "
        "Empty: spans are made (ids reach the logs) but not exported.",
    )
    client: ClientSettings = Field(
        default_factory=ClientSettings, description="Outbound call policy."
    )
    tls: TlsSettings = Field(
        default_factory=TlsSettings, description="Certificates of the server and its calls."
    )
