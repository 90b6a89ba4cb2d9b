"""The embedding service (the `Embedder` port), for indexes of another model than a
turn's stored vector: `hippo_core.embedding_client`, which waits out a busy
service's RetryInfo, so a rebuild slows down under load instead of failing."""

from __future__ import annotations

from collections.abc import Sequence

from hippo_core.embedding_client import BlockingEmbedder
from hippo_core.errors import FailedPrecondition, InvalidArgument
from hippo_core.settings import TlsSettings
from hippo_retrieval.domain.models import EmbeddingModel, Vector


class GrpcEmbedder:
    def __init__(self, addr: str, timeout_s: float, tls: TlsSettings | None = None) -> None:
        self._client = BlockingEmbedder(addr, timeout_s, tls)

    def models(self) -> list[EmbeddingModel]:
        return [EmbeddingModel(m.model, m.dimension) for m in self._client.models()]

    def embed(self, texts: Sequence[str], model: str) -> Vector:
        try:
            vectors, used = self._client.embed(texts, model)
        except InvalidArgument as exc:
            if exc.field != "model":
                raise
            # The projector retries and logs this until it is fixed: say how.
            raise FailedPrecondition(
                f"the index holds vectors of {model!r}, which the embedding service has not "
                "loaded: add it to HIPPO_EMBEDDING_MODELS, or on a fresh install with "
                "another embedder set HIPPO_RETRIEVAL_EMBEDDING_MODEL and "
                "HIPPO_RETRIEVAL_DIMENSION to that embedder's (docs/recall.md)",
                reason="EMBEDDING_MODEL",
            ) from exc
        if used != model:
            raise ValueError(f"the embedding service answered with {used!r}, not {model!r}")
        return vectors

    def close(self) -> None:
        self._client.close()
