"""grpc.health.v1 checks, shared by `hippo health` and the launcher."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hippo_core import client
from hippo_core.settings import TlsSettings


async def check(
    addr: str, service: str, timeout: float = 2.0, tls: TlsSettings | None = None
) -> str:
    """'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN' or 'UNREACHABLE (<code>)'. Under TLS,
    internal services answer only callers with a certificate (the operator's)."""
    async with client.channel(addr, tls_settings=tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            return f"UNREACHABLE ({exc.code().name})"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


async def wait_serving(
    addr: str,
    service: str,
    timeout: float,
    poll: float = 0.25,
    tls: TlsSettings | None = None,
) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if await check(addr, service, timeout=min(2.0, poll * 8), tls=tls) == "SERVING":
            return True
        await asyncio.sleep(poll)
    return False
