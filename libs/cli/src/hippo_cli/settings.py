"""Settings of the `hippo` command (environment prefix `HIPPO_CLI_`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from hippo_core.settings import TlsSettings


class CliSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="HIPPO_CLI_", extra="forbid", frozen=True, env_nested_delimiter="__"
    )

    gateway_addr: str = Field(
        "127.0.0.1:50051", description="Where the memory commands reach the gateway."
    )
    embedding_addr: str = Field(
        "127.0.0.1:50052", description="Where `hippo embed` and `hippo health` reach embedding."
    )
    retrieval_addr: str = Field(
        "127.0.0.1:50053",
        description="Where `hippo reindex` and `hippo health` reach the retrieval service.",
    )
    injection_addr: str = Field(
        "127.0.0.1:50055", description="Where `hippo health` reaches the injection service."
    )
    summariser_addr: str = Field(
        "127.0.0.1:50054", description="Where `hippo health` reaches the summariser."
    )
    audit_addr: str = Field(
        "127.0.0.1:50056",
        description="Where `hippo audit verify|tail` and `hippo health` reach the audit service.",
    )
    api_key: str = Field(
        "hippo-local-dev-key",
        repr=False,
        description="API key the memory commands send. `hippo up` configures the gateway to "
        'accept it for tenant "local" unless HIPPO_GATEWAY_API_KEYS is set.',
    )
    timeout_seconds: float = Field(10.0, gt=0, description="Deadline of each CLI call.")
    data_dir: str = Field(
        "var", description="Where `hippo up` keeps service data and logs (relative to cwd)."
    )
    postgres_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of the PostgreSQL that `hippo up --cluster` starts; 0 reserves a "
        "free one.",
    )
    replicas: int = Field(
        2, ge=1, le=8, description="Processes per service that `hippo up --cluster` starts."
    )
    tls: TlsSettings = Field(
        default_factory=TlsSettings,
        description="Certificates the commands call with (--tls-ca, --tls-cert, --tls-key): "
        "the CA alone reaches a TLS gateway; internal services also need an operator "
        "certificate (identity spiffe://hippo/operator). `hippo up --tls` makes them.",
    )
    startup_timeout_seconds: float = Field(
        300.0, gt=0, description="How long `hippo up` waits for each service to be SERVING."
    )
