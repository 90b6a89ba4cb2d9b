"""`hippo reindex` and `hippo health` against an in-process double of the retrieval
service (the real one: tests/test_cluster.py). What is checked is the CLI's side of an
online embedding-model switch: the request it sends, what it prints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_cli.main import cli
from hippo_cli.registry import SERVICES


class FakeRetrieval(retrieval_pb2_grpc.RetrievalServiceServicer):
    def __init__(self) -> None:
        self.requests: list[retrieval_pb2.ReindexRequest] = []

    def Status(self, request, context):  # type: ignore[no-untyped-def]
        return retrieval_pb2.StatusResponse(
            turns=4,
            embedding_model="model-a",
            generation=3,
            vectors_outside_graph=12,
            rebuilding=True,
            lexical_backend="qdrant",
            vector_backend="qdrant",
        )

    def Reindex(self, request, context):  # type: ignore[no-untyped-def]
        self.requests.append(request)
        model = request.embedding_model or "model-a"
        embedded = 4 if request.embedding_model else 0
        half = retrieval_pb2.ReindexResponse(
            applied=2, embedded=embedded // 2, embedding_model=model
        )
        yield half
        yield retrieval_pb2.ReindexResponse(
            applied=4, embedded=embedded, done=True, embedding_model=model
        )


@pytest.fixture
def retrieval(tmp_path: Path) -> Iterator[tuple[FakeRetrieval, dict[str, str]]]:
    fake = FakeRetrieval()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(fake, server)
    checks = health.HealthServicer()
    for spec in SERVICES:  # every service "answers" here, so `health` reaches them all
        checks.set(spec.full_name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    addr = f"127.0.0.1:{port}"
    env = {f"HIPPO_CLI_{spec.name.upper()}_ADDR": addr for spec in SERVICES}
    env["HIPPO_CLI_DATA_DIR"] = str(tmp_path)  # no recorded `hippo up` endpoints
    yield fake, env
    server.stop(None)


def test_reindex_without_a_model_asks_for_none(retrieval) -> None:  # type: ignore[no-untyped-def]
    fake, env = retrieval
    result = CliRunner().invoke(cli, ["reindex"], env=env)
    assert result.exit_code == 0, result.output
    assert fake.requests == [retrieval_pb2.ReindexRequest()]
    assert "4 changes applied; the new indexes are live" in result.stdout
    assert "re-embedded" not in result.stdout


def test_reindex_with_a_model_sends_it_and_reports_the_live_model(retrieval) -> None:  # type: ignore[no-untyped-def]
    fake, env = retrieval
    result = CliRunner().invoke(cli, ["reindex", "--embedding-model", "model-b"], env=env)
    assert result.exit_code == 0, result.output
    assert fake.requests == [retrieval_pb2.ReindexRequest(embedding_model="model-b")]
    assert "4 turns re-embedded" in result.stdout
    assert "the new indexes are live (embedding model model-b)" in result.stdout


def test_reindex_refuses_an_empty_model_name_before_calling(retrieval) -> None:  # type: ignore[no-untyped-def]
    fake, env = retrieval
    result = CliRunner().invoke(cli, ["reindex", "--embedding-model", " "], env=env)
    assert result.exit_code == 2 and "--embedding-model" in result.output
    assert fake.requests == []


def test_health_shows_the_live_model_and_generation_of_retrieval(retrieval) -> None:  # type: ignore[no-untyped-def]
    _, env = retrieval
    table = CliRunner().invoke(cli, ["health"], env=env)
    assert table.exit_code == 0, table.output
    (line,) = [x for x in table.stdout.splitlines() if x.startswith("retrieval")]
    assert line.endswith(
        "SERVING  qdrant+qdrant, model model-a, generation 3, 12 vectors outside the graph, "
        "rebuilding"
    )
    as_json = CliRunner().invoke(cli, ["health", "--json"], env=env)
    report = json.loads(as_json.stdout)
    assert report["retrieval"][0] | {"addr": ""} == {
        "addr": "",
        "status": "SERVING",
        "embedding_model": "model-a",
        "generation": 3,
        "vectors_outside_graph": 12,
        "rebuilding": 1,
        "indexes": "qdrant+qdrant",
    }
    assert set(report["gateway"][0]) == {"addr", "status"}  # only retrieval has an index
