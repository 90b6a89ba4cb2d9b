"""Model backends behind the `Encoder` port, loaded lazily by spec."""

from __future__ import annotations

from pathlib import Path

from hippo_encoders.encoder import Encoder
from hippo_encoders.settings import EncoderSettings
from hippo_encoders.specs import ModelSpec


def load_spec(spec: ModelSpec, settings: EncoderSettings) -> Encoder:
    """Import only the backend a spec needs: onnx never imports torch (~7 s, ~400 MB)."""
    threads, max_tokens = settings.threads, settings.max_tokens
    if spec.layout == "builtin" and settings.backend == "torch":
        from hippo_encoders.torch_encoder import TorchEncoder

        return TorchEncoder(threads=threads, max_tokens=max_tokens)
    if spec.layout == "builtin":
        from hippo_encoders.onnx_encoder import OnnxEncoder

        return OnnxEncoder(
            threads=threads,
            max_tokens=max_tokens,
            quantization=settings.onnx_quantization,
            cache_dir=Path(settings.graph_cache_dir) if settings.graph_cache_dir else None,
        )
    assert spec.path is not None  # a directory spec
    if spec.layout == "sentence-transformers":
        from hippo_encoders.torch_encoder import SentenceTransformerEncoder

        return SentenceTransformerEncoder(
            spec.name, spec.path, threads=threads, max_tokens=max_tokens
        )
    from hippo_encoders.onnx_encoder import OnnxDirEncoder

    return OnnxDirEncoder.from_directory(
        spec.name, spec.path, threads=threads, max_tokens=max_tokens
    )


def load_all(settings: EncoderSettings) -> list[Encoder]:
    """Every model of `settings.models`, the default first."""
    return [load_spec(spec, settings) for spec in settings.model_specs()]


def load(settings: EncoderSettings) -> Encoder:
    """The default model alone (the first of `settings.models`)."""
    return load_spec(settings.model_specs()[0], settings)
