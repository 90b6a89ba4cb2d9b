"""API-key roles, ambiguous credentials and per-tenant quotas: the domain rules, then the
same rules through a real gateway (RESOURCE_EXHAUSTED carries RetryInfo and QuotaFailure,
a refused Remember stores nothing, VerifyAudit answers for the caller's tenant)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest
from gateway_harness import Cluster, gateway_process
from google.rpc import error_details_pb2, status_pb2

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.errors import PermissionDenied, ResourceExhausted, Unauthenticated
from hippo_core.testing import ServiceProcess, wait_for
from hippo_gateway.domain.auth import REQUIRED, Authenticator, KeyGrant
from hippo_gateway.domain.quota import Quotas, TenantQuota

GATEWAY = "hippo.memory.v1.MemoryService"

# -- the domain ---------------------------------------------------------------------------


def test_a_plain_key_is_an_application_key_without_audit_reads() -> None:
    auth = Authenticator({"k": "acme"})
    for rpc in ("Remember", "Recall", "Forget", "BuildContext", "Chat", "GetSession"):
        assert auth.caller([("x-api-key", "k")], rpc).tenant == "acme"
    for rpc in ("ListAuditEntries", "VerifyAudit"):
        with pytest.raises(PermissionDenied, match="audit-read"):
            auth.caller([("x-api-key", "k")], rpc)


def test_each_role_allows_exactly_its_rpcs() -> None:
    roles = ("read", "write", "erase", "audit-read")
    auth = Authenticator({role: KeyGrant("acme", (role,)) for role in roles})
    for rpc, needed in REQUIRED.items():
        for role in roles:
            allowed = set(needed) <= {role}
            if allowed:
                assert auth.caller([("x-api-key", role)], rpc).tenant == "acme"
            else:
                with pytest.raises(PermissionDenied):
                    auth.caller([("x-api-key", role)], rpc)
    admin = Authenticator({"a": KeyGrant("acme", ("admin",))})
    for rpc in (*REQUIRED, "SomeFutureRpc"):
        assert admin.caller([("x-api-key", "a")], rpc).admin
    # An RPC nobody listed is refused to everyone but admins (fails closed).
    with pytest.raises(PermissionDenied):
        Authenticator({"k": KeyGrant("acme", roles)}).caller([("x-api-key", "k")], "Other")


def test_two_credentials_are_refused_even_when_both_are_valid() -> None:
    auth = Authenticator({"a": "acme", "b": "globex"})
    for metadata in (
        [("x-api-key", "a"), ("x-api-key", "b")],
        [("x-api-key", "a"), ("x-api-key", "a")],
        [("x-api-key", "a"), ("authorization", "Bearer b")],
        [("authorization", "Bearer a"), ("authorization", "Bearer a")],
    ):
        with pytest.raises(Unauthenticated) as refused:
            auth.caller(metadata, "Recall")
        assert refused.value.reason == "AMBIGUOUS_CREDENTIALS"


def test_bad_grants_are_refused_at_start() -> None:
    with pytest.raises(ValueError, match="unknown roles"):
        Authenticator({"k": KeyGrant("acme", ("root",))})
    with pytest.raises(ValueError, match="no roles"):
        Authenticator({"k": KeyGrant("acme", ())})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_request_rate_is_a_token_bucket_per_tenant() -> None:
    clock = Clock()
    quotas = Quotas(
        {"acme": TenantQuota(requests_per_second=2, burst=3)}, TenantQuota(), clock=clock
    )
    for _ in range(3):
        quotas.admit("acme")
    with pytest.raises(ResourceExhausted) as refused:
        quotas.admit("acme")
    assert refused.value.reason == "RATE_LIMITED"
    assert refused.value.retry_after == pytest.approx(0.5)
    assert refused.value.quota is not None and refused.value.quota[0] == "tenant:acme"
    for _ in range(50):
        quotas.admit("globex")  # the default quota: unlimited
    clock.now += 0.5  # one token back
    quotas.admit("acme")
    with pytest.raises(ResourceExhausted):
        quotas.admit("acme")


def test_stored_turns_are_counted_from_the_store_and_by_this_replica() -> None:
    clock, reads = Clock(), []

    async def count(tenant: str) -> int:
        reads.append(tenant)
        return 8

    quotas = Quotas(
        {}, TenantQuota(max_stored_turns=10), count_turns=count, refresh_seconds=5, clock=clock
    )

    async def scenario() -> None:
        await quotas.admit_turns("acme", 2)  # 8 + 2 = 10: allowed
        quotas.stored("acme", 2)
        with pytest.raises(ResourceExhausted) as refused:
            await quotas.admit_turns("acme", 1)  # 10 + 1, from the cache
        assert refused.value.retry_after is None  # waiting frees nothing
        assert refused.value.reason == "QUOTA_EXCEEDED"
        assert reads == ["acme"]
        quotas.stored("acme", -5)  # a Forget
        await quotas.admit_turns("acme", 3)
        clock.now += 5  # refreshed: the store says 8 again
        await quotas.admit_turns("acme", 2)
        assert reads == ["acme", "acme"]

    asyncio.run(scenario())


# -- through a gateway --------------------------------------------------------------------

QUOTAS = {
    "rated": {"requests_per_second": 1, "burst": 2},
    "quotas": {"max_stored_turns": 3},
}


@pytest.fixture(scope="module")
def limited(cluster: Cluster) -> Iterator[ServiceProcess]:
    """A second gateway on the same peers, with quotas."""
    with gateway_process(
        cluster.embedding.addr,
        cluster.retrieval.addr,
        cluster.audit.addr,
        quotas=json.dumps(QUOTAS),
        quota_refresh_seconds="0.2",
    ) as proc:
        wait_for(proc.addr, GATEWAY, timeout=60)
        yield proc


def _details(error: grpc.RpcError) -> list[object]:
    raw = dict(error.trailing_metadata() or ()).get("grpc-status-details-bin")
    assert raw, "no rich status details"
    status = status_pb2.Status.FromString(raw)
    found: list[object] = []
    for item in status.details:
        for kind in (
            error_details_pb2.RetryInfo,
            error_details_pb2.QuotaFailure,
            error_details_pb2.ErrorInfo,
        ):
            if item.Is(kind.DESCRIPTOR):
                message = kind()
                item.Unpack(message)
                found.append(message)
    return found


def _md(key: str) -> tuple[tuple[str, str], ...]:
    return (("x-api-key", key),)


def _remember(user: str, *texts: str) -> memory_pb2.RememberRequest:
    return memory_pb2.RememberRequest(
        scope=memory_pb2.Scope(user_id=user, session_id="s1"),
        turns=[memory_pb2.Turn(role=memory_pb2.ROLE_USER, text=t) for t in texts],
        wait_searchable=True,
    )


def _recall(user: str, query: str) -> memory_pb2.RecallRequest:
    return memory_pb2.RecallRequest(
        scope=memory_pb2.Scope(user_id=user), query=query, mode=memory_pb2.RECALL_MODE_LEXICAL
    )


def test_roles_through_the_gateway(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    stub.Remember(_remember(user, "the reader may read this zebra"), metadata=_md("key-acme-app"))
    with pytest.raises(grpc.RpcError) as refused:
        stub.Remember(_remember(user, "no"), metadata=_md("key-acme-reader"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "write" in (refused.value.details() or "")
    hits = stub.Recall(_recall(user, "zebra"), metadata=_md("key-acme-reader")).hits
    assert [h.memory.text for h in hits] == ["the reader may read this zebra"]
    forget = memory_pb2.ForgetRequest(user_id=user)
    for key in ("key-acme-reader", "key-acme-auditor"):
        with pytest.raises(grpc.RpcError) as refused:
            stub.Forget(forget, metadata=_md(key))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    listing = memory_pb2.ListAuditEntriesRequest(scope=memory_pb2.Scope(user_id=user))
    with pytest.raises(grpc.RpcError) as refused:
        stub.ListAuditEntries(listing, metadata=_md("key-acme-app"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    stub.ListAuditEntries(listing, metadata=_md("key-acme-auditor"))
    # Nothing was erased by the refused Forgets.
    assert len(stub.Recall(_recall(user, "zebra"), metadata=_md("key-acme-app")).hits) == 1


def test_two_api_keys_in_one_call_are_unauthenticated(
    stub: memory_pb2_grpc.MemoryServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        stub.Recall(
            _recall("u", "x"), metadata=(("x-api-key", "key-acme"), ("x-api-key", "key-globex"))
        )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "exactly one" in (refused.value.details() or "")


def test_verify_audit_answers_for_the_callers_tenant(
    stub: memory_pb2_grpc.MemoryServiceStub,
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    stub.Remember(_remember(user, "audited"), metadata=_md("key-acme-app"))
    stub.Remember(_remember(user, "audited too"), metadata=_md("key-globex-app"))
    listing = memory_pb2.ListAuditEntriesRequest(scope=memory_pb2.Scope(user_id=user))
    for _ in range(100):  # the entries reach the log from the spool, in the background
        delivered = [
            stub.ListAuditEntries(listing, metadata=_md(key)).entries
            for key in ("key-acme", "key-globex")
        ]
        if all(delivered):
            break
        time.sleep(0.1)
    request = memory_pb2.VerifyAuditRequest()
    admin = stub.VerifyAudit(request, metadata=_md("key-acme"))
    acme = stub.VerifyAudit(request, metadata=_md("key-acme-auditor"))
    assert admin.ok and acme.ok
    assert 0 < acme.entries_checked < admin.entries_checked
    assert 0 < acme.head_seq <= admin.head_seq and acme.head_hash
    listed = stub.ListAuditEntries(
        memory_pb2.ListAuditEntriesRequest(scope=memory_pb2.Scope(user_id=user), page_size=1000),
        metadata=_md("key-acme-auditor"),
    )
    # The tenant's head is its own last entry, never another tenant's.
    assert listed.entries and acme.head_seq >= max(e.seq for e in listed.entries)


def test_over_the_request_rate_is_resource_exhausted_with_retry_info(
    limited: ServiceProcess,
) -> None:
    with grpc.insecure_channel(limited.addr) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        key = _md("key-rated")
        codes = []
        for _ in range(6):
            try:
                stub.Recall(_recall("u", "anything"), metadata=key)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as error:
                codes.append(error.code())
                last = error
        assert codes[:2] == [grpc.StatusCode.OK] * 2
        assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
        details = _details(last)
        retry = next(d for d in details if isinstance(d, error_details_pb2.RetryInfo))
        assert 0 < retry.retry_delay.ToTimedelta().total_seconds() <= 1.0
        quota = next(d for d in details if isinstance(d, error_details_pb2.QuotaFailure))
        assert quota.violations[0].subject == "tenant:rated"
        # Another tenant is not slowed by this one's limit.
        acme = _md("key-acme")
        for _ in range(6):
            stub.Recall(_recall("u", "anything"), metadata=acme)


def test_over_the_stored_turns_quota_nothing_is_stored(limited: ServiceProcess) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    key = _md("key-quotas")
    with grpc.insecure_channel(limited.addr) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        stub.Remember(_remember(user, "one kiwi", "two kiwis"), metadata=key)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Remember(_remember(user, "three kiwis", "four kiwis"), metadata=key)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = _details(refused.value)
        assert not any(isinstance(d, error_details_pb2.RetryInfo) for d in details)
        quota = next(d for d in details if isinstance(d, error_details_pb2.QuotaFailure))
        assert "max_stored_turns=3" in quota.violations[0].description
        hits = stub.Recall(_recall(user, "kiwis"), metadata=key).hits
        assert sorted(h.memory.text for h in hits) == ["one kiwi", "two kiwis"]
        stub.Remember(_remember(user, "three kiwis"), metadata=key)  # exactly 3: allowed
        stub.Forget(memory_pb2.ForgetRequest(user_id=user), metadata=key)
        stub.Remember(_remember(user, "after forgetting"), metadata=key)
