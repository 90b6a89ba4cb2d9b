"""Settings of the gateway (environment prefix `HIPPO_GATEWAY_`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hippo_core.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIPPO_GATEWAY_")

    port: int = Field(50051, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    metrics_port: int = Field(
        9101, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 picks a free one)."
    )
    api_keys: dict[str, str] = Field(
        default_factory=dict,
        repr=False,  # the keys are the secrets
        description='JSON object: API key -> tenant, e.g. {"k3y": "acme"}; a key may be '
        'given as "sha256:<hex digest>" instead. Required: with none, the gateway does not '
        'start. `hippo up` sets a local key (HIPPO_CLI_API_KEY -> tenant "local").',
    )
    embedding_addr: str = Field("127.0.0.1:50052", description="The embedding service.")
    retrieval_addr: str = Field("127.0.0.1:50053", description="The retrieval service.")
    peer_wait_seconds: float = Field(
        120.0,
        gt=0,
        description="At start, how long to wait for the embedding service to answer Info "
        "before giving up (the gateway is NOT_SERVING meanwhile).",
    )
