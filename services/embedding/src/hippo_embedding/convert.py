"""Pure conversions between protobuf messages and domain values."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hippo.embedding.v1 import embedding_pb2
from hippo_embedding.domain.encoder import Encoder
from hippo_embedding.domain.service import Embedded
from hippo_embedding.settings import EmbeddingSettings

VECTOR_ENCODING = "float32-le-row-major"


def embed_response(result: Embedded) -> embedding_pb2.EmbedResponse:
    count, dimension = result.vectors.shape
    return embedding_pb2.EmbedResponse(
        vectors=np.ascontiguousarray(result.vectors, dtype="<f4").tobytes(),
        count=count,
        dimension=dimension,
        model=result.model,
        cached=result.cached,
    )


def model_info(encoder: Encoder) -> embedding_pb2.ModelInfo:
    return embedding_pb2.ModelInfo(
        model=encoder.model,
        dimension=encoder.dimension,
        backend=encoder.backend,
        max_tokens=encoder.max_tokens,
    )


def info_response(
    encoders: Sequence[Encoder], settings: EmbeddingSettings
) -> embedding_pb2.InfoResponse:
    """The top-level fields describe the default model (the first); `models` lists all."""
    default = encoders[0]
    return embedding_pb2.InfoResponse(
        model=default.model,
        dimension=default.dimension,
        backend=default.backend,
        normalized=True,
        vector_encoding=VECTOR_ENCODING,
        max_texts=settings.max_texts,
        max_chars=settings.max_chars,
        max_batch=settings.max_batch,
        max_tokens=default.max_tokens,
        models=[model_info(encoder) for encoder in encoders],
    )
