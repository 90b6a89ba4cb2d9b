"""UpdateMemoryMetadata through the public API: the change is stored, re-indexed
(metadata filters and the searched context follow it), audited with the keys in public
and the values in the sealed private part, and the text never changes. Refusals name the
field; another user's or tenant's memory is NOT_FOUND; the read role cannot write. Real
gateway, embedding, retrieval and audit processes."""

from __future__ import annotations

import uuid
from typing import Any

import grpc
import pytest
from gateway_harness import key_of
from google.protobuf import json_format

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.testing import eventually

Stub = memory_pb2_grpc.MemoryServiceStub
ACME = key_of("acme")


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def remember(stub: Stub, user: str, *turns: tuple[str, dict[str, str]]) -> list[str]:
    request = memory_pb2.RememberRequest(
        scope=memory_pb2.Scope(user_id=user, session_id="s1"), wait_searchable=True
    )
    for text, meta in turns:
        request.turns.add(role=memory_pb2.ROLE_USER, text=text, metadata=meta)
    return list(stub.Remember(request, metadata=ACME, timeout=15).memory_ids)


def update(
    stub: Stub,
    user: str,
    memory_id: str,
    set_: dict[str, str] | None = None,
    remove: list[str] | None = None,
    key: Any = ACME,
) -> memory_pb2.UpdateMemoryMetadataResponse:
    request = memory_pb2.UpdateMemoryMetadataRequest(
        user_id=user, memory_id=memory_id, set=set_ or {}, remove=remove or []
    )
    reply: memory_pb2.UpdateMemoryMetadataResponse = stub.UpdateMemoryMetadata(
        request, metadata=key, timeout=15
    )
    return reply


def refused(stub: Stub, code: grpc.StatusCode, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(grpc.RpcError) as err:
        update(stub, *args, **kwargs)
    assert err.value.code() == code, err.value.details()
    details: str = err.value.details()
    return details


def recall(stub: Stub, user: str, query: str, **metadata: str) -> list[str]:
    request = memory_pb2.RecallRequest(
        scope=memory_pb2.Scope(user_id=user), query=query, top_k=10, metadata=metadata
    )
    return [h.memory.memory_id for h in stub.Recall(request, metadata=ACME, timeout=15).hits]


def metadata_entries(stub: Stub, user: str) -> list[memory_pb2.AuditEntry]:
    page = stub.ListAuditEntries(
        memory_pb2.ListAuditEntriesRequest(scope=memory_pb2.Scope(user_id=user)),
        metadata=ACME,
        timeout=10,
    )
    return [e for e in page.entries if e.event_type == "metadata"]


def test_an_update_sets_and_removes_keys_and_keeps_the_text(stub: Stub) -> None:
    user = uid("upd")
    (memory_id,) = remember(stub, user, ("The boiler was serviced on Monday", {"k": "v"}))
    reply = update(stub, user, memory_id, {"category": "home", "k2": "v2"}, ["k", "absent"])

    assert dict(reply.memory.metadata) == {"category": "home", "k2": "v2"}
    assert reply.memory.text == "The boiler was serviced on Monday"
    got = stub.GetMemory(
        memory_pb2.GetMemoryRequest(user_id=user, memory_id=memory_id), metadata=ACME
    ).memory
    assert dict(got.metadata) == {"category": "home", "k2": "v2"}
    assert (got.text, got.sequence, got.time) == (
        reply.memory.text,
        reply.memory.sequence,
        reply.memory.time,
    )


def test_filters_follow_the_new_metadata(stub: Stub) -> None:
    user = uid("filter")
    first, second = remember(
        stub,
        user,
        ("Water the ferns every Sunday", {"category": "garden"}),
        ("Water the orchids every Sunday", {"category": "garden"}),
    )
    assert sorted(recall(stub, user, "water Sunday", category="garden")) == sorted([first, second])
    update(stub, user, second, {"category": "indoor"})

    def moved() -> bool | None:
        # Both indexes re-applied the turn (each within its own lag): the new value finds
        # it, the old one no longer does.
        indoor = recall(stub, user, "water Sunday", category="indoor")
        garden = recall(stub, user, "water Sunday", category="garden")
        return (indoor, garden) == ([second], [first]) or None

    eventually(moved, "the new category is searchable, the old one no longer finds it")
    listed = stub.ListMemories(
        memory_pb2.ListMemoriesRequest(
            scope=memory_pb2.Scope(user_id=user), metadata={"category": "indoor"}
        ),
        metadata=ACME,
        timeout=10,
    )
    assert [m.memory_id for m in listed.memories] == [second]


def test_the_change_is_audited_keys_in_public_values_sealed(stub: Stub) -> None:
    user = uid("audit")
    (memory_id,) = remember(stub, user, ("Pick up the parcel at the depot", {}))
    update(stub, user, memory_id, {"category": "errands"})
    update(stub, user, memory_id, {"speaker": "Maya"}, ["category"])

    entries = eventually(
        lambda: found if len(found := metadata_entries(stub, user)) == 2 else None,
        "two metadata entries",
    )
    bodies = [json_format.MessageToDict(e.body) for e in entries]
    # The values are private (sealed under the user's key; readable here, before a Forget).
    privates = [body.pop("private") for body in bodies]
    assert bodies[0] == {"set_keys": ["category"], "removed_keys": [], "reembedded": False}
    # The speaker is embedded with the text: the turn got a new vector.
    assert bodies[1] == {"set_keys": ["speaker"], "removed_keys": ["category"], "reembedded": True}
    assert privates == [{"set": {"category": "errands"}}, {"set": {"speaker": "Maya"}}]
    assert all(list(e.memory_ids) == [memory_id] for e in entries)


def test_an_update_that_changes_nothing_records_nothing(stub: Stub) -> None:
    user = uid("noop")
    (memory_id,) = remember(stub, user, ("Renew the passport in May", {"k": "v"}))
    reply = update(stub, user, memory_id, {"k": "v"}, ["absent"])
    assert dict(reply.memory.metadata) == {"k": "v"} and reply.audit_seq == 0
    update(stub, user, memory_id, {"k": "w"})  # a real change, as a barrier
    entries = eventually(lambda: metadata_entries(stub, user) or None, "the real change")
    assert len(entries) == 1


def test_bad_requests_are_refused_naming_the_field(stub: Stub) -> None:
    user = uid("bad")
    (memory_id,) = remember(stub, user, ("Call the plumber", {"k": "v"}))
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert refused(stub, invalid, user, memory_id).startswith("set: ")
    assert refused(stub, invalid, user, memory_id, {"a": "1"}, ["a"]).startswith("remove[0]: ")
    assert refused(stub, invalid, user, memory_id, {"a": "x" * 1025}).startswith("set[a]: ")
    assert refused(stub, invalid, user, memory_id, {"": "x"}).startswith("set: ")
    assert refused(stub, invalid, user, memory_id, None, ["k"] * 33).startswith("remove: ")
    assert refused(stub, invalid, "bad user", memory_id, {"a": "b"}).startswith("user_id: ")
    assert refused(stub, invalid, user, "", {"a": "b"}).startswith("memory_id: ")
    too_many = {f"key{i}": "v" for i in range(32)}
    details = refused(stub, invalid, user, memory_id, too_many)
    assert details.startswith("set: ") and "33" in details
    # Nothing of the refused requests was stored.
    got = stub.GetMemory(
        memory_pb2.GetMemoryRequest(user_id=user, memory_id=memory_id), metadata=ACME
    ).memory
    assert dict(got.metadata) == {"k": "v"}


def test_other_users_tenants_and_unknown_ids_are_not_found(cluster: Any, stub: Stub) -> None:
    user = uid("owner")
    (memory_id,) = remember(stub, user, ("My locker code is on the card", {}))
    missing = grpc.StatusCode.NOT_FOUND
    for details in (
        refused(stub, missing, uid("other"), memory_id, {"a": "b"}),
        refused(stub, missing, user, memory_id, {"a": "b"}, key=key_of("globex")),
        refused(stub, missing, user, "no-such-memory", {"a": "b"}),
    ):
        assert details.startswith("memory_id: "), details
    reader = (("x-api-key", "key-acme-reader"),)
    refused(stub, grpc.StatusCode.PERMISSION_DENIED, user, memory_id, {"a": "b"}, key=reader)
    got = stub.GetMemory(
        memory_pb2.GetMemoryRequest(user_id=user, memory_id=memory_id), metadata=ACME
    ).memory
    assert dict(got.metadata) == {}
