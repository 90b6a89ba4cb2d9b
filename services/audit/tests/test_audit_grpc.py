"""The audit service as a real process over loopback gRPC, with its files on disk."""

from __future__ import annotations

import base64
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo_core.listen import reserve_port
from hippo_core.testing import ServiceProcess, service_process, wait_for

SERVICE = "hippo.audit.v1.AuditService"


def audit_process(
    data_dir: Path, port: int = 0, **env: str
) -> AbstractContextManager[ServiceProcess]:
    settings = {"HIPPO_AUDIT_DATA_DIR": str(data_dir), "HIPPO_AUDIT_GRACE_SECONDS": "2", **env}
    if port:
        settings["HIPPO_AUDIT_PORT"] = str(port)
    return service_process("hippo_audit", "HIPPO_AUDIT_", settings)


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    with audit_process(tmp_path_factory.mktemp("audit"), HIPPO_AUDIT_CHECKPOINT_EVERY="5") as proc:
        wait_for(proc.addr, SERVICE, timeout=60)
        yield proc


@pytest.fixture
def stub(audit: ServiceProcess) -> Iterator[audit_pb2_grpc.AuditServiceStub]:
    with grpc.insecure_channel(audit.addr) as channel:
        yield audit_pb2_grpc.AuditServiceStub(channel)


def new_entry(tenant: str, user: str, **extra: object) -> audit_pb2.NewEntry:
    body = struct_pb2.Struct()
    body.update({"candidates": 3, "hits": [{"rank": 1, "fused_score": 0.25}]})
    out = audit_pb2.NewEntry(
        tenant=tenant,
        actor="gateway",
        event_type="recall",
        user_id=user,
        session_id="s1",
        memory_ids=["m1", "m2"],
        body=body,
    )
    for name, value in extra.items():
        if name == "private":
            out.private_body.update(value)  # type: ignore[arg-type]
        else:
            setattr(out, name, value)
    return out


def test_append_read_verify_and_forget_over_grpc(stub: audit_pb2_grpc.AuditServiceStub) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    reply = stub.Append(
        audit_pb2.AppendRequest(
            entries=[
                new_entry(tenant, "alice", private={"query_fingerprint": "abc123"}),
                new_entry(tenant, "bob"),
            ]
        ),
        timeout=10,
    )
    first, second = reply.entries
    assert second.seq == first.seq + 1 and reply.head_seq >= second.seq
    head = stub.Head(audit_pb2.HeadRequest(), timeout=10)
    assert head.writable and len(head.public_key) == 32 and len(head.key_id) == 16

    page = stub.Read(
        audit_pb2.ReadRequest(tenant=tenant, user_id="alice", include_private=True), timeout=10
    )
    [alice] = page.entries
    assert alice.seq == first.seq and alice.hash == first.hash
    assert alice.body["candidates"] == 3 and alice.body["hits"][0]["rank"] == 1
    assert alice.private_state == audit_pb2.PRIVATE_STATE_READABLE
    assert alice.private_body["query_fingerprint"] == "abc123"
    sealed = stub.Read(audit_pb2.ReadRequest(tenant=tenant, user_id="alice"), timeout=10)
    assert sealed.entries[0].private_state == audit_pb2.PRIVATE_STATE_SEALED
    assert not sealed.entries[0].HasField("private_body")
    other = stub.Read(audit_pb2.ReadRequest(tenant="someone-else"), timeout=10)
    assert tenant not in {e.tenant for e in other.entries}

    erased = stub.ForgetUser(
        audit_pb2.ForgetUserRequest(tenant=tenant, user_id="alice", actor="gateway"), timeout=10
    )
    assert erased.keys_destroyed == 1 and erased.audit_seq > second.seq
    page = stub.Read(
        audit_pb2.ReadRequest(tenant=tenant, user_id="alice", include_private=True), timeout=10
    )
    assert [e.event_type for e in page.entries] == ["recall", "erase"]
    assert page.entries[0].private_state == audit_pb2.PRIVATE_STATE_ERASED
    verdict = stub.Verify(audit_pb2.VerifyRequest(), timeout=30)
    assert verdict.ok and verdict.entries_checked == verdict.head_seq
    assert verdict.checkpoints_checked >= 0 and verdict.reason == ""


def test_expected_prev_hash_and_bad_input(stub: audit_pb2_grpc.AuditServiceStub) -> None:
    head = stub.Head(audit_pb2.HeadRequest(), timeout=10)
    stub.Append(
        audit_pb2.AppendRequest(entries=[new_entry("acme", "u")], expected_prev_hash=head.hash),
        timeout=10,
    )
    with pytest.raises(grpc.RpcError) as err:  # the head has moved on
        stub.Append(
            audit_pb2.AppendRequest(entries=[new_entry("acme", "u")], expected_prev_hash=head.hash),
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.ABORTED
    cases = [
        (audit_pb2.AppendRequest(), "entries: must hold 1..1000 entries, got 0"),
        (
            audit_pb2.AppendRequest(entries=[new_entry("acme", "u", actor="")]),
            "entries[0].actor: must be 1..64 characters of [A-Za-z0-9._:@-]",
        ),
        (
            audit_pb2.AppendRequest(entries=[new_entry("acme", "u")], expected_prev_hash="zz"),
            "expected_prev_hash: must be 64 lowercase hex digits",
        ),
    ]
    for request, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub.Append(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == message
    with pytest.raises(grpc.RpcError) as err:
        stub.Read(audit_pb2.ReadRequest(tenant="acme", limit=5000), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("limit:")


def test_stream_follows_new_entries(stub: audit_pb2_grpc.AuditServiceStub) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    stub.Append(audit_pb2.AppendRequest(entries=[new_entry(tenant, "a")]), timeout=10)
    stream = stub.Stream(audit_pb2.StreamRequest(tenant=tenant), timeout=30)
    seen: list[str] = []

    def append_later() -> None:
        time.sleep(0.3)
        for user in ("b", "c"):
            stub.Append(audit_pb2.AppendRequest(entries=[new_entry(tenant, user)]), timeout=10)

    threading.Thread(target=append_later).start()
    for message in stream:
        seen.extend(e.user_id for e in message.entries)
        if len(seen) == 3:
            stream.cancel()
            break
    assert seen == ["a", "b", "c"]


def test_acknowledged_entries_survive_kill_9(tmp_path: Path) -> None:
    """Four writers append as fast as they can; the service is killed -9 mid-stream. After
    a restart every acknowledged entry is there with the hash it was acknowledged with,
    and the whole log (chain and checkpoints) verifies."""
    port = reserve_port()
    acked: dict[int, tuple[str, str]] = {}  # seq -> (hash, marker)
    lock = threading.Lock()
    stop = threading.Event()

    def writer(addr: str, w: int) -> None:
        with grpc.insecure_channel(addr) as channel:
            client = audit_pb2_grpc.AuditServiceStub(channel)
            i = 0
            while not stop.is_set():
                marker = f"w{w}-{i}"
                try:
                    reply = client.Append(
                        audit_pb2.AppendRequest(
                            entries=[new_entry("acme", marker, idempotency_key=marker)]
                        ),
                        timeout=5,
                    )
                except grpc.RpcError:
                    return
                with lock:
                    acked[reply.entries[0].seq] = (reply.entries[0].hash, marker)
                i += 1

    with audit_process(tmp_path, port, HIPPO_AUDIT_CHECKPOINT_EVERY="50") as proc:
        wait_for(proc.addr, SERVICE, timeout=60)
        threads = [threading.Thread(target=writer, args=(proc.addr, w)) for w in range(4)]
        for t in threads:
            t.start()
        while len(acked) < 300:
            time.sleep(0.01)
        os.kill(proc.process.pid, signal.SIGKILL)
        proc.process.wait()
        stop.set()
        for t in threads:
            t.join()
    assert len(acked) >= 300
    with audit_process(tmp_path, port) as again:
        wait_for(again.addr, SERVICE, timeout=60)
        with grpc.insecure_channel(again.addr) as channel:
            client = audit_pb2_grpc.AuditServiceStub(channel)
            stored: dict[int, tuple[str, str]] = {}
            after = 0
            while True:
                page = client.Read(
                    audit_pb2.ReadRequest(tenant="acme", after_seq=after, limit=1000), timeout=10
                )
                stored.update({e.seq: (e.hash, e.user_id) for e in page.entries})
                if not page.next_after_seq:
                    break
                after = page.next_after_seq
            for seq, (digest, marker) in acked.items():
                assert stored.get(seq) == (digest, marker), seq
            assert sorted(stored) == list(range(1, len(stored) + 1))
            verdict = client.Verify(audit_pb2.VerifyRequest(), timeout=60)
            assert verdict.ok, verdict
            assert verdict.entries_checked == len(stored)
            assert client.Head(audit_pb2.HeadRequest(), timeout=10).writable


def test_a_truncated_log_is_reported_and_refuses_writes_after_restart(tmp_path: Path) -> None:
    """A graceful stop signs a final checkpoint, so even the last entries are protected."""
    with audit_process(tmp_path) as proc:
        wait_for(proc.addr, SERVICE, timeout=60)
        with grpc.insecure_channel(proc.addr) as channel:
            client = audit_pb2_grpc.AuditServiceStub(channel)
            for _ in range(7):
                client.Append(audit_pb2.AppendRequest(entries=[new_entry("acme", "u")]), timeout=10)
        assert proc.terminate() == 0
    with sqlite3.connect(tmp_path / "audit.sqlite3") as conn:
        conn.execute("DROP TRIGGER entries_are_never_deleted")
        conn.execute("DELETE FROM entries WHERE seq = 7")
    with audit_process(tmp_path) as proc:
        wait_for(proc.addr, SERVICE, timeout=60)
        with grpc.insecure_channel(proc.addr) as channel:
            client = audit_pb2_grpc.AuditServiceStub(channel)
            head = client.Head(audit_pb2.HeadRequest(), timeout=10)
            assert head.seq == 6 and head.latest_checkpoint.size == 7 and not head.writable
            verdict = client.Verify(audit_pb2.VerifyRequest(), timeout=30)
            assert not verdict.ok and verdict.first_bad_seq == 7
            assert verdict.reason.startswith("truncated below checkpoint")
            with pytest.raises(grpc.RpcError) as err:
                client.Append(audit_pb2.AppendRequest(entries=[new_entry("acme", "u")]), timeout=10)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_two_replicas_on_one_database_serve_one_chain(postgres_url: str, tmp_path: Path) -> None:
    """Cluster mode through the real processes: two audit replicas on one PostgreSQL,
    three writers on each appending the same idempotency keys. Every key is stored once
    (both replicas answer it with the same seq), Verify passes through either replica,
    both report the same head, and a replica killed -9 comes back to the same chain."""
    env = {
        "HIPPO_AUDIT_DATABASE__URL": postgres_url,
        "HIPPO_AUDIT_SIGNING_KEY": base64.b64encode(os.urandom(32)).decode(),
        "HIPPO_AUDIT_CHECKPOINT_EVERY": "25",
    }
    answers: dict[str, set[tuple[int, str]]] = {}
    lock = threading.Lock()

    def writer(addr: str, w: int) -> None:
        with grpc.insecure_channel(addr) as channel:
            client = audit_pb2_grpc.AuditServiceStub(channel)
            for i in range(w, 60, 3):
                key = f"k-{i}"
                reply = client.Append(
                    audit_pb2.AppendRequest(
                        entries=[new_entry("acme", f"u{i % 4}", idempotency_key=key)]
                    ),
                    timeout=10,
                )
                with lock:
                    answers.setdefault(key, set()).add(
                        (reply.entries[0].seq, reply.entries[0].hash)
                    )

    port = reserve_port()
    with audit_process(tmp_path / "a", port, **env) as a, audit_process(tmp_path / "b", **env) as b:
        wait_for(a.addr, SERVICE, timeout=60)
        wait_for(b.addr, SERVICE, timeout=60)
        threads = [
            threading.Thread(target=writer, args=(proc.addr, w))
            for proc in (a, b)
            for w in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(answers) == 60 and all(len(seen) == 1 for seen in answers.values())
        assert sorted(seq for [(seq, _)] in answers.values()) == list(range(1, 61))
        os.kill(a.process.pid, signal.SIGKILL)
        a.process.wait()
        with grpc.insecure_channel(b.addr) as channel:
            client = audit_pb2_grpc.AuditServiceStub(channel)
            client.Append(audit_pb2.AppendRequest(entries=[new_entry("acme", "z")]), timeout=10)
            verdict = client.Verify(audit_pb2.VerifyRequest(), timeout=30)
            assert verdict.ok and verdict.entries_checked == verdict.head_seq == 61, verdict
            assert verdict.checkpoints_checked >= 2
            b_head = client.Head(audit_pb2.HeadRequest(), timeout=10)
    with audit_process(tmp_path / "a", port, **env) as again:
        wait_for(again.addr, SERVICE, timeout=60)
        with grpc.insecure_channel(again.addr) as channel:
            client = audit_pb2_grpc.AuditServiceStub(channel)
            head = client.Head(audit_pb2.HeadRequest(), timeout=10)
            assert (head.seq, head.hash, head.writable) == (61, b_head.hash, True)
            assert head.latest_checkpoint.size == 61  # b signed its tail when it stopped
            assert client.Verify(audit_pb2.VerifyRequest(), timeout=30).ok


def test_cluster_mode_refuses_a_signing_key_made_per_pod(postgres_url: str, tmp_path: Path) -> None:
    """With a database URL and no shared signing key, the process stops at once and says
    which setting to give."""
    env = {
        **os.environ,
        "HIPPO_AUDIT_DATABASE__URL": postgres_url,
        "HIPPO_AUDIT_DATA_DIR": str(tmp_path),
        "HIPPO_AUDIT_PORT": str(reserve_port()),
        "HIPPO_AUDIT_METRICS_PORT": str(reserve_port()),
    }
    env.pop("HIPPO_AUDIT_SIGNING_KEY", None)
    done = subprocess.run(
        [sys.executable, "-m", "hippo_audit"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "HIPPO_AUDIT_SIGNING_KEY" in done.stderr and "cluster mode" in done.stderr
    assert not (tmp_path / "checkpoint.key").exists()


def test_seqs_beyond_int64_are_refused_naming_the_field(
    stub: audit_pb2_grpc.AuditServiceStub,
) -> None:
    """uint64 on the wire, int64 in the stores: 2^63 and above is INVALID_ARGUMENT naming
    the field, not an OverflowError (INTERNAL) from the database driver."""
    calls = [
        ("after_seq", lambda: stub.Read(audit_pb2.ReadRequest(tenant="acme", after_seq=2**63))),
        ("to_seq", lambda: stub.Read(audit_pb2.ReadRequest(tenant="acme", to_seq=2**64 - 1))),
        ("from_seq", lambda: stub.Verify(audit_pb2.VerifyRequest(from_seq=2**63))),
        ("to_seq", lambda: stub.Verify(audit_pb2.VerifyRequest(to_seq=2**64 - 1))),
    ]
    for field, call in calls:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert err.value.details().startswith(f"{field}: must be at most {2**63 - 1}")
    assert stub.Read(audit_pb2.ReadRequest(tenant="acme", after_seq=2**63 - 1)).entries == []


def test_an_entry_edited_in_place_keeps_the_service_up_but_refuses_writes(
    tmp_path: Path,
) -> None:
    """The start recomputes the chain: the edited entry is found, health is SERVING (reads
    and Verify work), every write is FAILED_PRECONDITION with reason LOG_CHAIN_BROKEN."""
    with audit_process(tmp_path) as proc:
        wait_for(proc.addr, SERVICE, timeout=60)
        with grpc.insecure_channel(proc.addr) as channel:
            client = audit_pb2_grpc.AuditServiceStub(channel)
            for _ in range(9):
                client.Append(audit_pb2.AppendRequest(entries=[new_entry("acme", "u")]), timeout=10)
        assert proc.terminate() == 0
    with sqlite3.connect(tmp_path / "audit.sqlite3") as conn:
        conn.execute("DROP TRIGGER entries_are_never_updated")
        conn.execute("UPDATE entries SET body = ? WHERE seq = 4", ('{"forged":true}',))
    with audit_process(tmp_path) as proc:
        wait_for(proc.addr, SERVICE, timeout=60)  # SERVING: reads and Verify are served
        with grpc.insecure_channel(proc.addr) as channel:
            client = audit_pb2_grpc.AuditServiceStub(channel)
            head = client.Head(audit_pb2.HeadRequest(), timeout=10)
            assert head.seq == 9 and not head.writable and "entry 4: hash mismatch" in head.problem
            verdict = client.Verify(audit_pb2.VerifyRequest(), timeout=30)
            assert not verdict.ok and verdict.first_bad_seq == 4
            assert len(client.Read(audit_pb2.ReadRequest(tenant="acme"), timeout=10).entries) == 9
            with pytest.raises(grpc.RpcError) as err:
                client.Append(audit_pb2.AppendRequest(entries=[new_entry("acme", "u")]), timeout=10)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "hash chain is broken" in err.value.details()
            assert client.Head(audit_pb2.HeadRequest(), timeout=10).seq == 9
