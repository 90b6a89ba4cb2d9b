"""The gateway follows the live index's embedding model: the retrieval client learns it
from replies, the embedder asks for it and falls back to the default model where the
embedding service has not loaded it. Unit level: doubles of the generated stubs' calls
(the real services answer in test_gateway_api.py)."""

from __future__ import annotations

import logging
from typing import Any
from unittest.mock import MagicMock

import grpc
import numpy as np
import pytest

from hippo.embedding.v1 import embedding_pb2
from hippo.retrieval.v1 import retrieval_pb2
from hippo_core.errors import InvalidArgument
from hippo_gateway.adapters import embedding_client
from hippo_gateway.adapters.embedding_client import GrpcEmbedder
from hippo_gateway.adapters.embedding_model import LiveModel
from hippo_gateway.adapters.retrieval_client import GrpcTurnStore
from hippo_gateway.domain.models import Mode, RecallQuery, Role, TurnToStore

DEFAULT = "sentence-transformers/all-MiniLM-L6-v2"


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class FakeEmbeddingStub:
    """Answers Embed as a service with `loaded` models would (the first the default)."""

    def __init__(self, loaded: tuple[str, ...] = (DEFAULT,)) -> None:
        self.loaded = loaded
        self.refusal = ""  # set: every call is INVALID_ARGUMENT with these details
        self.requests: list[embedding_pb2.EmbedRequest] = []

    async def Embed(self, request: embedding_pb2.EmbedRequest, **_: Any) -> Any:
        self.requests.append(request)
        if self.refusal:
            raise rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.refusal)
        name = request.model or self.loaded[0]
        if name not in self.loaded:
            raise rpc_error(grpc.StatusCode.INVALID_ARGUMENT, f"model: no model {name!r} is loaded")
        rows = np.full((len(request.texts), 2), 0.5, "<f4")
        return embedding_pb2.EmbedResponse(
            vectors=rows.tobytes(), count=len(request.texts), dimension=2, model=name
        )


def embedder(stub: FakeEmbeddingStub, live: LiveModel, max_texts: int = 8) -> GrpcEmbedder:
    out = GrpcEmbedder(MagicMock(), live)  # no channel: the stub is replaced
    out._stub = stub
    out.dimension, out._max_texts, out._max_chars = 2, max_texts, 100
    return out


def test_live_model_follows_named_models_and_ignores_empty_ones() -> None:
    live = LiveModel()
    assert live.current == ""  # the embedding service's default until retrieval names one
    live.learn("model-a")
    live.learn("")  # a reply naming none (an older retrieval service) changes nothing
    assert live.current == "model-a"
    live.learn("model-b")
    assert live.current == "model-b"


async def test_the_embedder_asks_for_the_live_model_and_reports_the_one_used() -> None:
    stub, live = FakeEmbeddingStub((DEFAULT, "model-b")), LiveModel()
    emb = embedder(stub, live)
    first = await emb.embed(["a"])
    assert (stub.requests[-1].model, first.model) == ("", DEFAULT)
    live.learn("model-b")
    second = await emb.embed(["a", "b"])
    assert stub.requests[-1].model == "model-b" and second.model == "model-b"
    assert second.vectors.shape == (2, 2)


async def test_a_model_not_loaded_falls_back_to_the_default_once_and_warns_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The vector's model is the one EmbedResponse named (the default here), never the
    hint: the retrieval service then re-embeds it with its index's model."""
    stub = FakeEmbeddingStub((DEFAULT,))
    emb = embedder(stub, LiveModel("model-b"))
    with caplog.at_level(logging.WARNING, logger=embedding_client.__name__):
        got = await emb.embed(["a"])
        again = await emb.embed(["b"])
    assert got.model == again.model == DEFAULT
    assert [r.model for r in stub.requests] == ["model-b", "", "model-b", ""]
    warnings = [r for r in caplog.records if "'model-b' is not loaded" in r.getMessage()]
    assert len(warnings) == 1  # once per FALLBACK_WARN_SECONDS, not per call


async def test_other_refusals_are_not_retried() -> None:
    stub = FakeEmbeddingStub((DEFAULT,))
    stub.refusal = "texts: at most 256 texts, got 300"
    with pytest.raises(InvalidArgument, match="texts: at most"):
        await embedder(stub, LiveModel("model-b")).embed(["a"])
    stub.refusal = "model: no model '' is loaded"  # the default itself: nothing to fall to
    with pytest.raises(InvalidArgument, match="model: no model"):
        await embedder(stub, LiveModel()).embed(["a"])
    assert [r.model for r in stub.requests] == ["model-b", ""]


async def test_a_split_call_embeds_every_chunk_with_the_first_chunks_model() -> None:
    """One Embedding is one model's: after the first chunk the rest name its model, so a
    replica with another default cannot mix models into one call."""
    stub = FakeEmbeddingStub((DEFAULT, "model-b"))
    got = await embedder(stub, LiveModel(), max_texts=2).embed(["a", "b", "c", "d", "e"])
    assert [r.model for r in stub.requests] == ["", DEFAULT, DEFAULT]
    assert got.model == DEFAULT and got.vectors.shape == (5, 2)


class FakeRetrievalStub:
    def __init__(self) -> None:
        self.model = "model-b"
        self.requests: list[Any] = []

    async def Write(self, request: retrieval_pb2.WriteRequest, **_: Any) -> Any:
        self.requests.append(request)
        return retrieval_pb2.WriteResponse(embedding_model=self.model)

    async def Search(self, request: retrieval_pb2.SearchRequest, **_: Any) -> Any:
        self.requests.append(request)
        return retrieval_pb2.SearchResponse(embedding_model=self.model)

    async def Status(self, request: retrieval_pb2.StatusRequest, **_: Any) -> Any:
        return retrieval_pb2.StatusResponse(embedding_model=self.model, tenant_turns=3)


async def test_the_turn_store_sends_vector_models_and_learns_the_live_model() -> None:
    stub, live = FakeRetrievalStub(), LiveModel()
    store = GrpcTurnStore(MagicMock(), live)
    store._stub = stub
    turn = TurnToStore(
        "m1", "u", "s", Role.USER, "x", 1, "", {}, np.zeros(2, np.float32), vector_model="a"
    )
    await store.write("t", [turn])
    assert stub.requests[-1].turns[0].vector_model == "a" and live.current == "model-b"
    stub.model = "model-c"
    query = RecallQuery(user="u", query="q", mode=Mode.HYBRID)
    await store.search("t", query, np.zeros(2, np.float32), "model-b")
    assert stub.requests[-1].vector_model == "model-b" and live.current == "model-c"
    stub.model = ""  # a reply that names no model keeps what was learnt
    await store.search("t", query, None)
    assert stub.requests[-1].vector_model == "" and live.current == "model-c"
    stub.model = "model-d"
    assert await store.tenant_turns("t") == 3 and live.current == "model-d"
