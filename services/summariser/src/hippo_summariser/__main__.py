"""Wiring only: settings -> store, counter, LLM -> domain -> serve()."""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable
from pathlib import Path

import grpc
import structlog

from hippo.summariser.v1 import summariser_pb2, summariser_pb2_grpc
from hippo_core import client, tls
from hippo_core.outbox import DrainConfig, Outbox, OutboxStore, SqliteOutbox, new_owner
from hippo_core.server.app import Service, run
from hippo_core.server.authz import OPERATOR, callers
from hippo_core.tokenizer import ModelTokenizer
from hippo_summariser import metrics
from hippo_summariser.adapters import tgi_info
from hippo_summariser.adapters.audit_client import GrpcAuditSink
from hippo_summariser.adapters.sqlite_store import SqliteSessionStore
from hippo_summariser.adapters.tgi_llm import Generation, TgiLlm
from hippo_summariser.adapters.token_counter import GrpcTokenCounter, LocalTokenCounter
from hippo_summariser.domain import audit
from hippo_summariser.domain.merge import MergeConfig, Merger
from hippo_summariser.domain.models import MergeEvent
from hippo_summariser.domain.ports import Llm, MergeObserver, NoObserver, SessionStore
from hippo_summariser.domain.service import Budgets, SummariserService
from hippo_summariser.domain.summarise import SummaryConfig
from hippo_summariser.domain.validation import Limits
from hippo_summariser.servicer import SummariserServicer
from hippo_summariser.settings import SummariserSettings

log = structlog.stdlib.get_logger("hippo.summariser")
FULL_NAME = summariser_pb2.DESCRIPTOR.services_by_name["SummariserService"].full_name
# Who may call each RPC when TLS is on (docs/security.md has the whole table).
CALLERS = callers(
    FULL_NAME,
    {
        "Append": {"gateway"},
        "GetSession": {"gateway", OPERATOR},
        "SessionVersions": {"gateway"},
        "Forget": {"gateway"},
        "Flush": {OPERATOR},
    },
)


def merge_config(settings: SummariserSettings) -> MergeConfig:
    return MergeConfig(
        window_tokens=settings.window_tokens,
        low_water_tokens=max(1, int(settings.window_tokens * settings.merge_low_water)),
        max_input_tokens=settings.merge_input_tokens,
        summary=SummaryConfig(
            summary_tokens=settings.summary_tokens,
            style=settings.merge_style,
            strict_retry=settings.strict_retry,
            # auto behind an OpenAI-compatible API means llm (a server chosen for its
            # model); behind TGI's API the model's /info settles it (Merger).
            mode="llm"
            if settings.merge_mode == "auto" and settings.llm_backend == "openai"
            else settings.merge_mode,
        ),
        max_concurrent=settings.max_concurrent_merges,
        backoff_initial_seconds=settings.backoff_initial_seconds,
        backoff_max_seconds=settings.backoff_max_seconds,
        drain_seconds=settings.drain_seconds,
        claim_lease_seconds=settings.claim_lease_seconds,
        pause_seconds=settings.merge_pause_seconds,
    )


def merge_llm(settings: SummariserSettings, context: ssl.SSLContext | None) -> Llm:
    """The merge LLM's client, by llm_backend: TGI's API (the default) or an
    OpenAI-compatible one (the `openai` client, imported only then). Both send every
    call as background work (X-Hippo-Priority); the merger paces them (PacedLlm)."""
    generation = Generation(
        greedy=settings.llm_greedy,
        temperature=settings.llm_temperature,
        top_p=settings.llm_top_p,
        seed=settings.llm_seed,
        repetition_penalty=settings.llm_repetition_penalty,
    )
    if settings.llm_backend == "openai":
        from hippo_summariser.adapters.openai_llm import OpenAiLlm

        return OpenAiLlm(
            settings.llm_url,
            settings.llm_api_key,
            settings.llm_model,
            settings.llm_api_style,
            settings.llm_timeout_seconds,
            generation,
            settings.llm_max_concurrency,
            context,
        )
    return TgiLlm(settings.llm_url, settings.llm_timeout_seconds, generation, context)


def open_stores(
    settings: SummariserSettings, owner: str, closers: list[Callable[[], None]]
) -> tuple[SessionStore, OutboxStore | None]:
    """The session store and, when merges are audited, the outbox store over its
    `audit_outbox` table: SQLite under data_dir, or PostgreSQL when database.url is set.
    Blocking (opening may migrate): call from a worker thread. `closers` gets what must
    be closed last (the PostgreSQL pool)."""
    audited = bool(settings.audit_addr)
    if not settings.database.url.get_secret_value():
        path = Path(settings.data_dir) / "sessions.sqlite3"
        store = SqliteSessionStore(path, owner=owner)
        return store, SqliteOutbox(path, audit.TABLE) if audited else None
    # Cluster mode only: psycopg is imported when a database URL is set.
    from hippo_core.outbox import PostgresOutbox
    from hippo_core.postgres import Database
    from hippo_summariser.adapters import postgres_store

    database = Database(
        settings.database, schema=postgres_store.SCHEMA, application="hippo-summariser"
    )
    closers.append(database.close)
    database.open(postgres_store.MIGRATIONS)
    store_pg = postgres_store.PostgresSessionStore(database, owner=owner)
    return store_pg, PostgresOutbox(database, audit.TABLE, owner) if audited else None


def build(settings: SummariserSettings, observer: MergeObserver | None = None) -> Service:
    """`observer` is the on_merge hook (e.g. the audit log's client); none by default."""
    servicer = SummariserServicer()
    opened: list[SummariserService] = []
    mergers: list[Merger] = []
    outboxes: list[Outbox[MergeEvent]] = []
    channels: list[grpc.aio.Channel] = []
    closers: list[Callable[[], None]] = []

    def register(server: grpc.aio.Server) -> None:
        summariser_pb2_grpc.add_SummariserServiceServicer_to_server(servicer, server)

    async def warmup() -> None:
        # Off the event loop: opening the store may migrate or recover a large WAL.
        owner = new_owner()  # this process: its merge claims and its outbox rows
        store, outbox_store = await asyncio.to_thread(open_stores, settings, owner, closers)
        metrics.SESSIONS.set_function(store.session_count)
        # Made inside the server's loop (aio channels bind to it). The injection service
        # is not awaited: until it answers, turns are stored uncounted (see service.py).
        injection = client.channel(
            settings.injection_addr, settings.client, tls_settings=settings.tls
        )
        channels.append(injection)
        counter: GrpcTokenCounter | LocalTokenCounter
        merge_counter: GrpcTokenCounter | LocalTokenCounter
        if settings.tokenizer_path:
            # A model served elsewhere: its own tokenizer counts, here (no host call).
            model = ModelTokenizer(settings.tokenizer_path)
            counter = merge_counter = LocalTokenCounter(model)
        else:
            counter = GrpcTokenCounter(injection, settings.count_timeout_seconds)
            # Merges' counts are background work at the injection host, as their LLM calls.
            merge_counter = GrpcTokenCounter(
                injection, settings.count_timeout_seconds, background=True
            )
        llm_tls = tls.http_client_context(settings.tls) if settings.tls.enabled else None
        # Under TLS the injection host's HTTP API wants the summariser's certificate.
        llm = merge_llm(settings, llm_tls)
        outbox = None
        if outbox_store is not None:
            audit_channel = client.channel(
                settings.audit_addr, settings.client, tls_settings=settings.tls
            )
            channels.append(audit_channel)
            outbox = Outbox(
                audit.OUTBOX,
                outbox_store,
                deliver=audit.deliverer(GrpcAuditSink(audit_channel)),
                encode=audit.encode,
                decode=audit.decode,
                config=DrainConfig(
                    retry_min_seconds=min(0.5, settings.audit_retry_max_seconds),
                    retry_max_seconds=settings.audit_retry_max_seconds,
                ),
            )
            outboxes.append(outbox)
            await outbox.start()  # delivers what a previous run left in the outbox
        else:
            log.warning("merges_not_audited", reason="HIPPO_SUMMARISER_AUDIT_ADDR is empty")
        merger = Merger(
            store,
            merge_counter,
            llm,
            merge_config(settings),
            observer or NoObserver(),
            outbox=outbox,
            special_tokens=merge_counter.special_tokens,
            # merge_mode=auto: extractive when the LLM is the built-in base model.
            llm_model_id=functools.partial(
                tgi_info.model_id, settings.llm_url, settings.llm_timeout_seconds, llm_tls
            ),
        )
        mergers.append(merger)
        service = SummariserService(
            store,
            counter,
            merger,
            Budgets(settings.window_tokens, settings.summary_tokens, settings.flush_max_seconds),
            Limits(max_turns=settings.max_turns_per_append, max_text_bytes=settings.max_text_bytes),
        )
        opened.append(service)
        await service.resume()
        servicer.service = service

    async def close() -> None:
        # Merges first (those in an LLM call get drain_seconds to commit and queue their
        # events), then the outbox gets drain_seconds to deliver; what it has not
        # delivered stays queued for the next start (or, in cluster mode, the replica
        # that adopts it). The store and the database last: both read it.
        for merger in mergers:
            await merger.close()
        for outbox in outboxes:
            await outbox.drained(timeout=settings.drain_seconds)
            await outbox.close()
        for service in opened:
            await service.close()
        for closer in closers:
            await asyncio.to_thread(closer)
        for channel in channels:
            await channel.close()

    return Service("summariser", [FULL_NAME], register, warmup, close, callers=CALLERS)


def main() -> None:
    settings = SummariserSettings()
    run(build(settings), settings)


if __name__ == "__main__":
    main()
