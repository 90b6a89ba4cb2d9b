"""Metadata filters on Recall and ListMemories through the public API: equality on
declared keys (all pairs must hold), undeclared keys refused naming the key, page tokens
bound to the filter, tenancy. Real gateway, embedding, retrieval and audit processes, with
the retrieval service's default filter keys (speaker, agent_id, run_id, app_id, source,
category)."""

from __future__ import annotations

import uuid

import grpc
import pytest
from gateway_harness import Cluster, key_of

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.testing import eventually

Stub = memory_pb2_grpc.MemoryServiceStub

TURNS = [
    ("Book the table by the window for Friday", {"agent_id": "concierge", "speaker": "Maya"}),
    ("The table is booked for Friday at eight", {"agent_id": "concierge", "speaker": "Bot"}),
    ("Friday's lesson covers the table of elements", {"agent_id": "tutor", "speaker": "Bot"}),
    ("Friday table notes without an agent", {"topic": "concierge"}),
]


@pytest.fixture(scope="module")
def stored(cluster: Cluster) -> tuple[str, list[str]]:
    user = f"meta-{uuid.uuid4().hex[:8]}"
    with grpc.insecure_channel(cluster.gateway.addr) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        request = memory_pb2.RememberRequest(
            scope=memory_pb2.Scope(user_id=user, session_id="s1"), wait_searchable=True
        )
        for text, meta in TURNS:
            request.turns.add(role=memory_pb2.ROLE_USER, text=text, metadata=meta)
        ids = list(stub.Remember(request, metadata=key_of("acme"), timeout=15).memory_ids)
    return user, ids


def recall(stub: Stub, user: str, tenant: str = "acme", **metadata: str) -> list[str]:
    request = memory_pb2.RecallRequest(
        scope=memory_pb2.Scope(user_id=user), query="Friday table", top_k=10, metadata=metadata
    )
    return [
        h.memory.memory_id for h in stub.Recall(request, metadata=key_of(tenant), timeout=15).hits
    ]


def listing(stub: Stub, user: str, **metadata: str) -> list[str]:
    request = memory_pb2.ListMemoriesRequest(
        scope=memory_pb2.Scope(user_id=user),
        order=memory_pb2.LIST_ORDER_OLDEST_FIRST,
        metadata=metadata,
    )
    return [
        m.memory_id
        for m in stub.ListMemories(request, metadata=key_of("acme"), timeout=10).memories
    ]


def test_recall_and_list_keep_only_memories_with_every_pair(
    stub: Stub, stored: tuple[str, list[str]]
) -> None:
    user, ids = stored
    eventually(lambda: len(recall(stub, user)) == 4 or None, "all four searchable")
    for search in (recall, listing):
        assert set(search(stub, user, agent_id="concierge")) == set(ids[:2]), search
        assert search(stub, user, agent_id="concierge", speaker="Bot") == [ids[1]], search
        assert search(stub, user, agent_id="tutor", speaker="Maya") == [], search
        assert search(stub, user, agent_id="Concierge") == [], search  # exact
        assert set(search(stub, user, speaker="Bot")) == {ids[1], ids[2]}, search
    assert listing(stub, user, agent_id="concierge") == ids[:2]  # in order


def test_an_undeclared_key_is_refused_naming_it(stub: Stub, stored: tuple[str, list[str]]) -> None:
    user, _ = stored
    for call in (recall, listing):
        with pytest.raises(grpc.RpcError) as caught:
            call(stub, user, topic="concierge")
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = caught.value.details() or ""
        assert "metadata[topic]" in details and "agent_id" in details, details
    with pytest.raises(grpc.RpcError) as caught:
        recall(stub, user, **{f"k{i}": "v" for i in range(9)})
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 8" in (caught.value.details() or "")


def test_a_page_token_is_bound_to_its_filter(stub: Stub, stored: tuple[str, list[str]]) -> None:
    user, ids = stored
    request = memory_pb2.ListMemoriesRequest(
        scope=memory_pb2.Scope(user_id=user), page_size=1, metadata={"agent_id": "concierge"}
    )
    first = stub.ListMemories(request, metadata=key_of("acme"), timeout=10)
    assert first.next_page_token and len(first.memories) == 1
    request.page_token = first.next_page_token
    second = stub.ListMemories(request, metadata=key_of("acme"), timeout=10)
    assert {first.memories[0].memory_id, second.memories[0].memory_id} == set(ids[:2])
    request.metadata["agent_id"] = "tutor"
    with pytest.raises(grpc.RpcError) as caught:
        stub.ListMemories(request, metadata=key_of("acme"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "page_token" in (caught.value.details() or "")


def test_another_tenant_finds_nothing_with_the_same_filter(
    stub: Stub, stored: tuple[str, list[str]]
) -> None:
    user, _ = stored
    assert recall(stub, user, tenant="globex", agent_id="concierge") == []
