"""ListMemories, GetMemory, ListSessions and ListUsers through the public API: pages and
their edges, filters, page tokens bound to their request, tenancy and roles, and the
audit entry of a read. Real gateway, embedding, retrieval and audit processes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
import pytest
from gateway_harness import key_of
from google.protobuf import json_format

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.testing import eventually

T = TypeVar("T")
Stub = memory_pb2_grpc.MemoryServiceStub
T0 = 1_700_000_000  # seconds
NEWEST = memory_pb2.LIST_ORDER_NEWEST_FIRST
OLDEST = memory_pb2.LIST_ORDER_OLDEST_FIRST


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def turn(text: str, role: int = memory_pb2.ROLE_USER, at: int | None = None) -> memory_pb2.Turn:
    out = memory_pb2.Turn(role=role, text=text)
    if at is not None:
        out.time.FromSeconds(at)
    return out


def remember(
    stub: Stub, user: str, session: str, turns: Sequence[memory_pb2.Turn], tenant: str = "acme"
) -> list[str]:
    reply = stub.Remember(
        memory_pb2.RememberRequest(
            scope=memory_pb2.Scope(user_id=user, session_id=session), turns=list(turns)
        ),
        metadata=key_of(tenant),
        timeout=15,
    )
    return list(reply.memory_ids)


def list_all(
    stub: Stub, tenant: str = "acme", **request: Any
) -> tuple[list[list[str]], list[memory_pb2.MemoryRecord]]:
    """Every page of a listing: (each page's memory ids, all records in order)."""
    pages: list[list[str]] = []
    records: list[memory_pb2.MemoryRecord] = []
    message = memory_pb2.ListMemoriesRequest(**request)
    while True:
        reply = stub.ListMemories(message, metadata=key_of(tenant), timeout=10)
        pages.append([m.memory_id for m in reply.memories])
        records += reply.memories
        if not reply.next_page_token:
            return pages, records
        message.page_token = reply.next_page_token


def refused(call: Callable[..., Any], request: Any, tenant: str = "acme") -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call(request, metadata=key_of(tenant), timeout=10)
    return err.value


@pytest.fixture(scope="module")
def user_data(cluster: Any) -> dict[str, Any]:
    """One user of acme: 7 turns of one request in s1 (one receive time, so the page
    boundaries below fall inside a run of equal times) and 3 timed turns in s2."""
    with grpc.insecure_channel(cluster.gateway.addr) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        user = uid("lister")
        roles = [memory_pb2.ROLE_USER, memory_pb2.ROLE_ASSISTANT]
        burst = remember(stub, user, "s1", [turn(f"burst {i}", roles[i % 2]) for i in range(7)])
        timed = remember(
            stub,
            user,
            "s2",
            [turn(f"timed {i}", memory_pb2.ROLE_SYSTEM, at=T0 + 100 * i) for i in range(3)],
        )
        return {"user": user, "burst": burst, "timed": timed}


def test_pages_cover_everything_once_in_either_order(stub: Stub, user_data: dict[str, Any]) -> None:
    user = user_data["user"]
    scope = memory_pb2.Scope(user_id=user)
    # The timed turns are older (2023) than the burst (received now); the burst's turns
    # share one time and keep their arrival order.
    oldest = user_data["timed"] + user_data["burst"]
    for size in (1, 3, 4, 7, 9):
        pages, records = list_all(stub, scope=scope, order=OLDEST, page_size=size)
        assert [i for p in pages for i in p] == oldest, size
        assert all(len(p) == size for p in pages[:-1]) and 1 <= len(pages[-1]) <= size
        pages, _ = list_all(stub, scope=scope, order=NEWEST, page_size=size)
        assert [i for p in pages for i in p] == oldest[::-1], size
    # Unspecified = newest first; exactly one page has no next token.
    reply = stub.ListMemories(
        memory_pb2.ListMemoriesRequest(scope=scope, page_size=10), metadata=key_of("acme")
    )
    assert [m.memory_id for m in reply.memories] == oldest[::-1]
    assert reply.next_page_token == ""
    first = records[0]
    assert first.scope.session_id == "s2" and first.text == "timed 0" and first.sequence == 1


def test_page_size_default_and_coercion(stub: Stub, user_data: dict[str, Any]) -> None:
    scope = memory_pb2.Scope(user_id=user_data["user"])
    for size in (0, 1000, 5000, 2**31 - 1):  # 0 = 50, more than 1000 = 1000: all ten
        reply = stub.ListMemories(
            memory_pb2.ListMemoriesRequest(scope=scope, page_size=size), metadata=key_of("acme")
        )
        assert len(reply.memories) == 10 and not reply.next_page_token
    err = refused(stub.ListMemories, memory_pb2.ListMemoriesRequest(scope=scope, page_size=-1))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_size" in err.details()


def test_a_user_without_memories_lists_nothing(stub: Stub) -> None:
    reply = stub.ListMemories(
        memory_pb2.ListMemoriesRequest(scope=memory_pb2.Scope(user_id=uid("nobody"))),
        metadata=key_of("acme"),
    )
    assert list(reply.memories) == [] and reply.next_page_token == ""
    sessions = stub.ListSessions(
        memory_pb2.ListSessionsRequest(user_id=uid("nobody")), metadata=key_of("acme")
    )
    assert list(sessions.sessions) == [] and sessions.next_page_token == ""


def test_filters(stub: Stub, user_data: dict[str, Any]) -> None:
    user, burst, timed = user_data["user"], user_data["burst"], user_data["timed"]

    def ids(session: str = "", **request: Any) -> list[str]:
        _, records = list_all(
            stub,
            scope=memory_pb2.Scope(user_id=user, session_id=session),
            order=OLDEST,
            page_size=2,
            **request,
        )
        return [m.memory_id for m in records]

    assert ids("s2") == timed
    assert ids("s1") == burst
    assert ids("s3") == []
    window = memory_pb2.TimeRange()
    window.start.FromSeconds(T0 + 100)
    window.end.FromSeconds(T0 + 200)
    assert ids(time_range=window) == [timed[1]]
    since = memory_pb2.TimeRange()
    since.start.FromSeconds(T0 + 100)
    assert ids(time_range=since) == timed[1:] + burst
    assert ids(roles=[memory_pb2.ROLE_ASSISTANT]) == burst[1::2]
    assert ids(roles=[memory_pb2.ROLE_SYSTEM, memory_pb2.ROLE_USER]) == timed + burst[0::2]
    assert ids("s1", roles=[memory_pb2.ROLE_SYSTEM]) == []
    bad = [
        (
            memory_pb2.ListMemoriesRequest(scope=memory_pb2.Scope(user_id=user), roles=[0]),
            "roles[0]",
        ),
        (memory_pb2.ListMemoriesRequest(), "scope.user_id"),
        (
            memory_pb2.ListMemoriesRequest(
                scope=memory_pb2.Scope(user_id=user),
                time_range=memory_pb2.TimeRange(start=window.end, end=window.start),
            ),
            "time_range",
        ),
        (
            memory_pb2.ListMemoriesRequest(scope=memory_pb2.Scope(user_id=user), roles=[1] * 5),
            "roles",
        ),
    ]
    for request, field in bad:
        err = refused(stub.ListMemories, request)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.details(), field


def test_page_tokens_are_bound_to_their_request(stub: Stub, user_data: dict[str, Any]) -> None:
    user = user_data["user"]
    first = stub.ListMemories(
        memory_pb2.ListMemoriesRequest(scope=memory_pb2.Scope(user_id=user), page_size=2),
        metadata=key_of("acme"),
    )
    token = first.next_page_token
    assert token
    uses = {
        "another user": memory_pb2.ListMemoriesRequest(
            scope=memory_pb2.Scope(user_id=uid("other")), page_token=token
        ),
        "another session": memory_pb2.ListMemoriesRequest(
            scope=memory_pb2.Scope(user_id=user, session_id="s1"), page_token=token
        ),
        "another order": memory_pb2.ListMemoriesRequest(
            scope=memory_pb2.Scope(user_id=user), order=OLDEST, page_token=token
        ),
        "another filter": memory_pb2.ListMemoriesRequest(
            scope=memory_pb2.Scope(user_id=user), roles=[memory_pb2.ROLE_USER], page_token=token
        ),
    }
    for what, request in uses.items():
        err = refused(stub.ListMemories, request)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, what
        assert err.details().startswith("page_token"), what
    # The same user id under another tenant's key: refused, not paged.
    same = memory_pb2.ListMemoriesRequest(scope=memory_pb2.Scope(user_id=user), page_token=token)
    err = refused(stub.ListMemories, same, tenant="globex")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in err.details()
    # A sessions token is no memories token; garbage and forged tokens are refused.
    sessions = stub.ListSessions(
        memory_pb2.ListSessionsRequest(user_id=user, page_size=1), metadata=key_of("acme")
    )
    for bad in (sessions.next_page_token, "garbage", "v1.e30", "v1." + "A" * 2000, token + "x"):
        err = refused(
            stub.ListMemories,
            memory_pb2.ListMemoriesRequest(scope=memory_pb2.Scope(user_id=user), page_token=bad),
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in err.details()
    # Page size may change between pages.
    rest = stub.ListMemories(
        memory_pb2.ListMemoriesRequest(
            scope=memory_pb2.Scope(user_id=user), page_size=100, page_token=token
        ),
        metadata=key_of("acme"),
    )
    assert len(rest.memories) == 8 and not rest.next_page_token


def test_another_tenant_sees_nothing(stub: Stub, user_data: dict[str, Any]) -> None:
    user = user_data["user"]
    reply = stub.ListMemories(
        memory_pb2.ListMemoriesRequest(scope=memory_pb2.Scope(user_id=user)),
        metadata=key_of("globex"),
    )
    assert list(reply.memories) == []
    sessions = stub.ListSessions(
        memory_pb2.ListSessionsRequest(user_id=user), metadata=key_of("globex")
    )
    assert list(sessions.sessions) == []
    users: list[str] = []
    request = memory_pb2.ListUsersRequest(page_size=1000)
    while True:
        page = stub.ListUsers(request, metadata=key_of("globex"), timeout=10)
        users += [u.user_id for u in page.users]
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert user not in users
    err = refused(
        stub.GetMemory,
        memory_pb2.GetMemoryRequest(user_id=user, memory_id=user_data["burst"][0]),
        tenant="globex",
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND


def test_get_memory(stub: Stub, user_data: dict[str, Any]) -> None:
    user, wanted = user_data["user"], user_data["timed"][2]
    reply = stub.GetMemory(
        memory_pb2.GetMemoryRequest(user_id=user, memory_id=wanted), metadata=key_of("acme")
    )
    assert reply.memory.memory_id == wanted and reply.memory.text == "timed 2"
    assert reply.memory.time.seconds == T0 + 200 and reply.memory.scope.session_id == "s2"
    absent = [
        memory_pb2.GetMemoryRequest(user_id=uid("other"), memory_id=wanted),  # another user's
        memory_pb2.GetMemoryRequest(user_id=user, memory_id="no-such-memory"),
    ]
    for request in absent:
        err = refused(stub.GetMemory, request)
        assert err.code() == grpc.StatusCode.NOT_FOUND and "memory_id" in err.details()
    for request, field in [
        (memory_pb2.GetMemoryRequest(memory_id=wanted), "user_id"),
        (memory_pb2.GetMemoryRequest(user_id=user), "memory_id"),
        (memory_pb2.GetMemoryRequest(user_id=user, memory_id="x" * 129), "memory_id"),
    ]:
        err = refused(stub.GetMemory, request)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.details()


def test_list_sessions_counts_and_pages(stub: Stub, user_data: dict[str, Any]) -> None:
    user = user_data["user"]
    first = stub.ListSessions(
        memory_pb2.ListSessionsRequest(user_id=user, page_size=1), metadata=key_of("acme")
    )
    assert [(s.session_id, s.turn_count) for s in first.sessions] == [("s1", 7)]
    assert first.next_page_token
    second = stub.ListSessions(
        memory_pb2.ListSessionsRequest(user_id=user, page_size=1, page_token=first.next_page_token),
        metadata=key_of("acme"),
    )
    [s2] = second.sessions
    assert (s2.session_id, s2.turn_count) == ("s2", 3) and not second.next_page_token
    assert (s2.first_time.seconds, s2.last_time.seconds) == (T0, T0 + 200)
    s1 = first.sessions[0]
    assert s1.first_time == s1.last_time  # one request's turns: one receive time
    # This cluster keeps no bounded sessions (no summariser): no state, version 0.
    assert (s1.summary_version, s2.summary_version) == (0, 0)
    err = refused(
        stub.ListSessions,
        memory_pb2.ListSessionsRequest(user_id=uid("other"), page_token=first.next_page_token),
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in err.details()
    err = refused(stub.ListSessions, memory_pb2.ListSessionsRequest())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "user_id" in err.details()


def test_list_users_counts_and_pages(stub: Stub, user_data: dict[str, Any]) -> None:
    seen: dict[str, memory_pb2.UserInfo] = {}
    request = memory_pb2.ListUsersRequest(page_size=2)
    pages = 0
    while True:
        page = stub.ListUsers(request, metadata=key_of("acme"), timeout=10)
        pages += 1
        assert len(page.users) <= 2
        for u in page.users:
            assert u.user_id not in seen  # no repeats across pages
            seen[u.user_id] = u
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert list(seen) == sorted(seen)
    mine = seen[user_data["user"]]
    assert (mine.turn_count, mine.session_count) == (10, 2)
    assert mine.first_time.seconds == T0
    err = refused(stub.ListUsers, memory_pb2.ListUsersRequest(page_token="v1.x"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in err.details()


def test_the_read_role_is_needed(cluster: Any, user_data: dict[str, Any]) -> None:
    user = user_data["user"]
    calls = [
        ("ListMemories", memory_pb2.ListMemoriesRequest(scope=memory_pb2.Scope(user_id=user))),
        ("GetMemory", memory_pb2.GetMemoryRequest(user_id=user, memory_id=user_data["burst"][0])),
        ("ListSessions", memory_pb2.ListSessionsRequest(user_id=user)),
        ("ListUsers", memory_pb2.ListUsersRequest()),
    ]
    with grpc.insecure_channel(cluster.gateway.addr) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        for name, request in calls:
            call = getattr(stub, name)
            call(request, metadata=(("x-api-key", "key-acme-reader"),), timeout=10)
            with pytest.raises(grpc.RpcError) as err:
                call(request, metadata=(("x-api-key", "key-acme-auditor"),), timeout=10)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
            with pytest.raises(grpc.RpcError) as err:
                call(request, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, name


def test_reads_of_memories_are_audited(stub: Stub) -> None:
    user = uid("audited")
    ids = remember(stub, user, "s1", [turn("read me"), turn("and me")])
    stub.ListMemories(
        memory_pb2.ListMemoriesRequest(
            scope=memory_pb2.Scope(user_id=user), roles=[memory_pb2.ROLE_USER]
        ),
        metadata=key_of("acme"),
    )
    stub.GetMemory(
        memory_pb2.GetMemoryRequest(user_id=user, memory_id=ids[1]), metadata=key_of("acme")
    )

    def reads() -> list[memory_pb2.AuditEntry] | None:
        page = stub.ListAuditEntries(
            memory_pb2.ListAuditEntriesRequest(scope=memory_pb2.Scope(user_id=user)),
            metadata=key_of("acme"),
            timeout=10,
        )
        found = [e for e in page.entries if e.event_type == "read"]
        return found if len(found) == 2 else None

    listed, got = eventually(reads, "two read entries")
    assert list(listed.memory_ids) == ids[::-1] and list(got.memory_ids) == [ids[1]]
    listed_body, got_body = (json_format.MessageToDict(e.body) for e in (listed, got))
    assert listed_body["rpc"] == "ListMemories" and listed_body["roles"] == ["user"]
    assert listed_body["order"] == "newest_first" and listed_body["returned"] == 2
    assert got_body == {"rpc": "GetMemory", "returned": 1}
