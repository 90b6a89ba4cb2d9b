"""Wiring only: settings -> peers -> domain -> serve()."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal, NamedTuple

import grpc

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core import client, outbox, tls
from hippo_core.postgres import Database, engine
from hippo_core.server.app import Service, run
from hippo_core.tokenizer import ModelTokenizer
from hippo_gateway.adapters import fingerprint_key, spool, spool_store
from hippo_gateway.adapters.audit_client import GrpcAuditLog
from hippo_gateway.adapters.embedding_client import GrpcEmbedder, GrpcEmbeddingCaches
from hippo_gateway.adapters.embedding_model import LiveModel
from hippo_gateway.adapters.influence_client import GrpcInfluencer
from hippo_gateway.adapters.llm_client import TgiLlm
from hippo_gateway.adapters.local_tokenizer import LocalTokenizer
from hippo_gateway.adapters.retrieval_client import GrpcTurnStore
from hippo_gateway.adapters.session_client import GrpcSessions, NoSessions
from hippo_gateway.adapters.tokenizer_client import GrpcTokenizer, NoTokenizer
from hippo_gateway.adapters.word_frequencies import english_word_counts
from hippo_gateway.domain.audit_recorder import AuditRecorder, RecorderConfig
from hippo_gateway.domain.audit_trail import AuditTrail
from hippo_gateway.domain.auth import Authenticator, KeyGrant
from hippo_gateway.domain.chat import ChatService
from hippo_gateway.domain.context import ContextBuilder, ContextConfig
from hippo_gateway.domain.listing import Listings
from hippo_gateway.domain.memory import MemoryService, QuerySpelling
from hippo_gateway.domain.ports import Llm, Sessions
from hippo_gateway.domain.quota import Quotas, TenantQuota
from hippo_gateway.domain.spelling import QuerySpeller
from hippo_gateway.domain.transfer import Transfers
from hippo_gateway.openai_api import OpenAiApi
from hippo_gateway.servicer import MemoryServicer
from hippo_gateway.settings import GatewaySettings, TenantQuotaSettings

FULL_NAME = memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name


SCHEMA = "hippo_gateway"
# HIPPO_GATEWAY_QUERY_SPELLING -> what BM25 and the speaker step search (QuerySpelling).
SPELLING_LEXICAL: dict[str, Literal["words", "repaired", "typed"]] = {
    "words": "words",
    "all": "repaired",
    "vector": "typed",
}


class AuditState(NamedTuple):
    store: outbox.OutboxStore
    scrub: spool_store.Scrub
    key: bytes
    database: Database | None  # closed at stop


def audit_state(settings: GatewaySettings) -> AuditState:
    """The spool's store and the fingerprint key: SQLite and a file under data_dir
    (embedded), or the gateway's PostgreSQL schema with this process's owner id (cluster
    mode). Blocking: run it off the event loop."""
    configured = settings.audit_fingerprint_key.get_secret_value()
    chosen = engine(settings.database, schema=SCHEMA, application="hippo-gateway")
    if chosen.database is None:
        data = Path(settings.data_dir)
        return AuditState(
            spool_store.sqlite_store(data),
            spool_store.sqlite_scrub(data),
            fingerprint_key.file_key(configured, data),
            None,
        )
    database = chosen.database
    try:
        database.open(spool_store.POSTGRES_MIGRATIONS)
        key = fingerprint_key.database_key(configured, database)
        store = spool_store.postgres_store(database, outbox.new_owner())
    except BaseException:
        database.close()
        raise
    return AuditState(store, spool_store.postgres_scrub(database), key, database)


def audit_recorder(
    settings: GatewaySettings, channel: grpc.aio.Channel, state: AuditState
) -> tuple[AuditRecorder, AuditTrail]:
    """The audit recorder over its spool and the audit service (not started)."""
    log = GrpcAuditLog(channel)
    config = RecorderConfig(settings.audit_fail_closed, settings.audit_seq_wait_seconds)
    outbox_of = spool.opener(state.store, scrub=state.scrub, seal_key=state.key)
    recorder = AuditRecorder(log, outbox_of, state.key, config)
    return recorder, AuditTrail(log, recorder)


def authenticator(settings: GatewaySettings) -> Authenticator:
    grants = {
        key: value if isinstance(value, str) else KeyGrant(value.tenant, tuple(value.roles))
        for key, value in settings.api_keys.items()
    }
    return Authenticator(grants)


def quotas(settings: GatewaySettings) -> Quotas:
    def quota(q: TenantQuotaSettings) -> TenantQuota:
        return TenantQuota(q.requests_per_second, q.burst, q.max_stored_turns)

    return Quotas(
        {tenant: quota(q) for tenant, q in settings.quotas.items()},
        quota(settings.default_quota),
        refresh_seconds=settings.quota_refresh_seconds,
    )


def llm(settings: GatewaySettings) -> Llm:
    """Chat's LLM client, by llm_backend: TGI's API (the default) or an OpenAI-compatible
    one (the `openai` client, imported only then)."""
    # Under TLS the injection host's HTTP API wants the gateway's certificate.
    context = tls.http_client_context(settings.tls) if settings.tls.enabled else None
    if settings.llm_backend == "openai":
        from hippo_gateway.adapters.openai_llm import OpenAiLlm

        return OpenAiLlm(
            settings.llm_url,
            settings.llm_api_key,
            settings.llm_model,
            settings.llm_api_style,
            settings.llm_timeout_seconds,
            settings.llm_max_concurrency,
            context,
        )
    return TgiLlm(settings.llm_url, settings.llm_timeout_seconds, context)


def tokenizer(
    settings: GatewaySettings, injection: grpc.aio.Channel
) -> LocalTokenizer | GrpcTokenizer | NoTokenizer:
    """Who counts prompts: the reading model's own files (`tokenizer_path`, for a model
    served elsewhere), else the LLM host, else nobody (BuildContext is not served)."""
    if settings.tokenizer_path:
        return LocalTokenizer(
            ModelTokenizer(settings.tokenizer_path, context_length=settings.context_length)
        )
    return GrpcTokenizer(injection) if settings.injection_addr else NoTokenizer()


def build(settings: GatewaySettings) -> Service:
    auth = authenticator(settings)
    if not len(auth):
        raise SystemExit(
            "gateway: no API keys configured; set HIPPO_GATEWAY_API_KEYS, e.g. "
            '\'{"<key>": "<tenant>"}\' (`hippo up` sets a local one)'
        )
    limits = quotas(settings)
    servicer = MemoryServicer(auth, limits)
    openai_api = OpenAiApi(
        auth,
        limits,
        settings.openai_default_session,
        settings.openai_timeout_seconds,
        settings.grace_seconds,
        settings.max_message_bytes,
    )
    channels: list[grpc.aio.Channel] = []
    recorders: list[AuditRecorder] = []
    databases: list[Database] = []

    def register(server: grpc.aio.Server) -> None:
        memory_pb2_grpc.add_MemoryServiceServicer_to_server(servicer, server)

    async def warmup() -> None:
        if settings.openai_port:  # first, so it answers 503 while the peers are reached
            await openai_api.start(settings.host, settings.openai_port, settings.tls)

        # Channels are made here, inside the server's event loop (aio channels bind to it).
        # Peers get messages as large as our own callers may send (a full Remember is
        # 64 turns of 32 KiB: over gRPC's 1 MiB default).
        def peer(addr: str) -> grpc.aio.Channel:
            channel = client.channel(
                addr,
                settings.client,
                max_message_bytes=settings.max_message_bytes,
                tls_settings=settings.tls,
            )
            channels.append(channel)
            return channel

        embedding, retrieval = peer(settings.embedding_addr), peer(settings.retrieval_addr)
        injection = peer(settings.injection_addr)
        sessions: Sessions = NoSessions()
        if settings.summariser_addr:
            sessions = GrpcSessions(peer(settings.summariser_addr))
        # The live index's embedding model: the turn store learns it from retrieval's
        # replies, the embedder asks for it (an online model switch reaches the gateway).
        live_model = LiveModel()
        embedder = GrpcEmbedder(embedding, live_model)
        await embedder.connect(timeout=settings.peer_wait_seconds)
        recorder = None
        if settings.audit_addr:
            state = await asyncio.to_thread(audit_state, settings)
            databases.extend([state.database] if state.database is not None else [])
            recorder, servicer.audit = audit_recorder(settings, peer(settings.audit_addr), state)
            recorders.append(recorder)
            await recorder.start()
        # The injection service's memtok pipeline: influence per request or per user (off
        # by default; a service without a store answers as off), and Forget's erasure.
        influencer = GrpcInfluencer(injection, settings.llm_timeout_seconds)
        store = GrpcTurnStore(retrieval, live_model)
        limits.count_turns_with(store.tenant_turns)
        spelling = None
        if settings.query_spelling != "off":
            speller = QuerySpeller(await asyncio.to_thread(english_word_counts))
            lexical = SPELLING_LEXICAL[settings.query_spelling]
            spelling = QuerySpelling(speller.spell, lexical=lexical)
        memory = MemoryService(
            embedder,
            store,
            sessions=sessions,
            audit=recorder,
            # Forget of a user erases their memtoks too; it fails (UNAVAILABLE, retried by
            # the caller) while the injection service is down rather than leave them.
            memtoks=influencer if settings.injection_addr else None,
            quotas=limits,
            caches=GrpcEmbeddingCaches(settings.embedding_addr, settings.client, settings.tls),
            spelling=spelling,
        )
        builder = ContextBuilder(
            memory,
            sessions,
            tokenizer(settings, injection),
            ContextConfig(settings.system_prompt, settings.default_token_budget),
            recorder=recorder,
        )
        servicer.chat = ChatService(
            memory,
            builder,
            llm(settings),
            influencer,
        )
        servicer.context = builder
        servicer.listings = Listings(store, recorder, sessions)
        servicer.transfers = Transfers(memory, store, sessions, recorder)
        servicer.service = memory
        openai_api.chat = servicer.chat

    async def close() -> None:
        # What is still spooled is delivered after a restart (or, in cluster mode, by
        # another replica once this one's lease is gone).
        for recorder in recorders:
            await recorder.close()
        for database in databases:
            database.close()
        for channel in channels:
            await channel.close()

    return Service("gateway", [FULL_NAME], register, warmup, close, drain=openai_api.stop)


def main() -> None:
    settings = GatewaySettings()
    run(build(settings), settings)


if __name__ == "__main__":
    main()
