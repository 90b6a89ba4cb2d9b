"""Recall's query embedded in the gateway (adapters/local_query_embedder.py): only while
no other Recall is in flight, only when a probe gives the embedding service's own vector,
and only for the live index's model; through the real processes, a Recall ranks exactly
as when the service embeds."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc
import numpy as np
import pytest
from gateway_harness import GATEWAY, Cluster, gateway_process, key_of

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.testing import metric, scrape, wait_for
from hippo_encoders.onnx_encoder import OnnxEncoder
from hippo_gateway.adapters import local_query_embedder
from hippo_gateway.adapters.embedding_model import LiveModel
from hippo_gateway.adapters.local_query_embedder import LocalQueryEmbedder
from hippo_gateway.domain.models import Embedding

QUERY = "what did she say about the trip to Lisbon?"


@pytest.fixture(scope="module")
def dynamic() -> OnnxEncoder:
    return OnnxEncoder(quantization="dynamic")


class ServiceDouble:
    """The embedding service's answer, computed by a real encoder under a given name."""

    def __init__(self, encoder: OnnxEncoder, model: str | None = None) -> None:
        self.encoder, self.model = encoder, model or encoder.model
        self.calls: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> Embedding:
        self.calls.append(list(texts))
        return Embedding(self.encoder.encode(list(texts)), self.model)


async def test_a_verified_encoder_embeds_here_for_the_live_model_only(
    dynamic: OnnxEncoder,
) -> None:
    service, live = ServiceDouble(dynamic), LiveModel()
    embedder = LocalQueryEmbedder(service, live, dynamic)
    assert await embedder.verify() and embedder.local_model == dynamic.model
    service.calls.clear()
    here = await embedder.embed_query(QUERY, alone=True)
    assert service.calls == [] and here.model == dynamic.model
    np.testing.assert_array_equal(here.vectors, dynamic.encode([QUERY]))
    live.learn(dynamic.model)  # retrieval names the same model: still here
    await embedder.embed_query(QUERY, alone=True)
    assert service.calls == []
    await embedder.embed_query(QUERY, alone=False)  # other Recalls in flight: the service
    assert service.calls == [[QUERY]]
    live.learn("mpnet")  # an online switch to another model: the service embeds
    there = await embedder.embed_query(QUERY, alone=True)
    assert service.calls == [[QUERY]] * 2 and there.model == dynamic.model  # the double's
    live.learn(dynamic.model)  # and back
    await embedder.embed_query(QUERY, alone=True)
    assert len(service.calls) == 2


async def test_another_graph_of_the_same_model_is_refused_by_the_probe(
    dynamic: OnnxEncoder, caplog: pytest.LogCaptureFixture
) -> None:
    """The packaged int8 graph and its dynamic-int8 conversion are one model by name, but
    their vectors differ by ~0.016 per coordinate: queries must not mix them."""
    service = ServiceDouble(OnnxEncoder(quantization="weights"))
    embedder = LocalQueryEmbedder(service, LiveModel(), dynamic)
    with caplog.at_level(logging.INFO, "hippo_gateway.adapters.local_query_embedder"):
        assert not await embedder.verify()
    assert "vectors differ" in caplog.text and embedder.local_model == ""
    service.calls.clear()
    await embedder.embed_query(QUERY, alone=True)
    assert service.calls == [[QUERY]]


async def test_a_model_of_another_name_or_none_loaded_goes_to_the_service(
    dynamic: OnnxEncoder, caplog: pytest.LogCaptureFixture
) -> None:
    renamed = LocalQueryEmbedder(ServiceDouble(dynamic, "other-model"), LiveModel(), dynamic)
    absent = LocalQueryEmbedder(ServiceDouble(dynamic), LiveModel(), None)
    with caplog.at_level(logging.INFO, "hippo_gateway.adapters.local_query_embedder"):
        assert not await renamed.verify()
        assert not await absent.verify("not installed here")
    assert "the service's model is 'other-model'" in caplog.text
    assert "not installed here" in caplog.text


def test_the_encoder_is_built_from_the_embedding_services_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encoder, why_not = local_query_embedder.load_encoder()
    assert encoder is not None and why_not == ""
    assert encoder.model == "sentence-transformers/all-MiniLM-L6-v2"
    monkeypatch.setenv("HIPPO_EMBEDDING_BACKEND", "torch")
    encoder, why_not = local_query_embedder.load_encoder()
    assert encoder is None and "runs on torch" in why_not
    monkeypatch.setenv("HIPPO_EMBEDDING_BACKEND", "onnx")
    monkeypatch.setenv("HIPPO_EMBEDDING_MODELS", "/nonexistent/model-dir")
    encoder, why_not = local_query_embedder.load_encoder()
    assert encoder is None and "is not a directory" in why_not


def _hits(addr: str, user: str, query: str) -> list[tuple[str, float, int, float]]:
    with grpc.insecure_channel(addr) as channel:
        reply = memory_pb2_grpc.MemoryServiceStub(channel).Recall(
            memory_pb2.RecallRequest(scope=memory_pb2.Scope(user_id=user), query=query, top_k=10),
            metadata=key_of("acme"),
            timeout=10,
        )
    return [
        (h.memory.memory_id, h.fused_score, h.semantic_rank, h.semantic_score) for h in reply.hits
    ]


def test_a_recall_ranks_the_same_whichever_process_embeds_its_query(
    cluster: Cluster, stub: memory_pb2_grpc.MemoryServiceStub
) -> None:
    user = "local-query-user"
    texts = [
        "We booked three nights in Lisbon for the end of May.",
        "The flight to Portugal leaves Boston at nine.",
        "My sister thinks the Algarve beaches are better in June.",
        "I fixed the crash in the checkout form yesterday.",
        "Our cat knocked the plant off the windowsill again.",
    ]
    stub.Remember(
        memory_pb2.RememberRequest(
            scope=memory_pb2.Scope(user_id=user, session_id="s1"),
            turns=[memory_pb2.Turn(role=memory_pb2.ROLE_USER, text=t) for t in texts],
            wait_searchable=True,
        ),
        metadata=key_of("acme"),
        timeout=10,
    )
    here_before = metric(
        scrape(cluster.gateway.metrics_url), "hippo_gateway_query_embeddings_total", where="gateway"
    )
    embedded_here = _hits(cluster.gateway.addr, user, QUERY)
    samples = scrape(cluster.gateway.metrics_url)
    assert metric(samples, "hippo_gateway_query_embeddings_total", where="gateway") == (
        here_before + 1
    )
    assert "recall queries are embedded in the gateway" in cluster.gateway.log_text()
    with gateway_process(
        cluster.embedding.addr, cluster.retrieval.addr, local_query_embedding="false"
    ) as remote:
        wait_for(remote.addr, GATEWAY, timeout=60)
        embedded_there = _hits(remote.addr, user, QUERY)
        samples = scrape(remote.metrics_url)
        assert metric(samples, "hippo_gateway_query_embeddings_total", where="service") == 1
        assert metric(samples, "hippo_gateway_query_embeddings_total", where="gateway") == 0
    assert len(embedded_here) == len(texts)
    # Same ids, order and scores: the cosines too, so the query vectors were the same.
    assert embedded_here == embedded_there
    assert all(rank > 0 and cosine != 0 for _, _, rank, cosine in embedded_here)
