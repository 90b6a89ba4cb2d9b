"""A blocking client of the embedding service, for code on worker threads (the injection
service's model thread, the retrieval service's projector re-embedding turns for an index
of another model), with a deadline on every call."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core import backoff, client, errors
from hippo_core.settings import TlsSettings

Vectors = npt.NDArray[np.float32]


def chunks(texts: Sequence[str], max_texts: int, max_chars: int) -> Iterator[list[str]]:
    """The texts in calls of at most `max_texts` (the service's Info), each cut to
    `max_chars`: the model ignores the rest anyway, and the service refuses longer ones."""
    for start in range(0, len(texts), max_texts):
        yield [t[:max_chars] for t in texts[start : start + max_texts]]


def vectors(reply: embedding_pb2.EmbedResponse) -> Vectors:
    """An EmbedResponse's packed '<f4' buffer as a (count, dimension) float32 array."""
    flat = np.frombuffer(reply.vectors, dtype="<f4").astype(np.float32)
    return flat.reshape(reply.count, reply.dimension)


@dataclass(frozen=True)
class ModelInfo:
    model: str
    dimension: int


class BlockingEmbedder:
    """Embed calls on a blocking channel, each with its own deadline. A busy service's
    RESOURCE_EXHAUSTED is waited out as its RetryInfo says (a bulk job slows down rather
    than fails), up to `max_wait_s` in all; anything else raises the HippoError it means."""

    def __init__(
        self,
        addr: str,
        timeout_s: float,
        tls: TlsSettings | None = None,
        *,
        max_wait_s: float = 120.0,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        # Counted and traced like aio peers, with this service's certificate under TLS.
        self._channel = client.blocking_channel(addr, tls_settings=tls)
        self._stub = embedding_pb2_grpc.EmbeddingServiceStub(self._channel)
        self._timeout = timeout_s
        self._max_wait = max_wait_s
        self._max_texts = 0
        self._max_chars = 0

    def models(self) -> list[ModelInfo]:
        """The loaded models, the default first."""
        info = self._call(self._stub.Info, embedding_pb2.InfoRequest())
        self._max_texts, self._max_chars = info.max_texts, info.max_chars
        listed = [ModelInfo(m.model, m.dimension) for m in info.models]
        return listed or [ModelInfo(info.model, info.dimension)]

    def embed(self, texts: Sequence[str], model: str = "") -> tuple[Vectors, str]:
        """(len(texts) x dimension float32 unit rows, the model that made them)."""
        if not self._max_texts:
            self.models()
        rows: list[Vectors] = []
        used = model
        for chunk in chunks(texts, self._max_texts, self._max_chars):
            reply = self._call(
                self._stub.Embed, embedding_pb2.EmbedRequest(texts=chunk, model=model)
            )
            rows.append(vectors(reply))
            used = reply.model
        if not rows:
            return np.zeros((0, 0), dtype=np.float32), used
        return np.concatenate(rows), used

    def _call(self, method: Callable[..., Any], request: Any) -> Any:
        waited, failures = 0.0, 0
        while True:
            try:
                return method(request, timeout=self._timeout)
            except grpc.RpcError as exc:
                error = client.peer_error(exc, "embedding")  # type: ignore[arg-type,unused-ignore]
                if not isinstance(error, errors.ResourceExhausted):
                    raise error from exc
                failures += 1
                pause = max(
                    error.retry_after or 0.0,
                    backoff.delay(failures, 0.1, 5.0, random.uniform(0.8, 1.2)),
                )
                if waited + pause > self._max_wait:
                    raise error from exc
                time.sleep(pause)
                waited += pause

    def close(self) -> None:
        self._channel.close()
