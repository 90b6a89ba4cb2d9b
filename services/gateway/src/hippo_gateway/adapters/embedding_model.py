"""Which embedding model the gateway asks for: the live vector index's, as the retrieval
service last named it in a reply (Write, Search, Status carry `embedding_model`).

One object, made in __main__, shared by the retrieval client (which writes it) and the
embedder (which reads it). It is a hint only: after an online switch of the embedding
model the next reply names the new one, and until then the retrieval service re-embeds a
vector of the old model itself. Correctness never depends on it, because every vector
travels with the model the embedding service says made it.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class LiveModel:
    """`current`: the model to ask the embedding service for ("" = its default, until
    retrieval has named one)."""

    def __init__(self, current: str = "") -> None:
        self.current = current

    def learn(self, model: str) -> None:
        """A reply's `embedding_model`; an empty one (an older retrieval service, or a
        reply that names none) leaves the hint as it is."""
        if model and model != self.current:
            log.info("embedding model of the live index: %s (was %r)", model, self.current)
            self.current = model
