"""Recall's query embedded inside the gateway (the `QueryEmbedder` port), where the
embedding service's default model can run here too.

A hybrid Recall embeds one short query: ~3.3 ms in the model, and around it one more
gRPC hop, the gateway's client call plus the embedding service's server, event loop and
batcher (bench/profile_recall.py). So when the gateway serves one Recall alone, its query's
model runs here and the hop is gone; under load, and for Remember's turns, the embedding
service embeds, which refuses at once what it cannot embed in time.

Vectors of one model are compared with each other, so the query's vector must be the one
the service would give. The encoder is built from the embedding service's own settings
(`HIPPO_EMBEDDING_*`: `hippo up` gives every process the same environment) by the
encoders library's loader (libs/encoders, which the embedding service serves), nothing
copied, and is used only after a probe: one
sentence embedded here and by the service must come back under the same model name with
the same vector (within PROBE_TOLERANCE). Where the probe fails, the library is not
installed (the gateway's container image), the model needs torch, or the live
index is of another model (an online switch), the query goes to the service as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from hippo_gateway import metrics
from hippo_gateway.adapters.embedding_model import LiveModel
from hippo_gateway.domain.models import Embedding, Vectors
from hippo_gateway.domain.ports import Embedder

log = logging.getLogger(__name__)

PROBE_TEXT = "Hippo checks that the gateway embeds a query as the embedding service does."
# The largest difference allowed in one coordinate of the probe's unit vector. The same
# graph gives the same bits (measured: 0.0); the packaged int8 graph of the same model
# against its dynamic-int8 conversion differs by ~0.016, which must be refused.
PROBE_TOLERANCE = 1e-4


class QueryEncoder(Protocol):
    """What the gateway needs of an encoder (hippo_encoders; blocking)."""

    @property
    def model(self) -> str: ...

    def encode(self, texts: Sequence[str]) -> Vectors: ...


def load_encoder() -> tuple[QueryEncoder | None, str]:
    """The embedding service's default model loaded here, or None and why not. Blocking
    (~0.4 s for the built-in model): run it off the event loop."""
    try:
        from hippo_encoders.loading import load_spec
        from hippo_encoders.settings import EncoderSettings
    except ImportError:
        return None, "the encoders library (hippo-encoders) is not installed here"
    try:
        settings = EncoderSettings()
        spec = settings.model_specs()[0]
        torch = spec.layout == "sentence-transformers" or (
            spec.layout == "builtin" and settings.backend == "torch"
        )
        if torch:  # ~7 s and ~400 MB to import: not worth it for the query alone
            return None, f"its default model {spec.name} runs on torch"
        encoder: QueryEncoder = load_spec(spec, settings)
        return encoder, ""
    except Exception as exc:  # a setting this host cannot honour: the service embeds
        return None, f"its settings do not load here ({type(exc).__name__}: {exc})"


class LocalQueryEmbedder:
    """The `QueryEmbedder` port: a query the gateway serves alone is embedded here, on the
    event loop, while `encoder` is verified and the live index is of its model; every
    other query goes through `remote` (the embedding service).

    Why only alone, and why on the loop (bench/load.py, 10k turns, three runs; figures in
    docs/embedding.md): on a thread of its own the model cost more CPU per Recall than the
    hop it saved (the GIL passed between the model's thread and the gRPC loop), and run on
    the loop it blocks the gateway's admission, so under overload refusals came late (33%
    goodput, DEADLINE_EXCEEDED instead of RESOURCE_EXHAUSTED). With no other Recall in
    flight there is nobody to block: the hop is simply saved."""

    def __init__(self, remote: Embedder, live: LiveModel, encoder: QueryEncoder | None) -> None:
        self._remote = remote
        self._live = live
        self._candidate = encoder
        self._encoder: QueryEncoder | None = None  # set by verify()

    @property
    def local_model(self) -> str:
        """The model embedded here ("": every query goes to the service)."""
        return self._encoder.model if self._encoder is not None else ""

    async def verify(self, why_not: str = "") -> bool:
        """Probe the candidate against the service (an Embed call, so after the service
        answers Info). Logs which way queries go, and why."""
        encoder = self._candidate
        if encoder is not None:
            remote = await self._remote.embed([PROBE_TEXT])
            here = await asyncio.to_thread(encoder.encode, [PROBE_TEXT])
            difference = float(np.abs(here[0] - remote.vectors[0]).max())
            if remote.model != encoder.model:
                why_not = f"the service's model is {remote.model!r}, this one {encoder.model!r}"
            elif difference > PROBE_TOLERANCE:
                why_not = (
                    f"its vectors differ from the service's by up to {difference:.4f} "
                    "(different HIPPO_EMBEDDING_* settings here?)"
                )
            else:
                self._encoder = encoder
                log.info("recall queries are embedded in the gateway (%s)", encoder.model)
                return True
        log.info("recall queries are embedded by the embedding service: %s", why_not)
        return False

    async def embed_query(self, text: str, *, alone: bool) -> Embedding:
        encoder = self._encoder
        if encoder is None or not alone or self._live.current not in ("", encoder.model):
            metrics.QUERY_EMBEDDINGS.labels("service").inc()
            return await self._remote.embed([text])
        metrics.QUERY_EMBEDDINGS.labels("gateway").inc()
        return Embedding(encoder.encode([text]), encoder.model)
