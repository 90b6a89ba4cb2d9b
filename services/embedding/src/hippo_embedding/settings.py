"""Settings of the embedding service (environment prefix `HIPPO_EMBEDDING_`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hippo_core.settings import ServiceSettings
from hippo_encoders.settings import EncoderSettings


class EmbeddingSettings(ServiceSettings, EncoderSettings):
    """The service's own settings, and the models' (EncoderSettings: the gateway reads
    those too, to embed a lone Recall's query as this service would)."""

    # extra=forbid again: EncoderSettings ignores the service's variables, this must not.
    model_config = SettingsConfigDict(env_prefix="HIPPO_EMBEDDING_", extra="forbid")

    port: int = Field(50052, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    metrics_port: int = Field(
        9102, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 picks a free one)."
    )
    max_texts: int = Field(256, ge=1, le=4096, description="Most texts per Embed call.")
    max_chars: int = Field(
        8192,
        ge=16,
        le=1_000_000,
        description="Most characters per text. The model reads only its first 256 word "
        "pieces (about 1,000-1,500 characters of English); the rest is ignored.",
    )
    max_batch: int = Field(
        64, ge=1, le=1024, description="Most texts encoded in one model call (a micro-batch)."
    )
    batch_wait_ms: float = Field(
        0.0,
        ge=0,
        le=50,
        description="How long the first request of a batch waits for others to join. 0: "
        "none; requests that arrive while the model is busy still share the next batch.",
    )
    max_queued_texts: int = Field(
        4096,
        ge=1,
        description="Texts waiting for the model at most; beyond it Embed answers "
        "RESOURCE_EXHAUSTED with RetryInfo instead of queueing without bound (a call whose "
        "deadline the queue ahead would outlast is refused the same way: docs/embedding.md).",
    )
    cache_entries: int = Field(
        20_000, ge=0, description="Vectors kept in the LRU cache (0 disables it); ~1.6 KB each."
    )
