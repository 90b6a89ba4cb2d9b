"""Model backends behind the `Encoder` port, loaded lazily by name."""

from __future__ import annotations

from hippo_embedding.domain.encoder import Encoder
from hippo_embedding.settings import EmbeddingSettings

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def load(settings: EmbeddingSettings) -> Encoder:
    """Import only the chosen backend: the onnx path never imports torch (~7 s, ~400 MB)."""
    if settings.backend == "torch":
        from hippo_embedding.adapters.torch_encoder import TorchEncoder

        return TorchEncoder(threads=settings.threads, max_tokens=settings.max_tokens)
    from hippo_embedding.adapters.onnx_encoder import OnnxEncoder

    return OnnxEncoder(threads=settings.threads, max_tokens=settings.max_tokens)
