"""Model backends behind the `Encoder` port, loaded lazily by spec."""

from __future__ import annotations

from pathlib import Path

from hippo_embedding.domain.encoder import Encoder
from hippo_embedding.settings import EmbeddingSettings
from hippo_embedding.specs import BUILTIN_NAME, ModelSpec

MODEL = BUILTIN_NAME


def load_spec(spec: ModelSpec, settings: EmbeddingSettings) -> Encoder:
    """Import only the backend a spec needs: onnx never imports torch (~7 s, ~400 MB)."""
    threads, max_tokens = settings.threads, settings.max_tokens
    if spec.layout == "builtin" and settings.backend == "torch":
        from hippo_embedding.adapters.torch_encoder import TorchEncoder

        return TorchEncoder(threads=threads, max_tokens=max_tokens)
    if spec.layout == "builtin":
        from hippo_embedding.adapters.onnx_encoder import OnnxEncoder

        return OnnxEncoder(
            threads=threads,
            max_tokens=max_tokens,
            quantization=settings.onnx_quantization,
            cache_dir=Path(settings.graph_cache_dir) if settings.graph_cache_dir else None,
        )
    assert spec.path is not None  # a directory spec
    if spec.layout == "sentence-transformers":
        from hippo_embedding.adapters.torch_encoder import SentenceTransformerEncoder

        return SentenceTransformerEncoder(
            spec.name, spec.path, threads=threads, max_tokens=max_tokens
        )
    from hippo_embedding.adapters.onnx_encoder import OnnxDirEncoder

    return OnnxDirEncoder.from_directory(
        spec.name, spec.path, threads=threads, max_tokens=max_tokens
    )


def load_all(settings: EmbeddingSettings) -> list[Encoder]:
    """Every model of `settings.models`, the default first."""
    return [load_spec(spec, settings) for spec in settings.model_specs()]


def load(settings: EmbeddingSettings) -> Encoder:
    """The default model alone (the first of `settings.models`)."""
    return load_spec(settings.model_specs()[0], settings)
