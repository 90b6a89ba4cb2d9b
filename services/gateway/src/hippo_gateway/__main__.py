"""Wiring only: settings -> peers -> domain -> serve()."""

from __future__ import annotations

from pathlib import Path

import grpc

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core import client
from hippo_core.server.app import Service, run
from hippo_gateway.adapters.audit_client import GrpcAuditLog
from hippo_gateway.adapters.embedding_client import GrpcEmbedder
from hippo_gateway.adapters.influence_client import GrpcInfluencer
from hippo_gateway.adapters.llm_client import TgiLlm
from hippo_gateway.adapters.retrieval_client import GrpcTurnStore
from hippo_gateway.adapters.session_client import GrpcSessions, NoSessions
from hippo_gateway.adapters.spool import SqliteSpool, local_secret
from hippo_gateway.adapters.tokenizer_client import GrpcTokenizer
from hippo_gateway.domain.audit import AuditRecorder, AuditTrail, RecorderConfig
from hippo_gateway.domain.auth import Authenticator
from hippo_gateway.domain.chat import ChatService
from hippo_gateway.domain.context import ContextBuilder, ContextConfig
from hippo_gateway.domain.memory import MemoryService
from hippo_gateway.domain.ports import Sessions
from hippo_gateway.servicer import MemoryServicer
from hippo_gateway.settings import GatewaySettings

FULL_NAME = memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name


def audit_recorder(
    settings: GatewaySettings, channel: grpc.aio.Channel
) -> tuple[AuditRecorder, AuditTrail, SqliteSpool]:
    """The audit recorder over its spool and the audit service (not started)."""
    data = Path(settings.data_dir)
    spool = SqliteSpool(data / "audit-spool.sqlite3")
    key = local_secret(
        settings.audit_fingerprint_key.get_secret_value(), data / "audit-fingerprint.key"
    )
    log = GrpcAuditLog(channel)
    config = RecorderConfig(settings.audit_fail_closed, settings.audit_seq_wait_seconds)
    recorder = AuditRecorder(log, spool, key, config)
    return recorder, AuditTrail(log, recorder), spool


def build(settings: GatewaySettings) -> Service:
    auth = Authenticator(settings.api_keys)
    if not len(auth):
        raise SystemExit(
            "gateway: no API keys configured; set HIPPO_GATEWAY_API_KEYS, e.g. "
            '\'{"<key>": "<tenant>"}\' (`hippo up` sets a local one)'
        )
    servicer = MemoryServicer(auth)
    channels: list[grpc.aio.Channel] = []
    audits: list[tuple[AuditRecorder, SqliteSpool]] = []

    def register(server: grpc.aio.Server) -> None:
        memory_pb2_grpc.add_MemoryServiceServicer_to_server(servicer, server)

    async def warmup() -> None:
        # Channels are made here, inside the server's event loop (aio channels bind to it).
        # Peers get messages as large as our own callers may send (a full Remember is
        # 64 turns of 32 KiB: over gRPC's 1 MiB default).
        def peer(addr: str) -> grpc.aio.Channel:
            channel = client.channel(
                addr, settings.client, max_message_bytes=settings.max_message_bytes
            )
            channels.append(channel)
            return channel

        embedding, retrieval = peer(settings.embedding_addr), peer(settings.retrieval_addr)
        injection = peer(settings.injection_addr)
        sessions: Sessions = NoSessions()
        if settings.summariser_addr:
            sessions = GrpcSessions(peer(settings.summariser_addr))
        embedder = GrpcEmbedder(embedding)
        await embedder.connect(timeout=settings.peer_wait_seconds)
        recorder = None
        if settings.audit_addr:
            recorder, servicer.audit, spool = audit_recorder(settings, peer(settings.audit_addr))
            audits.append((recorder, spool))
            await recorder.start()
        memory = MemoryService(
            embedder, GrpcTurnStore(retrieval), sessions=sessions, audit=recorder
        )
        builder = ContextBuilder(
            memory,
            sessions,
            GrpcTokenizer(injection),
            ContextConfig(settings.system_prompt, settings.default_token_budget),
            recorder=recorder,
        )
        servicer.chat = ChatService(
            memory,
            builder,
            TgiLlm(settings.llm_url, settings.llm_timeout_seconds),
            # The injection service's memtok pipeline: influence per request or per user
            # (off by default; a service without a store answers as off).
            GrpcInfluencer(injection, settings.llm_timeout_seconds),
        )
        servicer.context = builder
        servicer.service = memory

    async def close() -> None:
        for recorder, spool in audits:  # what is still spooled is delivered after a restart
            await recorder.close()
            spool.close()
        for channel in channels:
            await channel.close()

    return Service("gateway", [FULL_NAME], register, warmup, close)


def main() -> None:
    settings = GatewaySettings()
    run(build(settings), settings)


if __name__ == "__main__":
    main()
