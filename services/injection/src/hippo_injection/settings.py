"""Settings of the injection service (environment prefix `HIPPO_INJECTION_`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from hippo_core.settings import ServiceSettings


class InjectionSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIPPO_INJECTION_")

    port: int = Field(50055, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    metrics_port: int = Field(
        9105, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 picks a free one)."
    )
    http_port: int = Field(
        8085,
        ge=0,
        le=65535,
        description="Port of the TGI-compatible HTTP API (/generate, /generate_stream, "
        "/info, /health) on `host`; 0 picks a free one.",
    )
    model_dir: str = Field(
        "var/injection/model",
        description="Where the converted model is cached (relative to the working "
        "directory). The first start converts the GGUF there (1-2 minutes on 2 cores); later "
        "starts load it in about a second. It is a derived copy of an installed package, not "
        "service state, so it is not under the launcher's per-cluster data dir: throwaway "
        "clusters (tests) reuse one conversion.",
    )
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="Weights' dtype. auto: float32 on CPU, bfloat16 on CUDA. On this AVX2 "
        "CPU (no bf16 instructions) bfloat16 decodes 1.2x faster but prefills a 256-token "
        "prompt 5.6x slower, so float32 wins below ~200 new tokens, and it is the "
        "reference (docs/injection.md).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: CUDA when a GPU is visible, else CPU."
    )
    threads: int = Field(
        1,
        ge=0,
        le=256,
        description="Intra-op CPU threads of torch (0: one per core). 1 by default: on a "
        "2-core machine shared with other services, 2 threads ran up to 10x slower than 1 "
        "(spinning threads fight for the cores; docs/injection.md).",
    )
    max_waiting: int = Field(
        16,
        ge=0,
        le=10_000,
        description="Requests that may wait for the model while one runs; the next one gets "
        "RESOURCE_EXHAUSTED. One request holds the model from its first to its last token.",
    )
    context_length: int = Field(
        4096,
        ge=64,
        le=32_768,
        description="Most tokens per request, prompt (with memories) + new tokens. The model "
        "allows 32k; CPU time and memory grow with it.",
    )
    max_new_tokens: int = Field(1024, ge=1, le=32_768, description="Most new tokens per request.")
    max_stop_sequences: int = Field(
        4, ge=0, le=64, description="Most stop sequences per request (TGI's default is 4)."
    )
    max_stop_chars: int = Field(256, ge=1, description="Most characters per stop sequence.")
    max_influences: int = Field(8, ge=0, le=256, description="Most influences per request.")
    max_strength: float = Field(
        8.0,
        gt=0,
        description="Largest |strength| of an influence. With vectors scaled to the layer "
        "norm, every sweep setting at 0.5 already wrecked unrelated answers "
        "(docs/injection.md); 8 leaves room for unscaled vectors, not for more damage.",
    )
    max_memories: int = Field(16, ge=0, le=256, description="Most attendable memory texts.")
    max_memory_tokens: int = Field(
        1024, ge=1, description="Most tokens of all attendable memories together."
    )
    max_value_scale: float = Field(
        16.0, gt=0, description="Largest attendable.value_scale accepted."
    )
    max_baseline_texts: int = Field(
        256, ge=1, description="Most baseline texts in one MakeValueVector call."
    )
    http_timeout_seconds: float = Field(
        300.0,
        gt=0,
        description="Deadline of an HTTP request (the HTTP API has no per-call deadline of "
        "its own); generation stops when it passes.",
    )
