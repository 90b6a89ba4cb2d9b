"""A real cluster for the gateway's tests: embedding, retrieval and gateway processes on
loopback (session scope: the model loads once), and stubs that carry an API key."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from hippo.memory.v1 import memory_pb2_grpc
from hippo_core.listen import reserve_port
from hippo_core.testing import ServiceProcess, service_process, wait_for

KEYS = {"key-acme": "acme", "key-globex": "globex", "key-initech": "initech"}
EMBEDDING = "hippo.embedding.v1.EmbeddingService"
RETRIEVAL = "hippo.retrieval.v1.RetrievalService"
GATEWAY = "hippo.memory.v1.MemoryService"
AUDIT = "hippo.audit.v1.AuditService"


def retrieval_process(
    data_dir: Path, port: int | None = None
) -> AbstractContextManager[ServiceProcess]:
    env = {"HIPPO_RETRIEVAL_DATA_DIR": str(data_dir)}
    if port is not None:
        env["HIPPO_RETRIEVAL_PORT"] = str(port)
    return service_process("hippo_retrieval", "HIPPO_RETRIEVAL_", env)


def audit_process(
    data_dir: Path, port: int | None = None
) -> AbstractContextManager[ServiceProcess]:
    env = {"HIPPO_AUDIT_DATA_DIR": str(data_dir), "HIPPO_AUDIT_GRACE_SECONDS": "2"}
    if port is not None:
        env["HIPPO_AUDIT_PORT"] = str(port)
    return service_process("hippo_audit", "HIPPO_AUDIT_", env)


def gateway_process(
    embedding: str,
    retrieval: str,
    audit: str = "",
    data_dir: Path | None = None,
    **extra: str,
) -> AbstractContextManager[ServiceProcess]:
    """`audit` empty: no audit log. `data_dir` (the audit spool) defaults to a fresh one."""
    env = {
        "HIPPO_GATEWAY_API_KEYS": json.dumps(KEYS),
        "HIPPO_GATEWAY_EMBEDDING_ADDR": embedding,
        "HIPPO_GATEWAY_RETRIEVAL_ADDR": retrieval,
        "HIPPO_GATEWAY_CLIENT__TIMEOUT_SECONDS": "5",
        "HIPPO_GATEWAY_SUMMARISER_ADDR": "",  # recall tests: no bounded sessions
        "HIPPO_GATEWAY_AUDIT_ADDR": audit,
        "HIPPO_GATEWAY_DATA_DIR": str(data_dir or tempfile.mkdtemp(prefix="gateway-")),
        **{f"HIPPO_GATEWAY_{name.upper()}": value for name, value in extra.items()},
    }
    return service_process("hippo_gateway", "HIPPO_GATEWAY_", env)


@dataclass
class Cluster:
    embedding: ServiceProcess
    retrieval: ServiceProcess
    gateway: ServiceProcess
    retrieval_dir: Path
    audit: ServiceProcess


@pytest.fixture(scope="session")
def embedding() -> Iterator[ServiceProcess]:
    with service_process("hippo_embedding", "HIPPO_EMBEDDING_") as proc:
        wait_for(proc.addr, EMBEDDING, timeout=120)
        yield proc


@pytest.fixture(scope="session")
def cluster(
    embedding: ServiceProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    data_dir = tmp_path_factory.mktemp("retrieval")
    with ExitStack() as stack:
        retrieval = stack.enter_context(retrieval_process(data_dir, reserve_port()))
        audit = stack.enter_context(audit_process(tmp_path_factory.mktemp("audit")))
        wait_for(retrieval.addr, RETRIEVAL, timeout=60)
        wait_for(audit.addr, AUDIT, timeout=60)
        gateway = stack.enter_context(
            gateway_process(
                embedding.addr, retrieval.addr, audit.addr, tmp_path_factory.mktemp("gateway")
            )
        )
        wait_for(gateway.addr, GATEWAY, timeout=60)
        yield Cluster(embedding, retrieval, gateway, data_dir, audit)


@pytest.fixture
def stub(cluster: Cluster) -> Iterator[memory_pb2_grpc.MemoryServiceStub]:
    with grpc.insecure_channel(cluster.gateway.addr) as channel:
        yield memory_pb2_grpc.MemoryServiceStub(channel)


def key_of(tenant: str) -> tuple[tuple[str, str], ...]:
    key = next(k for k, t in KEYS.items() if t == tenant)
    return (("x-api-key", key),)
