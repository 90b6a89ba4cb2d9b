"""Pure conversions between protobuf messages and domain values."""

from __future__ import annotations

import numpy as np

from hippo.embedding.v1 import embedding_pb2
from hippo_embedding.domain.encoder import Encoder
from hippo_embedding.domain.service import Embedded
from hippo_embedding.settings import EmbeddingSettings

VECTOR_ENCODING = "float32-le-row-major"


def embed_response(result: Embedded, model: str) -> embedding_pb2.EmbedResponse:
    count, dimension = result.vectors.shape
    return embedding_pb2.EmbedResponse(
        vectors=np.ascontiguousarray(result.vectors, dtype="<f4").tobytes(),
        count=count,
        dimension=dimension,
        model=model,
        cached=result.cached,
    )


def info_response(encoder: Encoder, settings: EmbeddingSettings) -> embedding_pb2.InfoResponse:
    return embedding_pb2.InfoResponse(
        model=encoder.model,
        dimension=encoder.dimension,
        backend=encoder.backend,
        normalized=True,
        vector_encoding=VECTOR_ENCODING,
        max_texts=settings.max_texts,
        max_chars=settings.max_chars,
        max_batch=settings.max_batch,
        max_tokens=settings.max_tokens,
    )


def vectors(response: embedding_pb2.EmbedResponse) -> np.ndarray:
    """The client side: the packed buffer as a (count, dimension) float32 array."""
    flat = np.frombuffer(response.vectors, dtype="<f4")
    return flat.reshape(response.count, response.dimension)
