"""`hippo up --tls` (`make run TLS=1`): mTLS between every service, through the launcher,
with the CLI holding the operator's certificate. Kept short: one cluster, the main
path end to end and the refusals that matter."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo_cli.cluster import LocalCluster, local_cluster
from hippo_cli.registry import SERVICES
from hippo_core.certs import Authority

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("var"), tls=True) as running:
        yield running
    stopped = "\n".join(running.shutdown)
    for spec in SERVICES:
        assert f"{spec.name} stopped (exit code 0)" in stopped, stopped


def _hippo(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "hippo"), *args], env=cluster.env, capture_output=True, text=True, timeout=120
    )


def _append(cluster: LocalCluster, credentials: grpc.ChannelCredentials | None) -> grpc.RpcError:
    """A forged `forget` entry sent straight to the audit service."""
    addr = cluster.addrs["audit"]
    channel = grpc.secure_channel(addr, credentials) if credentials else grpc.insecure_channel(addr)
    entry = audit_pb2.NewEntry(
        event_type="forget", actor="gateway", tenant="local", user_id="alice"
    )
    with channel, pytest.raises(grpc.RpcError) as caught:
        stub = audit_pb2_grpc.AuditServiceStub(channel)
        stub.Append(audit_pb2.AppendRequest(entries=[entry]), timeout=5)
    return caught.value


def test_remember_and_recall_over_mtls(cluster: LocalCluster) -> None:
    assert "mTLS" in cluster.banner and "grpc.secure_channel(" in cluster.banner
    health = _hippo(cluster, "health", "--json")
    assert health.returncode == 0, health.stdout + health.stderr
    assert all(
        r["status"] == "SERVING" for rows in json.loads(health.stdout).values() for r in rows
    )
    stored = _hippo(
        cluster, "remember", "--user", "alice", "--session", "s1", "I moved to Lisbon in May"
    )
    assert stored.returncode == 0, stored.stderr
    found = _hippo(cluster, "recall", "Lisbon", "--user", "alice", "--json")
    assert found.returncode == 0, found.stderr
    assert "Lisbon" in json.loads(found.stdout.splitlines()[0])["text"]


def test_audit_append_from_a_service_not_allowed_is_refused(cluster: LocalCluster) -> None:
    ca = Authority(cluster.data_dir / "tls")  # the launcher's CA: a genuine certificate
    retrieval = ca.issue("retrieval", file_stem="test-retrieval")
    credentials = grpc.ssl_channel_credentials(
        ca.ca_file.read_bytes(), retrieval.key_file.read_bytes(), retrieval.cert_file.read_bytes()
    )
    refused = _append(cluster, credentials)
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    assert "retrieval may not call" in (refused.details() or "")  # type: ignore[attr-defined]


def test_a_plaintext_caller_reaches_no_service(cluster: LocalCluster) -> None:
    refused = _append(cluster, None)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    plain = dict(cluster.env)
    for name in ("CA_FILE", "CERT_FILE", "KEY_FILE"):
        plain.pop(f"HIPPO_CLI_TLS__{name}")
    result = subprocess.run(
        [str(BIN / "hippo"), "recall", "Lisbon", "--user", "alice"],
        env=plain,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "UNAVAILABLE" in result.stderr


def test_chat_generates_through_the_llm_hosts_https_api(cluster: LocalCluster) -> None:
    """The gateway's Chat posts to the injection host's TGI API, which under TLS takes
    only callers with a certificate: the gateway's."""
    from hippo.memory.v1 import memory_pb2 as pb
    from hippo.memory.v1 import memory_pb2_grpc

    env = cluster.env
    credentials = grpc.ssl_channel_credentials(Path(env["HIPPO_CLI_TLS__CA_FILE"]).read_bytes())
    with grpc.secure_channel(cluster.gateway, credentials) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        request = pb.ChatRequest(
            scope=pb.Scope(user_id="chat-user", session_id="s1"),
            message="Say hello to Bob.",
            params=pb.GenerationParameters(max_new_tokens=4),
        )
        events = list(stub.Chat(request, metadata=[("x-api-key", env_key(cluster))], timeout=120))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and "token" in kinds


def env_key(cluster: LocalCluster) -> str:
    return cluster.env.get("HIPPO_CLI_API_KEY", "hippo-local-dev-key")
