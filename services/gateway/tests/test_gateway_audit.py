"""The audit log through the public API: what Remember, Recall and Forget record, the audit
RPCs (VerifyAudit, ListAuditEntries, ReportOutcome), the spool across an audit outage and
fail-closed mode. Real gateway, embedding, retrieval and audit processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from gateway_harness import (
    AUDIT,
    GATEWAY,
    RETRIEVAL,
    Cluster,
    audit_process,
    gateway_process,
    key_of,
    retrieval_process,
)
from google.protobuf import json_format

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.listen import reserve_port
from hippo_core.testing import ServiceProcess, eventually, metric, scrape, wait_for

T = TypeVar("T")
Stub = memory_pb2_grpc.MemoryServiceStub


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def remember(
    stub: Stub, tenant: str, user: str, texts: list[str], session: str = "s1"
) -> list[str]:
    reply = stub.Remember(
        memory_pb2.RememberRequest(
            scope=memory_pb2.Scope(user_id=user, session_id=session),
            turns=[memory_pb2.Turn(role=memory_pb2.ROLE_USER, text=t) for t in texts],
            wait_searchable=True,
        ),
        metadata=key_of(tenant),
        timeout=15,
    )
    return list(reply.memory_ids)


def recall(stub: Stub, tenant: str, user: str, query: str) -> memory_pb2.RecallResponse:
    reply: memory_pb2.RecallResponse = stub.Recall(
        memory_pb2.RecallRequest(scope=memory_pb2.Scope(user_id=user), query=query),
        metadata=key_of(tenant),
        timeout=15,
    )
    return reply


def entries(stub: Stub, tenant: str, user: str, session: str = "") -> list[memory_pb2.AuditEntry]:
    out: list[memory_pb2.AuditEntry] = []
    token = ""
    while True:
        page = stub.ListAuditEntries(
            memory_pb2.ListAuditEntriesRequest(
                scope=memory_pb2.Scope(user_id=user, session_id=session), page_token=token
            ),
            metadata=key_of(tenant),
            timeout=10,
        )
        out.extend(page.entries)
        if not page.next_page_token:
            return out
        token = page.next_page_token


def of_type(found: list[memory_pb2.AuditEntry], kind: str) -> list[memory_pb2.AuditEntry]:
    return [e for e in found if e.event_type == kind]


def body(entry: memory_pb2.AuditEntry) -> dict[str, object]:
    out: dict[str, object] = json_format.MessageToDict(entry.body)
    return out


def code_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details() or ""


def test_remember_recall_and_forget_are_recorded_without_user_text(
    cluster: Cluster, stub: Stub
) -> None:
    user = uid("audited")
    secret = f"zanzibar{uuid.uuid4().hex[:6]}"
    texts = [f"my locker code is {secret}", "I like green tea"]
    ids = remember(stub, "acme", user, texts)
    hits = recall(stub, "acme", user, f"what is the {secret} locker code?").hits
    assert hits and hits[0].memory.memory_id == ids[0]

    def both() -> list[memory_pb2.AuditEntry] | None:
        found = entries(stub, "acme", user)
        return found if of_type(found, "recall") and of_type(found, "remember") else None

    found = eventually(both, "remember and recall entries")
    [stored] = of_type(found, "remember")
    assert list(stored.memory_ids) == ids and body(stored)["turns"] == 2
    assert stored.session_id == "s1" and stored.actor == "gateway"
    [recalled] = of_type(found, "recall")
    assert list(recalled.memory_ids) == [h.memory.memory_id for h in hits]
    rb = body(recalled)
    assert rb["mode"] == "hybrid" and rb["candidates"]["lexical"] >= 1  # type: ignore[index]
    first = rb["hits"][0]  # type: ignore[index]
    assert first["memory_id"] == ids[0] and first["rank"] == 1
    assert first["fused_score"] == pytest.approx(hits[0].fused_score, abs=1e-6)
    assert first["lexical_rank"] == hits[0].lexical_rank
    fingerprint = rb["private"]["query_fingerprint"]  # type: ignore[index]
    assert len(fingerprint) == 32
    everything = json.dumps([json_format.MessageToDict(e) for e in found])
    assert secret not in everything and "green tea" not in everything

    assert (
        stub.Forget(
            memory_pb2.ForgetRequest(user_id=user), metadata=key_of("acme"), timeout=15
        ).memories_deleted
        == 2
    )

    def erased() -> list[memory_pb2.AuditEntry] | None:
        found = entries(stub, "acme", user)
        return found if of_type(found, "erase") else None

    found = eventually(erased, "the erasure of the user's key")
    [forgot] = of_type(found, "forget")
    assert body(forgot)["memories_deleted"] == 2 and body(forgot)["target"] == "user"
    assert sorted(forgot.memory_ids) == sorted(ids)
    assert body(of_type(found, "recall")[0])["private"] == "erased"
    verdict = stub.VerifyAudit(memory_pb2.VerifyAuditRequest(), metadata=key_of("acme"), timeout=30)
    assert verdict.ok and verdict.entries_checked == verdict.head_seq and verdict.head_seq > 0


def test_audit_reads_are_confined_to_the_tenant_and_pages_to_their_scope(
    cluster: Cluster, stub: Stub
) -> None:
    user = uid("pager")
    for i in range(3):
        remember(stub, "acme", user, [f"note number {i}"], session=f"s{i}")
    eventually(lambda: True if len(entries(stub, "acme", user)) == 3 else None, "3 entries")
    assert entries(stub, "globex", user) == []  # same user id, another tenant
    assert [e.session_id for e in entries(stub, "acme", user, "s1")] == ["s1"]
    request = memory_pb2.ListAuditEntriesRequest(scope=memory_pb2.Scope(user_id=user), page_size=2)
    page = stub.ListAuditEntries(request, metadata=key_of("acme"), timeout=10)
    assert len(page.entries) == 2 and page.next_page_token
    assert page.entries[0].seq < page.entries[1].seq
    rest = stub.ListAuditEntries(
        memory_pb2.ListAuditEntriesRequest(
            scope=memory_pb2.Scope(user_id=user), page_size=2, page_token=page.next_page_token
        ),
        metadata=key_of("acme"),
        timeout=10,
    )
    assert len(rest.entries) == 1 and not rest.next_page_token
    assert rest.entries[0].seq > page.entries[1].seq
    for tenant, scope, token, field in [
        ("acme", memory_pb2.Scope(user_id="someone-else"), page.next_page_token, "page_token"),
        ("globex", memory_pb2.Scope(user_id=user), page.next_page_token, "page_token"),
        ("acme", memory_pb2.Scope(user_id=user), "v1.garbage", "page_token"),
        ("acme", memory_pb2.Scope(user_id=""), "", "scope.user_id"),
    ]:
        code, details = code_of(
            lambda tenant=tenant, scope=scope, token=token: stub.ListAuditEntries(  # type: ignore[misc]
                memory_pb2.ListAuditEntriesRequest(scope=scope, page_token=token),
                metadata=key_of(tenant),
                timeout=10,
            )
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}:")
    code, details = code_of(
        lambda: stub.ListAuditEntries(
            memory_pb2.ListAuditEntriesRequest(
                scope=memory_pb2.Scope(user_id=user), page_size=1001
            ),
            metadata=key_of("acme"),
            timeout=10,
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "1..1000" in details


def test_report_outcome_references_an_entry_of_the_same_tenant_and_user(
    cluster: Cluster, stub: Stub
) -> None:
    user = uid("judged")
    ids = remember(stub, "acme", user, ["the launch is on Friday"])
    [stored] = eventually(
        lambda: of_type(entries(stub, "acme", user), "remember") or None, "remember entry"
    )

    def report(
        tenant: str, who: str, seq: int, kind: int, note: str = ""
    ) -> memory_pb2.ReportOutcomeResponse:
        reply: memory_pb2.ReportOutcomeResponse = stub.ReportOutcome(
            memory_pb2.ReportOutcomeRequest(
                scope=memory_pb2.Scope(user_id=who), audit_seq=seq, kind=kind, note=note
            ),
            metadata=key_of(tenant),
            timeout=10,
        )
        return reply

    reply = report(
        "acme", user, stored.seq, memory_pb2.OUTCOME_KIND_CORRECTED, "it moved to Monday"
    )
    assert reply.audit_seq > stored.seq
    [outcome] = of_type(entries(stub, "acme", user), "outcome")
    assert outcome.seq == reply.audit_seq and list(outcome.memory_ids) == ids
    ob = body(outcome)
    assert ob["ref_seq"] == stored.seq and ob["kind"] == "corrected"
    assert ob["private"] == {"note": "it moved to Monday"}
    assert (
        report("acme", user, stored.seq, memory_pb2.OUTCOME_KIND_ACCEPTED).audit_seq
        > reply.audit_seq
    )

    for tenant, who, seq in [
        ("acme", "another-user", stored.seq),  # someone else's entry
        ("globex", user, stored.seq),  # another tenant's
        ("acme", user, 10**9),  # no such entry
    ]:
        code, details = code_of(
            lambda tenant=tenant, who=who, seq=seq: report(  # type: ignore[misc]
                tenant, who, seq, memory_pb2.OUTCOME_KIND_ACCEPTED
            )
        )
        assert code == grpc.StatusCode.NOT_FOUND and details.startswith("audit_seq:")
    for kind, note, field in [
        (memory_pb2.OUTCOME_KIND_UNSPECIFIED, "", "kind"),
        (memory_pb2.OUTCOME_KIND_NOTE, " ", "note"),
        (memory_pb2.OUTCOME_KIND_ACCEPTED, "x" * 4097, "note"),
    ]:
        code, details = code_of(
            lambda kind=kind, note=note: report("acme", user, stored.seq, kind, note)  # type: ignore[misc]
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}:")
    code, details = code_of(lambda: report("acme", user, 0, memory_pb2.OUTCOME_KIND_ACCEPTED))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("audit_seq:")


def test_verify_audit_checks_its_range(cluster: Cluster, stub: Stub) -> None:
    remember(stub, "acme", uid("v"), ["something to log"])
    head = eventually(
        lambda: (
            stub.VerifyAudit(
                memory_pb2.VerifyAuditRequest(), metadata=key_of("acme"), timeout=30
            ).head_seq
            or None
        ),
        "a non-empty log",
    )
    part = stub.VerifyAudit(
        memory_pb2.VerifyAuditRequest(from_seq=1, to_seq=1), metadata=key_of("globex"), timeout=30
    )
    assert part.ok and part.entries_checked == 1 and part.head_seq >= head
    code, details = code_of(
        lambda: stub.VerifyAudit(
            memory_pb2.VerifyAuditRequest(from_seq=5, to_seq=2), metadata=key_of("acme"), timeout=10
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("from_seq:")


def test_hippo_audit_show_lists_a_users_entries(cluster: Cluster, stub: Stub) -> None:
    user = uid("shown")
    ids = remember(stub, "acme", user, ["shown through the CLI"])
    eventually(lambda: entries(stub, "acme", user) or None, "the remember entry")
    env = {
        **os.environ,
        "HIPPO_CLI_GATEWAY_ADDR": cluster.gateway.addr,
        "HIPPO_CLI_API_KEY": "key-acme",
    }
    hippo = str(Path(sys.executable).parent / "hippo")
    shown = subprocess.run(
        [hippo, "audit", "show", "--user", user, "--json"], env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    [line] = shown.stdout.splitlines()
    record = json.loads(line)
    assert record["event_type"] == "remember" and record["memory_ids"] == ids
    text = subprocess.run(
        [hippo, "audit", "show", "--user", user], env=env, capture_output=True, text=True
    )
    assert text.returncode == 0 and " remember " in text.stdout and user in text.stdout
    nobody = subprocess.run(
        [hippo, "audit", "show", "--user", uid("nobody")], env=env, capture_output=True, text=True
    )
    assert nobody.stdout.startswith("no audit entries for user")


def _spool_depth(gateway: ServiceProcess) -> float:
    return metric(scrape(gateway.metrics_url), "hippo_outbox_depth", outbox="gateway_audit")


def test_the_spool_survives_an_audit_outage_and_a_gateway_restart_in_order(
    embedding: ServiceProcess, tmp_path: Path
) -> None:
    """With the audit service down, calls still succeed and their entries wait in the
    gateway's spool, which survives a gateway restart; when the service is back they are
    delivered in call order, each exactly once, and the chain verifies."""
    audit_port = reserve_port()
    user = uid("outage")
    calls: list[list[str]] = []  # memory ids of each Remember, in call order
    with (
        retrieval_process(tmp_path / "retrieval", reserve_port()) as retrieval,
        audit_process(tmp_path / "audit", audit_port) as audit,
    ):
        wait_for(retrieval.addr, RETRIEVAL, timeout=60)
        wait_for(audit.addr, AUDIT, timeout=60)
        audit_addr = audit.addr
        spool_dir = tmp_path / "gateway"
        with gateway_process(embedding.addr, retrieval.addr, audit_addr, spool_dir) as gateway:
            wait_for(gateway.addr, GATEWAY, timeout=60)
            with grpc.insecure_channel(gateway.addr) as channel:
                stub = memory_pb2_grpc.MemoryServiceStub(channel)
                calls.append(remember(stub, "acme", user, ["before the outage"]))
                eventually(lambda: _spool_depth(gateway) == 0 or None, "first delivery")
                os.kill(audit.process.pid, signal.SIGKILL)
                audit.process.wait()
                for i in range(5):
                    calls.append(remember(stub, "acme", user, [f"during the outage {i}"]))
                    recall(stub, "acme", user, f"outage {i}")
                assert _spool_depth(gateway) >= 10  # 5 remember + 5 recall entries wait
        # The gateway stopped with items spooled; a new one finds them on disk.
        with (
            gateway_process(embedding.addr, retrieval.addr, audit_addr, spool_dir) as gateway,
            audit_process(tmp_path / "audit", audit_port) as again,
        ):
            wait_for(gateway.addr, GATEWAY, timeout=60)
            wait_for(again.addr, AUDIT, timeout=60)
            eventually(lambda: _spool_depth(gateway) == 0 or None, "the spool drains", 60)
            with grpc.insecure_channel(gateway.addr) as channel:
                stub = memory_pb2_grpc.MemoryServiceStub(channel)
                found = entries(stub, "acme", user)
                stored = [list(e.memory_ids) for e in of_type(found, "remember")]
                assert stored == calls  # all of them, once each, in call order
                assert len(of_type(found, "recall")) == 5
                verdict = stub.VerifyAudit(
                    memory_pb2.VerifyAuditRequest(), metadata=key_of("acme"), timeout=30
                )
                assert verdict.ok, verdict


def test_gateway_replicas_share_the_spool_and_key_in_postgresql(
    embedding: ServiceProcess, tmp_path: Path, postgres_url: str
) -> None:
    """Cluster mode: two gateways on one PostgreSQL record through the spool in the
    gateway's schema and fingerprint with one shared key; when one is killed -9 with
    events undelivered (the audit service down), the other adopts and delivers them: every
    Remember is in the log once, the stranded ones in call order, and the chain verifies."""
    audit_port = reserve_port()
    user = uid("replicas")
    cluster = {"database__url": postgres_url}
    with (
        retrieval_process(tmp_path / "retrieval", reserve_port()) as retrieval,
        audit_process(tmp_path / "audit", audit_port) as audit,
    ):
        wait_for(retrieval.addr, RETRIEVAL, timeout=60)
        wait_for(audit.addr, AUDIT, timeout=60)
        with (
            gateway_process(embedding.addr, retrieval.addr, audit.addr, **cluster) as first,
            gateway_process(embedding.addr, retrieval.addr, audit.addr, **cluster) as second,
            grpc.insecure_channel(first.addr) as first_channel,
            grpc.insecure_channel(second.addr) as second_channel,
        ):
            wait_for(first.addr, GATEWAY, timeout=60)
            wait_for(second.addr, GATEWAY, timeout=60)
            one, two = Stub(first_channel), Stub(second_channel)
            calls = [
                remember(one, "acme", user, ["told the first replica"]),
                remember(two, "acme", user, ["told the second replica"]),
            ]
            recall(one, "acme", user, "which replica was told?")
            recall(two, "acme", user, "which replica was told?")

            def recorded() -> list[memory_pb2.AuditEntry] | None:
                found = entries(two, "acme", user)
                return found if len(of_type(found, "recall")) == 2 else None

            recalls = of_type(eventually(recorded, "both replicas' recall entries"), "recall")
            fingerprints = {str(body(e)["private"]["query_fingerprint"]) for e in recalls}  # type: ignore[index]
            assert len(fingerprints) == 1  # one generated key, shared through PostgreSQL

            os.kill(audit.process.pid, signal.SIGKILL)
            audit.process.wait()
            stranded = [remember(one, "acme", user, [f"stranded {i}"]) for i in range(3)]
            assert _spool_depth(first) == 3
            os.kill(first.process.pid, signal.SIGKILL)  # its events wait in PostgreSQL
            first.process.wait()
            with audit_process(tmp_path / "audit", audit_port) as again:
                wait_for(again.addr, AUDIT, timeout=60)

                def delivered() -> list[list[str]] | None:
                    # The second gateway's channel to the restarted audit service may
                    # still be reconnecting: its reads answer UNAVAILABLE meanwhile.
                    listed = _retry_unavailable(lambda: entries(two, "acme", user))
                    found = of_type(listed or [], "remember")
                    return [list(e.memory_ids) for e in found] if len(found) >= 5 else None

                stored = eventually(delivered, "the stopped replica's events", 60)
                assert sorted(stored) == sorted([*calls, *stranded])  # each once
                assert stored[-3:] == stranded  # adopted, delivered in their order
                adopted = metric(
                    scrape(second.metrics_url), "hippo_outbox_adopted_total", outbox="gateway_audit"
                )
                assert adopted == 3
                verdict = two.VerifyAudit(
                    memory_pb2.VerifyAuditRequest(), metadata=key_of("acme"), timeout=30
                )
                assert verdict.ok, verdict


def test_fail_closed_refuses_to_act_unrecorded(embedding: ServiceProcess, tmp_path: Path) -> None:
    """audit_fail_closed: with the audit service down, Remember and Recall fail
    UNAVAILABLE and Remember stores nothing; Forget still erases (its record waits in
    the spool). Once the service is up, calls succeed and are in the log when answered."""
    audit_port = reserve_port()
    user = uid("closed")
    token = f"tok{uuid.uuid4().hex[:8]}"
    with retrieval_process(tmp_path / "retrieval", reserve_port()) as retrieval:
        wait_for(retrieval.addr, RETRIEVAL, timeout=60)
        gateway_env = {"audit_fail_closed": "true"}
        with gateway_process(
            embedding.addr,
            retrieval.addr,
            f"127.0.0.1:{audit_port}",
            tmp_path / "gw",
            **gateway_env,
        ) as gateway:
            wait_for(gateway.addr, GATEWAY, timeout=60)
            with grpc.insecure_channel(gateway.addr) as channel:
                stub = memory_pb2_grpc.MemoryServiceStub(channel)
                code, details = code_of(lambda: remember(stub, "acme", user, [f"{token} one"]))
                assert code == grpc.StatusCode.UNAVAILABLE and "audit" in details
                code, _ = code_of(lambda: recall(stub, "acme", user, token))
                assert code == grpc.StatusCode.UNAVAILABLE
                forgot = stub.Forget(
                    memory_pb2.ForgetRequest(user_id=user), metadata=key_of("acme"), timeout=15
                )
                assert forgot.memories_deleted == 0  # nothing had been stored
                with audit_process(tmp_path / "audit", audit_port) as audit:
                    wait_for(audit.addr, AUDIT, timeout=60)
                    ids = eventually(
                        lambda: _retry_unavailable(
                            lambda: remember(stub, "acme", user, [f"{token} two"])
                        ),
                        "Remember once the audit service is up",
                    )
                    found = entries(stub, "acme", user)  # no waiting: recorded before the reply
                    kinds = [e.event_type for e in found]
                    assert kinds[-1] == "remember" and list(found[-1].memory_ids) == ids
                    assert "forget" in kinds  # the spooled Forget entry went first
                    assert kinds.index("forget") < kinds.index("remember")
                    hits = recall(stub, "acme", user, token).hits
                    assert [h.memory.memory_id for h in hits] == ids  # "one" was never stored
                    assert of_type(entries(stub, "acme", user), "recall")


def _retry_unavailable(call: Callable[[], T]) -> T | None:
    try:
        return call()
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return None
