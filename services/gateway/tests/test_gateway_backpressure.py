"""Backpressure end to end: a saturated embedding service refuses at once with
RESOURCE_EXHAUSTED and a RetryInfo, and the gateway passes both on to its caller
(never DEADLINE_EXCEEDED, INTERNAL or UNAVAILABLE); a refused Remember stores nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from gateway_harness import EMBEDDING, GATEWAY, Cluster, gateway_process, key_of
from google.rpc import error_details_pb2, status_pb2

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.testing import ServiceProcess, service_process, wait_for


@pytest.fixture(scope="module")
def small_queue(cluster: Cluster) -> Iterator[ServiceProcess]:
    """An embedding service that holds at most 8 queued texts, and a gateway on it."""
    env = {"HIPPO_EMBEDDING_MAX_QUEUED_TEXTS": "8", "HIPPO_EMBEDDING_MAX_BATCH": "4"}
    with service_process("hippo_embedding", "HIPPO_EMBEDDING_", env) as embedding:
        wait_for(embedding.addr, EMBEDDING, timeout=120)
        with gateway_process(embedding.addr, cluster.retrieval.addr) as gateway:
            wait_for(gateway.addr, GATEWAY, timeout=60)
            yield gateway


def _retry_delay(err: grpc.RpcError) -> float | None:
    raw = dict(err.trailing_metadata() or ()).get("grpc-status-details-bin")  # type: ignore[attr-defined]
    if raw is None:
        return None
    status = status_pb2.Status.FromString(raw)
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.ToNanoseconds() / 1e9
    return None


def test_a_saturated_embedder_is_resource_exhausted_with_retry_info_through_the_gateway(
    small_queue: ServiceProcess,
) -> None:
    run = uuid.uuid4().hex[:8]
    with grpc.insecure_channel(small_queue.addr) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)

        def remember(n: int) -> tuple[str, grpc.StatusCode, float | None]:
            user = f"bp-{run}-{n}"
            turns = [
                memory_pb2.Turn(role=memory_pb2.ROLE_USER, text=f"walrus {run} {n} note {i}")
                for i in range(8)
            ]
            request = memory_pb2.RememberRequest(
                scope=memory_pb2.Scope(user_id=user, session_id="s"), turns=turns
            )
            try:
                stub.Remember(request, metadata=key_of("acme"), timeout=30)
            except grpc.RpcError as err:
                return user, err.code(), _retry_delay(err)  # type: ignore[attr-defined]
            return user, grpc.StatusCode.OK, None

        with ThreadPoolExecutor(24) as pool:
            results = list(pool.map(remember, range(48)))
        codes = {code for _, code, _ in results}
        assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
        refused = [(user, delay) for user, code, delay in results if code != grpc.StatusCode.OK]
        assert refused and len(refused) < len(results), codes
        assert all(delay is not None and 0 < delay <= 5 for _, delay in refused), refused
        for user, _ in refused[:5]:  # nothing of a refused Remember was stored
            recall = memory_pb2.RecallRequest(
                scope=memory_pb2.Scope(user_id=user),
                query=f"walrus {run}",
                mode=memory_pb2.RECALL_MODE_LEXICAL,
            )
            assert not stub.Recall(recall, metadata=key_of("acme"), timeout=30).hits


def test_a_batch_slower_than_the_hop_deadline_lands_within_the_callers_deadline(
    cluster: Cluster,
) -> None:
    """A full batch on a slow embedder (here: the per-hop default cut to 0.1 s) gets most
    of what the caller allows, not the hop's default: a slow embedder must slow a bulk
    load down, never make each try miss its deadline."""
    run = uuid.uuid4().hex[:8]
    long_text = " ".join(f"word{i} of a long turn about otters {run}" for i in range(60))
    with gateway_process(
        cluster.embedding.addr, cluster.retrieval.addr, client__timeout_seconds="0.1"
    ) as gateway:
        wait_for(gateway.addr, GATEWAY, timeout=60)
        with grpc.insecure_channel(gateway.addr) as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            turns = [
                memory_pb2.Turn(role=memory_pb2.ROLE_USER, text=f"{i} {long_text}")
                for i in range(64)
            ]
            request = memory_pb2.RememberRequest(
                scope=memory_pb2.Scope(user_id=f"slow-{run}", session_id="s"), turns=turns
            )
            reply = stub.Remember(request, metadata=key_of("acme"), timeout=60)
    assert reply.created == 64
