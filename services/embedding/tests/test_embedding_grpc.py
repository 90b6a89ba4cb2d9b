"""The embedding service through real gRPC, in its own process, with the real model."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from embedding_harness import FULL_NAME
from google.rpc import error_details_pb2, status_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core.testing import ServiceProcess, metric, scrape

EmbedStub = embedding_pb2_grpc.EmbeddingServiceStub


def _vectors(reply: embedding_pb2.EmbedResponse) -> np.ndarray:
    return np.frombuffer(reply.vectors, "<f4").reshape(reply.count, reply.dimension)


def test_embed_returns_unit_vectors_in_order(stub: EmbedStub) -> None:
    texts = ["The cat sat on the mat.", "A feline rested on the rug.", "Quarterly tax filing"]
    reply = stub.Embed(embedding_pb2.EmbedRequest(texts=texts), timeout=10)
    vectors = _vectors(reply)
    assert reply.model == "sentence-transformers/all-MiniLM-L6-v2" and reply.dimension == 384
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2  # paraphrase beats unrelated


def test_repeated_text_is_answered_from_cache(stub: EmbedStub) -> None:
    text = f"cache probe {time.time_ns()}"
    first = stub.Embed(embedding_pb2.EmbedRequest(texts=[text]), timeout=10)
    second = stub.Embed(
        embedding_pb2.EmbedRequest(texts=[text, "another new one " + text]), timeout=10
    )
    assert first.cached == 0 and second.cached == 1
    np.testing.assert_array_equal(_vectors(first)[0], _vectors(second)[0])


def test_drop_cache_forgets_every_text_it_had_seen(stub: EmbedStub) -> None:
    """After DropCache no text answers as cached (a Forget relies on it: `cached` would
    otherwise tell that erased text was embedded), and the vectors stay the same."""
    text = f"forgotten sentence {time.time_ns()}"
    first = stub.Embed(embedding_pb2.EmbedRequest(texts=[text]), timeout=10)
    assert stub.Embed(embedding_pb2.EmbedRequest(texts=[text]), timeout=10).cached == 1
    dropped = stub.DropCache(embedding_pb2.DropCacheRequest(), timeout=10)
    assert dropped.entries_dropped >= 1
    again = stub.Embed(embedding_pb2.EmbedRequest(texts=[text]), timeout=10)
    assert again.cached == 0
    np.testing.assert_allclose(_vectors(again)[0], _vectors(first)[0], atol=1e-6)
    assert stub.DropCache(embedding_pb2.DropCacheRequest(), timeout=10).entries_dropped == 1


def _field_violation(err: grpc.RpcError) -> str:
    raw = dict(err.trailing_metadata() or ())["grpc-status-details-bin"]  # type: ignore[attr-defined]
    bad = error_details_pb2.BadRequest()
    for detail in status_pb2.Status.FromString(raw).details:
        if detail.Unpack(bad):
            return str(bad.field_violations[0].field)
    raise AssertionError("no BadRequest detail")


@pytest.mark.parametrize(
    ("texts", "field", "fragment"),
    [
        ([], "texts", "at least 1 text"),
        (["x"] * 257, "texts", "at most 256 texts per call, got 257"),
        (["ok", "y" * 8193], "texts[1]", "at most 8192 characters, got 8193"),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field(
    stub: EmbedStub, texts: list[str], field: str, fragment: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.Embed(embedding_pb2.EmbedRequest(texts=texts), timeout=10)
    err = caught.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert err.details().startswith(f"{field}: ") and fragment in err.details()  # type: ignore[attr-defined]
    assert _field_violation(err) == field


def test_lone_surrogate_on_the_wire_is_invalid_argument(server: ServiceProcess) -> None:
    """Python refuses to encode a lone surrogate, so send the bytes other clients would."""
    good = embedding_pb2.EmbedRequest(texts=["fine"]).SerializeToString()
    raw = good + b"\x0a\x05ab\xed\xa0\x80"  # texts[1] = "ab" + U+D800 as 3 bytes
    with grpc.insecure_channel(server.addr) as channel:
        call = channel.unary_unary(f"/{FULL_NAME}/Embed")
        with pytest.raises(grpc.RpcError) as caught:
            call(raw, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert caught.value.details().startswith("texts[1]: is not valid UTF-8")  # type: ignore[attr-defined]


def test_concurrent_calls_are_micro_batched(stub: EmbedStub, server: ServiceProcess) -> None:
    before = scrape(server.metrics_url)
    texts = [f"concurrent request {i} at {time.time_ns()}" for i in range(48)]
    with ThreadPoolExecutor(16) as pool:
        replies = list(
            pool.map(lambda t: stub.Embed(embedding_pb2.EmbedRequest(texts=[t]), timeout=30), texts)
        )
    after = scrape(server.metrics_url)
    assert all(r.count == 1 for r in replies)
    calls = metric(after, "hippo_embedding_batch_requests_count") - metric(
        before, "hippo_embedding_batch_requests_count"
    )
    requests = metric(after, "hippo_embedding_batch_requests_sum") - metric(
        before, "hippo_embedding_batch_requests_sum"
    )
    assert requests == len(texts)
    assert calls < requests  # some model calls served several requests
    # And each still got its own text's vector.
    solo = _vectors(stub.Embed(embedding_pb2.EmbedRequest(texts=[texts[5]]), timeout=10))
    np.testing.assert_allclose(_vectors(replies[5]), solo, atol=2e-3)


def test_deadline_shorter_than_the_work_stops_the_work(
    stub: EmbedStub, server: ServiceProcess
) -> None:
    stamp = time.time_ns()
    texts = [f"{i} {stamp} " + "a long sentence about many things " * 40 for i in range(256)]
    before = scrape(server.metrics_url)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Embed(embedding_pb2.EmbedRequest(texts=texts), timeout=0.3)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
    # The chunk already on the model (64 texts of 256 word pieces, seconds) finishes;
    # the rest of the request must then be dropped, not encoded.
    end = time.monotonic() + 30
    while True:
        after = scrape(server.metrics_url)
        if metric(after, "hippo_embedding_queue_texts") == 0 or time.monotonic() > end:
            break
        time.sleep(0.2)
    dropped = metric(after, "hippo_embedding_texts_dropped_total") - metric(
        before, "hippo_embedding_texts_dropped_total"
    )
    encoded = metric(after, "hippo_embedding_texts_total", source="model") - metric(
        before, "hippo_embedding_texts_total", source="model"
    )
    assert dropped > 0 and encoded < len(texts) and dropped + encoded == len(texts)
    assert metric(after, "hippo_embedding_queue_texts") == 0
    handled = metric(
        after, "grpc_server_handled_total", grpc_method="Embed", grpc_code="DEADLINE_EXCEEDED"
    )
    assert handled >= 1


def test_info_describes_model_and_limits(stub: EmbedStub) -> None:
    info = stub.Info(embedding_pb2.InfoRequest(), timeout=5)
    assert (info.dimension, info.backend, info.max_texts, info.max_batch) == (384, "onnx", 256, 64)
    assert info.vector_encoding == "float32-le-row-major" and info.normalized
    (only,) = info.models  # one model by default, the one the top-level fields describe
    assert (only.model, only.dimension, only.backend, only.max_tokens) == (
        info.model,
        384,
        "onnx",
        256,
    )


def test_standard_grpc_metrics_are_exported(stub: EmbedStub, server: ServiceProcess) -> None:
    stub.Info(embedding_pb2.InfoRequest(), timeout=5)
    samples = scrape(server.metrics_url)
    labels = {"grpc_service": FULL_NAME, "grpc_method": "Info", "grpc_type": "unary"}
    assert metric(samples, "grpc_server_handled_total", grpc_code="OK", **labels) >= 1
    assert metric(samples, "grpc_server_handling_seconds_count", **labels) >= 1
    assert metric(samples, "grpc_server_started_total", **labels) >= 1


def test_reflection_lists_the_services(server: ServiceProcess) -> None:
    with grpc.insecure_channel(server.addr) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (reply,) = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    names = {s.name for s in reply.list_services_response.service}
    assert {FULL_NAME, "grpc.health.v1.Health"} <= names


def test_logs_are_json_lines_with_request_ids(stub: EmbedStub, server: ServiceProcess) -> None:
    import json

    with pytest.raises(grpc.RpcError):
        stub.Embed(
            embedding_pb2.EmbedRequest(texts=[]),
            timeout=5,
            metadata=(("x-request-id", "log-probe-1"),),
        )
    time.sleep(0.2)
    lines = [json.loads(line) for line in server.log_text().splitlines() if line.startswith("{")]
    assert lines and all("timestamp" in line and "level" in line for line in lines)
    (entry,) = [line for line in lines if line.get("request_id") == "log-probe-1"]
    assert (
        entry["code"] == "INVALID_ARGUMENT"
        and entry["service"] == "embedding"
        and entry["trace_id"]
    )
