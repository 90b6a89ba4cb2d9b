"""The embedding service through gRPC (the `Embedder` and `EmbeddingCaches` ports)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import grpc
import numpy as np

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core import client, embedding_client
from hippo_core.client import calling
from hippo_core.errors import InvalidArgument
from hippo_core.settings import ClientSettings, TlsSettings
from hippo_gateway.adapters.embedding_model import LiveModel
from hippo_gateway.domain.models import Embedding, Vectors

log = logging.getLogger(__name__)

# At most one warning this often while the live index's model is refused (every Remember
# and Recall would otherwise log one).
FALLBACK_WARN_SECONDS = 60.0


class GrpcEmbedder:
    """Learns the service's limits from Info once (`connect`), then cuts texts to what the
    model reads (it ignores the rest anyway) and splits calls at its batch limit.

    Asks for the live index's model (`live`, learnt from the retrieval service's replies).
    Where the embedding service has not loaded it (INVALID_ARGUMENT on `model`) the call
    is made once more with the default model: the retrieval service re-embeds a vector of
    another model itself, so this is slower, never wrong."""

    def __init__(self, channel: grpc.aio.Channel, live: LiveModel | None = None) -> None:
        self._stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        self._live = live or LiveModel()
        self.dimension = 0
        self._max_texts = 1
        self._max_chars = 1
        self._warned_at = -FALLBACK_WARN_SECONDS
        self._unwarned = 0  # fallbacks since the last warning

    async def connect(self, timeout: float) -> None:
        async with calling("embedding"):
            info = await self._stub.Info(
                embedding_pb2.InfoRequest(), timeout=timeout, wait_for_ready=True
            )
        self.dimension, self._max_texts, self._max_chars = (
            info.dimension,
            info.max_texts,
            info.max_chars,
        )

    async def embed(self, texts: Sequence[str]) -> Embedding:
        wanted = self._live.current
        try:
            return await self._embed(texts, wanted)
        except InvalidArgument as exc:
            if not wanted or exc.field != "model":
                raise
            self._warn_fallback(wanted, exc.problem)
            return await self._embed(texts, "")

    async def _embed(self, texts: Sequence[str], model: str) -> Embedding:
        rows: list[Vectors] = []
        for chunk in embedding_client.chunks(texts, self._max_texts, self._max_chars):
            async with calling("embedding"):
                reply = await self._stub.Embed(
                    embedding_pb2.EmbedRequest(texts=chunk, model=model),
                    timeout=client.bulk_timeout(),
                )
            # The rest by the name of the model that made the first chunk: one Embedding
            # is one model's, even where replicas differ in their default (a rollout).
            model = reply.model or model
            rows.append(embedding_client.vectors(reply))
        if not rows:
            return Embedding(np.empty((0, self.dimension), np.float32), model)
        return Embedding(np.concatenate(rows), model)

    def _warn_fallback(self, wanted: str, problem: str) -> None:
        now = time.monotonic()
        self._unwarned += 1
        if now - self._warned_at < FALLBACK_WARN_SECONDS:
            return
        log.warning(
            "embedding: the live index's model %r is not loaded there (%s); embedded with "
            "the default model instead (%d time(s) since the last warning), which the "
            "retrieval service re-embeds: load it (HIPPO_EMBEDDING_MODELS)",
            wanted,
            problem,
            self._unwarned,
        )
        self._warned_at, self._unwarned = now, 0


class GrpcEmbeddingCaches:
    """`EmbeddingCaches`: DropCache on every replica behind the embedding address (an
    `ipv4:` list, or a name resolved to all its pods), each on a channel of its own. A
    replica that is not running (UNAVAILABLE) holds no cache: an in-memory cache dies
    with its process, and a new one starts empty."""

    def __init__(
        self,
        target: str,
        settings: ClientSettings,
        tls_settings: TlsSettings | None = None,
    ) -> None:
        self._target = target
        self._settings = settings
        self._tls = tls_settings

    async def drop(self) -> int:
        async def one(channel: grpc.aio.Channel) -> int:
            stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            try:
                reply = await stub.DropCache(embedding_pb2.DropCacheRequest())
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    log.warning("embedding: a replica is down, so its cache is empty")
                    return 0
                raise client.peer_error(exc, "embedding") from exc
            return int(reply.entries_dropped)

        return sum(
            await client.each_replica(self._target, one, self._settings, tls_settings=self._tls)
        )
