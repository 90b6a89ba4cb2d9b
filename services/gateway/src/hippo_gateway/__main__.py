"""Wiring only: settings -> peers -> domain -> serve()."""

from __future__ import annotations

import grpc

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core import client
from hippo_core.server.app import Service, run
from hippo_gateway.adapters.embedding_client import GrpcEmbedder
from hippo_gateway.adapters.retrieval_client import GrpcTurnStore
from hippo_gateway.domain.auth import Authenticator
from hippo_gateway.domain.memory import MemoryService
from hippo_gateway.servicer import MemoryServicer
from hippo_gateway.settings import GatewaySettings

FULL_NAME = memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name


def build(settings: GatewaySettings) -> Service:
    auth = Authenticator(settings.api_keys)
    if not len(auth):
        raise SystemExit(
            "gateway: no API keys configured; set HIPPO_GATEWAY_API_KEYS, e.g. "
            '\'{"<key>": "<tenant>"}\' (`hippo up` sets a local one)'
        )
    servicer = MemoryServicer(auth)
    channels: list[grpc.aio.Channel] = []

    def register(server: grpc.aio.Server) -> None:
        memory_pb2_grpc.add_MemoryServiceServicer_to_server(servicer, server)

    async def warmup() -> None:
        # Channels are made here, inside the server's event loop (aio channels bind to it).
        # Peers get messages as large as our own callers may send (a full Remember is
        # 64 turns of 32 KiB: over gRPC's 1 MiB default).
        size = settings.max_message_bytes
        embedding = client.channel(settings.embedding_addr, settings.client, max_message_bytes=size)
        retrieval = client.channel(settings.retrieval_addr, settings.client, max_message_bytes=size)
        channels.extend([embedding, retrieval])
        embedder = GrpcEmbedder(embedding)
        await embedder.connect(timeout=settings.peer_wait_seconds)
        servicer.service = MemoryService(embedder, GrpcTurnStore(retrieval))

    async def close() -> None:
        for channel in channels:
            await channel.close()

    return Service("gateway", [FULL_NAME], register, warmup, close)


def main() -> None:
    settings = GatewaySettings()
    run(build(settings), settings)


if __name__ == "__main__":
    main()
