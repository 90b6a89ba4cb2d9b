"""mTLS and caller identities through the real runtime: real certificates, real gRPC
over loopback. The server is the scripted EmbeddingService of core_harness, whose
`Embed` only the gateway may call and whose `Info` nobody has been allowed."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from core_harness import Harness, start
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core import client, healthcheck
from hippo_core.certs import Authority, Issued
from hippo_core.server.authz import callers
from hippo_core.settings import ServiceSettings, TlsSettings

FULL_NAME = "hippo.embedding.v1.EmbeddingService"


def tls_of(issued: Issued, ca_file: Path | None = None) -> TlsSettings:
    return TlsSettings(
        ca_file=str(ca_file or issued.ca_file),
        cert_file=str(issued.cert_file),
        key_file=str(issued.key_file),
    )


async def answer(request: embedding_pb2.EmbedRequest, context: object) -> object:
    return embedding_pb2.EmbedResponse(model="scripted", count=len(request.texts))


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path / "ca")


@pytest.fixture
async def server(ca: Authority) -> AsyncIterator[Harness]:
    settings = ServiceSettings(grace_seconds=0.5, tls=tls_of(ca.issue("embedding")))
    h = await start(settings, callers=callers(FULL_NAME, {"Embed": {"gateway"}}))
    h.servicer.behaviour = answer
    await asyncio.wait_for(h.runner.ready.wait(), 5)
    yield h
    await h.runner.stop()


async def embed(addr: str, tls: TlsSettings | None) -> embedding_pb2.EmbedResponse:
    async with client.channel(addr, tls_settings=tls) as channel:
        stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        reply: embedding_pb2.EmbedResponse = await stub.Embed(
            embedding_pb2.EmbedRequest(texts=["hello"]), timeout=3
        )
        return reply


async def refused(addr: str, tls: TlsSettings | None) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await embed(addr, tls)
    return caught.value


async def test_an_allowed_service_is_served(server: Harness, ca: Authority) -> None:
    reply = await embed(server.addr, tls_of(ca.issue("gateway")))
    assert reply.count == 1
    assert server.servicer.calls == 1


async def test_a_service_not_allowed_for_the_rpc_gets_permission_denied(
    server: Harness, ca: Authority
) -> None:
    error = await refused(server.addr, tls_of(ca.issue("summariser")))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "summariser may not call /hippo.embedding.v1.EmbeddingService/Embed" in (
        error.details() or ""
    )
    status = status_pb2.Status.FromString(
        dict(error.trailing_metadata() or ())["grpc-status-details-bin"]
    )
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert info.reason == "CALLER_NOT_ALLOWED"
    assert server.servicer.calls == 0


async def test_an_rpc_nobody_was_allowed_is_refused_even_to_known_services(
    server: Harness, ca: Authority
) -> None:
    async with client.channel(server.addr, tls_settings=tls_of(ca.issue("gateway"))) as channel:
        stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Info(embedding_pb2.InfoRequest(), timeout=3)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_an_identity_of_another_trust_domain_is_refused(
    server: Harness, ca: Authority
) -> None:
    issued = ca.issue("gateway", uri="spiffe://elsewhere/gateway", file_stem="foreign")
    error = await refused(server.addr, tls_of(issued))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_health_stays_open_to_any_verified_caller(server: Harness, ca: Authority) -> None:
    tls = tls_of(ca.issue("summariser"))
    async with client.channel(server.addr, tls_settings=tls) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=FULL_NAME), timeout=3
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_caller_without_a_certificate_fails_the_handshake(
    server: Harness, ca: Authority
) -> None:
    error = await refused(server.addr, TlsSettings(ca_file=str(ca.ca_file)))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert server.servicer.calls == 0


async def test_a_certificate_of_another_ca_fails_the_handshake(
    server: Harness, ca: Authority, tmp_path: Path
) -> None:
    stranger = Authority(tmp_path / "other-ca").issue("gateway")
    # It trusts our CA (so the server's certificate passes) but presents its own.
    error = await refused(server.addr, tls_of(stranger, ca_file=ca.ca_file))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert server.servicer.calls == 0


async def test_a_plaintext_caller_is_refused(server: Harness) -> None:
    error = await refused(server.addr, None)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert server.servicer.calls == 0


async def test_a_rotated_server_certificate_is_served_on_the_next_connection(
    server: Harness, ca: Authority, tmp_path: Path
) -> None:
    gateway = ca.issue("gateway")
    new_ca = Authority(tmp_path / "new-ca")
    trusts_new = tls_of(gateway, ca_file=new_ca.ca_file)
    error = await refused(server.addr, trusts_new)  # still the old certificate
    assert error.code() == grpc.StatusCode.UNAVAILABLE

    rotated = new_ca.issue("embedding")
    served = Path(server.runner.settings.tls.cert_file)
    # Key first, then the certificate, each renamed into place (as a Secret update is).
    shutil.copy(rotated.key_file, served.with_suffix(".key.new"))
    served.with_suffix(".key.new").replace(served.with_suffix(".key"))
    shutil.copy(rotated.cert_file, served.with_suffix(".pem.new"))
    served.with_suffix(".pem.new").replace(served)

    assert (await embed(server.addr, trusts_new)).count == 1
    old = await refused(server.addr, tls_of(gateway))  # a new connection, old trust only
    assert old.code() == grpc.StatusCode.UNAVAILABLE


async def test_an_edge_server_takes_callers_without_a_certificate(ca: Authority) -> None:
    """The gateway: TLS, no caller table, client certificates not asked for."""
    settings = ServiceSettings(grace_seconds=0.5, tls=tls_of(ca.issue("gateway")))
    h = await start(settings)
    h.servicer.behaviour = answer
    try:
        await asyncio.wait_for(h.runner.ready.wait(), 5)
        assert (await embed(h.addr, TlsSettings(ca_file=str(ca.ca_file)))).count == 1
        assert (await refused(h.addr, None)).code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await h.runner.stop()


async def test_a_blocking_channel_speaks_tls_too(server: Harness, ca: Authority) -> None:
    tls = tls_of(ca.issue("gateway"))

    def call() -> int:
        with client.blocking_channel(server.addr, tls_settings=tls) as channel:
            stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            reply = stub.Embed(embedding_pb2.EmbedRequest(texts=["a", "b"]), timeout=3)
            return int(reply.count)

    assert await asyncio.to_thread(call) == 2


async def test_an_ipv4_list_target_is_checked_against_its_first_host(
    server: Harness, ca: Authority
) -> None:
    reply = await embed(f"ipv4:{server.addr}", tls_of(ca.issue("gateway")))
    assert reply.count == 1


async def test_the_probe_module_checks_an_mtls_server_with_the_pods_certificate(
    server: Harness, ca: Authority
) -> None:
    """What the chart's exec probes run under TLS (kubelet's gRPC probes cannot)."""
    own = ca.issue("embedding")
    with_cert = [
        f"{server.addr}/{FULL_NAME}",
        "--tls-ca", str(ca.ca_file), "--tls-cert", str(own.cert_file),
        "--tls-key", str(own.key_file), "--tls-server-name", "localhost",
    ]  # fmt: skip
    assert await asyncio.to_thread(healthcheck.main, with_cert) == 0
    without = [f"{server.addr}/{FULL_NAME}", "--tls-ca", str(ca.ca_file), "--timeout", "1"]
    assert await asyncio.to_thread(healthcheck.main, without) == 1
